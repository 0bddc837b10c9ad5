//! Exact parallel chunking: [`ParallelChunker`] gives the cut points of sequential
//! chunking for every [`ChunkerKind`], thread count and segment size, on whole streams
//! and block by block, on random, low-entropy and real data.

#[path = "support/inputs.rs"]
mod inputs;

#[path = "support/real_files.rs"]
mod real_files;

use std::num::NonZeroUsize;
use std::sync::{Arc, OnceLock};

use inputs::{random_bytes, text_like};
use larder_chunk::{
    chunk_block_sequential, dirty_chunks, Chunker, ChunkerConfig, ChunkerKind, FixedSize,
    ParallelChunker, ParallelStats,
};
use larder_crypto::WindowPrf;
use proptest::prelude::*;
use rayon::ThreadPool;

const MAX_THREADS: usize = 8;

/// Pools of 1 to [`MAX_THREADS`] threads, built once for every test of this binary.
fn pool(threads: usize) -> &'static ThreadPool {
    static POOLS: OnceLock<Vec<ThreadPool>> = OnceLock::new();
    let pools = POOLS.get_or_init(|| {
        (1..=MAX_THREADS)
            .map(|n| {
                rayon::ThreadPoolBuilder::new()
                    .num_threads(n)
                    .build()
                    .expect("a thread pool for the tests")
            })
            .collect()
    });
    &pools[threads - 1]
}

/// Any kind's chunker; the keyed one under a fixed test key.
fn build(config: &ChunkerConfig) -> Box<dyn Chunker> {
    config.build_keyed(Arc::new(WindowPrf::from_secret(&[0x3c; 32])))
}

fn segment(size: usize) -> NonZeroUsize {
    NonZeroUsize::new(size).expect("segment sizes in tests are non-zero")
}

/// `base` with the given kind, sizes and level; set field by field so that fields other
/// kinds may add keep their defaults.
fn with_sizes(
    mut base: ChunkerConfig,
    kind: ChunkerKind,
    (min, avg, max): (usize, usize, usize),
    level: u8,
) -> ChunkerConfig {
    base.kind = kind;
    base.min_size = min;
    base.avg_size = avg;
    base.max_size = max;
    base.level = level;
    base
}

/// A valid config of `kind` as close to the requested sizes as the kind accepts: as
/// asked, rounded to even, rounded to powers of two, then small fixed sizes, then the
/// kind's defaults. Every kind, including ones added later, gets tested this way.
fn valid_config(
    kind: ChunkerKind,
    (min, avg, max): (usize, usize, usize),
    level: u8,
) -> ChunkerConfig {
    let candidates = [
        (min, avg, max),
        (min & !1, avg & !1, max & !1),
        (
            min.next_power_of_two(),
            avg.next_power_of_two(),
            max.next_power_of_two(),
        ),
        (64, 256, 1024),
    ];
    candidates
        .into_iter()
        .flat_map(|sizes| [level, 0].map(|level| (sizes, level)))
        .map(|(sizes, level)| with_sizes(ChunkerConfig::default(), kind, sizes, level))
        .chain([with_sizes(
            ChunkerConfig::default(),
            kind,
            (2048, 8192, 65536),
            2,
        )])
        .find(|config| config.validate().is_ok())
        .unwrap_or_else(|| panic!("no valid test config for {kind:?}: add one here"))
}

/// Chunks `data` with `config` in parallel and sequentially; panics at the first
/// difference, naming the case. Returns the parallel statistics.
fn assert_exact(
    config: &ChunkerConfig,
    data: &[u8],
    threads: usize,
    segment_size: usize,
) -> ParallelStats {
    let chunker = build(config);
    let sequential = chunker.chunk_lengths(data);
    let parallel = ParallelChunker::new(chunker.as_ref(), pool(threads))
        .with_segment_size(segment(segment_size))
        .chunk_lengths(data);
    let what = format!(
        "{config:?}, {threads} threads, segments of {segment_size}, {} bytes",
        data.len()
    );
    assert_same_lengths(&what, &sequential, &parallel.lengths);
    assert_eq!(parallel.consumed, data.len(), "{what}");
    parallel.stats
}

