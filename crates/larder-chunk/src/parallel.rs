//! Exact parallel chunking: the cut points of sequential chunking, found by several
//! threads, for any [`Chunker`].
//!
//! The block is split into segments. Each worker chunks one segment speculatively, as if
//! a chunk started at its first byte, until its last chunk crosses into the next
//! segment. Then, also in parallel, each segment gets a bridge: chunks cut from where
//! the previous segment's chain ends until they land on this segment's chain. A
//! sequential merge walks the true chain of cuts, adopting from each chain or bridge
//! everything after the first true cut it contains, and cutting chunks itself only
//! where neither contains one. A chunk's length depends only on the bytes from its
//! start, so two chains that share one cut share every later one: the result equals
//! sequential chunking whatever the data, segment size or thread count.
//! `docs/design/chunking-parallel.md` gives the argument, the costs and the worst case;
//! `tests/parallel.rs` compares every [`crate::ChunkerKind`] with its sequential twin,
//! [`chunk_block_sequential`].

use std::num::NonZeroUsize;
use std::ops::AddAssign;

use rayon::prelude::*;
use rayon::ThreadPool;

use crate::Chunker;

/// Chunks a block of a stream on a thread pool, with the cut points of
/// [`chunk_block_sequential`] (and so of [`Chunker::chunk_lengths`] on a whole stream).
///
/// A pool of one thread runs [`chunk_block_sequential`] itself, on the calling thread.
pub struct ParallelChunker<'a, C: Chunker + ?Sized> {
    chunker: &'a C,
    pool: &'a ThreadPool,
    segment_size: NonZeroUsize,
}

// By hand: a derive would demand `C: Copy`, which `dyn Chunker` is not.
impl<C: Chunker + ?Sized> Clone for ParallelChunker<'_, C> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<C: Chunker + ?Sized> Copy for ParallelChunker<'_, C> {}

/// The chunks of one block whose cuts are final.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockChunks {
    /// Lengths of the chunks, in stream order.
    pub lengths: Vec<usize>,
    /// Bytes the chunks cover (their sum): the next block starts at `data[consumed]`.
    /// Equals `data.len()` for the last block of a stream.
    pub consumed: usize,
    pub stats: ParallelStats,
}

/// What parallel chunking cost, for progress output and for choosing the segment size.
/// Summed over blocks with `+=`.
///
/// Bytes chunked in all = bytes consumed + `discarded_bytes`; the workers chunk all of
/// them in parallel but `merge_chunked_bytes`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct ParallelStats {
    /// Segments the block was split into; 1 when it was chunked sequentially (one thread,
    /// or no more than one segment of chunk starts), 0 when it held no chunk to cut.
    pub segments: u64,
    /// Bytes of true chunks that were not on their segment's speculative chain: the cost
    /// of resynchronising at segment boundaries, whether paid by the parallel bridges or
    /// by the sequential merge.
    pub rechunked_bytes: u64,
    /// The chunks of `rechunked_bytes`.
    pub rechunked_chunks: u64,
    /// Of `rechunked_bytes`, those the sequential merge chunked itself: where a bridge
    /// left its segment without meeting the segment's chain, or the true chain entered a
    /// segment elsewhere than where its bridge starts.
    pub merge_chunked_bytes: u64,
    /// Bytes chunked in parallel from positions the true chain never reached: work
    /// thrown away.
    pub discarded_bytes: u64,
}

impl AddAssign for ParallelStats {
    fn add_assign(&mut self, other: Self) {
        self.segments += other.segments;
        self.rechunked_bytes += other.rechunked_bytes;
        self.rechunked_chunks += other.rechunked_chunks;
        self.merge_chunked_bytes += other.merge_chunked_bytes;
        self.discarded_bytes += other.discarded_bytes;
    }
}

