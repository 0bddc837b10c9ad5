//! Encrypted containers (docs/design/crypto.md, "Containers, encrypted"): the
//! `LARDERC2` layout. Each chunk is sealed on its own under the container's data key;
//! the table and footer are sealed under a metadata subkey; the file is padded to its
//! size class with a keystream of the data key, which a full key can check.

use larder_crypto::{ChunkOpener, ContainerFooter, ContainerSealer, RepoKeys, TableOpener};

use super::units::{check_tiling, UNITS_VERSION};
use super::{container_name, le_u32, le_u64, ChunkEntry, ENTRY_LEN};
use crate::error::{Result, StoreError};

pub(crate) const MAGIC: &[u8; 8] = b"LARDERC2";
const END_MAGIC: &[u8; 8] = b"LARDERCF";
/// The version of an encrypted container without compression units; version 3 with
/// them.
const VERSION: u32 = 2;
/// Bytes 0..32: magic, version, fingerprint code, AEAD code, id.
const HEADER32: usize = 32;
/// Bytes before the first chunk: the 32-byte header, `E` and the sealed data key (80),
/// the table salt (32).
pub const HEADER_LEN: usize = 144;
/// The sealed footer (32), 8 zero bytes, the end magic.
pub const TAIL_LEN: usize = 48;
/// What sealing adds to each chunk, and to the table: the AEAD tag.
pub const TAG_LEN: usize = 16;
/// The smallest size class a container is padded to.
const MIN_CLASS: usize = 64 << 10;

/// The encrypted half of a [`super::ContainerBuilder`].
pub(super) struct Sealing {
    sealer: ContainerSealer,
    /// Full containers are padded to exactly this size (the repository's container
    /// size); others to a power of two.
    target: usize,
}

impl Sealing {
    /// Starts container `id`, of the version that may hold `units`: writes its 144
    /// header bytes into `buf`.
    pub(super) fn start(
        keys: &RepoKeys,
        id: u64,
        id_code: u8,
        units: bool,
        target: usize,
        buf: &mut Vec<u8>,
    ) -> Self {
        let version = if units { UNITS_VERSION } else { VERSION };
        let header = header32(id, id_code, keys.aead().code(), version);
        let sealer = keys.container_sealer(id, &header);
        buf.extend_from_slice(&header);
        buf.extend_from_slice(sealer.key_block());
        buf.extend_from_slice(sealer.table_salt());
        Self { sealer, target }
    }

    /// Seals the stored bytes `buf[offset..]` of the chunk or unit whose (first) entry
    /// is the `index`-th of the table, and appends its tag.
    pub(super) fn seal_chunk(&self, index: u32, fp: &[u8; 32], buf: &mut Vec<u8>, offset: usize) {
        let tag = self
            .sealer
            .seal_chunk_detached(index, fp, &mut buf[offset..]);
        buf.extend_from_slice(&tag);
    }

    /// The file size, before padding, of a container with `data_end` bytes of header
    /// and chunks and `entries` table entries.
    pub(super) fn unpadded_len(data_end: usize, entries: usize) -> usize {
        data_end + entries * ENTRY_LEN + TAG_LEN + TAIL_LEN
    }

    /// Pads, then appends the sealed table and the tail: the complete file.
    pub(super) fn finish(self, buf: &mut Vec<u8>, entries: &[ChunkEntry]) {
        let len = Self::unpadded_len(buf.len(), entries.len());
        let padding = padded_len(len, self.target) - len;
        let start = buf.len();
        buf.resize(start + padding, 0);
        self.sealer.fill_padding(&mut buf[start..]);
        let table_offset = buf.len() as u64;
        let mut table = Vec::with_capacity(entries.len() * ENTRY_LEN + TAG_LEN);
        for e in entries {
            e.encode(&mut table);
        }
        self.sealer.seal_table(&mut table);
        buf.extend_from_slice(&table);
        let footer = ContainerFooter {
            table_offset,
            entry_count: entries.len() as u32,
        };
        buf.extend_from_slice(&self.sealer.seal_footer(footer));
        buf.extend_from_slice(&[0; 8]);
        buf.extend_from_slice(END_MAGIC);
    }
}

