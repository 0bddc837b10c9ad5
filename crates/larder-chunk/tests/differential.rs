//! Differential tests: larder's FastCDC against the `fastcdc` crate 5.0.0, whose
//! `v2016` and `v2020` cut points larder's [`FastCdc2016`] and [`FastCdc2020`] are
//! defined to equal (for the sizes that crate accepts: `min >= 64`); `FastCdc2020`
//! against `FastCdc2016`; and the [`Chunker`] contract for every [`ChunkerKind`].
//! `tests/reference_models.rs` checks each algorithm against an independent model.

#[path = "support/inputs.rs"]
mod inputs;

use fastcdc::{v2016, v2020};
use inputs::{random_bytes, text_like, XorShift64Star};
use std::sync::Arc;

use larder_chunk::{Chunker, ChunkerConfig, ChunkerKind, FastCdc2016, FastCdc2020, KEYED_MIN_SIZE};
use larder_crypto::WindowPrf;
use proptest::prelude::*;

/// Chunk sizes in bytes, as `ChunkerConfig` and the `fastcdc` constructors take them.
#[derive(Debug, Clone, Copy)]
struct Sizes {
    min: usize,
    avg: usize,
    max: usize,
}

const fn sizes(min: usize, avg: usize, max: usize) -> Sizes {
    Sizes { min, avg, max }
}

/// Even sizes, valid for both forms: powers of two from the smallest the crate accepts
/// to 1 MiB chunks, degenerate ratios, and averages whose rounded log2 differs from
/// their floor (12000 and 6000 select the masks of 16 KiB and 8 KiB).
const EVEN_SIZES: [Sizes; 21] = [
    sizes(64, 256, 1024),
    sizes(64, 512, 4096),
    sizes(128, 256, 1024),
    sizes(256, 256, 1024),
    sizes(256, 1024, 4096),
    sizes(512, 2048, 8192),
    sizes(1024, 1024, 1024),
    sizes(1024, 4096, 16384),
    sizes(2048, 8192, 65536),
    sizes(2048, 8192, 8192),
    sizes(4096, 16384, 65536),
    sizes(8192, 32768, 131072),
    sizes(16384, 65536, 262144),
    sizes(65536, 262144, 1 << 20),
    sizes(64, 65536, 1 << 20),
    sizes(6000, 12000, 48000),
    sizes(2000, 6000, 24000),
    sizes(3000, 11000, 50000),
    sizes(1000, 3000, 9000),
    sizes(100, 300, 1024),
    sizes(4094, 8190, 65534),
];

/// Odd sizes. The 2020 form judges pairs from the even offset below an odd minimum, as
/// the crate does (its debug assertions refuse odd sizes, and are off in this
/// workspace's test profile), so it no longer equals the 2016 form there.
const ODD_SIZES: [Sizes; 6] = [
    sizes(1001, 3001, 9001),
    sizes(65, 257, 1025),
    sizes(777, 5555, 33333),
    sizes(2047, 8191, 65535),
    sizes(4096, 16384, 65535),
    sizes(4097, 16384, 65535),
];

/// `(offset, length)` of every chunk, in order: what the `fastcdc` iterators yield.
type Chunks = Vec<(usize, usize)>;

fn with_offsets(lengths: &[usize]) -> Chunks {
    let mut offset = 0;
    lengths
        .iter()
        .map(|&length| {
            let chunk = (offset, length);
            offset += length;
            chunk
        })
        .collect()
}

fn level_2016(level: u8) -> v2016::Normalization {
    match level {
        0 => v2016::Normalization::Level0,
        1 => v2016::Normalization::Level1,
        2 => v2016::Normalization::Level2,
        _ => v2016::Normalization::Level3,
    }
}

fn level_2020(level: u8) -> v2020::Normalization {
    match level {
        0 => v2020::Normalization::Level0,
        1 => v2020::Normalization::Level1,
        2 => v2020::Normalization::Level2,
        _ => v2020::Normalization::Level3,
    }
}

fn crate_2016(data: &[u8], s: Sizes, level: u8) -> Chunks {
    v2016::FastCDC::with_level(data, s.min, s.avg, s.max, level_2016(level))
        .map(|c| (c.offset, c.length))
        .collect()
}

fn crate_2020(data: &[u8], s: Sizes, level: u8) -> Chunks {
    crate_2020_seeded(data, s, level, 0)
        .into_iter()
        .map(|(offset, length, _)| (offset, length))
        .collect()
}