/// The default segment size for a chunker whose chunks are at most `max_size` bytes:
/// at least 1 MiB and 16 maximal chunks, and a multiple of `max_size`.
///
/// Large enough that resynchronising (about one to three chunks per segment boundary on
/// real data) costs little, small enough that an 8 MiB block still gives every thread of
/// a small machine several segments; `benches/parallel.rs` measured the choice. Being a
/// multiple of `max_size` makes every segment start on a true cut of a chunker that cuts
/// every `max_size` bytes (fixed-size chunking), so such a chunker never resynchronises.
pub fn default_segment_size(max_size: usize) -> NonZeroUsize {
    const FLOOR: usize = 1 << 20;
    let max_size = max_size.max(1);
    let size = FLOOR
        .div_ceil(max_size)
        .saturating_mul(max_size)
        .max(max_size.saturating_mul(16));
    // `size >= FLOOR > 0`; the fallback is never taken.
    NonZeroUsize::new(size).unwrap_or(NonZeroUsize::MIN)
}

/// First position of a block of `data_len` bytes at which no chunk may start: a chunk
/// is cut only when at least `max_size` bytes follow its start or the stream has ended
/// (`is_last`; the contract of [`Chunker::next_chunk_len`]). A device that chunks a
/// block as a whole stream keeps the chunks starting before it.
pub fn cut_limit(data_len: usize, max_size: usize, is_last: bool) -> usize {
    if is_last {
        data_len
    } else {
        (data_len + 1).saturating_sub(max_size.max(1))
    }
}

/// The sequential twin of [`ParallelChunker::chunk_block`]: the chunks of `data` whose
/// cut is final, and the bytes they cover.
///
/// `data` starts at a chunk boundary of the stream. With `is_last` it is the rest of the
/// stream and is cut entirely. Otherwise a chunk is cut only while at least `max_size`
/// bytes follow its start, so fewer than `max_size` bytes are left over; the caller puts
/// them in front of the next block, and the cuts equal those of chunking the whole
/// stream at once.
pub fn chunk_block_sequential<C: Chunker + ?Sized>(
    chunker: &C,
    data: &[u8],
    is_last: bool,
) -> (Vec<usize>, usize) {
    let limit = cut_limit(data.len(), chunker.max_size(), is_last);
    let mut lengths = Vec::with_capacity(limit / 4096 + 1);
    let mut pos = 0;
    while pos < limit {
        let len = chunker.next_chunk_len(&data[pos..]);
        lengths.push(len);
        pos += len;
    }
    (lengths, pos)
}

/// Consecutive chunks cut sequentially from `starts[0]`, which may or may not be a true
/// cut.
struct Chain {
    /// Start of every chunk, ascending; never empty.
    starts: Vec<usize>,
    /// End of the last chunk.
    end: usize,
}

impl Chain {
    /// A segment's speculative chain: chunks from `start`, the segment's first byte, as
    /// if a chunk started there, until one ends at or past `segment_end`.
    /// `start < segment_end <= limit` (see [`cut_limit`]), so every chunk started obeys
    /// the chunker's contract.
    fn speculate<C: Chunker + ?Sized>(
        chunker: &C,
        data: &[u8],
        start: usize,
        segment_end: usize,
    ) -> Self {
        let mut starts = Vec::with_capacity((segment_end - start) / 4096 + 1);
        let mut pos = start;
        while pos < segment_end {
            starts.push(pos);
            pos += chunker.next_chunk_len(&data[pos..]);
        }
        Self { starts, end: pos }
    }

    /// The bridge into a segment: chunks from `from`, where the previous segment's chain
    /// ends, until one ends on a chunk start of `target` (the segment's chain) or at or
    /// past `segment_end`. `None` when there is nothing to bridge: `from` already is on
    /// `target`, or past the segment. Chunks start only below `segment_end <= limit`,
    /// as above.
    fn bridge<C: Chunker + ?Sized>(
        chunker: &C,
        data: &[u8],
        from: usize,
        target: &Chain,
        segment_end: usize,
    ) -> Option<Self> {
        if from >= segment_end || target.starts.binary_search(&from).is_ok() {
            return None;
        }
        // `target.starts[next]` is the first start of `target` at or past `pos`.
        let mut next = target.starts.partition_point(|&start| start < from);
        let mut starts = Vec::new();
        let mut pos = from;
        loop {
            starts.push(pos);
            pos += chunker.next_chunk_len(&data[pos..]);
            while target.starts.get(next).is_some_and(|&start| start < pos) {
                next += 1;
            }
            if pos >= segment_end || target.starts.get(next) == Some(&pos) {
                return Some(Self { starts, end: pos });
            }
        }
    }

    fn bytes(&self) -> usize {
        self.end - self.starts[0]
    }

