//! Reading any byte range of one file of a snapshot without reading the rest of the
//! file or of the snapshot: what `larder mount` serves reads with
//! (docs/design/mount.md, "Reading files").
//!
//! A file's [`FileLayout`] maps its byte offsets to its chunks; their raw lengths come
//! from their containers' tables, read once each through a small table cache. A
//! [`ChunkCache`] holds decoded chunks, keyed by fingerprint (so files that share
//! chunks share them), up to a bound in bytes. A miss reads a run: the chunk and the
//! file's next chunks that lie in the same container, up to [`RUN_BYTES`] of stored
//! bytes, in one request of byte ranges, and decodes them on every core. Sequential
//! reads then cost one container request per run, not one per chunk, and read ahead:
//! each sequential read starts, in the background, the runs of the next
//! [`READ_AHEAD`] bytes not yet cached, so decoding overlaps the reader
//! (docs/performance.md, "larder mount").
//!
//! Invariants: every byte [`ChunkCache::read_at`] returns belongs to a chunk whose raw
//! bytes hashed to its fingerprint; a layout is built only if its chunks' raw lengths
//! sum to the size the snapshot records; a chunk is read by at most one run at a time
//! (whoever else needs it waits for that run); the cache holds at most its bound,
//! plus the runs being read.

mod lru;

use std::collections::{HashMap, HashSet};
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};

use larder_crypto::ChunkOpener;
use larder_hash::Fingerprint;
use larder_store::{
    error_chain, position, stored_form, ChunkEncoding, ChunkSeal, ContainerTable, Repository,
    StoreError, StoredChunk, TreeEntry,
};
use rayon::prelude::*;

use crate::error::{EngineError, Result};
use crate::names::display_path;
use lru::Lru;

/// Container tables kept for building layouts. A 4 MiB container of 8 KiB chunks has
/// a table of about 500 rows (60 bytes each in memory): 256 tables take about 8 MiB.
const TABLES: usize = 256;

/// Most stored bytes one miss reads: the missing chunk and the file's next chunks in
/// the same container. Half a default container: large enough that a sequential read
/// costs one request per few hundred chunks, small enough that a random read of one
/// chunk does not wait long.
const RUN_BYTES: u64 = 2 << 20;

/// How far a sequential read reads ahead, in raw bytes from the end of the read: two
/// runs of incompressible data, so that one is decoded while the reader takes the
/// other.
const READ_AHEAD: u64 = 2 * RUN_BYTES;

/// Largest gap between two chunks of a run that one range read spans, as a restore
/// does (`assembly.rs`): reading 64 KiB more costs about what another read costs.
const MAX_GAP: u64 = 64 << 10;

/// Each chunk of a run, decoded and verified, or why it was not.
type Decoded = Vec<Result<Arc<Vec<u8>>, String>>;

/// Where each byte of one file lies: its chunks in order, with their raw lengths and
/// where they are stored. Memory: about 70 bytes per chunk (1% of an 8 KiB chunk).
pub struct FileLayout {
    /// The file's path, as larder shows it, and its snapshot's short id: for errors.
    path: String,
    snapshot: String,
    /// End of each chunk's raw bytes in the file, ascending; the last is the size.
    ends: Vec<u64>,
    chunks: Vec<ChunkSpot>,
    containers: Vec<ContainerRef>,
    /// Where the last read ended: a read starting there is sequential.
    last_end: AtomicU64,
}

/// One chunk of a file and where it is stored.
#[derive(Debug, Clone, Copy)]
struct ChunkSpot {
    /// Index into [`FileLayout::containers`].
    container: u32,
    /// The table row its stored bytes are sealed at: its own, or its unit's first
    /// member's.
    index: u32,
    offset: u32,
    stored_len: u32,
    raw_len: u32,
    encoding: ChunkEncoding,
    fingerprint: Fingerprint,
}

/// A container a file's chunks lie in.
struct ContainerRef {
    id: u64,
    /// In an encrypted repository, what opens its chunks (`None` inside for a
    /// write-only key); `None` in a plaintext one.
    seal: Option<Option<ChunkOpener>>,
}

impl FileLayout {
    /// The file's size: the sum of its chunks' raw lengths.
    pub fn size(&self) -> u64 {
        self.ends.last().copied().unwrap_or(0)
    }