/// `(offset, length, hash)` of every chunk of the crate's `v2020` with `seed`.
fn crate_2020_seeded(data: &[u8], s: Sizes, level: u8, seed: u64) -> Vec<(usize, usize, u64)> {
    v2020::FastCDC::with_level_and_seed(data, s.min, s.avg, s.max, level_2020(level), seed)
        .map(|c| (c.offset, c.length, c.hash))
        .collect()
}

/// larder's `FastCdc2020` with `seed`, in the crate's terms, fingerprints included.
/// Where a chunk ends without a judged cut on an odd length, the crate (since 5.0.0)
/// folds the unjudged last byte into the fingerprint and larder, as the Remote
/// Execution API's vectors, does not: larder's value is converted to the crate's.
fn larder_2020_seeded(data: &[u8], s: Sizes, level: u8, seed: u64) -> Vec<(usize, usize, u64)> {
    let chunker = FastCdc2020::with_seed(s.min, s.avg, s.max, level, seed);
    let gear = |b: u8| larder_chunk::GEAR[usize::from(b)] ^ seed;
    let mut chunks = Vec::new();
    let mut offset = 0;
    while offset < data.len() {
        let rest = &data[offset..];
        let len = chunker.next_chunk_len(rest);
        let mut fingerprint = chunker.cut_fingerprint(rest, len);
        let forced = rest.len() > s.min && len == rest.len().min(s.max);
        if forced && len % 2 == 1 {
            fingerprint = (fingerprint << 1).wrapping_add(gear(rest[len - 1]));
        }
        chunks.push((offset, len, fingerprint));
        offset += len;
    }
    chunks
}

/// The config of `kind` at sizes `s`; the keyed chunker's minimum is raised to the
/// smallest it accepts.
fn config(kind: ChunkerKind, s: Sizes, level: u8) -> ChunkerConfig {
    let min_size = match kind {
        ChunkerKind::Keyed => s.min.max(KEYED_MIN_SIZE),
        _ => s.min,
    };
    let config = ChunkerConfig {
        kind,
        min_size,
        avg_size: s.avg,
        max_size: s.max,
        level,
        seed: 0,
    };
    config.validate().expect("test sizes must be valid");
    config
}

/// Any kind's chunker; the keyed one under a fixed test key.
fn build(config: &ChunkerConfig) -> Box<dyn Chunker> {
    config.build_keyed(Arc::new(WindowPrf::from_secret(&[0x17; 32])))
}

/// Panics at the first chunk where the two lists differ, naming it, rather than
/// printing thousands of chunks.
fn assert_same_chunks(what: &str, expected: &Chunks, actual: &Chunks) {
    if expected == actual {
        return;
    }
    let first = expected
        .iter()
        .zip(actual)
        .position(|(e, a)| e != a)
        .unwrap_or(expected.len().min(actual.len()));
    panic!(
        "{what}: chunk {first} differs: fastcdc crate {:?}, larder {:?} ({} vs {} chunks)",
        expected.get(first),
        actual.get(first),
        expected.len(),
        actual.len()
    );
}

/// The [`Chunker`] contract on a whole stream: lengths sum to the input, each is in
/// `1..=max`, and each but the last is at least `min`.
fn assert_contract(what: &str, data_len: usize, lengths: &[usize], min: usize, max: usize) {
    assert_eq!(
        lengths.iter().sum::<usize>(),
        data_len,
        "{what}: lengths do not cover the input"
    );
    for (i, &len) in lengths.iter().enumerate() {
        assert!(
            (1..=max).contains(&len),
            "{what}: chunk {i} has length {len}, outside 1..={max}"
        );
        assert!(
            len >= min || i + 1 == lengths.len(),
            "{what}: chunk {i} of {} has length {len} < min {min}",
            lengths.len()
        );
    }
}

/// `FastCdc2020` cuts where `FastCdc2016` does, except that it never judges the last
/// byte of an odd stretch: when the stream's final `R < max` bytes are odd in number,
/// 2016 may end with chunks `R - 1` and `1`, where 2020 ends with one chunk of `R`.
fn assert_2020_matches_2016(what: &str, l2016: &[usize], l2020: &[usize], max: usize) {
    if l2016 == l2020 {
        return;
    }
    let n = l2016.len();
    let odd_tail = n >= 2
        && l2020.len() == n - 1
        && l2016[..n - 2] == l2020[..n - 2]
        && l2016[n - 1] == 1
        && l2020[n - 2] == l2016[n - 2] + 1
        && l2020[n - 2] % 2 == 1
        && l2020[n - 2] < max;
    assert!(
        odd_tail,
        "{what}: FastCdc2020 differs from FastCdc2016 other than by the odd tail: \
         2016 ends {:?}, 2020 ends {:?}",
        &l2016[n.saturating_sub(3)..],
        &l2020[l2020.len().saturating_sub(3)..]
    );
}

