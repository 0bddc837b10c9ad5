//! Restore planning and assembly (docs/design/restore.md). The restore's whole chunk
//! sequence is planned from the recipes before any data is read, then cut into
//! look-ahead windows whose container byte ranges fit the cache. Each window's
//! containers are read once each, in the order the window first needs them, while
//! the window is assembled in slices as their containers arrive: each chunk decoded
//! and verified on every core straight into its place in a slice buffer, which the
//! writer takes as one run of file bytes.
//!
//! Invariants: a container is read once per window that needs it, so a restore whose
//! containers' ranges fit the cache reads each container exactly once; every byte
//! handed to the writer belongs to a chunk whose raw bytes hashed to its fingerprint.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::OnceLock;

use larder_crypto::ChunkOpener;
use larder_hash::Fingerprint;
use larder_store::{
    error_chain, position, stored_form, ChunkCodec, ChunkEncoding, ChunkSeal, ContainerTable,
    Repository, StoreError, StoredChunk,
};
use rayon::prelude::*;
use serde::Serialize;

/// What a restore read from the containers, for the summary.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct ReadStats {
    /// Containers read for chunk data: each once per look-ahead window that needs it.
    pub container_reads: u64,
    /// Reads those made: one per run of needed chunks (gaps up to 64 KiB read through).
    pub range_reads: u64,
    /// Containers holding the restored files' chunks: the fewest reads possible.
    pub distinct_containers: u64,
    /// Container tables read (each with its header and footer) to plan the restore.
    pub table_reads: u64,
    /// Whole containers read to load the snapshot's tree stream.
    pub tree_container_reads: u64,
    /// Bytes read from containers by all of the above.
    pub bytes_read: u64,
}

/// Where a file's bytes lie in the restore stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileData {
    pub start: u64,
    pub len: u64,
}

/// One chunk of the restore stream, where it is stored and how.
#[derive(Debug, Clone, Copy)]
struct ChunkRef {
    /// Index into [`RestorePlan::containers`].
    container: u32,
    /// The table index its stored bytes are sealed at: its own, or its unit's first
    /// member's.
    index: u32,
    offset: u32,
    stored_len: u32,
    raw_len: u32,
    encoding: ChunkEncoding,
    fingerprint: Fingerprint,
}

/// The chunks of every restorable file, in the order the writer takes them.
pub struct RestorePlan {
    /// Ids of the containers the chunks lie in.
    containers: Vec<u64>,
    /// Per container in `containers`, in an encrypted repository: what opens its chunks
    /// (`None` inside for a write-only key). `None` in a plaintext repository.
    seals: Vec<Option<Option<ChunkOpener>>>,
    chunks: Vec<ChunkRef>,
    /// Per file given to [`RestorePlan::new`]: its place in the stream, or why it
    /// cannot be restored (a missing chunk, an unreadable table, a wrong size).
    pub files: Vec<Result<FileData, String>>,
    pub stats: ReadStats,
}

