//! The one chunk codec (docs/design/format.md, "Chunk codec"): every chunk a
//! repository stores goes through it. It fingerprints raw chunks (keyed in an
//! encrypted repository); writing compresses (if the repository does) and the
//! container seals; reading opens a sealed chunk, decodes exactly the raw length and
//! then verifies the chunk against its fingerprint, so no caller can use a chunk it
//! has not verified.

use std::cell::RefCell;
use std::sync::Arc;

use larder_crypto::{ChunkOpener, RepoKeys};
use larder_hash::{Fingerprint, HashAlgo};

use crate::compression::{
    ChunkCompressor, ChunkDecoder, ChunkEncoding, Compression, UnitPlace, MAX_COMPRESSED_RAW_LEN,
};
use crate::error::Result;

thread_local! {
    /// This thread's zstd compression context, made on its first chunk.
    static COMPRESSOR: RefCell<Option<ChunkCompressor>> = const { RefCell::new(None) };
    /// This thread's zstd decompression context, made on its first compressed chunk.
    static DECODER: RefCell<ChunkDecoder> = RefCell::new(ChunkDecoder::new());
    /// This thread's buffer for opening sealed chunks.
    static OPENED: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
    /// This thread's last decoded compression units: reading a unit's members one
    /// after another, or interleaved with a few other units' members, decodes it once.
    static UNITS: RefCell<UnitCache> = const { RefCell::new(UnitCache::EMPTY) };
    /// This thread's buffer for the raw bytes of a unit being compressed.
    static UNIT_RAW: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Units a thread keeps decoded.
const UNIT_CACHE: usize = 4;

/// The last [`UNIT_CACHE`] units a thread decoded, replaced oldest first.
struct UnitCache {
    units: [DecodedUnit; UNIT_CACHE],
    /// The slot the next decoded unit takes.
    next: usize,
}

impl UnitCache {
    const EMPTY: Self = Self {
        units: [const { DecodedUnit::EMPTY }; UNIT_CACHE],
        next: 0,
    };

    /// The decoded unit of member `chunk` at `place`: a held one, or decoded now into
    /// the oldest slot.
    fn unit(
        &mut self,
        chunk: &StoredChunk<'_>,
        place: &UnitPlace,
    ) -> std::result::Result<&[u8], String> {
        if let Some(i) = self.units.iter().position(|u| u.holds(chunk, place)) {
            return Ok(&self.units[i].raw);
        }
        let slot = self.next;
        self.next = (slot + 1) % UNIT_CACHE;
        let unit = &mut self.units[slot];
        unit.raw.clear();
        let mut raw = std::mem::take(&mut unit.raw);
        raw.resize(place.unit_len as usize, 0);
        // The unit is sealed with its first member's fingerprint.
        let sealed_as = StoredChunk {
            fingerprint: place.first,
            ..*chunk
        };
        with_opened(sealed_as, |stored| {
            DECODER.with_borrow_mut(|d| d.decode_to_slice(chunk.encoding, stored, &mut raw))
        })
        .map_err(|reason| format!("its unit does not decode: {reason}"))?;
        unit.stored.clear();
        unit.stored.extend_from_slice(chunk.bytes);
        unit.seal_index = chunk.seal.map(|s| s.index);
        unit.first = place.first;
        unit.raw = raw;
        Ok(&unit.raw)
    }
}

/// A decoded unit and what it was decoded from. Whatever it holds, every member taken
/// from it is verified against the member's fingerprint, so the cache can never make a
/// damaged chunk read as good.
struct DecodedUnit {
    /// The stored bytes as the container holds them (sealed, in an encrypted one).
    stored: Vec<u8>,
    seal_index: Option<u32>,
    first: Fingerprint,
    /// The unit's raw bytes; empty when nothing is held.
    raw: Vec<u8>,
}

impl DecodedUnit {
    const EMPTY: Self = Self {
        stored: Vec::new(),
        seal_index: None,
        first: Fingerprint([0; 32]),
        raw: Vec::new(),
    };

    /// Whether it holds the unit of `chunk`, a member at `place`.
    fn holds(&self, chunk: &StoredChunk<'_>, place: &UnitPlace) -> bool {
        !self.raw.is_empty()
            && self.raw.len() == place.unit_len as usize
            && self.first == place.first
            && self.seal_index == chunk.seal.map(|s| s.index)
            && self.stored == chunk.bytes
    }
}

/// What names a repository's fingerprint function in container and segment headers:
/// a plaintext repository's hash, or a codec (keyed in an encrypted repository).
pub trait IdCode {
    /// The code: the hash's (1 to 3), or the keyed fingerprint's (4, 5).
    fn id_code(&self) -> u8;
}

impl IdCode for HashAlgo {
    fn id_code(&self) -> u8 {
        self.code()
    }
}

impl IdCode for &ChunkCodec {
    fn id_code(&self) -> u8 {
        ChunkCodec::id_code(self)
    }
}

/// How a repository turns raw chunks into stored bytes and back. Cheap to clone; every
/// thread that encodes or decodes uses its own zstd contexts.
#[derive(Debug, Clone)]
pub struct ChunkCodec {
    compression: Compression,
    algo: HashAlgo,
    /// The repository's keys, if it is encrypted.
    keys: Option<Arc<RepoKeys>>,
}

/// A chunk as a container stores it: which chunk, how encoded, and the stored bytes.
#[derive(Debug, Clone, Copy)]
pub struct StoredChunk<'a> {
    pub fingerprint: Fingerprint,
    pub encoding: ChunkEncoding,
    pub bytes: &'a [u8],
    /// How to open it, if its container is sealed (crypto.md, "Containers, encrypted").
    pub seal: Option<ChunkSeal<'a>>,
}

