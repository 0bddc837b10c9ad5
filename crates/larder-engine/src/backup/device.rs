//! Chunking and fingerprinting on another device (docs/design/gpu.md, "Backups on the
//! GPU"): stage 1 hands each block of a large file to the device, which returns the
//! block's cut points and fingerprints, and stage 2 keeps them instead of hashing.
//! Everything else, and every result, is the CPU path's.

use larder_chunk::ChunkerKind;
use larder_hash::Fingerprint;
use larder_store::RepoConfig;

use crate::error::{EngineError, Result};

/// A device that chunks and fingerprints. It must give exactly the CPU's cut points
/// (FastCDC 2020 of the repository's config) and fingerprints (the repository's
/// unkeyed hash); [`check_usable`] says which repositories it serves.
pub trait ChunkDevice: Send {
    /// The chunks of `data` as one whole stream (its last chunk ends where `data`
    /// ends): each chunk's length and fingerprint, in order.
    fn chunk_and_hash(
        &mut self,
        data: &[u8],
    ) -> std::result::Result<Vec<(u32, Fingerprint)>, String>;
}

/// Whether a device that chunks with FastCDC 2020 and hashes without a key can back up
/// into a repository with `config`; the error says why not.
pub fn check_usable(config: &RepoConfig) -> Result<()> {
    let why = if config.encryption.is_some() {
        "an encrypted repository's fingerprints are keyed, and its chunker too"
    } else if config.chunker.kind != ChunkerKind::Fastcdc2020 {
        "it chunks with fastcdc2020 only"
    } else if config.chunker.seed != 0 {
        "it chunks with the unseeded Gear table only"
    } else {
        return Ok(());
    };
    Err(EngineError::Device(format!(
        "the GPU cannot back up into this repository: {why}; use --device cpu"
    )))
}

/// The GPU backend (crate larder-gpu) as a [`ChunkDevice`], on a real GPU or on its
/// CPU emulation.
#[cfg(feature = "gpu")]
pub struct GpuChunkDevice<D: larder_gpu::Device + Sync + 'static> {
    hasher: larder_gpu::ChunkerHasher<'static, D>,
    block_size: usize,
}

#[cfg(feature = "gpu")]
impl<D: larder_gpu::Device + Sync + 'static> GpuChunkDevice<D>
where
    D::Slot: Send,
{
    /// Chunks as `chunker` says (FastCDC 2020) and hashes with `algo` on `device`,
    /// opened for the life of the process.
    pub fn new(
        device: &'static D,
        chunker: &larder_chunk::ChunkerConfig,
        algo: larder_hash::HashAlgo,
        config: larder_gpu::GpuConfig,
    ) -> Result<Self> {
        let candidates = larder_chunk::CandidateChunker::new(
            chunker.min_size,
            chunker.avg_size,
            chunker.max_size,
            chunker.level,
        );
        let hasher =
            larder_gpu::ChunkerHasher::new(device, candidates, chunker.max_size, algo, config)
                .map_err(|e| EngineError::Device(e.to_string()))?;
        Ok(Self {
            hasher,
            block_size: config.block_size,
        })
    }
}

#[cfg(feature = "gpu")]
impl<D: larder_gpu::Device + Sync + 'static> ChunkDevice for GpuChunkDevice<D>
where
    D::Slot: Send,
{
    fn chunk_and_hash(
        &mut self,
        data: &[u8],
    ) -> std::result::Result<Vec<(u32, Fingerprint)>, String> {
        let mut chunks = Vec::new();
        for block in data.chunks(self.block_size) {
            chunks.extend(self.hasher.push(block).map_err(|e| e.to_string())?);
        }
        chunks.extend(self.hasher.end_stream().map_err(|e| e.to_string())?);
        // A chunk is at most 16 MiB (`ChunkerConfig`'s largest maximum).
        Ok(chunks
            .into_iter()
            .map(|c| (c.len as u32, c.fingerprint))
            .collect())
    }
}