/// Compares both forms with the crate at every level, checks the contract and, for
/// even sizes, the 2016/2020 relation.
fn check_all_levels(what: &str, data: &[u8], s: Sizes) {
    let even = [s.min, s.avg, s.max].iter().all(|n| n.is_multiple_of(2));
    for level in 0..=3 {
        let what = format!("{what}, {s:?}, level {level}, {} bytes", data.len());
        let l2016 = config(ChunkerKind::Fastcdc2016, s, level)
            .build()
            .chunk_lengths(data);
        assert_contract(&what, data.len(), &l2016, s.min, s.max);
        assert_same_chunks(
            &format!("FastCdc2016, {what}"),
            &crate_2016(data, s, level),
            &with_offsets(&l2016),
        );
        let l2020 = config(ChunkerKind::Fastcdc2020, s, level)
            .build()
            .chunk_lengths(data);
        assert_contract(&what, data.len(), &l2020, s.min & !1, s.max);
        assert_same_chunks(
            &format!("FastCdc2020, {what}"),
            &crate_2020(data, s, level),
            &with_offsets(&l2020),
        );
        if even {
            assert_2020_matches_2016(&what, &l2016, &l2020, s.max);
        }
    }
}

/// Long enough for dozens of average chunks and several maximal ones, capped so the
/// 1 MiB-chunk sizes stay fast in a debug build; odd, to reach the 2020 odd tail.
fn random_input_len(s: Sizes) -> usize {
    (24 * s.avg + 3 * s.max).min(3 << 20) | 1
}

#[test]
fn random_data_matches_fastcdc_crate_small_sizes() {
    for (i, &s) in EVEN_SIZES.iter().chain(&ODD_SIZES).enumerate() {
        if s.max <= 65536 {
            let data = random_bytes(1000 + i as u64, random_input_len(s));
            check_all_levels("random", &data, s);
        }
    }
}

#[test]
fn random_data_matches_fastcdc_crate_large_sizes() {
    for (i, &s) in EVEN_SIZES.iter().enumerate() {
        if s.max > 65536 {
            let data = random_bytes(2000 + i as u64, random_input_len(s));
            check_all_levels("random", &data, s);
        }
    }
}

/// Inputs on which a Gear hash behaves badly: constant runs reach a fixed point, short
/// periods repeat it, text uses few byte values.
fn low_entropy_inputs(len: usize) -> Vec<(&'static str, Vec<u8>)> {
    let mut rng = XorShift64Star::new(7);
    let block = random_bytes(8, 1000);
    vec![
        ("zeros", vec![0; len]),
        ("0xff", vec![0xff; len]),
        (
            "period 3",
            b"abc".iter().copied().cycle().take(len).collect(),
        ),
        (
            "period 1000 random block",
            block.iter().copied().cycle().take(len).collect(),
        ),
        ("text", text_like(9, len)),
        (
            "sparse",
            (0..len)
                .map(|_| {
                    if rng.below(64) == 0 {
                        rng.next_u64() as u8
                    } else {
                        0
                    }
                })
                .collect(),
        ),
        (
            "two symbols",
            (0..len).map(|_| b'0' + (rng.below(2) as u8)).collect(),
        ),
    ]
}

#[test]
fn low_entropy_data_matches_fastcdc_crate() {
    let inputs = low_entropy_inputs(256 << 10);
    for &s in EVEN_SIZES.iter().chain(&ODD_SIZES) {
        let len = (16 * s.avg + 2 * s.max).min(256 << 10);
        for (name, data) in &inputs {
            check_all_levels(name, &data[..len], s);
        }
    }
}

/// Real files, when present; each read up to `REAL_FILE_CAP` bytes. The test binary
/// itself is always there.
const REAL_FILES: [&str; 8] = [
    "/usr/bin/bash",
    "/usr/bin/perl",
    "/usr/lib/x86_64-linux-gnu/libc.so.6",
    "/usr/lib/aarch64-linux-gnu/libc.so.6",
    "/usr/share/dict/words",
    "/usr/share/common-licenses/GPL-3",
    "/etc/services",
    env!("CARGO"),
];

const REAL_FILE_CAP: usize = 1 << 20;

