//! Containers: sealed files of chunk data plus a table (docs/design/format.md,
//! "Container").

use larder_hash::{Fingerprint, HashAlgo};

use crate::error::{Result, StoreError};

const MAGIC: &[u8; 8] = b"LARDERC1";
const END_MAGIC: &[u8; 8] = b"LARDERCE";
const VERSION: u32 = 1;
/// Bytes before the first chunk of a container.
pub const HEADER_LEN: usize = 32;
pub(crate) const ENTRY_LEN: usize = 48;
const FOOTER_LEN: usize = 16 + 32 + 8;

/// Bytes a container adds around its chunk data, besides 48 per chunk.
pub const CONTAINER_OVERHEAD: usize = HEADER_LEN + FOOTER_LEN;

/// One row of a container's table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkEntry {
    pub fingerprint: Fingerprint,
    /// From the start of the container file.
    pub offset: u32,
    pub stored_len: u32,
    pub raw_len: u32,
    pub flags: u8,
}

impl ChunkEntry {
    pub(crate) fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self.fingerprint.as_bytes());
        out.extend_from_slice(&self.offset.to_le_bytes());
        out.extend_from_slice(&self.stored_len.to_le_bytes());
        out.extend_from_slice(&self.raw_len.to_le_bytes());
        out.push(self.flags);
        out.extend_from_slice(&[0; 3]);
    }

    /// `bytes` is exactly [`ENTRY_LEN`] long.
    pub(crate) fn decode(bytes: &[u8]) -> Self {
        let mut fp = [0u8; 32];
        fp.copy_from_slice(&bytes[..32]);
        Self {
            fingerprint: Fingerprint(fp),
            offset: le_u32(&bytes[32..36]),
            stored_len: le_u32(&bytes[36..40]),
            raw_len: le_u32(&bytes[40..44]),
            flags: bytes[44],
        }
    }
}

pub(crate) fn le_u32(b: &[u8]) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[..4]);
    u32::from_le_bytes(a)
}

pub(crate) fn le_u64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_le_bytes(a)
}

fn header(id: u64, algo: HashAlgo) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    h[..8].copy_from_slice(MAGIC);
    h[8..12].copy_from_slice(&VERSION.to_le_bytes());
    h[12] = algo.code();
    h[16..24].copy_from_slice(&id.to_le_bytes());
    h
}

/// Fills a container in memory; [`ContainerBuilder::seal`] gives the file's bytes.
pub struct ContainerBuilder {
    id: u64,
    buf: Vec<u8>,
    entries: Vec<ChunkEntry>,
}

impl ContainerBuilder {
    pub fn new(id: u64, algo: HashAlgo, capacity: usize) -> Self {
        Self::with_buffer(id, algo, Vec::with_capacity(capacity + HEADER_LEN))
    }

    /// Like [`ContainerBuilder::new`], reusing the allocation of `buf` (its contents are
    /// discarded), e.g. a sealed container's bytes after they were written.
    pub fn with_buffer(id: u64, algo: HashAlgo, mut buf: Vec<u8>) -> Self {
        buf.clear();
        buf.extend_from_slice(&header(id, algo));
        Self {
            id,
            buf,
            entries: Vec::new(),
        }
    }

    pub fn id(&self) -> u64 {
        self.id
    }