    /// Appends the lengths of the chunks from `starts[first]` on.
    fn push_lengths_from(&self, first: usize, lengths: &mut Vec<usize>) {
        let starts = &self.starts[first..];
        lengths.extend(starts.windows(2).map(|pair| pair[1] - pair[0]));
        lengths.extend(starts.last().map(|&last| self.end - last));
    }
}

impl<'a, C: Chunker + ?Sized> ParallelChunker<'a, C> {
    /// Chunks with `chunker` on `pool`, in segments of [`default_segment_size`].
    pub fn new(chunker: &'a C, pool: &'a ThreadPool) -> Self {
        Self {
            chunker,
            pool,
            segment_size: default_segment_size(chunker.max_size()),
        }
    }

    /// Any segment size gives the same cuts; it only changes the cost. Segments much
    /// larger than a chunk keep resynchronisation cheap; a multiple of `max_size` lets
    /// fixed-size chunking skip it.
    pub fn with_segment_size(self, segment_size: NonZeroUsize) -> Self {
        Self {
            segment_size,
            ..self
        }
    }

    pub fn segment_size(&self) -> NonZeroUsize {
        self.segment_size
    }

    /// Splits a whole in-memory stream into chunk lengths, as [`Chunker::chunk_lengths`].
    pub fn chunk_lengths(&self, data: &[u8]) -> BlockChunks {
        self.chunk_block(data, true)
    }

    /// The chunks of `data` whose cut is final, exactly as [`chunk_block_sequential`]
    /// gives them: `data` starts at a chunk boundary; with `is_last` it is the rest of
    /// the stream, otherwise chunks are cut only while at least `max_size` bytes follow
    /// their start and `data[consumed..]` must be carried into the next block.
    pub fn chunk_block(&self, data: &[u8], is_last: bool) -> BlockChunks {
        let limit = cut_limit(data.len(), self.chunker.max_size(), is_last);
        let segment = self.segment_size.get();
        if self.pool.current_num_threads() <= 1 || limit <= segment {
            let (lengths, consumed) = chunk_block_sequential(self.chunker, data, is_last);
            return BlockChunks {
                lengths,
                consumed,
                stats: ParallelStats {
                    segments: u64::from(limit > 0),
                    ..ParallelStats::default()
                },
            };
        }
        let segments = limit.div_ceil(segment);
        // Segment `index` is `start(index)..end(index)`; `index < segments`, so
        // `start(index) < limit <= data.len()`.
        let start = |index: usize| index * segment;
        let end = |index: usize| start(index).saturating_add(segment).min(limit);
        let (chains, bridges) = self.pool.install(|| {
            let chains: Vec<Chain> = (0..segments)
                .into_par_iter()
                .map(|index| Chain::speculate(self.chunker, data, start(index), end(index)))
                .collect();
            let bridges: Vec<Option<Chain>> = (0..segments)
                .into_par_iter()
                .map(|index| {
                    let previous = index.checked_sub(1)?;
                    let from = chains[previous].end;
                    Chain::bridge(self.chunker, data, from, &chains[index], end(index))
                })
                .collect();
            (chains, bridges)
        });
        self.merge(data, limit, &chains, &bridges)
    }