fn real_files() -> Vec<(String, Vec<u8>)> {
    let exe = std::env::current_exe().expect("path of the test binary");
    let paths = REAL_FILES.iter().map(std::path::PathBuf::from).chain([exe]);
    paths
        .filter_map(|path| {
            let mut data = std::fs::read(&path).ok()?;
            data.truncate(REAL_FILE_CAP);
            (!data.is_empty()).then(|| (path.display().to_string(), data))
        })
        .collect()
}

#[test]
fn real_files_match_fastcdc_crate() {
    let files = real_files();
    assert!(!files.is_empty(), "no real file could be read");
    let sizes = [
        sizes(64, 256, 1024),
        sizes(2048, 8192, 65536),
        sizes(6000, 12000, 48000),
        sizes(16384, 65536, 262144),
        sizes(1001, 3001, 9001),
    ];
    for (path, data) in &files {
        for s in sizes {
            check_all_levels(path, data, s);
        }
    }
}

/// Every kind, at lengths around each size that matters, obeys the contract; FixedSize
/// cuts exactly every `avg_size` bytes.
#[test]
fn chunker_contract_holds_at_boundary_lengths() {
    let data = random_bytes(3, 3 * 65536 + 7);
    for kind in ChunkerKind::ALL {
        for s in [
            sizes(64, 256, 1024),
            sizes(0, 256, 1024),
            sizes(2, 512, 2048),
            sizes(2048, 8192, 65536),
            sizes(1024, 1024, 1024),
        ] {
            for level in 0..=3 {
                let config = config(kind, s, level);
                let chunker = build(&config);
                assert_eq!(chunker.max_size(), config.max_chunk_size());
                let (min, max) = match kind {
                    ChunkerKind::Fixed => (s.avg, s.avg),
                    _ => (config.min_size, s.max),
                };
                for base in [0, 1, 2, s.min, s.avg, s.max, 2 * s.max, 3 * s.max] {
                    for len in base.saturating_sub(2)..=base + 2 {
                        let lengths = chunker.chunk_lengths(&data[..len]);
                        let what = format!("{config:?} on {len} bytes");
                        assert_contract(&what, len, &lengths, min, max);
                        assert_eq!(lengths.is_empty(), len == 0, "{what}");
                    }
                }
            }
        }
    }
}

/// Given at least `max_size` bytes, the cut never depends on how many more there are,
/// so a streaming caller may pass any buffer of at least `max_size` bytes.
#[test]
fn cut_ignores_bytes_past_max_size() {
    let data = random_bytes(4, 200_000);
    let zeros = vec![0u8; 200_000];
    for kind in ChunkerKind::ALL {
        for level in 0..=3 {
            let config = config(kind, sizes(2048, 8192, 65536), level);
            let chunker = build(&config);
            let max = chunker.max_size();
            for input in [&data, &zeros] {
                let full = chunker.next_chunk_len(input);
                for len in [max, max + 1, max + 2, 100_001] {
                    assert_eq!(
                        chunker.next_chunk_len(&input[..len]),
                        full,
                        "{config:?} with {len} bytes"
                    );
                }
            }
        }
    }
}

/// What a streaming caller (`larder-engine`) does: refill a buffer from pieces of the
/// stream until it holds at least `max_size` bytes or the stream has ended, cut one
/// chunk, drop it, repeat.
fn streamed_lengths(chunker: &dyn Chunker, data: &[u8], piece_seed: u64) -> Vec<usize> {
    let mut rng = XorShift64Star::new(piece_seed);
    let max = chunker.max_size();
    let (mut buffer, mut fed, mut lengths) = (Vec::new(), 0, Vec::new());
    loop {
        while buffer.len() < max && fed < data.len() {
            let piece = (1 + rng.below(3 * max)).min(data.len() - fed);
            buffer.extend_from_slice(&data[fed..fed + piece]);
            fed += piece;
        }
        if buffer.is_empty() {
            return lengths;
        }
        let len = chunker.next_chunk_len(&buffer);
        lengths.push(len);
        buffer.drain(..len);
    }
}