    /// Bytes of chunk data and header so far: the offset the next chunk gets.
    pub fn data_end(&self) -> usize {
        self.buf.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn entries(&self) -> &[ChunkEntry] {
        &self.entries
    }

    /// Appends a chunk and returns its table entry.
    pub fn push(&mut self, fingerprint: Fingerprint, data: &[u8]) -> ChunkEntry {
        let entry = ChunkEntry {
            fingerprint,
            offset: self.buf.len() as u32,
            stored_len: data.len() as u32,
            raw_len: data.len() as u32,
            flags: 0,
        };
        self.buf.extend_from_slice(data);
        self.entries.push(entry);
        entry
    }

    /// The complete container file and its table.
    pub fn seal(mut self) -> (Vec<u8>, Vec<ChunkEntry>) {
        let table_offset = self.buf.len() as u64;
        let mut hasher = blake3::Hasher::new();
        hasher.update(&self.buf[..HEADER_LEN]);
        for e in &self.entries {
            e.encode(&mut self.buf);
        }
        let mut footer = [0u8; 16];
        footer[..8].copy_from_slice(&table_offset.to_le_bytes());
        footer[8..12].copy_from_slice(&(self.entries.len() as u32).to_le_bytes());
        self.buf.extend_from_slice(&footer);
        hasher.update(&self.buf[table_offset as usize..]);
        self.buf.extend_from_slice(hasher.finalize().as_bytes());
        self.buf.extend_from_slice(END_MAGIC);
        (self.buf, self.entries)
    }
}

/// A container read back and verified (everything but the chunk data, which the
/// fingerprints cover: see [`ParsedContainer::verify_chunks`]).
#[derive(Debug)]
pub struct ParsedContainer {
    pub id: u64,
    pub entries: Vec<ChunkEntry>,
    bytes: Vec<u8>,
}

impl ParsedContainer {
    /// Parses and verifies `bytes` as container `id` of a repository using `algo`.
    pub fn parse(bytes: Vec<u8>, id: u64, algo: HashAlgo) -> Result<Self> {
        let name = format!("containers/{id:016x}.ctr");
        let bad = |reason: String| StoreError::corrupt("container", name.clone(), reason);
        if bytes.len() < HEADER_LEN + FOOTER_LEN {
            return Err(bad(format!("only {} bytes long", bytes.len())));
        }
        if &bytes[..8] != MAGIC {
            return Err(bad("bad magic: not a larder container".into()));
        }
        if &bytes[bytes.len() - 8..] != END_MAGIC {
            return Err(bad("bad end magic: the file is truncated or damaged".into()));
        }
        let footer_start = bytes.len() - FOOTER_LEN;
        let footer = &bytes[footer_start..];
        let table_offset = le_u64(&footer[..8]);
        let count = le_u32(&footer[8..12]) as usize;
        let table_len = count
            .checked_mul(ENTRY_LEN)
            .ok_or_else(|| bad("entry count overflows".into()))?;
        if table_offset < HEADER_LEN as u64
            || table_offset.checked_add(table_len as u64) != Some(footer_start as u64)
        {
            return Err(bad(format!(
                "table at {table_offset} with {count} entries does not fit the file"
            )));
        }
        let table_offset = table_offset as usize;
        let mut hasher = blake3::Hasher::new();
        hasher.update(&bytes[..HEADER_LEN]);
        hasher.update(&bytes[table_offset..footer_start + 16]);
        if hasher.finalize().as_bytes() != &footer[16..48] {
            return Err(bad("checksum mismatch in header, table or footer".into()));
        }
        let version = le_u32(&bytes[8..12]);
        if version != VERSION {
            return Err(StoreError::UnsupportedVersion(u64::from(version)));
        }
        if bytes[12] != algo.code() {
            return Err(bad(format!(
                "fingerprint algorithm code {} but the repository uses {}",
                bytes[12],
                algo.name()
            )));
        }
        if le_u64(&bytes[16..24]) != id {
            return Err(bad(format!(
                "header names container {:016x}",
                le_u64(&bytes[16..24])
            )));
        }
        let mut entries = Vec::with_capacity(count);
        let mut expected_offset = HEADER_LEN;
        for raw in bytes[table_offset..footer_start].chunks_exact(ENTRY_LEN) {
            let e = ChunkEntry::decode(raw);
            if e.offset as usize != expected_offset || e.flags != 0 || e.raw_len != e.stored_len {
                return Err(bad(format!(
                    "table entry {} does not tile the data region",
                    entries.len()
                )));
            }
            expected_offset += e.stored_len as usize;
            entries.push(e);
        }
        if expected_offset != table_offset {
            return Err(bad("chunk data does not end where the table starts".into()));
        }
        Ok(Self { id, entries, bytes })
    }

    /// The stored bytes of `entry`, which must come from this container's table.
    pub fn chunk(&self, offset: u32, len: u32) -> Option<&[u8]> {
        self.bytes
            .get(offset as usize..offset as usize + len as usize)
    }

    /// Re-hashes every chunk; returns the entries whose data no longer matches.
    pub fn verify_chunks(&self, algo: HashAlgo) -> Vec<ChunkEntry> {
        self.entries
            .iter()
            .filter(|e| {
                let data = &self.bytes[e.offset as usize..(e.offset + e.stored_len) as usize];
                algo.fingerprint(data) != e.fingerprint
            })
            .copied()
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> (Vec<u8>, Vec<ChunkEntry>) {
        let algo = HashAlgo::Blake3;
        let mut b = ContainerBuilder::new(7, algo, 1 << 16);
        for i in 0..5u8 {
            let data = vec![i; 100 + usize::from(i)];
            b.push(algo.fingerprint(&data), &data);
        }
        b.seal()
    }

    #[test]
    fn round_trips() {
        let (bytes, entries) = sample();
        let c = ParsedContainer::parse(bytes, 7, HashAlgo::Blake3).unwrap();
        assert_eq!(c.entries, entries);
        assert_eq!(
            c.chunk(entries[2].offset, entries[2].stored_len).unwrap(),
            &[2u8; 102][..]
        );
        assert!(c.verify_chunks(HashAlgo::Blake3).is_empty());
    }

    #[test]
    fn every_flipped_byte_is_detected() {
        let (bytes, _) = sample();
        for i in 0..bytes.len() {
            let mut damaged = bytes.clone();
            damaged[i] ^= 0x40;
            match ParsedContainer::parse(damaged, 7, HashAlgo::Blake3) {
                Err(_) => {}
                Ok(c) => assert_eq!(
                    c.verify_chunks(HashAlgo::Blake3).len(),
                    1,
                    "flip at byte {i} went unnoticed"
                ),
            }
        }
    }

    proptest::proptest! {
        /// The in-CI twin of the `container` fuzz target: any bytes, no panic.
        #[test]
        fn arbitrary_bytes_never_panic(mut bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..400), tail in proptest::prelude::any::<bool>()) {
            if tail {
                bytes.extend_from_slice(END_MAGIC);
            }
            if let Ok(c) = ParsedContainer::parse(bytes, 7, HashAlgo::Blake3) {
                for e in &c.entries {
                    proptest::prop_assert!(c.chunk(e.offset, e.stored_len).is_some());
                }
            }
        }
    }

    #[test]
    fn wrong_id_or_algorithm_is_refused() {
        let (bytes, _) = sample();
        assert!(ParsedContainer::parse(bytes.clone(), 8, HashAlgo::Blake3).is_err());
        assert!(ParsedContainer::parse(bytes, 7, HashAlgo::Sha256).is_err());
    }
}
