//! Containers: sealed files of chunk data plus a table (docs/design/format.md,
//! "Container"; encrypted ones in `sealed`, docs/design/crypto.md).

mod sealed;
mod units;

use larder_crypto::ChunkOpener;
use larder_hash::{Fingerprint, HashAlgo};
use larder_index::ChunkLocation;

pub use sealed::{padded_len, SealedTable};
pub use units::{position, stored_bytes, stored_form, stored_shares, unit_span};

use crate::backend::{Backend, FileKind};
use crate::chunk_codec::{ChunkCodec, ChunkSeal, StoredChunk};
use crate::compression::{ChunkEncoding, FLAGS_MEMBER};
use crate::error::{Result, StoreError};

const MAGIC: &[u8; 8] = b"LARDERC1";
const END_MAGIC: &[u8; 8] = b"LARDERCE";
/// The version of a container without compression units; [`units::UNITS_VERSION`]
/// with them.
const VERSION: u32 = 1;
/// Bytes before the first chunk of a container.
pub const HEADER_LEN: usize = 32;
pub(crate) const ENTRY_LEN: usize = 48;
const FOOTER_LEN: usize = 16 + 32 + 8;

/// Bytes a container adds around its chunk data, besides 48 per chunk.
pub const CONTAINER_OVERHEAD: usize = HEADER_LEN + FOOTER_LEN;

/// Reads and verifies container `id`'s header, table and footer from `backend`, not
/// its chunk data (three small reads: footer, table, header). Returns the table and
/// the bytes read. Needs no repository lock: a container in its final place never
/// changes (a cluster node reads other nodes' containers this way).
pub fn read_container_table(
    backend: &dyn Backend,
    id: u64,
    algo: HashAlgo,
) -> Result<(Vec<ChunkEntry>, u64)> {
    let name = format!("{id:016x}");
    let kind = FileKind::Container;
    let short = || StoreError::corrupt("container", container_name(id), "short read");
    let file_len = backend.file_len(kind, &name)?;
    let tail_at = file_len.saturating_sub(CONTAINER_TAIL_LEN as u64);
    let footer = backend
        .read_ranges(kind, &name, std::slice::from_ref(&(tail_at..file_len)))?
        .pop()
        .ok_or_else(short)?;
    let loc = TableLocation::parse(&footer, file_len, id)?;
    let table_end = loc.table_offset + loc.tail_len() as u64;
    let mut pieces = backend.read_ranges(
        kind,
        &name,
        &[loc.table_offset..table_end, 0..HEADER_LEN as u64],
    )?;
    let (header, tail) = match (pieces.pop(), pieces.pop()) {
        (Some(header), Some(tail)) => (header, tail),
        _ => return Err(short()),
    };
    let entries = parse_container_table(&header, &tail, loc, id, algo)?;
    let read = footer.len() + tail.len() + header.len();
    Ok((entries, read as u64))
}

/// A container's table, verified, as a reader needs it to read chunks.
pub struct ContainerTable {
    pub entries: Vec<ChunkEntry>,
    /// What opens the chunks of an encrypted container (`None` for a plaintext one,
    /// and for a write-only key).
    pub opener: Option<ChunkOpener>,
    /// Bytes read to get it.
    pub read: u64,
}