/// Names the first differing chunk rather than printing thousands of lengths.
fn assert_same_lengths(what: &str, sequential: &[usize], parallel: &[usize]) {
    if sequential == parallel {
        return;
    }
    let first = sequential
        .iter()
        .zip(parallel)
        .position(|(s, p)| s != p)
        .unwrap_or(sequential.len().min(parallel.len()));
    let offset: usize = sequential[..first].iter().sum();
    panic!(
        "{what}: chunk {first} (at byte {offset}) differs: sequential {:?}, parallel {:?}; \
         {} dirty chunks of {} ({} sequential chunks)",
        sequential.get(first),
        parallel.get(first),
        dirty_chunks(sequential, parallel),
        parallel.len(),
        sequential.len()
    );
}

/// The block loop of `larder-engine`'s `chunk_large`, written out independently of the
/// library: cut while the stream has ended or at least `max_size` bytes follow.
fn engine_block(chunker: &dyn Chunker, block: &[u8], is_last: bool) -> (Vec<usize>, usize) {
    let max = chunker.max_size();
    let (mut lengths, mut pos) = (Vec::new(), 0);
    while pos < block.len() && (is_last || block.len() - pos >= max) {
        let len = chunker.next_chunk_len(&block[pos..]);
        lengths.push(len);
        pos += len;
    }
    (lengths, pos)
}

/// Streams `data` through `chunk_block` in blocks that add `new_bytes[i % len]` bytes
/// each (cycling), carrying each block's uncut tail into the next as the engine does.
/// Each block must match the sequential twin, and the whole the sequential cuts.
fn assert_streamed_exact(
    config: &ChunkerConfig,
    data: &[u8],
    threads: usize,
    segment_size: usize,
    new_bytes: &[usize],
) {
    let chunker = build(config);
    let max = chunker.max_size();
    let parallel = ParallelChunker::new(chunker.as_ref(), pool(threads))
        .with_segment_size(segment(segment_size));
    let what = format!(
        "{config:?}, {threads} threads, segments of {segment_size}, blocks adding {new_bytes:?}, {} bytes",
        data.len()
    );
    let mut lengths = Vec::new();
    let (mut start, mut read) = (0, 0);
    for &new in new_bytes.iter().cycle() {
        read = (read + new).min(data.len());
        let is_last = read == data.len();
        let block = &data[start..read];
        let got = parallel.chunk_block(block, is_last);
        let (want, want_consumed) = chunk_block_sequential(chunker.as_ref(), block, is_last);
        assert_eq!(
            (want.clone(), want_consumed),
            engine_block(chunker.as_ref(), block, is_last),
            "{what}: the sequential twin differs from the engine's loop, block at {start}"
        );
        assert_same_lengths(&format!("{what}, block at {start}"), &want, &got.lengths);
        assert_eq!(got.consumed, want_consumed, "{what}, block at {start}");
        assert_eq!(got.lengths.iter().sum::<usize>(), got.consumed, "{what}");
        if is_last {
            assert_eq!(got.consumed, block.len(), "{what}: last block left bytes");
        } else {
            assert!(
                block.len() - got.consumed < max,
                "{what}: block at {start} carries {} bytes, max_size {max}",
                block.len() - got.consumed
            );
        }
        lengths.extend(got.lengths);
        start += got.consumed;
        if is_last {
            break;
        }
    }
    assert_same_lengths(&what, &chunker.chunk_lengths(data), &lengths);
}

/// A stretch of test data: Gear-like hashes behave differently on each.
#[derive(Debug, Clone)]
enum Piece {
    Random { seed: u64, len: usize },
    Zeros { len: usize },
    Repeated { pattern: Vec<u8>, len: usize },
    Text { seed: u64, len: usize },
}

impl Piece {
    fn append_to(&self, out: &mut Vec<u8>) {
        match self {
            Piece::Random { seed, len } => out.extend(random_bytes(*seed, *len)),
            Piece::Zeros { len } => out.resize(out.len() + len, 0),
            Piece::Repeated { pattern, len } => {
                out.extend(pattern.iter().copied().cycle().take(*len))
            }
            Piece::Text { seed, len } => out.extend(text_like(*seed, *len)),
        }
    }
}