impl RestorePlan {
    /// Plans the restore of `files` (each a file's recipe and recorded size), reading
    /// the table of every container they use, in parallel.
    pub fn new<'a>(
        repo: &Repository,
        files: impl IntoIterator<Item = (&'a [Fingerprint], u64)>,
    ) -> Self {
        let mut container_ids: HashMap<u64, u32> = HashMap::new();
        let mut containers = Vec::new();
        let located: Vec<_> = files
            .into_iter()
            .map(|(recipe, size)| {
                // One batch per file: a disk index answers runs of a file's chunks from
                // its cache, after one on-disk lookup and prefetch.
                let found = repo.index().get_batch(recipe).map_err(|e| error_chain(&e));
                let locations = found.and_then(|found| {
                    recipe
                        .iter()
                        .zip(found)
                        .map(|(fp, loc)| {
                            let loc =
                                loc.ok_or_else(|| StoreError::MissingChunk(*fp).to_string())?;
                            let c = *container_ids.entry(loc.container).or_insert_with(|| {
                                containers.push(loc.container);
                                (containers.len() - 1) as u32
                            });
                            Ok((c, loc.offset, loc.length))
                        })
                        .collect::<Result<Vec<_>, String>>()
                });
                (recipe, size, locations)
            })
            .collect();
        let tables: Vec<Result<ContainerTable, String>> = containers
            .par_iter()
            .map(|&id| repo.load_container_table(id).map_err(|e| error_chain(&e)))
            .collect();
        let mut stats = ReadStats {
            table_reads: tables.iter().filter(|t| t.is_ok()).count() as u64,
            bytes_read: tables.iter().flatten().map(|t| t.read).sum(),
            ..ReadStats::default()
        };
        let sealed = repo.keys().is_some();
        let seals = tables
            .iter()
            .map(|t| {
                let opener = t.as_ref().ok().and_then(|t| t.opener.clone());
                sealed.then_some(opener)
            })
            .collect();
        let mut chunks = Vec::new();
        let mut pos = 0u64;
        let files = located
            .into_iter()
            .map(|(recipe, size, locations)| {
                let first = chunks.len();
                let planned = locations.and_then(|locations| {
                    let mut len = 0u64;
                    for (fp, (c, offset, stored_len)) in recipe.iter().zip(locations) {
                        let id = containers[c as usize];
                        let table = tables[c as usize].as_ref().map_err(Clone::clone)?;
                        let (entry, encoding, index) = position(&table.entries, offset, fp)
                            .map(|i| (table.entries[i], stored_form(&table.entries, i)))
                            .filter(|(e, _)| e.stored_len == stored_len)
                            .ok_or_else(|| damaged(id, format!("chunk {fp} is not in its table")))
                            .and_then(|(e, form)| {
                                let (encoding, index) = form.ok_or_else(|| {
                                    damaged(id, format!("chunk {fp} has unknown flags {}", e.flags))
                                })?;
                                Ok((e, encoding, index))
                            })?;
                        len += u64::from(entry.raw_len);
                        chunks.push(ChunkRef {
                            container: c,
                            index,
                            offset,
                            stored_len,
                            raw_len: entry.raw_len,
                            encoding,
                            fingerprint: *fp,
                        });
                    }
                    if len != size {
                        return Err(format!(
                            "the snapshot records {size} bytes but the file's chunks hold {len}"
                        ));
                    }
                    Ok(FileData { start: pos, len })
                });
                match &planned {
                    Ok(data) => pos += data.len,
                    Err(_) => chunks.truncate(first),
                }
                planned
            })
            .collect();
        let mut used = vec![false; containers.len()];
        for c in &chunks {
            used[c.container as usize] = true;
        }
        stats.distinct_containers = used.iter().filter(|&&u| u).count() as u64;
        Self {
            containers,
            seals,
            chunks,
            files,
            stats,
        }
    }

    /// Cuts the stream into look-ahead windows (ranges of chunk indices): each the
    /// longest run of chunks whose containers' byte ranges (from the first to the end
    /// of the last of the run's chunks in each) total at most `cache_size`, or one
    /// chunk.
    pub fn windows(&self, cache_size: u64) -> Vec<Range<usize>> {
        window_bounds(
            self.chunks
                .iter()
                .map(|c| (c.container, u64::from(c.offset), end_of(c))),
            cache_size,
        )
    }

    /// What window `window` (one of [`RestorePlan::windows`]) needs from each of its
    /// containers: the runs of needed chunks, a run taking in gaps of up to
    /// [`MAX_GAP`] bytes between chunks (cheaper to read than to skip with another
    /// read). Nothing is read yet: see [`WindowData::read_all`].
    pub fn window_data(&self, window: Range<usize>) -> WindowData {
        let mut order = Vec::new();
        let mut needed: HashMap<u32, Vec<(u32, u64)>> = HashMap::new();
        for c in &self.chunks[window.clone()] {
            let chunks = needed.entry(c.container).or_insert_with(|| {
                order.push(c.container);
                Vec::new()
            });
            chunks.push((c.offset, end_of(c)));
        }
        let ranges = needed
            .into_iter()
            .map(|(c, chunks)| {
                let runs = ContainerRuns {
                    id: self.containers[c as usize],
                    seal: self.seals[c as usize].clone(),
                    runs: read_runs(chunks, MAX_GAP),
                    data: OnceLock::new(),
                };
                (c, runs)
            })
            .collect();
        WindowData {
            window,
            order,
            ranges,
        }
    }