/// Reads and verifies container `id`'s table from `backend` as [`read_container_table`]
/// does, plaintext or encrypted as `codec` says (encrypted: the header and the tail in
/// one request, then the table).
pub fn read_table(backend: &dyn Backend, id: u64, codec: &ChunkCodec) -> Result<ContainerTable> {
    let Some(keys) = codec.keys() else {
        let (entries, read) = read_container_table(backend, id, codec.algo())?;
        return Ok(ContainerTable {
            entries,
            opener: None,
            read,
        });
    };
    let name = format!("{id:016x}");
    let kind = FileKind::Container;
    let short = || StoreError::corrupt("container", container_name(id), "short read");
    let file_len = backend.file_len(kind, &name)?;
    if file_len < (sealed::HEADER_LEN + sealed::TAIL_LEN) as u64 {
        return Err(StoreError::corrupt(
            "container",
            container_name(id),
            format!("only {file_len} bytes long"),
        ));
    }
    let ends = [
        0..sealed::HEADER_LEN as u64,
        file_len - sealed::TAIL_LEN as u64..file_len,
    ];
    let mut pieces = backend.read_ranges(kind, &name, &ends)?;
    let (tail, header) = match (pieces.pop(), pieces.pop()) {
        (Some(tail), Some(header)) => (tail, header),
        _ => return Err(short()),
    };
    let loc = sealed::SealedLocation::parse(keys, codec.id_code(), &header, &tail, file_len, id)?;
    let table_range = loc.table_offset..loc.table_offset + loc.table_len() as u64;
    let table = backend
        .read_ranges(kind, &name, std::slice::from_ref(&table_range))?
        .pop()
        .ok_or_else(short)?;
    let read = (header.len() + tail.len() + table.len()) as u64;
    let SealedTable { entries, opener } = loc.open_table(keys, table, id)?;
    Ok(ContainerTable {
        entries,
        opener,
        read,
    })
}

/// One row of a container's table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkEntry {
    pub fingerprint: Fingerprint,
    /// From the start of the container file.
    pub offset: u32,
    pub stored_len: u32,
    pub raw_len: u32,
    /// How the chunk is stored ([`ChunkEncoding::flags`]; [`stored_form`] reads it).
    pub flags: u8,
    /// A unit member's offset in its unit's raw bytes (below 16 MiB); 0 otherwise.
    pub unit_offset: u32,
}

impl ChunkEntry {
    /// Where this entry's chunk is, as an index records it: container `container`, the
    /// stored bytes' range.
    pub fn location(&self, container: u64) -> ChunkLocation {
        ChunkLocation {
            container,
            offset: self.offset,
            length: self.stored_len,
        }
    }

    /// Whether it is a member of a compression unit.
    pub fn is_member(&self) -> bool {
        self.flags == FLAGS_MEMBER
    }

    pub(crate) fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self.fingerprint.as_bytes());
        out.extend_from_slice(&self.offset.to_le_bytes());
        out.extend_from_slice(&self.stored_len.to_le_bytes());
        out.extend_from_slice(&self.raw_len.to_le_bytes());
        out.push(self.flags);
        out.extend_from_slice(&self.unit_offset.to_le_bytes()[..3]);
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
            unit_offset: u32::from_le_bytes([bytes[45], bytes[46], bytes[47], 0]),
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

fn header(id: u64, id_code: u8, version: u32) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    h[..8].copy_from_slice(MAGIC);
    h[8..12].copy_from_slice(&version.to_le_bytes());
    h[12] = id_code;
    h[16..24].copy_from_slice(&id.to_le_bytes());
    h
}

/// Fills a container in memory; [`ContainerBuilder::seal`] gives the file's bytes.
pub struct ContainerBuilder {
    id: u64,
    buf: Vec<u8>,
    entries: Vec<ChunkEntry>,
    /// Set for an encrypted container: seals each chunk as it is pushed.
    sealing: Option<sealed::Sealing>,
}

impl ContainerBuilder {
    /// A plaintext container of a repository that uses `algo`.
    pub fn new(id: u64, algo: HashAlgo, capacity: usize) -> Self {
        Self::with_buffer(
            id,
            &ChunkCodec::new(Default::default(), algo),
            Vec::with_capacity(capacity + HEADER_LEN),
            0,
        )
    }

    /// A container of the repository whose codec is `codec`: encrypted if it is, and
    /// then padded to the size class of `container_size` (crypto.md) when sealed.
    pub fn for_codec(id: u64, codec: &ChunkCodec, capacity: usize, container_size: usize) -> Self {
        Self::with_buffer(
            id,
            codec,
            Vec::with_capacity(capacity + sealed::HEADER_LEN),
            container_size,
        )
    }

