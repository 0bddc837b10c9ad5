//! Reading chunks and tree streams back from a repository.

use std::collections::{HashMap, VecDeque};
use std::ops::Range;
use std::sync::Arc;

use larder_hash::Fingerprint;
use larder_index::ChunkLocation;
use larder_store::{
    position, stored_form, ChunkSeal, ContainerTable, ParsedContainer, Repository, StoreError,
    StoredChunk, TreeDecoder, TreeEntry,
};

use crate::error::Result;

/// Containers kept in memory while reading; 16 × 4 MiB.
const CACHE_CONTAINERS: usize = 16;
/// Runs of a stream's chunks closer than this in one container are read as one.
const MAX_RUN_GAP: u64 = 64 << 10;

/// Reads chunks by fingerprint, decoding and verifying each one, through a small
/// container cache.
pub struct ChunkReader<'r> {
    repo: &'r Repository,
    cache: HashMap<u64, Arc<ParsedContainer>>,
    order: VecDeque<u64>,
    /// Parts of containers read for streams ([`ChunkReader::read_chunks`]), at most
    /// [`CACHE_CONTAINERS`] containers' worth, oldest dropped first.
    parts: HashMap<u64, ContainerParts>,
    parts_order: VecDeque<u64>,
    containers_read: u64,
    bytes_read: u64,
}

/// A container's table and the runs of its bytes read so far.
struct ContainerParts {
    table: ContainerTable,
    /// Sorted by start, not overlapping.
    runs: Vec<(u64, Vec<u8>)>,
}

impl ContainerParts {
    /// The stored bytes at `loc`, if a run holds them.
    fn bytes(&self, loc: &ChunkLocation) -> Option<&[u8]> {
        let (start, end) = (
            u64::from(loc.offset),
            u64::from(loc.offset) + u64::from(loc.length),
        );
        let i = self
            .runs
            .partition_point(|(s, _)| *s <= start)
            .checked_sub(1)?;
        let (run_start, bytes) = &self.runs[i];
        bytes.get((start - run_start) as usize..(end - run_start) as usize)
    }
}

impl<'r> ChunkReader<'r> {
    pub fn new(repo: &'r Repository) -> Self {
        Self {
            repo,
            cache: HashMap::new(),
            order: VecDeque::new(),
            parts: HashMap::new(),
            parts_order: VecDeque::new(),
            containers_read: 0,
            bytes_read: 0,
        }
    }

    /// Containers read so far (each whole, or a stream's parts of it) and the bytes
    /// read.
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
            .position(loc.offset, fp)
            .map(|i| &container.entries[i])
            .filter(|e| e.stored_len == loc.length)
            .ok_or_else(|| corrupt(&name, format!("chunk {fp} is not in its table")))?;
        container.read_chunk(entry, &self.repo.codec(), out)?;
        Ok(())
    }
}

impl ChunkReader<'_> {
    /// Appends the raw bytes of chunks `fps`, in order, to `out`, each verified. From a
    /// container this reader does not hold whole it reads the table and only the runs
    /// of bytes these chunks occupy: a tree stream's chunks lie together in a few
    /// containers shared with file data, which a remote repository would otherwise
    /// download whole.
    pub fn read_chunks(&mut self, fps: &[Fingerprint], out: &mut Vec<u8>) -> Result<()> {
        let index = self.repo.index();
        let mut locs = Vec::with_capacity(fps.len());
        for fp in fps {
            locs.push(index.get(fp)?.ok_or(StoreError::MissingChunk(*fp))?);
        }
        for (i, (fp, loc)) in fps.iter().zip(&locs).enumerate() {
            if self.cache.contains_key(&loc.container) {
                self.read_into(fp, out)?;
                continue;
            }
            // Parts read for an earlier stream may lack this one's chunks.
            let held = self.parts.get(&loc.container);
            if held.is_none_or(|p| p.bytes(loc).is_none()) {
                self.read_parts(loc.container, &locs[i..])?;
            }
            self.decode_part(fp, loc, out)?;
        }
        Ok(())
    }

    /// Reads container `id`'s table and the runs holding those of `locs` that are in
    /// it.
    fn read_parts(&mut self, id: u64, locs: &[ChunkLocation]) -> Result<()> {
        let table = self.repo.load_container_table(id)?;
        let mut wanted: Vec<Range<u64>> = locs
            .iter()
            .filter(|l| l.container == id)
            .map(|l| u64::from(l.offset)..u64::from(l.offset) + u64::from(l.length))
            .collect();
        wanted.sort_unstable_by_key(|r| (r.start, r.end));
        let mut runs: Vec<Range<u64>> = Vec::new();
        for r in wanted {
            match runs.last_mut() {
                Some(last) if r.start <= last.end + MAX_RUN_GAP => last.end = last.end.max(r.end),
                _ => runs.push(r),
            }
        }
        let bytes = self.repo.read_container_ranges(id, &runs)?;
        self.containers_read += 1;
        self.bytes_read += table.read + bytes.iter().map(|b| b.len() as u64).sum::<u64>();
        let runs = runs.iter().map(|r| r.start).zip(bytes).collect();
        // Read again, a container replaces its earlier parts.
        self.parts_order.retain(|&held| held != id);
        if self.parts_order.len() >= CACHE_CONTAINERS {
            if let Some(old) = self.parts_order.pop_front() {
                self.parts.remove(&old);
            }
        }
        self.parts_order.push_back(id);
        self.parts.insert(id, ContainerParts { table, runs });
        Ok(())
    }

    /// Decodes chunk `fp` at `loc` from the parts read of its container.
    fn decode_part(&self, fp: &Fingerprint, loc: &ChunkLocation, out: &mut Vec<u8>) -> Result<()> {
        let name = format!("{:016x}", loc.container);
        let parts = &self.parts[&loc.container];
        let entries = &parts.table.entries;
        let index = position(entries, loc.offset, fp)
            .filter(|&i| entries[i].stored_len == loc.length)
            .ok_or_else(|| corrupt(&name, format!("chunk {fp} is not in its table")))?;
        let entry = &entries[index];
        let bytes = parts
            .bytes(loc)
            .ok_or_else(|| corrupt(&name, format!("chunk {fp} was not read")))?;
        let (encoding, seal_index) = stored_form(entries, index)
            .ok_or_else(|| corrupt(&name, format!("chunk {fp} has an unknown encoding")))?;
        let codec = self.repo.codec();
        let seal = codec.keys().map(|_| ChunkSeal {
            opener: parts.table.opener.as_ref(),
            index: seal_index,
        });
        let chunk = StoredChunk {
            fingerprint: *fp,
            encoding,
            bytes,
            seal,
        };
        codec
            .decode_into(chunk, entry.raw_len, out)
            .map_err(|reason| corrupt(&name, reason))?;
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
    reader.read_chunks(fps, &mut stream)?;
    Ok(stream)
}