    /// Cuts window `data` into slices of at most `slice_size` raw bytes (or one chunk).
    pub fn slices(&self, data: &WindowData, slice_size: u64) -> Vec<Range<usize>> {
        let first = data.window.start;
        slice_bounds(
            self.chunks[data.window.clone()].iter().map(|c| c.raw_len),
            slice_size,
        )
        .into_iter()
        .map(|r| r.start + first..r.end + first)
        .collect()
    }

    /// Fills `buf` with the raw bytes of the chunks `slice` (one of
    /// [`RestorePlan::slices`] of `data`), decoding and verifying them on the rayon
    /// pool from the window's container ranges. Returns the damaged chunks' ranges
    /// within `buf` with their errors; their bytes in `buf` are unspecified.
    pub fn fill_slice(
        &self,
        data: &WindowData,
        slice: Range<usize>,
        codec: &ChunkCodec,
        buf: &mut Vec<u8>,
    ) -> Vec<(Range<usize>, String)> {
        let chunks = &self.chunks[slice];
        let len: usize = chunks.iter().map(|c| c.raw_len as usize).sum();
        if buf.capacity() < len {
            // A fresh zeroed allocation comes from the kernel's zero pages; no memset.
            *buf = vec![0; len];
        } else {
            buf.clear();
            buf.resize(len, 0);
        }
        let mut slots = Vec::with_capacity(chunks.len());
        let mut rest = buf.as_mut_slice();
        let mut at = 0;
        for c in chunks {
            let (slot, tail) = std::mem::take(&mut rest).split_at_mut(c.raw_len as usize);
            slots.push((c, at, slot));
            rest = tail;
            at += c.raw_len as usize;
        }
        let mut damage: Vec<(Range<usize>, String)> = slots
            .into_par_iter()
            .with_min_len(16)
            .map(|(c, at, slot)| {
                let reason = decode_chunk(data, c, codec, slot).err()?;
                Some((at..at + slot.len(), reason))
            })
            .flatten()
            .collect();
        damage.sort_unstable_by_key(|(r, _)| r.start);
        damage
    }
}

/// Largest gap between two needed chunks of a container that one read spans: reading
/// 64 KiB more from the page cache costs about what another read costs.
const MAX_GAP: u64 = 64 << 10;

/// The runs of a container that a window needs, and once read, their bytes.
struct ContainerRuns {
    id: u64,
    /// What opens its chunks, in an encrypted repository (see [`RestorePlan`]).
    seal: Option<Option<ChunkOpener>>,
    runs: Vec<Range<u64>>,
    /// Each run's bytes, in the order of `runs`; set once, by [`WindowData::read_all`].
    data: OnceLock<Result<Vec<Vec<u8>>, String>>,
}

/// The container runs a window needs.
pub struct WindowData {
    window: Range<usize>,
    /// The window's containers in the order its chunks first need them.
    order: Vec<u32>,
    ranges: HashMap<u32, ContainerRuns>,
}

impl WindowData {
    /// Reads every container's runs, one container after another in the order the
    /// window first needs them (the file opened once, one read per run), and
    /// publishes each as soon as it is read: assembling a slice waits only for the
    /// containers that slice needs, so reading overlaps decoding and writing. Every
    /// container's result is set, error or not, so nothing waits forever.
    pub fn read_all(&self, repo: &Repository) -> ReadStats {
        let mut stats = ReadStats::default();
        for c in &self.order {
            let Some(runs) = self.ranges.get(c) else {
                continue;
            };
            let read = repo
                .read_container_ranges(runs.id, &runs.runs)
                .map_err(|e| error_chain(&e));
            if let Ok(bytes) = &read {
                stats.container_reads += 1;
                stats.range_reads += bytes.len() as u64;
                stats.bytes_read += bytes.iter().map(|b| b.len() as u64).sum::<u64>();
            }
            let _ = runs.data.set(read);
        }
        stats
    }
}