fn piece(max_len: usize) -> impl Strategy<Value = Piece> {
    let len = 0..=max_len;
    prop_oneof![
        (any::<u64>(), len.clone()).prop_map(|(seed, len)| Piece::Random { seed, len }),
        len.clone().prop_map(|len| Piece::Zeros { len }),
        (prop::collection::vec(any::<u8>(), 1..=64), len.clone())
            .prop_map(|(pattern, len)| Piece::Repeated { pattern, len }),
        (any::<u64>(), len).prop_map(|(seed, len)| Piece::Text { seed, len }),
    ]
}

/// Up to four pieces, at most `max_len` bytes in all: one kind of data, or the
/// transitions between kinds (where chains fall out of step and back in).
fn data(max_len: usize) -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(piece(max_len), 1..=4).prop_map(move |pieces| {
        let mut out = Vec::new();
        for piece in &pieces {
            piece.append_to(&mut out);
        }
        out.truncate(max_len);
        out
    })
}

/// Segment sizes from one byte to past the input, each with an input length that keeps
/// the case quick: a worker chunks at least one whole chunk per segment, so tiny
/// segments on long inputs cost a chunk per byte.
fn segment_and_data() -> impl Strategy<Value = (usize, Vec<u8>)> {
    prop_oneof![
        (1..=16usize, Just(3_000usize)),
        (17..=3_000usize, Just(16_000usize)),
        (3_000..=40_000usize, Just(48_000usize)),
        (40_000..=200_000usize, Just(48_000usize)),
    ]
    .prop_flat_map(|(segment, max_len)| (Just(segment), data(max_len)))
}