/// What opens a sealed chunk: its container's opener (`None` when the key is
/// write-only) and the chunk's index in the container's table.
#[derive(Debug, Clone, Copy)]
pub struct ChunkSeal<'a> {
    pub opener: Option<&'a ChunkOpener>,
    pub index: u32,
}

impl ChunkCodec {
    /// The codec of a plaintext repository.
    pub const fn new(compression: Compression, algo: HashAlgo) -> Self {
        Self {
            compression,
            algo,
            keys: None,
        }
    }

    /// The codec of an encrypted repository: fingerprints are keyed, containers sealed.
    pub fn encrypted(compression: Compression, algo: HashAlgo, keys: Arc<RepoKeys>) -> Self {
        Self {
            compression,
            algo,
            keys: Some(keys),
        }
    }

    /// The repository's keys, if it is encrypted.
    pub fn keys(&self) -> Option<&Arc<RepoKeys>> {
        self.keys.as_ref()
    }

    /// The unkeyed hash the repository's fingerprints are built on.
    pub fn algo(&self) -> HashAlgo {
        self.algo
    }

    /// The fingerprint code in container and segment headers: the hash's (1 to 3), or
    /// the keyed fingerprint's (4, 5) in an encrypted repository.
    pub fn id_code(&self) -> u8 {
        match &self.keys {
            Some(keys) => keys.fingerprint_kind().code(),
            None => self.algo.code(),
        }
    }

    /// The fingerprint of a raw chunk: keyed in an encrypted repository.
    pub fn fingerprint(&self, raw: &[u8]) -> Fingerprint {
        match &self.keys {
            Some(keys) => Fingerprint(keys.fingerprint(raw)),
            None => self.algo.fingerprint(raw),
        }
    }

    /// The fingerprints of many raw chunks, in order, on this thread: BLAKE3 across
    /// SIMD lanes (keyed in an encrypted repository), as [`ChunkCodec::fingerprint`]
    /// would give one by one.
    pub fn fingerprint_many(&self, raw: &[&[u8]]) -> Vec<Fingerprint> {
        match &self.keys {
            Some(keys) => keys
                .fingerprint_many(raw)
                .into_iter()
                .map(Fingerprint)
                .collect(),
            None => self.algo.fingerprint_many(raw),
        }
    }