/// Decodes chunk `c` from the window's range of its container into `slot` (exactly its
/// raw length) and checks its fingerprint.
fn decode_chunk(
    data: &WindowData,
    c: &ChunkRef,
    codec: &ChunkCodec,
    slot: &mut [u8],
) -> Result<(), String> {
    let container = data
        .ranges
        .get(&c.container)
        .ok_or("the chunk's container was not read")?;
    let data = container.data.wait().as_ref().map_err(Clone::clone)?;
    let i = container
        .runs
        .partition_point(|r| r.start <= u64::from(c.offset))
        .checked_sub(1)
        .ok_or("the chunk's run was not read")?;
    let (run_start, bytes) = (container.runs[i].start, &data[i]);
    let at = (u64::from(c.offset) - run_start) as usize;
    let stored = bytes
        .get(at..at + c.stored_len as usize)
        .ok_or("the chunk lies outside its run")?;
    let chunk = StoredChunk {
        fingerprint: c.fingerprint,
        encoding: c.encoding,
        bytes: stored,
        seal: container.seal.as_ref().map(|opener| ChunkSeal {
            opener: opener.as_ref(),
            index: c.index,
        }),
    };
    codec
        .decode_to_slice(chunk, slot)
        .map_err(|reason| damaged(container.id, reason))
}

/// The runs to read for chunks at `chunks` (offset, end) of one container: sorted,
/// each run covering the chunks whose gaps to the previous one are at most `max_gap`.
fn read_runs(mut chunks: Vec<(u32, u64)>, max_gap: u64) -> Vec<Range<u64>> {
    chunks.sort_unstable();
    let mut runs: Vec<Range<u64>> = Vec::new();
    for (lo, hi) in chunks {
        match runs.last_mut() {
            Some(run) if u64::from(lo) <= run.end + max_gap => run.end = run.end.max(hi),
            _ => runs.push(u64::from(lo)..hi),
        }
    }
    runs
}

/// Cuts a stream of chunks, each given as (container, start, end) of its stored bytes,
/// into windows: each the longest run of consecutive chunks, from where the last one
/// ended, for which the sum over containers of the span from the least start to the
/// greatest end of the run's chunks in that container is at most `budget`, or a single
/// chunk. The windows tile the stream in order.
fn window_bounds(
    chunks: impl IntoIterator<Item = (u32, u64, u64)>,
    budget: u64,
) -> Vec<Range<usize>> {
    let mut windows = Vec::new();
    let mut spans: HashMap<u32, (u64, u64)> = HashMap::new();
    let mut total = 0u64;
    let mut start = 0;
    let mut n = 0;
    for (i, (container, lo, hi)) in chunks.into_iter().enumerate() {
        let old = spans.get(&container).copied();
        let grown = old.map_or((lo, hi), |(a, b)| (a.min(lo), b.max(hi)));
        let new_total = total - old.map_or(0, |(a, b)| b - a) + (grown.1 - grown.0);
        if i > start && new_total > budget {
            windows.push(start..i);
            start = i;
            spans.clear();
            spans.insert(container, (lo, hi));
            total = hi - lo;
        } else {
            spans.insert(container, grown);
            total = new_total;
        }
        n = i + 1;
    }
    if n > start {
        windows.push(start..n);
    }
    windows
}

/// End of a chunk's stored bytes in its container file.
fn end_of(c: &ChunkRef) -> u64 {
    u64::from(c.offset) + u64::from(c.stored_len)
}

fn damaged(id: u64, reason: String) -> String {
    StoreError::Corrupt {
        what: "container",
        name: format!("{id:016x}"),
        reason,
    }
    .to_string()
}

/// Cuts a stream of chunks with raw lengths `raw_lens` into slices: each the longest
/// run of consecutive chunks, from where the last one ended, whose lengths sum to at
/// most `slice_size`, or a single chunk longer than that. The slices tile the stream.
fn slice_bounds(raw_lens: impl IntoIterator<Item = u32>, slice_size: u64) -> Vec<Range<usize>> {
    let mut slices = Vec::new();
    let mut start = 0;
    let mut filled = 0u64;
    let mut n = 0;
    for (i, len) in raw_lens.into_iter().enumerate() {
        let len = u64::from(len);
        if i > start && filled + len > slice_size {
            slices.push(start..i);
            start = i;
            filled = 0;
        }
        filled += len;
        n = i + 1;
    }
    if n > start {
        slices.push(start..n);
    }
    slices
}