    /// The chunks that hold bytes `offset..offset + len`, clipped at the end of the
    /// file; empty past it or for `len` 0.
    fn span(&self, offset: u64, len: u64) -> Range<usize> {
        let end = offset.saturating_add(len).min(self.size());
        if offset >= end {
            return 0..0;
        }
        let first = self.ends.partition_point(|&e| e <= offset);
        let last = self.ends.partition_point(|&e| e < end);
        first..last + 1
    }

    /// Where chunk `i`'s raw bytes start in the file.
    fn start(&self, i: usize) -> u64 {
        i.checked_sub(1).map_or(0, |p| self.ends[p])
    }

    /// The chunks to read with chunk `i`: `i`, then each next chunk of the file in the
    /// same container that `cached` does not hold, while the stored bytes from the
    /// least offset to the greatest end stay within `RUN_BYTES` (always `i` itself).
    fn run_from(&self, i: usize, cached: impl Fn(&Fingerprint) -> bool) -> Vec<usize> {
        let first = &self.chunks[i];
        let (mut lo, mut hi) = (u64::from(first.offset), end_of(first));
        let mut run = vec![i];
        for (j, c) in self.chunks.iter().enumerate().skip(i + 1) {
            if c.container != first.container {
                break;
            }
            let (l, h) = (lo.min(u64::from(c.offset)), hi.max(end_of(c)));
            if h - l > RUN_BYTES {
                break;
            }
            if !cached(&c.fingerprint) {
                run.push(j);
                (lo, hi) = (l, h);
            }
        }
        run
    }

    fn damaged(&self, reason: String) -> EngineError {
        EngineError::DamagedEntry {
            path: self.path.clone(),
            snapshot: self.snapshot.clone(),
            reason,
        }
    }
}

/// Decoded chunks and container tables of one repository, shared by every file read
/// through it; safe to use from several threads. No lock is held while reading or
/// decoding.
pub struct ChunkCache {
    repo: Arc<Repository>,
    chunks: Mutex<Chunks>,
    /// Signalled when a run's chunks are cached (or have failed).
    run_done: Condvar,
    tables: Mutex<Lru<u64, ContainerTable>>,
}

struct Chunks {
    cached: Lru<Fingerprint, Vec<u8>>,
    /// Chunks a run is reading now; whoever needs one waits for that run.
    reading: HashSet<Fingerprint>,
}

impl Chunks {
    fn has(&self, fp: &Fingerprint) -> bool {
        self.cached.contains(fp) || self.reading.contains(fp)
    }
}

impl ChunkCache {
    /// A cache of `repo`'s chunks holding at most `bytes` of decoded chunks (plus the
    /// runs being read) and [`TABLES`] container tables.
    pub fn new(repo: Arc<Repository>, bytes: usize) -> Self {
        Self {
            repo,
            chunks: Mutex::new(Chunks {
                cached: Lru::new(bytes),
                reading: HashSet::new(),
            }),
            run_done: Condvar::new(),
            tables: Mutex::new(Lru::new(TABLES)),
        }
    }

