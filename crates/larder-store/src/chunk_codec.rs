//! The one chunk codec (docs/design/format.md, "Chunk codec"): every chunk a
//! repository stores goes through it. Writing compresses (if the repository does);
//! reading decodes exactly the raw length and then verifies the chunk against its
//! fingerprint, so no caller can use a chunk it has not verified.

use std::cell::RefCell;

use larder_hash::{Fingerprint, HashAlgo};

use crate::compression::{ChunkCompressor, ChunkDecoder, ChunkEncoding, Compression};
use crate::error::Result;

thread_local! {
    /// This thread's zstd compression context, made on its first chunk.
    static COMPRESSOR: RefCell<Option<ChunkCompressor>> = const { RefCell::new(None) };
    /// This thread's zstd decompression context, made on its first compressed chunk.
    static DECODER: RefCell<ChunkDecoder> = RefCell::new(ChunkDecoder::new());
}

/// How a repository turns raw chunks into stored bytes and back. Cheap to copy; every
/// thread that encodes or decodes uses its own zstd contexts.
#[derive(Debug, Clone, Copy)]
pub struct ChunkCodec {
    compression: Compression,
    algo: HashAlgo,
}

/// A chunk as a container stores it: which chunk, how encoded, and the stored bytes.
#[derive(Debug, Clone, Copy)]
pub struct StoredChunk<'a> {
    pub fingerprint: Fingerprint,
    pub encoding: ChunkEncoding,
    pub bytes: &'a [u8],
}

impl ChunkCodec {
    pub const fn new(compression: Compression, algo: HashAlgo) -> Self {
        Self { compression, algo }
    }

    /// The fingerprint algorithm chunks are verified with.
    pub fn algo(&self) -> HashAlgo {
        self.algo
    }

    /// Whether new chunks are compressed.
    pub fn compresses(&self) -> bool {
        self.compression != Compression::None
    }

    /// The fingerprint of a raw chunk.
    pub fn fingerprint(&self, raw: &[u8]) -> Fingerprint {
        self.algo.fingerprint(raw)
    }

    /// How `raw` is to be stored: its zstd frame if compression is on and the frame is
    /// shorter than the chunk, else `None` (store it raw). Runs on any thread.
    pub fn compress(&self, raw: &[u8]) -> Result<Option<Vec<u8>>> {
        let Compression::Zstd { level } = self.compression else {
            return Ok(None);
        };
        COMPRESSOR.with_borrow_mut(|slot| {
            let compressor = match slot {
                Some(c) if c.level() == level => c,
                other => other.insert(ChunkCompressor::new(level)?),
            };
            Ok(compressor.compress(raw)?.map(<[u8]>::to_vec))
        })
    }

    /// Decodes `chunk` into `out`, which must be exactly its raw length, and verifies
    /// the raw bytes against the fingerprint. The error is a reason, for the caller
    /// to wrap with the container's name; on an error `out` holds no verified data.
    pub fn decode_to_slice(
        &self,
        chunk: StoredChunk<'_>,
        out: &mut [u8],
    ) -> std::result::Result<(), String> {
        let fp = chunk.fingerprint;
        DECODER
            .with_borrow_mut(|d| d.decode_to_slice(chunk.encoding, chunk.bytes, out))
            .map_err(|reason| format!("chunk {fp} is damaged: {reason}"))?;
        self.verify(fp, out)
    }

    /// Appends the `raw_len` raw bytes of `chunk` to `out` and verifies them; on an
    /// error `out` is left as it was. Allocates at most `raw_len` bytes, and refuses a
    /// compressed chunk that claims more than a chunk may hold.
    pub fn decode_into(
        &self,
        chunk: StoredChunk<'_>,
        raw_len: u32,
        out: &mut Vec<u8>,
    ) -> std::result::Result<(), String> {
        let fp = chunk.fingerprint;
        let start = out.len();
        DECODER
            .with_borrow_mut(|d| d.decode_into(chunk.encoding, chunk.bytes, raw_len, out))
            .map_err(|reason| format!("chunk {fp} is damaged: {reason}"))?;
        let verified = self.verify(fp, &out[start..]);
        if verified.is_err() {
            out.truncate(start);
        }
        verified
    }

    fn verify(&self, fp: Fingerprint, raw: &[u8]) -> std::result::Result<(), String> {
        if self.algo.fingerprint(raw) == fp {
            Ok(())
        } else {
            Err(format!(
                "chunk {fp} is damaged (its data no longer matches its fingerprint)"
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compression::noise;

    fn codec(compression: Compression) -> ChunkCodec {
        ChunkCodec::new(compression, HashAlgo::Blake3)
    }

    fn stored<'a>(fp: Fingerprint, frame: &'a Option<Vec<u8>>, raw: &'a [u8]) -> StoredChunk<'a> {
        match frame {
            Some(f) => StoredChunk {
                fingerprint: fp,
                encoding: ChunkEncoding::Zstd,
                bytes: f,
            },
            None => StoredChunk {
                fingerprint: fp,
                encoding: ChunkEncoding::Raw,
                bytes: raw,
            },
        }
    }

    #[test]
    fn round_trips_compressible_and_incompressible_chunks() {
        let text = b"abcabcabd ".repeat(1000);
        let random = noise(7, 10_000);
        for compression in [Compression::None, Compression::DEFAULT] {
            let c = codec(compression);
            for raw in [&text[..], &random[..], &[][..]] {
                let frame = c.compress(raw).unwrap();
                assert_eq!(
                    frame.is_some(),
                    compression != Compression::None && raw == &text[..]
                );
                let chunk = stored(c.fingerprint(raw), &frame, raw);
                let mut out = vec![0; raw.len()];
                c.decode_to_slice(chunk, &mut out).unwrap();
                assert_eq!(out, raw);
                let mut appended = b"prefix".to_vec();
                c.decode_into(chunk, raw.len() as u32, &mut appended)
                    .unwrap();
                assert_eq!(&appended[6..], raw);
            }
        }
    }

    #[test]
    fn a_chunk_that_does_not_match_its_fingerprint_is_refused_and_not_appended() {
        let c = codec(Compression::DEFAULT);
        let raw = b"some chunk ".repeat(100);
        let frame = c.compress(&raw).unwrap();
        let wrong = c.fingerprint(b"another chunk");
        let chunk = stored(wrong, &frame, &raw);
        let mut out = b"kept".to_vec();
        let err = c
            .decode_into(chunk, raw.len() as u32, &mut out)
            .unwrap_err();
        assert!(err.contains("no longer matches its fingerprint"), "{err}");
        assert_eq!(out, b"kept");
        let mut slot = vec![0; raw.len()];
        assert!(c.decode_to_slice(chunk, &mut slot).is_err());
    }

    #[test]
    fn a_damaged_frame_names_the_chunk() {
        let c = codec(Compression::DEFAULT);
        let raw = b"some chunk ".repeat(100);
        let mut frame = c.compress(&raw).unwrap();
        if let Some(f) = frame.as_mut() {
            let last = f.len() - 1;
            f[last] ^= 1;
        }
        let fp = c.fingerprint(&raw);
        let err = c
            .decode_into(stored(fp, &frame, &raw), raw.len() as u32, &mut Vec::new())
            .unwrap_err();
        assert!(err.starts_with(&format!("chunk {fp} is damaged")), "{err}");
    }
}