#[cfg(test)]
mod tests {
    use super::{read_runs, slice_bounds, window_bounds};
    use proptest::prelude::*;

    #[test]
    fn slices_hold_what_fits_and_oversized_chunks_alone() {
        assert_eq!(slice_bounds([], 10), vec![]);
        assert_eq!(slice_bounds([4, 4, 4], 10), vec![0..2, 2..3]);
        assert_eq!(slice_bounds([4, 6, 4], 10), vec![0..2, 2..3]);
        assert_eq!(
            slice_bounds([11, 1, 20, 0, 0], 10),
            vec![0..1, 1..2, 2..3, 3..5]
        );
        assert_eq!(slice_bounds([0, 0, 0], 0), vec![0..3]);
    }

    #[test]
    fn runs_read_through_small_gaps_only() {
        let chunks = vec![(500, 600), (32, 100), (100, 200), (32, 100), (260, 300)];
        assert_eq!(
            read_runs(chunks.clone(), 0),
            vec![32..200, 260..300, 500..600]
        );
        assert_eq!(read_runs(chunks.clone(), 60), vec![32..300, 500..600]);
        assert_eq!(read_runs(chunks, 200), vec![32..600]);
        assert_eq!(read_runs(vec![], 10), vec![]);
    }

    #[test]
    fn windows_count_each_container_span_once() {
        // Two chunks of container 0 spanning 0..30, one of container 1: 30 + 10.
        let chunks = [(0, 0, 10), (1, 0, 10), (0, 20, 30), (1, 50, 60), (2, 0, 5)];
        assert_eq!(window_bounds(chunks, 40), vec![0..3, 3..5]);
        assert_eq!(window_bounds(chunks, 39), vec![0..2, 2..5]);
        assert_eq!(window_bounds(chunks, 1 << 40), vec![0..5]);
        assert_eq!(window_bounds(chunks, 0), vec![0..1, 1..2, 2..3, 3..4, 4..5]);
    }

    proptest! {
        /// Windows tile the stream; each one's spans fit or it is one chunk; none could
        /// have taken the next chunk too.
        #[test]
        fn windows_tile_the_stream_greedily(
            chunks in proptest::collection::vec((0u32..6, 0u64..1000, 1u64..300), 0..150),
            budget in 0u64..4000,
        ) {
            let chunks: Vec<_> = chunks.into_iter().map(|(c, lo, len)| (c, lo, lo + len)).collect();
            let span_total = |run: &[(u32, u64, u64)]| {
                let mut spans = std::collections::HashMap::new();
                for &(c, lo, hi) in run {
                    let s = spans.entry(c).or_insert((lo, hi));
                    *s = (s.0.min(lo), s.1.max(hi));
                }
                spans.values().map(|(a, b)| b - a).sum::<u64>()
            };
            let windows = window_bounds(chunks.iter().copied(), budget);
            let mut next = 0;
            for w in &windows {
                prop_assert_eq!(w.start, next);
                prop_assert!(w.end > w.start);
                prop_assert!(span_total(&chunks[w.clone()]) <= budget || w.len() == 1);
                if w.end < chunks.len() {
                    prop_assert!(span_total(&chunks[w.start..=w.end]) > budget);
                }
                next = w.end;
            }
            prop_assert_eq!(next, chunks.len());
        }

        /// The slices tile the stream; each fits or is one chunk; none could have taken
        /// the next chunk too.
        #[test]
        fn slices_tile_the_stream_greedily(
            lens in proptest::collection::vec(0u32..5000, 0..200),
            size in 0u64..20_000,
        ) {
            let slices = slice_bounds(lens.iter().copied(), size);
            let mut next = 0;
            for a in &slices {
                prop_assert_eq!(a.start, next);
                prop_assert!(a.end > a.start);
                let sum: u64 = lens[a.clone()].iter().map(|&l| u64::from(l)).sum();
                prop_assert!(sum <= size || a.len() == 1);
                if a.end < lens.len() {
                    prop_assert!(sum + u64::from(lens[a.end]) > size);
                }
                next = a.end;
            }
            prop_assert_eq!(next, lens.len());
        }
    }
}