    /// The layout of file `entry` of snapshot `snapshot` (its short id, for errors):
    /// one index lookup per chunk and one table read per container not cached. Fails
    /// if a chunk is missing, its table does not list it, or the chunks' raw lengths
    /// do not sum to the recorded size.
    pub fn layout(&self, entry: &TreeEntry, snapshot: &str) -> Result<FileLayout> {
        let repo = &*self.repo;
        let mut file = FileLayout {
            path: display_path(&entry.path),
            snapshot: snapshot.to_string(),
            ends: Vec::with_capacity(entry.chunks.len()),
            chunks: Vec::with_capacity(entry.chunks.len()),
            containers: Vec::new(),
            last_end: AtomicU64::new(0),
        };
        let found = repo.index().get_batch(&entry.chunks)?;
        let sealed = repo.keys().is_some();
        let mut ids: HashMap<u64, u32> = HashMap::new();
        let count = entry.chunks.len();
        let mut end = 0u64;
        for (n, (fp, loc)) in entry.chunks.iter().zip(found).enumerate() {
            let what = |reason: String| file_damaged(entry, snapshot, n, count, reason);
            let loc = loc.ok_or_else(|| what(StoreError::MissingChunk(*fp).to_string()))?;
            let table = self
                .table(loc.container)
                .map_err(|e| what(error_chain(&e)))?;
            let i = position(&table.entries, loc.offset, fp)
                .filter(|&i| table.entries[i].stored_len == loc.length)
                .ok_or_else(|| {
                    what(format!(
                        "it is not in the table of container {:016x}",
                        loc.container
                    ))
                })?;
            let row = table.entries[i];
            let (encoding, index) = stored_form(&table.entries, i)
                .ok_or_else(|| what(format!("it has unknown flags {}", row.flags)))?;
            let container = *ids.entry(loc.container).or_insert_with(|| {
                file.containers.push(ContainerRef {
                    id: loc.container,
                    seal: sealed.then(|| table.opener.clone()),
                });
                (file.containers.len() - 1) as u32
            });
            end += u64::from(row.raw_len);
            file.ends.push(end);
            file.chunks.push(ChunkSpot {
                container,
                index,
                offset: loc.offset,
                stored_len: loc.length,
                raw_len: row.raw_len,
                encoding,
                fingerprint: *fp,
            });
        }
        if end != entry.size {
            return Err(file.damaged(format!(
                "its chunks hold {end} bytes but the snapshot records {}",
                entry.size
            )));
        }
        Ok(file)
    }

    /// Bytes `offset..offset + len` of `file`, fewer at its end (none past it), each
    /// chunk verified when it was decoded. Fails if a chunk it needs cannot be read or
    /// is damaged. A read that starts where the last one ended also reads ahead.
    pub fn read_at(
        self: &Arc<Self>,
        file: &Arc<FileLayout>,
        offset: u64,
        len: u64,
    ) -> Result<Vec<u8>> {
        let end = offset.saturating_add(len).min(file.size());
        let sequential = file.last_end.swap(end, Ordering::Relaxed) == offset;
        let span = file.span(offset, len);
        let mut out = Vec::with_capacity(end.saturating_sub(offset) as usize);
        for i in span.clone() {
            let chunk = self.chunk(file, i)?;
            let start = file.start(i);
            let lo = offset.saturating_sub(start) as usize;
            let hi = (end - start).min(chunk.len() as u64) as usize;
            out.extend_from_slice(&chunk[lo..hi]);
        }
        if sequential {
            self.read_ahead(file, span.end);
        }
        Ok(out)
    }

    /// Chunk `i` of `file`, decoded: from the cache, from the run reading it, or read
    /// with its own run.
    fn chunk(&self, file: &FileLayout, i: usize) -> Result<Arc<Vec<u8>>> {
        let fp = file.chunks[i].fingerprint;
        let run = {
            let mut chunks = lock(&self.chunks);
            loop {
                if let Some(hit) = chunks.cached.get(&fp) {
                    return Ok(hit);
                }
                if !chunks.reading.contains(&fp) {
                    break;
                }
                chunks = self
                    .run_done
                    .wait(chunks)
                    .unwrap_or_else(PoisonError::into_inner);
            }
            let run = file.run_from(i, |fp| chunks.has(fp));
            chunks
                .reading
                .extend(run.iter().map(|&j| file.chunks[j].fingerprint));
            run
        };
        let damaged = |reason: String| {
            file.damaged(format!(
                "chunk {} of {}: {reason}",
                i + 1,
                file.chunks.len()
            ))
        };
        // `run` starts with `i`: its result is the first.
        let mut decoded = self
            .read_run(file, &run)
            .map_err(|e| damaged(error_chain(&e)))?;
        std::mem::replace(&mut decoded[0], Err(String::new())).map_err(damaged)
    }

    /// Starts reading in the background the first chunk from chunk `next` on that is
    /// neither cached nor being read and starts within [`READ_AHEAD`] of it, with its
    /// run; nothing if there is none.
    fn read_ahead(self: &Arc<Self>, file: &Arc<FileLayout>, next: usize) {
        let limit = file.start(next.min(file.chunks.len())) + READ_AHEAD;
        let run = {
            let mut chunks = lock(&self.chunks);
            let Some(first) = (next..file.chunks.len())
                .take_while(|&j| file.start(j) < limit)
                .find(|&j| !chunks.has(&file.chunks[j].fingerprint))
            else {
                return;
            };
            let run = file.run_from(first, |fp| chunks.has(fp));
            chunks
                .reading
                .extend(run.iter().map(|&j| file.chunks[j].fingerprint));
            run
        };
        let (cache, file) = (self.clone(), file.clone());
        // A chunk that fails here is read again, and its error reported, by the read
        // that needs it.
        rayon::spawn(move || drop(cache.read_run(&file, &run)));
    }