/// Streaming in pieces, with at least `max_size` bytes buffered before each cut (or
/// the end of the stream), gives the cuts of the whole stream in memory.
#[test]
fn streaming_gives_the_same_cuts_as_the_whole_stream() {
    let random = random_bytes(5, 300_001);
    let low_entropy = low_entropy_inputs(100_001);
    for kind in ChunkerKind::ALL {
        for s in [
            sizes(0, 256, 1024),
            sizes(64, 512, 4096),
            sizes(2048, 8192, 65536),
        ] {
            let config = config(kind, s, 2);
            let chunker = build(&config);
            let inputs = [("random", &random)]
                .into_iter()
                .chain(low_entropy.iter().map(|(name, data)| (*name, data)));
            for (seed, (name, data)) in inputs.enumerate() {
                let whole = chunker.chunk_lengths(data);
                let streamed = streamed_lengths(chunker.as_ref(), data, seed as u64);
                assert_eq!(streamed, whole, "{config:?} on {name}");
            }
        }
    }
}

/// The one documented difference between the forms really occurs, and the crate's
/// `v2020` shares it: the final odd stretch of a stream is one chunk in 2020 where 2016
/// may cut it one byte before its end.
#[test]
fn fastcdc2020_keeps_an_odd_final_stretch_whole() {
    let s = sizes(64, 256, 1024);
    let (c2016, c2020) = (
        FastCdc2016::new(s.min, s.avg, s.max, 1),
        FastCdc2020::new(s.min, s.avg, s.max, 1),
    );
    let found = (0..10_000u64).find_map(|seed| {
        let data = random_bytes(seed, 501);
        (c2016.next_chunk_len(&data) == 500).then_some(data)
    });
    let data = found.expect("some seed makes FastCdc2016 cut one byte before the end");
    assert_eq!(c2016.chunk_lengths(&data), vec![500, 1]);
    assert_eq!(c2020.chunk_lengths(&data), vec![501]);
    assert_eq!(crate_2020(&data, s, 1), vec![(0, 501)]);
}

/// Valid sizes, rounded down to even where `even`.
fn valid_sizes(even: bool) -> impl Strategy<Value = Sizes> {
    (64usize..=4096, 0usize..=8192, 0usize..=16384).prop_map(move |(min, extra_avg, extra_max)| {
        let avg = (min + extra_avg).max(256);
        let max = (avg + extra_max).max(1024);
        let round = |n: usize| if even { n & !1 } else { n };
        sizes(round(min), round(avg), round(max))
    })
}

/// Random bytes, or bytes from a tiny alphabet, which makes long cut-free runs and
/// hash fixed points likely.
fn stream() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..60_000),
        proptest::collection::vec(0u8..3, 0..60_000),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn prop_fastcdc2016_matches_crate(data in stream(), s in valid_sizes(false), level in 0u8..=3) {
        let lengths = FastCdc2016::new(s.min, s.avg, s.max, level).chunk_lengths(&data);
        assert_contract("FastCdc2016", data.len(), &lengths, s.min, s.max);
        assert_same_chunks("FastCdc2016", &crate_2016(&data, s, level), &with_offsets(&lengths));
    }

    #[test]
    fn prop_fastcdc2020_matches_crate_and_2016(data in stream(), s in valid_sizes(true), level in 0u8..=3) {
        let l2020 = FastCdc2020::new(s.min, s.avg, s.max, level).chunk_lengths(&data);
        assert_contract("FastCdc2020", data.len(), &l2020, s.min, s.max);
        assert_same_chunks("FastCdc2020", &crate_2020(&data, s, level), &with_offsets(&l2020));
        let l2016 = FastCdc2016::new(s.min, s.avg, s.max, level).chunk_lengths(&data);
        assert_2020_matches_2016("FastCdc2020 vs FastCdc2016", &l2016, &l2020, s.max);
    }

    /// Any sizes, odd ones included, and any seed: the crate's chunks and the Gear
    /// value it reports with each; and with even sizes the seeded 2016 form cuts alike.
    #[test]
    fn prop_seeded_fastcdc2020_matches_crate_with_fingerprints(
        data in stream(),
        s in valid_sizes(false),
        level in 0u8..=3,
        seed in prop_oneof![Just(0u64), Just(666), any::<u64>()],
    ) {
        let larder = larder_2020_seeded(&data, s, level, seed);
        prop_assert_eq!(&larder, &crate_2020_seeded(&data, s, level, seed));
        let lengths: Vec<usize> = larder.iter().map(|c| c.1).collect();
        assert_contract("seeded FastCdc2020", data.len(), &lengths, s.min & !1, s.max);
        let even = [s.min, s.avg, s.max].iter().all(|n| n.is_multiple_of(2));
        if even {
            let l2016 = FastCdc2016::with_seed(s.min, s.avg, s.max, level, seed).chunk_lengths(&data);
            assert_2020_matches_2016("seeded FastCdc2020 vs FastCdc2016", &l2016, &lengths, s.max);
        }
    }
}