/// The size a container of `len` bytes is padded to: the repository's container size
/// `target` if it is at most that and more than half of it, else the next power of
/// two (at least 64 KiB, at most `target` while `len` fits in it).
pub fn padded_len(len: usize, target: usize) -> usize {
    let class = len.max(MIN_CLASS).next_power_of_two();
    if len <= target {
        class.min(target)
    } else {
        class
    }
}

fn header32(id: u64, id_code: u8, aead_code: u8, version: u32) -> [u8; HEADER32] {
    let mut h = [0u8; HEADER32];
    h[..8].copy_from_slice(MAGIC);
    h[8..12].copy_from_slice(&version.to_le_bytes());
    h[12] = id_code;
    h[13] = aead_code;
    h[16..24].copy_from_slice(&id.to_le_bytes());
    h
}

/// An encrypted container's table, verified, with what opens its chunks (`None` for a
/// write-only key).
pub struct SealedTable {
    pub entries: Vec<ChunkEntry>,
    pub opener: Option<ChunkOpener>,
}

/// Where an encrypted container's table lies: from the header and the last
/// [`TAIL_LEN`] bytes.
pub(crate) struct SealedLocation {
    pub table_offset: u64,
    pub entries: usize,
    table: TableOpener,
    header32: [u8; HEADER32],
    key_block: [u8; 80],
}

impl SealedLocation {
    /// Checks the header (the first [`HEADER_LEN`] bytes) and opens the footer in the
    /// tail (the last [`TAIL_LEN`] bytes) of container `id`, `file_len` bytes long.
    pub(crate) fn parse(
        keys: &RepoKeys,
        id_code: u8,
        header: &[u8],
        tail: &[u8],
        file_len: u64,
        id: u64,
    ) -> Result<Self> {
        let bad = |reason: String| StoreError::corrupt("container", container_name(id), reason);
        if header.len() != HEADER_LEN || tail.len() != TAIL_LEN {
            return Err(bad(format!("only {file_len} bytes long")));
        }
        check_header(keys, id_code, header, id)?;
        if &tail[TAIL_LEN - 8..] != END_MAGIC || tail[32..40] != [0; 8] {
            return Err(bad("bad end magic: the file is truncated or damaged".into()));
        }
        let mut header32 = [0u8; HEADER32];
        header32.copy_from_slice(&header[..HEADER32]);
        let mut salt = [0u8; 32];
        salt.copy_from_slice(&header[112..144]);
        let table = keys.table_opener(id, &header32, &salt);
        let mut sealed_footer = [0u8; 32];
        sealed_footer.copy_from_slice(&tail[..32]);
        let footer = table
            .open_footer(&sealed_footer)
            .map_err(|e| bad(e.to_string()))?;
        let count = footer.entry_count as usize;
        let fits = (count as u64)
            .checked_mul(ENTRY_LEN as u64)
            .and_then(|len| {
                footer
                    .table_offset
                    .checked_add(len + (TAG_LEN + TAIL_LEN) as u64)
            })
            == Some(file_len);
        if footer.table_offset < HEADER_LEN as u64 || !fits {
            return Err(bad(format!(
                "table at {} with {count} entries does not fit the file",
                footer.table_offset
            )));
        }
        let mut key_block = [0u8; 80];
        key_block.copy_from_slice(&header[32..112]);
        Ok(Self {
            table_offset: footer.table_offset,
            entries: count,
            table,
            header32,
            key_block,
        })
    }

    /// Bytes of the sealed table.
    pub(crate) fn table_len(&self) -> usize {
        self.entries * ENTRY_LEN + TAG_LEN
    }