    /// Walks the true chain of cuts through the segments' chains and bridges.
    ///
    /// Invariant: `pos` is a true cut (one of [`chunk_block_sequential`]) and `lengths`
    /// holds the true chunks before it. A chain or bridge that contains `pos` continues
    /// from it exactly as sequential chunking does (the same calls on the same bytes),
    /// so all of it from `pos` on is adopted; otherwise the next chunk is cut here.
    /// Each adoption moves `pos` to the chain's end, past its segment (a chain) or onto
    /// the segment's chain or past the segment (a bridge), so each is adopted at most
    /// once.
    fn merge(
        &self,
        data: &[u8],
        limit: usize,
        chains: &[Chain],
        bridges: &[Option<Chain>],
    ) -> BlockChunks {
        let segment = self.segment_size.get();
        let speculative: usize = chains
            .iter()
            .chain(bridges.iter().flatten())
            .map(Chain::bytes)
            .sum();
        let mut adopted = 0;
        let mut stats = ParallelStats {
            segments: chains.len() as u64,
            ..ParallelStats::default()
        };
        let mut lengths = Vec::with_capacity(chains.iter().map(|c| c.starts.len()).sum());
        let mut pos = 0;
        while pos < limit {
            // Segment `pos / segment` exists: `pos < limit` and the segments cover
            // `0..limit`.
            let index = pos / segment;
            let chain = &chains[index];
            if let Ok(first) = chain.starts.binary_search(&pos) {
                chain.push_lengths_from(first, &mut lengths);
                adopted += chain.end - pos;
                pos = chain.end;
            } else if let Some(bridge) = bridges[index].as_ref().filter(|b| b.starts[0] == pos) {
                bridge.push_lengths_from(0, &mut lengths);
                adopted += bridge.bytes();
                stats.rechunked_bytes += bridge.bytes() as u64;
                stats.rechunked_chunks += bridge.starts.len() as u64;
                pos = bridge.end;
            } else {
                let len = self.chunker.next_chunk_len(&data[pos..]);
                lengths.push(len);
                pos += len;
                stats.rechunked_bytes += len as u64;
                stats.rechunked_chunks += 1;
                stats.merge_chunked_bytes += len as u64;
            }
        }
        stats.discarded_bytes = (speculative - adopted) as u64;
        BlockChunks {
            lengths,
            consumed: pos,
            stats,
        }
    }
}

/// Chunks of `candidate` that are not chunks of `reference` (same start and length):
/// "dirty" chunks in P-Dedupe's terms. Both must be splits of the same bytes, for
/// example sequential and parallel chunk lengths; exact parallel chunking gives 0.
pub fn dirty_chunks(reference: &[usize], candidate: &[usize]) -> usize {
    let mut reference_cuts = reference.iter().scan(0usize, |end, &len| {
        *end += len;
        Some(*end)
    });
    // The first reference cut past the start of the current candidate chunk.
    let mut next_reference_cut = reference_cuts.next();
    // Whether the current candidate chunk starts on a reference cut.
    let mut start_shared = true;
    let mut end = 0usize;
    let mut dirty = 0;
    for &len in candidate {
        end += len;
        // Clean: a reference chunk starts where this one does and ends where it ends.
        if !(start_shared && next_reference_cut == Some(end)) {
            dirty += 1;
        }
        let mut end_shared = false;
        while let Some(cut) = next_reference_cut.filter(|&cut| cut <= end) {
            end_shared = cut == end;
            next_reference_cut = reference_cuts.next();
        }
        start_shared = end_shared;
    }
    dirty
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dirty_chunks_counts_chunks_not_in_the_reference() {
        assert_eq!(dirty_chunks(&[3, 4, 5], &[3, 4, 5]), 0);
        assert_eq!(dirty_chunks(&[], &[]), 0);
        // 0..3 and 7..12 are shared; 3..5 and 5..7 are not.
        assert_eq!(dirty_chunks(&[3, 4, 5], &[3, 2, 2, 5]), 2);
        // One chunk 0..12 matches none of three.
        assert_eq!(dirty_chunks(&[3, 4, 5], &[12]), 1);
        assert_eq!(dirty_chunks(&[12], &[3, 4, 5]), 3);
        // A shifted cut dirties the chunks on both sides of it.
        assert_eq!(dirty_chunks(&[4, 4, 4], &[4, 5, 3]), 2);
    }

    #[test]
    fn default_segment_size_is_a_multiple_of_max_size() {
        for max in [1, 1000, 1024, 65536, 65534, 300_000, 1 << 20, 16 << 20] {
            let size = default_segment_size(max).get();
            assert_eq!(size % max, 0, "max {max}");
            assert!(size >= 1 << 20 && size >= 16 * max, "max {max}: {size}");
        }
        assert_eq!(default_segment_size(65536).get(), 1 << 20);
        assert_eq!(default_segment_size(0).get(), 1 << 20);
    }

    #[test]
    fn cut_limit_keeps_max_size_bytes_after_every_chunk_start() {
        assert_eq!(cut_limit(100, 10, true), 100);
        assert_eq!(cut_limit(100, 10, false), 91);
        assert_eq!(cut_limit(10, 10, false), 1);
        assert_eq!(cut_limit(9, 10, false), 0);
        assert_eq!(cut_limit(0, 10, false), 0);
    }
}