/// Sizes as drawn; [`valid_config`] fits them to each kind.
fn sizes() -> impl Strategy<Value = (usize, usize, usize)> {
    (64..=1_024usize, 0..=3_072usize, 0..=6_144usize).prop_map(|(min, avg_over, max_over)| {
        let avg = min.max(256) + avg_over;
        (min, avg, avg.max(1_024) + max_over)
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn parallel_equals_sequential_for_every_kind(
        (segment_size, data) in segment_and_data(),
        sizes in sizes(),
        level in 0..=3u8,
        threads in 1..=MAX_THREADS,
    ) {
        for kind in ChunkerKind::ALL {
            assert_exact(&valid_config(kind, sizes, level), &data, threads, segment_size);
        }
    }

    #[test]
    fn streamed_blocks_equal_sequential_for_every_kind(
        (segment_size, data) in segment_and_data(),
        sizes in sizes(),
        level in 0..=3u8,
        threads in 1..=MAX_THREADS,
        extra in prop::collection::vec(0..=20_000usize, 1..=5),
    ) {
        for kind in ChunkerKind::ALL {
            let config = valid_config(kind, sizes, level);
            let max = build(&config).max_size();
            let new_bytes: Vec<usize> = extra.iter().map(|e| max + e).collect();
            assert_streamed_exact(&config, &data, threads, segment_size, &new_bytes);
        }
    }
}

/// `(start, length)` of every chunk.
fn chunk_spans(lengths: &[usize]) -> std::collections::HashSet<(usize, usize)> {
    let mut start = 0;
    lengths
        .iter()
        .map(|&len| {
            start += len;
            (start - len, len)
        })
        .collect()
}

/// Splits `total` bytes at the given fractions-of-a-thousand, deduplicated.
fn split(total: usize, cuts: &[usize]) -> Vec<usize> {
    let mut cuts: Vec<usize> = cuts.iter().map(|c| c * total / 1000).collect();
    cuts.extend([0, total]);
    cuts.sort_unstable();
    cuts.dedup();
    cuts.windows(2).map(|pair| pair[1] - pair[0]).collect()
}

proptest! {
    /// `dirty_chunks` against its definition, on two random splits of the same bytes.
    #[test]
    fn dirty_chunks_counts_chunks_missing_from_the_reference(
        total in 1..2_000usize,
        reference_cuts in prop::collection::vec(0..=1000usize, 0..40),
        candidate_cuts in prop::collection::vec(0..=1000usize, 0..40),
    ) {
        let reference = split(total, &reference_cuts);
        let candidate = split(total, &candidate_cuts);
        let reference_spans = chunk_spans(&reference);
        let expected = chunk_spans(&candidate)
            .iter()
            .filter(|span| !reference_spans.contains(span))
            .count();
        prop_assert_eq!(dirty_chunks(&reference, &candidate), expected);
        prop_assert_eq!(dirty_chunks(&candidate, &candidate), 0);
    }
}

/// Lengths around every size that matters, with segments from one byte to past the
/// input: the boundary cases of BLAKE3's backend tests, for chunking.
#[test]
fn boundary_lengths_and_segment_sizes() {
    let data = random_bytes(11, 4 * 1024 + 9);
    for kind in ChunkerKind::ALL {
        let config = valid_config(kind, (64, 256, 1024), 1);
        let (min, max) = (config.min_size, build(&config).max_size());
        let mut lengths = vec![0, 1, 2, 3, 2 * max, 3 * max + 1, data.len()];
        for size in [min, max] {
            lengths.extend([size.saturating_sub(1), size, size + 1]);
        }
        for len in lengths.into_iter().map(|len| len.min(data.len())) {
            let segment_sizes = [
                1,
                2,
                7,
                min.saturating_sub(1).max(1),
                min.max(1),
                min + 1,
                max,
                max + 1,
                len.max(1),
                len + 1,
            ];
            for segment_size in segment_sizes {
                for threads in [1, 2, 3] {
                    assert_exact(&config, &data[..len], threads, segment_size);
                }
            }
        }
    }
}

#[test]
fn empty_input_gives_no_chunk_and_no_segment() {
    for kind in ChunkerKind::ALL {
        let chunker = build(&valid_config(kind, (64, 256, 1024), 2));
        for threads in [1, 4] {
            let parallel =
                ParallelChunker::new(chunker.as_ref(), pool(threads)).with_segment_size(segment(1));
            for is_last in [true, false] {
                let got = parallel.chunk_block(&[], is_last);
                assert!(got.lengths.is_empty(), "{kind:?}");
                assert_eq!((got.consumed, got.stats), (0, ParallelStats::default()));
            }
        }
    }
}

/// A segment boundary inside the first bytes of a true chunk, which content-defined
/// chunkers skip without hashing (below `min_size`): the speculative chain there
/// starts where no true chunk does, and must be resynchronised, not trusted.
#[test]
fn segment_boundary_inside_the_skipped_minimum_of_a_chunk() {
    let data = random_bytes(12, 40_000);
    for kind in ChunkerKind::ALL {
        let config = valid_config(kind, (512, 1024, 4096), 2);
        let sequential = build(&config).chunk_lengths(&data);
        let mut cut = 0;
        for (index, &len) in sequential.iter().enumerate().take(10) {
            // Past the first chunks, so that segments stay large enough to be quick.
            if index >= 2 {
                let inside_minimum = (config.min_size.min(len) / 2).max(1);
                for offset in [0, 1, inside_minimum, len - 1] {
                    for threads in [2, 5] {
                        assert_exact(&config, &data, threads, cut + offset);
                    }
                }
            }
            cut += len;
        }
    }
}

/// A chunk followed by exactly `max_size` bytes of the block is final and must be cut;
/// one byte fewer and it must wait for the next block.
#[test]
fn a_block_cuts_a_chunk_exactly_when_max_size_bytes_follow_its_start() {
    let data = random_bytes(18, 60_000);
    for kind in ChunkerKind::ALL {
        let config = valid_config(kind, (256, 1024, 4096), 2);
        let chunker = build(&config);
        let max = chunker.max_size();
        let parallel =
            ParallelChunker::new(chunker.as_ref(), pool(3)).with_segment_size(segment(999));
        let mut cut = 0;
        for &len in chunker.chunk_lengths(&data).iter().take(20) {
            if cut + max > data.len() {
                break;
            }
            let exactly = parallel.chunk_block(&data[..cut + max], false);
            assert_eq!(exactly.consumed, cut + len, "{config:?}, chunk at {cut}");
            let short = parallel.chunk_block(&data[..cut + max - 1], false);
            assert_eq!(short.consumed, cut, "{config:?}, chunk at {cut}");
            cut += len;
        }
    }
}

/// Every chain starts on a true cut and is adopted whole, so the merge cuts nothing.
#[test]
fn fixed_size_chunks_never_resynchronise_with_the_default_segment_size() {
    let data = random_bytes(13, 5 << 20);
    for size in [1000, 4096, 65536] {
        let chunker = FixedSize::new(size);
        let got = ParallelChunker::new(&chunker, pool(2)).chunk_lengths(&data);
        assert_eq!(got.lengths, chunker.chunk_lengths(&data), "size {size}");
        assert!(got.stats.segments >= 5, "size {size}: {:?}", got.stats);
        assert_eq!(
            (got.stats.rechunked_bytes, got.stats.discarded_bytes),
            (0, 0),
            "size {size}"
        );
    }
}

/// Guards the speed of the merge, which exactness tests cannot see: on random data the
/// chains meet within a few chunks of each segment boundary, so bridges are short and
/// the sequential merge cuts next to nothing itself. A merge that failed to adopt chains
/// or bridges would still be exact, at sequential speed.
#[test]
fn resynchronisation_costs_a_few_chunks_per_segment_on_random_data() {
    let data = random_bytes(14, 1 << 20);
    for kind in ChunkerKind::ALL {
        let config = valid_config(kind, (256, 1024, 4096), 2);
        let segment_size = 64 << 10;
        let stats = assert_exact(&config, &data, 2, segment_size);
        assert_eq!(stats.segments, 16, "{config:?}");
        assert!(
            stats.rechunked_bytes * 8 <= data.len() as u64
                && stats.discarded_bytes * 8 <= data.len() as u64,
            "{config:?}: {stats:?}"
        );
        // Bridges, cut in parallel, do the resynchronising; the merge almost never.
        assert!(
            stats.merge_chunked_bytes * 4 <= stats.rechunked_bytes,
            "{config:?}: {stats:?}"
        );
    }
}

/// Long zero runs give only maximal chunks, from whatever position they start: chains
/// that start off the true chain never meet it inside the run. The merge then cuts the
/// run itself, and stays exact.
#[test]
fn chains_that_never_meet_degrade_to_sequential_and_stay_exact() {
    let mut data = random_bytes(15, 10_000);
    data.resize(200_000, 0);
    data.extend(random_bytes(16, 10_000));
    for kind in ChunkerKind::ALL {
        let config = valid_config(kind, (256, 1024, 4096), 2);
        for segment_size in [4097, 10_001, 33_333] {
            assert_exact(&config, &data, 3, segment_size);
            assert_streamed_exact(&config, &data, 3, segment_size, &[50_000, 4096, 70_001]);
        }
    }
}

#[test]
fn one_thread_runs_the_sequential_path() {
    let data = random_bytes(17, 300_000);
    for kind in ChunkerKind::ALL {
        let config = valid_config(kind, (256, 1024, 4096), 2);
        let stats = assert_exact(&config, &data, 1, 1000);
        assert_eq!(
            stats,
            ParallelStats {
                segments: 1,
                ..ParallelStats::default()
            },
            "{config:?}"
        );
    }
}

/// Real files (as `benches/parallel.rs` reads them), at the default 2/8/64 KiB, 2 and
/// 4 threads: zero dirty chunks, whole and in engine-like blocks. Skipped where the
/// system has no files to read.
#[test]
fn real_files_have_no_dirty_chunks() {
    let data = real_files::gather(&[
        real_files::Source {
            dir: "/usr/lib",
            bytes: 6 << 20,
        },
        real_files::Source {
            dir: "/usr/share",
            bytes: 2 << 20,
        },
    ]);
    if data.is_empty() {
        eprintln!(
            "real_files_have_no_dirty_chunks: no files under /usr/lib or /usr/share; skipped"
        );
        return;
    }
    for kind in ChunkerKind::ALL {
        let config = valid_config(kind, (2048, 8192, 65536), 2);
        let chunker = build(&config);
        let sequential = chunker.chunk_lengths(&data);
        for threads in [2, 4] {
            let default_segments = ParallelChunker::new(chunker.as_ref(), pool(threads));
            let small_segments = default_segments.with_segment_size(segment(100_003));
            for parallel in [&default_segments, &small_segments] {
                let got = parallel.chunk_lengths(&data);
                assert_eq!(
                    dirty_chunks(&sequential, &got.lengths),
                    0,
                    "{config:?}, {threads} threads, segments of {}",
                    parallel.segment_size()
                );
                assert_eq!(got.lengths, sequential);
                eprintln!(
                    "{}: {threads} threads, segments of {}: {:?}",
                    kind.name(),
                    parallel.segment_size(),
                    got.stats
                );
            }
        }
        assert_streamed_exact(&config, &data, 2, 100_003, &[3 << 20]);
    }
}