    /// Opens and checks the sealed table (`sealed`, [`Self::table_len`] bytes from
    /// `table_offset`): the entries must tile the chunk region from the header on, in
    /// order, and end before the table.
    pub(crate) fn open_table(
        self,
        keys: &RepoKeys,
        mut sealed: Vec<u8>,
        id: u64,
    ) -> Result<SealedTable> {
        let bad = |reason: String| StoreError::corrupt("container", container_name(id), reason);
        if sealed.len() != self.table_len() {
            return Err(bad("table has the wrong length".into()));
        }
        self.table
            .open_table(&mut sealed)
            .map_err(|e| bad(e.to_string()))?;
        let entries: Vec<ChunkEntry> = sealed[..self.entries * ENTRY_LEN]
            .chunks_exact(ENTRY_LEN)
            .map(ChunkEntry::decode)
            .collect();
        let units = le_u32(&self.header32[8..12]) == UNITS_VERSION;
        let end = check_tiling(&entries, HEADER_LEN as u64, TAG_LEN as u32, units).map_err(bad)?;
        if end > self.table_offset {
            return Err(bad("chunks run into the table".into()));
        }
        let opener = if keys.is_full() {
            let opener = keys
                .chunk_opener(id, &self.header32, &self.key_block)
                .map_err(|e| bad(e.to_string()))?;
            Some(opener)
        } else {
            None
        };
        Ok(SealedTable { entries, opener })
    }
}

/// What opens container `id`'s chunks, from its header alone (the first
/// [`HEADER_LEN`] bytes of `file`): `None` if the header does not check or its sealed
/// data key does not open, or for a write-only key. For salvaging the chunks of a
/// container whose table or tail is damaged.
pub(super) fn header_opener(
    keys: &RepoKeys,
    id_code: u8,
    file: &[u8],
    id: u64,
) -> Option<ChunkOpener> {
    let header = file.get(..HEADER_LEN)?;
    check_header(keys, id_code, header, id).ok()?;
    let header32: [u8; HEADER32] = header[..HEADER32].try_into().ok()?;
    let key_block: [u8; 80] = header[32..112].try_into().ok()?;
    keys.is_full()
        .then(|| keys.chunk_opener(id, &header32, &key_block).ok())
        .flatten()
}

fn check_header(keys: &RepoKeys, id_code: u8, header: &[u8], id: u64) -> Result<()> {
    let bad = |reason: String| StoreError::corrupt("container", container_name(id), reason);
    if &header[..8] != MAGIC {
        return Err(bad("bad magic: not an encrypted larder container".into()));
    }
    let version = le_u32(&header[8..12]);
    if version != VERSION && version != UNITS_VERSION {
        return Err(StoreError::UnsupportedVersion {
            what: "encrypted container",
            version: u64::from(version),
            supported: "versions 2 and 3",
        });
    }
    if header[12] != id_code {
        return Err(bad(format!(
            "fingerprint code {} but the repository uses {id_code}",
            header[12]
        )));
    }
    if header[13] != keys.aead().code() || header[14..16] != [0, 0] || header[24..32] != [0; 8] {
        return Err(bad(format!(
            "header names cipher code {} but the repository uses {}",
            header[13],
            keys.aead()
        )));
    }
    if le_u64(&header[16..24]) != id {
        return Err(bad(format!(
            "header names container {:016x}",
            le_u64(&header[16..24])
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::padded_len;

    #[test]
    fn containers_pad_to_their_size_class() {
        let s = 4 << 20;
        // Full containers: exactly the container size.
        for len in [(2 << 20) + 1, 3 << 20, s - 1, s] {
            assert_eq!(padded_len(len, s), s, "{len}");
        }
        // Others: the next power of two, at least 64 KiB.
        assert_eq!(padded_len(1, s), 64 << 10);
        assert_eq!(padded_len(64 << 10, s), 64 << 10);
        assert_eq!(padded_len((64 << 10) + 1, s), 128 << 10);
        assert_eq!(padded_len(2 << 20, s), 2 << 20);
        // One chunk larger than the container size.
        assert_eq!(padded_len(s + 1, s), 8 << 20);
        // A container size that is not a power of two, and one below 64 KiB.
        assert_eq!(padded_len(2_500_000, 3_000_000), 3_000_000);
        assert_eq!(padded_len(1_400_000, 3_000_000), 2 << 20);
        assert_eq!(padded_len(100, 8192), 8192);
        for len in 1..200_000 {
            let class = padded_len(len, 100_000);
            assert!(class >= len);
        }
    }
}
