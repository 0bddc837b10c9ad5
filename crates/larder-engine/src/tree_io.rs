//! Reading chunks and tree streams back from a repository.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use larder_hash::Fingerprint;
use larder_store::{ParsedContainer, Repository, StoreError, TreeDecoder, TreeEntry};

use crate::error::Result;

/// Containers kept in memory while reading; 16 × 4 MiB.
const CACHE_CONTAINERS: usize = 16;

/// Reads chunks by fingerprint, decoding and verifying each one, through a small
/// container cache.
pub struct ChunkReader<'r> {
    repo: &'r Repository,
    cache: HashMap<u64, Arc<ParsedContainer>>,
    order: VecDeque<u64>,
    containers_read: u64,
    bytes_read: u64,
}

impl<'r> ChunkReader<'r> {
    pub fn new(repo: &'r Repository) -> Self {
        Self {
            repo,
            cache: HashMap::new(),
            order: VecDeque::new(),
            containers_read: 0,
            bytes_read: 0,
        }
    }

    /// Containers read so far (each whole) and their bytes.
    pub fn reads(&self) -> (u64, u64) {
        (self.containers_read, self.bytes_read)
    }

    fn container(&mut self, id: u64) -> Result<Arc<ParsedContainer>> {
        if let Some(c) = self.cache.get(&id) {
            return Ok(c.clone());
        }
        let c = Arc::new(self.repo.load_container(id)?);
        self.containers_read += 1;
        self.bytes_read += c.file_len() as u64;
        if self.order.len() >= CACHE_CONTAINERS {
            if let Some(old) = self.order.pop_front() {
                self.cache.remove(&old);
            }
        }
        self.order.push_back(id);
        self.cache.insert(id, c.clone());
        Ok(c)
    }

    /// Appends the raw bytes of chunk `fp` to `out`. Fails, leaving `out` as it was,
    /// if it is not indexed, its container is unreadable, it does not decode, or its
    /// raw bytes no longer hash to `fp`.
    pub fn read_into(&mut self, fp: &Fingerprint, out: &mut Vec<u8>) -> Result<()> {
        let loc = self
            .repo
            .index()
            .get(fp)?
            .ok_or(StoreError::MissingChunk(*fp))?;
        let container = self.container(loc.container)?;
        let name = format!("{:016x}", loc.container);
        let entry = container
            .entry_at(loc.offset)
            .filter(|e| e.stored_len == loc.length && e.fingerprint == *fp)
            .ok_or_else(|| corrupt(&name, format!("chunk {fp} is not in its table")))?;
        container.read_chunk(entry, &self.repo.codec(), out)?;
        Ok(())
    }
}

fn corrupt(name: &str, reason: String) -> StoreError {
    StoreError::Corrupt {
        what: "container",
        name: name.to_string(),
        reason,
    }
}

/// Reads and decodes a snapshot's whole tree stream.
pub fn load_tree(reader: &mut ChunkReader<'_>, fps: &[Fingerprint]) -> Result<Vec<TreeEntry>> {
    let stream = read_stream(reader, fps, 0)?;
    let entries = TreeDecoder::new(&stream)?.collect::<Result<Vec<_>, StoreError>>()?;
    Ok(entries)
}

/// The bytes of a stream stored as chunks `fps`, every chunk verified; `size_hint`
/// (the length the snapshot records, at most 256 MiB of it trusted) sizes the buffer
/// once.
pub(crate) fn read_stream(
    reader: &mut ChunkReader<'_>,
    fps: &[Fingerprint],
    size_hint: u64,
) -> Result<Vec<u8>> {
    let mut stream = Vec::with_capacity(size_hint.min(256 << 20) as usize);
    for fp in fps {
        reader.read_into(fp, &mut stream)?;
    }
    Ok(stream)
}