    /// Reads and decodes chunks `run` of `file` (marked as being read), caches those
    /// that decode, and ends their being read; returns each one's bytes or error.
    fn read_run(&self, file: &FileLayout, run: &[usize]) -> Result<Decoded, StoreError> {
        let spots: Vec<ChunkSpot> = run.iter().map(|&j| file.chunks[j]).collect();
        let container = &file.containers[spots[0].container as usize];
        let decoded = read_chunks(&self.repo, container, &spots);
        let mut chunks = lock(&self.chunks);
        for (i, spot) in spots.iter().enumerate() {
            chunks.reading.remove(&spot.fingerprint);
            if let Ok(Ok(bytes)) = decoded.as_ref().map(|d| &d[i]) {
                chunks
                    .cached
                    .insert(spot.fingerprint, bytes.clone(), bytes.len());
            }
        }
        drop(chunks);
        self.run_done.notify_all();
        decoded
    }

    fn table(&self, id: u64) -> Result<Arc<ContainerTable>, StoreError> {
        if let Some(t) = lock(&self.tables).get(&id) {
            return Ok(t);
        }
        let table = Arc::new(self.repo.load_container_table(id)?);
        lock(&self.tables).insert(id, table.clone(), 1);
        Ok(table)
    }
}

/// Reads chunks `spots` (of one container) in one request of byte ranges, and decodes
/// and verifies each on the rayon pool. Fails only if the container cannot be read;
/// a chunk that does not decode is an `Err` in its place.
fn read_chunks(
    repo: &Repository,
    container: &ContainerRef,
    spots: &[ChunkSpot],
) -> Result<Decoded, StoreError> {
    let ranges = merged_ranges(
        spots.iter().map(|c| u64::from(c.offset)..end_of(c)),
        MAX_GAP,
    );
    let data = repo.read_container_ranges(container.id, &ranges)?;
    let codec = repo.codec();
    // Runs of spots go to one thread each: a unit's members decode it once there.
    Ok(spots
        .par_iter()
        .with_min_len(16)
        .map(|c| {
            let k = ranges.partition_point(|r| r.start <= u64::from(c.offset)) - 1;
            let at = (u64::from(c.offset) - ranges[k].start) as usize;
            let stored = data[k]
                .get(at..at + c.stored_len as usize)
                .ok_or("the container is shorter than its table says")?;
            let chunk = StoredChunk {
                fingerprint: c.fingerprint,
                encoding: c.encoding,
                bytes: stored,
                seal: container.seal.as_ref().map(|opener| ChunkSeal {
                    opener: opener.as_ref(),
                    index: c.index,
                }),
            };
            let mut raw = vec![0; c.raw_len as usize];
            codec.decode_to_slice(chunk, &mut raw)?;
            Ok(Arc::new(raw))
        })
        .collect())
}

/// `ranges` sorted and merged where they overlap or lie at most `max_gap` apart.
fn merged_ranges(ranges: impl Iterator<Item = Range<u64>>, max_gap: u64) -> Vec<Range<u64>> {
    let mut sorted: Vec<Range<u64>> = ranges.collect();
    sorted.sort_unstable_by_key(|r| r.start);
    let mut merged: Vec<Range<u64>> = Vec::with_capacity(sorted.len());
    for r in sorted {
        match merged.last_mut() {
            Some(last) if r.start <= last.end + max_gap => last.end = last.end.max(r.end),
            _ => merged.push(r),
        }
    }
    merged
}

fn end_of(c: &ChunkSpot) -> u64 {
    u64::from(c.offset) + u64::from(c.stored_len)
}

fn file_damaged(
    entry: &TreeEntry,
    snapshot: &str,
    n: usize,
    count: usize,
    reason: String,
) -> EngineError {
    EngineError::DamagedEntry {
        path: display_path(&entry.path),
        snapshot: snapshot.to_string(),
        reason: format!("chunk {} of {count}: {reason}", n + 1),
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests;