    /// Like [`ContainerBuilder::for_codec`], reusing the allocation of `buf` (its
    /// contents are discarded), e.g. a sealed container's bytes after they were written.
    pub fn with_buffer(
        id: u64,
        codec: &ChunkCodec,
        mut buf: Vec<u8>,
        container_size: usize,
    ) -> Self {
        buf.clear();
        let units = codec.compression().unit_chunks() > 1;
        let sealing = match codec.keys() {
            Some(keys) => Some(sealed::Sealing::start(
                keys,
                id,
                codec.id_code(),
                units,
                container_size,
                &mut buf,
            )),
            None => {
                let version = if units { units::UNITS_VERSION } else { VERSION };
                buf.extend_from_slice(&header(id, codec.id_code(), version));
                None
            }
        };
        Self {
            id,
            buf,
            entries: Vec::new(),
            sealing,
        }
    }

    /// Whether a stored unit of `stored_len` bytes and `entries` table entries (1 for a
    /// chunk alone, a unit's member count) may join this container without taking it
    /// past `container_size`: counting the data for a plaintext container, and the
    /// whole file (tags, table, footer) for an encrypted one, which would otherwise be
    /// padded to the next power of two.
    pub fn fits(&self, stored_len: usize, entries: usize, container_size: usize) -> bool {
        let after = match self.sealing {
            None => self.buf.len() + stored_len,
            Some(_) => sealed::Sealing::unpadded_len(
                self.buf.len() + stored_len + sealed::TAG_LEN,
                self.entries.len() + entries,
            ),
        };
        self.is_empty() || after <= container_size
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

    /// Appends a chunk stored raw and returns its table entry.
    pub fn push(&mut self, fingerprint: Fingerprint, data: &[u8]) -> ChunkEntry {
        self.push_stored(fingerprint, data, data.len() as u32, false)
    }

    /// Appends a chunk's stored bytes, which encode its `raw_len` raw bytes alone
    /// (`compressed`: as one zstd frame; else raw), and returns its table entry.
    pub fn push_stored(
        &mut self,
        fingerprint: Fingerprint,
        stored: &[u8],
        raw_len: u32,
        compressed: bool,
    ) -> ChunkEntry {
        let encoding = match compressed {
            true => ChunkEncoding::Zstd,
            false => ChunkEncoding::Raw,
        };
        let stored_len = self.append_sealed(stored, &fingerprint);
        let entry = ChunkEntry {
            fingerprint,
            offset: stored_len.start,
            stored_len: stored_len.end - stored_len.start,
            raw_len,
            flags: encoding.flags(),
            unit_offset: 0,
        };
        self.entries.push(entry);
        entry
    }

    /// Appends a compression unit: `frame`, the zstd frame of the raw bytes of
    /// `members` (fingerprint and raw length, 2 to 255 of them, in order) concatenated.
    /// Only a container of a repository with units may hold one.
    pub fn push_unit(&mut self, frame: &[u8], members: &[(Fingerprint, u32)]) {
        let range = self.append_sealed(frame, &members[0].0);
        let mut unit_offset = 0;
        for &(fingerprint, raw_len) in members {
            self.entries.push(ChunkEntry {
                fingerprint,
                offset: range.start,
                stored_len: range.end - range.start,
                raw_len,
                flags: FLAGS_MEMBER,
                unit_offset,
            });
            unit_offset += raw_len;
        }
    }

    /// Appends stored bytes, sealed in an encrypted container at the next table index
    /// with `fingerprint` (a unit's first member's); returns where they lie.
    fn append_sealed(&mut self, stored: &[u8], fingerprint: &Fingerprint) -> std::ops::Range<u32> {
        let offset = self.buf.len();
        self.buf.extend_from_slice(stored);
        if let Some(sealing) = &self.sealing {
            let index = self.entries.len() as u32;
            sealing.seal_chunk(index, fingerprint.as_bytes(), &mut self.buf, offset);
        }
        offset as u32..self.buf.len() as u32
    }

    /// The complete container file and its table.
    pub fn seal(mut self) -> (Vec<u8>, Vec<ChunkEntry>) {
        if let Some(sealing) = self.sealing.take() {
            sealing.finish(&mut self.buf, &self.entries);
            return (self.buf, self.entries);
        }
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

/// Where a container's table lies, from its footer: what a reader that reads the
/// table without the chunk data fetches next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TableLocation {
    /// From the start of the file: where the chunk data ends.
    pub table_offset: u64,
    pub entries: usize,
}

impl TableLocation {
    /// Parses the last [`CONTAINER_TAIL_LEN`] bytes of a container file `file_len`
    /// bytes long: the end magic, and a table that fits between the header and the
    /// footer.
    pub fn parse(tail: &[u8], file_len: u64, id: u64) -> Result<Self> {
        let bad = |reason: String| StoreError::corrupt("container", container_name(id), reason);
        if file_len < (HEADER_LEN + FOOTER_LEN) as u64 || tail.len() != FOOTER_LEN {
            return Err(bad(format!("only {file_len} bytes long")));
        }
        if &tail[FOOTER_LEN - 8..] != END_MAGIC {
            return Err(bad("bad end magic: the file is truncated or damaged".into()));
        }
        let table_offset = le_u64(&tail[..8]);
        let count = le_u32(&tail[8..12]) as usize;
        let footer_start = file_len - FOOTER_LEN as u64;
        let fits = (count as u64)
            .checked_mul(ENTRY_LEN as u64)
            .and_then(|len| table_offset.checked_add(len))
            == Some(footer_start);
        if table_offset < HEADER_LEN as u64 || !fits {
            return Err(bad(format!(
                "table at {table_offset} with {count} entries does not fit the file"
            )));
        }
        Ok(Self {
            table_offset,
            entries: count,
        })
    }

    /// Bytes from the table's start to the end of the file: table and footer.
    pub fn tail_len(&self) -> usize {
        self.entries * ENTRY_LEN + FOOTER_LEN
    }
}

/// The file size of an encrypted container holding `data` bytes of sealed stored units
/// and `entries` table entries, padded to its size class for `container_size`.
pub(crate) fn sealed_container_len(data: usize, entries: usize, container_size: usize) -> usize {
    padded_len(
        sealed::Sealing::unpadded_len(sealed::HEADER_LEN + data, entries),
        container_size,
    )
}

/// Bytes at the end of a container that locate its table: the footer.
pub const CONTAINER_TAIL_LEN: usize = FOOTER_LEN;

fn container_name(id: u64) -> String {
    format!("containers/{id:016x}.ctr")
}

/// Verifies a container's header (its first [`HEADER_LEN`] bytes) and its table and
/// footer (`tail`, the file from `loc.table_offset` to the end) and returns the
/// table's entries: everything a container holds but the chunk data, which the
/// fingerprints cover. Checks the checksum, version, algorithm, id, encodings, and
/// that the entries tile the data region.
pub fn parse_container_table(
    header: &[u8],
    tail: &[u8],
    loc: TableLocation,
    id: u64,
    algo: HashAlgo,
) -> Result<Vec<ChunkEntry>> {
    let bad = |reason: String| StoreError::corrupt("container", container_name(id), reason);
    if header.len() != HEADER_LEN || tail.len() != loc.tail_len() {
        return Err(bad("header or table has the wrong length".into()));
    }
    if &header[..8] != MAGIC {
        return Err(bad("bad magic: not a larder container".into()));
    }
    let (table, footer) = tail.split_at(loc.entries * ENTRY_LEN);
    let mut hasher = blake3::Hasher::new();
    hasher.update(header);
    hasher.update(table);
    hasher.update(&footer[..16]);
    // Fuzzing builds (`cfg(fuzzing)`) go on past a wrong checksum, to reach the checks
    // below (docs/design/fuzzing.md); every other build stops here.
    if hasher.finalize().as_bytes() != &footer[16..48] && !cfg!(fuzzing) {
        return Err(bad("checksum mismatch in header, table or footer".into()));
    }
    let version = le_u32(&header[8..12]);
    if version != VERSION && version != units::UNITS_VERSION {
        return Err(StoreError::UnsupportedVersion {
            what: "container",
            version: u64::from(version),
            supported: "versions 1 and 3",
        });
    }
    if header[12] != algo.code() {
        return Err(bad(format!(
            "fingerprint algorithm code {} but the repository uses {}",
            header[12],
            algo.name()
        )));
    }
    if le_u64(&header[16..24]) != id {
        return Err(bad(format!(
            "header names container {:016x}",
            le_u64(&header[16..24])
        )));
    }
    let entries: Vec<ChunkEntry> = table
        .chunks_exact(ENTRY_LEN)
        .map(ChunkEntry::decode)
        .collect();
    let units = version == units::UNITS_VERSION;
    let end = units::check_tiling(&entries, HEADER_LEN as u64, 0, units).map_err(bad)?;
    if end != loc.table_offset {
        return Err(bad("chunk data does not end where the table starts".into()));
    }
    Ok(entries)
}

/// A container read back and verified (everything but the chunk data, which the
/// fingerprints cover: see [`ParsedContainer::verify_chunks`]).
#[derive(Debug)]
pub struct ParsedContainer {
    pub id: u64,
    pub entries: Vec<ChunkEntry>,
    bytes: Vec<u8>,
    /// Set for an encrypted container: its chunks are sealed, and `opener` (absent for
    /// a write-only key) opens them.
    sealed: Option<Option<ChunkOpener>>,
    /// An encrypted container's padding: from its last chunk to its table.
    padding: std::ops::Range<usize>,
}

impl ParsedContainer {
    /// Parses and verifies `bytes` as container `id` of a repository using `algo`:
    /// the same checks as [`TableLocation::parse`] and [`parse_container_table`] on
    /// the pieces of the file.
    pub fn parse(bytes: Vec<u8>, id: u64, algo: HashAlgo) -> Result<Self> {
        let len = bytes.len();
        if len >= HEADER_LEN + FOOTER_LEN && &bytes[..8] != MAGIC {
            return Err(StoreError::corrupt(
                "container",
                container_name(id),
                "bad magic: not a larder container",
            ));
        }
        let tail = &bytes[len.saturating_sub(FOOTER_LEN)..];
        let loc = TableLocation::parse(tail, len as u64, id)?;
        let entries = parse_container_table(
            &bytes[..HEADER_LEN],
            &bytes[loc.table_offset as usize..],
            loc,
            id,
            algo,
        )?;
        Ok(Self {
            id,
            entries,
            bytes,
            sealed: None,
            padding: 0..0,
        })
    }

    /// Parses and verifies `bytes` as container `id` of the repository whose codec is
    /// `codec`: as [`ParsedContainer::parse`] for a plaintext repository, and for an
    /// encrypted one the header, the sealed footer and table, and the tiling.
    pub fn parse_with(bytes: Vec<u8>, id: u64, codec: &ChunkCodec) -> Result<Self> {
        let Some(keys) = codec.keys() else {
            return Self::parse(bytes, id, codec.algo());
        };
        let len = bytes.len();
        if len < sealed::HEADER_LEN + sealed::TAIL_LEN {
            return Err(StoreError::corrupt(
                "container",
                container_name(id),
                format!("only {len} bytes long"),
            ));
        }
        let loc = sealed::SealedLocation::parse(
            keys,
            codec.id_code(),
            &bytes[..sealed::HEADER_LEN],
            &bytes[len - sealed::TAIL_LEN..],
            len as u64,
            id,
        )?;
        let start = loc.table_offset as usize;
        let table = bytes[start..start + loc.table_len()].to_vec();
        let SealedTable { entries, opener } = loc.open_table(keys, table, id)?;
        let data_end = entries
            .last()
            .map_or(sealed::HEADER_LEN, |e| (e.offset + e.stored_len) as usize);
        Ok(Self {
            id,
            entries,
            bytes,
            sealed: Some(opener),
            padding: data_end..start,
        })
    }

    /// Container `id`'s file bytes read against `entries`, the table the index holds
    /// for it (a segment's copy, verified there), trusting nothing of the file but
    /// what each chunk's fingerprint verifies: for salvaging the chunks of a damaged
    /// container that still verify (docs/design/repair.md). `bytes` may be short,
    /// empty, or hold a damaged table. An encrypted container's chunks open only
    /// with the data key its header seals: with a damaged header none does.
    pub fn salvage(bytes: Vec<u8>, id: u64, entries: Vec<ChunkEntry>, codec: &ChunkCodec) -> Self {
        let sealed = codec
            .keys()
            .map(|keys| sealed::header_opener(keys, codec.id_code(), &bytes, id));
        Self {
            id,
            entries,
            bytes,
            sealed,
            padding: 0..0,
        }
    }

    /// Length of the container file.
    pub fn file_len(&self) -> usize {
        self.bytes.len()
    }

    /// The stored bytes at `offset`, `len` long, if they lie inside the file.
    pub fn chunk(&self, offset: u32, len: u32) -> Option<&[u8]> {
        self.bytes
            .get(offset as usize..offset as usize + len as usize)
    }

    /// The table index of chunk `fp` stored at `offset`: see [`position`].
    pub fn position(&self, offset: u32, fp: &Fingerprint) -> Option<usize> {
        position(&self.entries, offset, fp)
    }

    /// Appends the raw bytes of `entry`, one of this container's, to `out`, decoded
    /// and verified against its fingerprint by `codec`; on an error `out` is left as
    /// it was. Members of one unit read one after another decode it once.
    pub fn read_chunk(
        &self,
        entry: &ChunkEntry,
        codec: &ChunkCodec,
        out: &mut Vec<u8>,
    ) -> Result<()> {
        let damaged = |reason: String| self.damaged(reason);
        let fp = entry.fingerprint;
        let (encoding, seal_index) = self
            .position(entry.offset, &fp)
            .and_then(|i| stored_form(&self.entries, i))
            .ok_or_else(|| damaged(format!("chunk {fp} is not in the table")))?;
        let bytes = self
            .chunk(entry.offset, entry.stored_len)
            .ok_or_else(|| damaged(format!("chunk {fp} lies outside the file")))?;
        let seal = self.sealed.as_ref().map(|opener| ChunkSeal {
            opener: opener.as_ref(),
            index: seal_index,
        });
        let chunk = StoredChunk {
            fingerprint: fp,
            encoding,
            bytes,
            seal,
        };
        codec
            .decode_into(chunk, entry.raw_len, out)
            .map_err(damaged)
    }

    /// The stored bytes of table entry `i` as its table's encoding reads them (raw, or
    /// one zstd frame: a member's is its whole unit's), into `out`: opened first if
    /// the container is sealed. For copying chunks verified with
    /// [`ParsedContainer::read_chunk`] into another container.
    pub fn encoded_chunk(&self, i: usize, out: &mut Vec<u8>) -> Result<()> {
        let e = &self.entries[i];
        let fp = e.fingerprint;
        let bytes = self
            .chunk(e.offset, e.stored_len)
            .ok_or_else(|| self.damaged(format!("chunk {fp} lies outside the file")))?;
        out.clear();
        out.extend_from_slice(bytes);
        let Some(sealed) = &self.sealed else {
            return Ok(());
        };
        let opener = sealed
            .as_ref()
            .ok_or(StoreError::WriteOnly("read chunks"))?;
        let first = unit_span(&self.entries, i).start;
        let sealed_as = self.entries[first].fingerprint;
        opener
            .open_chunk(first as u32, sealed_as.as_bytes(), out)
            .map_err(|e| self.damaged(format!("chunk {fp} is damaged: {e}")))
    }

    fn damaged(&self, reason: String) -> StoreError {
        StoreError::corrupt("container", format!("{:016x}", self.id), reason)
    }

    /// Checks an encrypted container's padding (the one part no chunk, table or
    /// footer covers) against its data key's keystream; `Ok` for a plaintext one. A
    /// write-only key cannot check it.
    pub fn verify_padding(&self) -> std::result::Result<(), String> {
        match &self.sealed {
            Some(Some(opener)) if !opener.padding_is(&self.bytes[self.padding.clone()]) => {
                Err("its padding was changed".into())
            }
            Some(None) => Err(crate::chunk_codec::WRITE_ONLY.into()),
            _ => Ok(()),
        }
    }

    /// Decodes and verifies every chunk; returns the entries that no longer decode or
    /// whose raw bytes no longer match their fingerprints.
    pub fn verify_chunks(&self, codec: &ChunkCodec) -> Vec<ChunkEntry> {
        let mut raw = Vec::new();
        self.entries
            .iter()
            .filter(|e| {
                raw.clear();
                self.read_chunk(e, codec, &mut raw).is_err()
            })
            .copied()
            .collect()
    }
}

#[cfg(test)]
mod tests;