    /// How `raw` is to be stored: its zstd frame if compression is on and the frame is
    /// shorter than the chunk, else `None` (store it raw). Runs on any thread.
    pub fn compress(&self, raw: &[u8]) -> Result<Option<Vec<u8>>> {
        let Compression::Zstd { level, .. } = self.compression else {
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

    /// The zstd frame of `raws` concatenated, a compression unit, if compression is on
    /// and the frame is shorter than the raw bytes; else `None` (store each chunk on
    /// its own). Runs on any thread.
    pub fn compress_unit(&self, raws: &[&[u8]]) -> Result<Option<Vec<u8>>> {
        UNIT_RAW.with_borrow_mut(|buf| {
            buf.clear();
            for raw in raws {
                buf.extend_from_slice(raw);
            }
            self.compress(buf)
        })
    }

    /// The repository's compression setting.
    pub fn compression(&self) -> Compression {
        self.compression
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
        refuse_write_only(chunk)?;
        match chunk.encoding {
            ChunkEncoding::Member(place) => take_member(chunk, &place, out),
            encoding => with_opened(chunk, |stored| {
                DECODER.with_borrow_mut(|d| d.decode_to_slice(encoding, stored, out))
            }),
        }
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
        refuse_write_only(chunk)?;
        let start = out.len();
        if let ChunkEncoding::Member(place) = chunk.encoding {
            // The unit's length bounds the member's: at most what a frame may hold.
            if u64::from(place.raw_offset) + u64::from(raw_len) > u64::from(place.unit_len) {
                return Err(format!("chunk {fp} is damaged: it lies outside its unit"));
            }
            out.resize(start + raw_len as usize, 0);
            let decoded = self.decode_to_slice(chunk, &mut out[start..]);
            if decoded.is_err() {
                out.truncate(start);
            }
            return decoded;
        }
        with_opened(chunk, |stored| {
            DECODER.with_borrow_mut(|d| d.decode_into(chunk.encoding, stored, raw_len, out))
        })
        .map_err(|reason| format!("chunk {fp} is damaged: {reason}"))?;
        let verified = self.verify(fp, &out[start..]);
        if verified.is_err() {
            out.truncate(start);
        }
        verified
    }

    fn verify(&self, fp: Fingerprint, raw: &[u8]) -> std::result::Result<(), String> {
        if self.fingerprint(raw) == fp {
            Ok(())
        } else {
            Err(format!(
                "chunk {fp} is damaged (its data no longer matches its fingerprint)"
            ))
        }
    }
}

/// Calls `decode` with the chunk's stored bytes: its bytes as they are, or opened into
/// this thread's buffer if the chunk is sealed.
fn with_opened<T>(
    chunk: StoredChunk<'_>,
    decode: impl FnOnce(&[u8]) -> std::result::Result<T, String>,
) -> std::result::Result<T, String> {
    let Some(seal) = chunk.seal else {
        return decode(chunk.bytes);
    };
    let opener = seal.opener.ok_or(WRITE_ONLY)?;
    OPENED.with_borrow_mut(|buf| {
        buf.clear();
        buf.extend_from_slice(chunk.bytes);
        opener
            .open_chunk(seal.index, chunk.fingerprint.as_bytes(), buf)
            .map_err(|e| e.to_string())?;
        decode(buf)
    })
}

/// Copies member `chunk` at `place` into `out` (exactly its raw length) from its unit,
/// decoding the unit first unless this thread holds it decoded. Does not verify the
/// member.
fn take_member(
    chunk: StoredChunk<'_>,
    place: &UnitPlace,
    out: &mut [u8],
) -> std::result::Result<(), String> {
    let start = place.raw_offset as usize;
    let end = start + out.len();
    if end > place.unit_len as usize || place.unit_len > MAX_COMPRESSED_RAW_LEN {
        return Err("it lies outside its unit".into());
    }
    UNITS.with_borrow_mut(|units| {
        let raw = units.unit(&chunk, place)?;
        out.copy_from_slice(&raw[start..end]);
        Ok(())
    })
}

/// A sealed chunk without an opener: the key is write-only.
fn refuse_write_only(chunk: StoredChunk<'_>) -> std::result::Result<(), String> {
    match chunk.seal {
        Some(ChunkSeal { opener: None, .. }) => Err(WRITE_ONLY.into()),
        _ => Ok(()),
    }
}

/// Why a write-only key cannot decode a chunk.
pub(crate) const WRITE_ONLY: &str =
    "this key is write-only: it can back up into the repository but not read chunks back";

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
                seal: None,
            },
            None => StoredChunk {
                fingerprint: fp,
                encoding: ChunkEncoding::Raw,
                bytes: raw,
                seal: None,
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
