//! Index segments: cached copies of container tables (docs/design/format.md, "Index
//! segment").

use larder_hash::Fingerprint;
use larder_index::ChunkLocation;

use crate::chunk_codec::IdCode;
use crate::compression::FLAGS_MEMBER;
use crate::container::{le_u32, le_u64, ChunkEntry, ENTRY_LEN};
use crate::error::{Result, StoreError};

const MAGIC: &[u8; 8] = b"LARDERI1";
const VERSION: u32 = 1;

/// One container's table inside a segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentContainer {
    pub id: u64,
    pub entries: Vec<ChunkEntry>,
}

impl SegmentContainer {
    /// Every chunk of the container with its location, in table order.
    pub fn locations(&self) -> impl Iterator<Item = (Fingerprint, ChunkLocation)> + '_ {
        self.entries
            .iter()
            .map(|e| (e.fingerprint, e.location(self.id)))
    }
}

/// The length of the segment [`encode_segment`] writes for `containers`.
pub fn segment_len(containers: &[SegmentContainer]) -> u64 {
    let entries: usize = containers.iter().map(|c| c.entries.len()).sum();
    (SEGMENT_HEADER_LEN + containers.len() * CONTAINER_HEADER_LEN + entries * ENTRY_LEN + 32) as u64
}

/// Bytes before a segment's first container: magic, version, algorithm, count.
const SEGMENT_HEADER_LEN: usize = 24;
/// Bytes before a container's entries in a segment: id, count, zero.
const CONTAINER_HEADER_LEN: usize = 16;

/// The plaintext of a segment naming `containers`, whose fingerprints are `ids`'s.
pub fn encode_segment(ids: impl IdCode, containers: &[SegmentContainer]) -> Vec<u8> {
    let mut out = Vec::with_capacity(segment_len(containers) as usize);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.push(ids.id_code());
    out.extend_from_slice(&[0; 3]);
    out.extend_from_slice(&(containers.len() as u64).to_le_bytes());
    for c in containers {
        out.extend_from_slice(&c.id.to_le_bytes());
        out.extend_from_slice(&(c.entries.len() as u32).to_le_bytes());
        out.extend_from_slice(&[0; 4]);
        for e in &c.entries {
            e.encode(&mut out);
        }
    }
    let sum = blake3::hash(&out);
    out.extend_from_slice(sum.as_bytes());
    out
}

/// Parses and verifies a segment. Never panics, whatever `bytes` holds.
pub fn decode_segment(bytes: &[u8], name: &str, ids: impl IdCode) -> Result<Vec<SegmentContainer>> {
    let bad = |reason: &str| StoreError::corrupt("index segment", name, reason);
    if bytes.len() < 24 + 32 {
        return Err(bad("too short"));
    }
    let (body, sum) = bytes.split_at(bytes.len() - 32);
    // Fuzzing builds (`cfg(fuzzing)`) go on past a wrong checksum, to reach the parser
    // below (docs/design/fuzzing.md); every other build stops here.
    if blake3::hash(body).as_bytes() != sum && !cfg!(fuzzing) {
        return Err(bad("checksum mismatch"));
    }
    if &body[..8] != MAGIC {
        return Err(bad("bad magic"));
    }
    let version = le_u32(&body[8..12]);
    if version != VERSION {
        return Err(StoreError::UnsupportedVersion {
            what: "index segment",
            version: u64::from(version),
            supported: "version 1",
        });
    }
    if body[12] != ids.id_code() {
        return Err(bad("fingerprint algorithm differs from the repository's"));
    }
    let count = le_u64(&body[16..24]);
    let mut pos = 24;
    let mut containers = Vec::new();
    for _ in 0..count {
        let head = body
            .get(pos..pos + 16)
            .ok_or_else(|| bad("truncated container record"))?;
        let id = le_u64(&head[..8]);
        let n = le_u32(&head[8..12]) as usize;
        pos += 16;
        let table = body
            .get(pos..pos + n * ENTRY_LEN)
            .ok_or_else(|| bad("truncated table"))?;
        pos += n * ENTRY_LEN;
        let entries: Vec<ChunkEntry> = table
            .chunks_exact(ENTRY_LEN)
            .map(ChunkEntry::decode)
            .collect();
        if let Some(e) = entries.iter().find(|e| e.flags > FLAGS_MEMBER) {
            return Err(StoreError::corrupt(
                "index segment",
                name,
                format!(
                    "container {id:016x} has an entry with unknown chunk encoding (flags {}); \
                     it was written by a newer larder",
                    e.flags
                ),
            ));
        }
        containers.push(SegmentContainer { id, entries });
    }
    if pos != body.len() {
        return Err(bad("trailing bytes after the last container"));
    }
    Ok(containers)
}

#[cfg(test)]
mod tests {
    use super::*;
    use larder_hash::{Fingerprint, HashAlgo};
    use proptest::prelude::*;

    fn containers() -> Vec<SegmentContainer> {
        (0..3u64)
            .map(|id| SegmentContainer {
                id,
                entries: (0..id as u32 + 1)
                    .map(|i| ChunkEntry {
                        fingerprint: Fingerprint([i as u8 + id as u8; 32]),
                        offset: 32 + i * 10,
                        stored_len: 10,
                        raw_len: 10,
                        flags: 0,
                        unit_offset: 0,
                    })
                    .collect(),
            })
            .collect()
    }

    #[test]
    fn lengths_are_those_of_the_files() {
        let all = containers();
        assert_eq!(
            segment_len(&all),
            encode_segment(HashAlgo::Blake3, &all).len() as u64
        );
        assert_eq!(
            segment_len(&[]),
            encode_segment(HashAlgo::Blake3, &[]).len() as u64
        );
    }

    #[test]
    fn round_trips_and_detects_flips() {
        let bytes = encode_segment(HashAlgo::Blake3, &containers());
        assert_eq!(
            decode_segment(&bytes, "s", HashAlgo::Blake3).unwrap(),
            containers()
        );
        for i in 0..bytes.len() {
            let mut d = bytes.clone();
            d[i] ^= 1;
            assert!(
                decode_segment(&d, "s", HashAlgo::Blake3).is_err(),
                "flip at {i}"
            );
        }
    }

    #[test]
    fn unknown_chunk_encodings_are_refused() {
        let mut cs = containers();
        cs[1].entries[0].flags = 3;
        let bytes = encode_segment(HashAlgo::Blake3, &cs);
        let err = decode_segment(&bytes, "s", HashAlgo::Blake3).unwrap_err();
        assert!(
            err.to_string().contains("unknown chunk encoding (flags 3)"),
            "{err}"
        );
        cs[1].entries[0].flags = 2;
        let bytes = encode_segment(HashAlgo::Blake3, &cs);
        assert!(decode_segment(&bytes, "s", HashAlgo::Blake3).is_ok());
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = decode_segment(&bytes, "s", HashAlgo::Blake3);
        }
    }
}
