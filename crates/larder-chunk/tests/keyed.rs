//! The keyed chunker against its reference: a sequential, position-by-position
//! transcription of `docs/design/chunking.md` (section `keyed`), with no batching, no
//! reuse of AES outputs and no run skipping, over random keys, sizes, levels and data
//! with zero runs, runs of other bytes, short periods and repeated blocks. Also: every
//! AES backend gives the same cuts, the statistics the design promises (anchor density,
//! cut probability), and that the key, not the content alone, decides the cuts.

#[allow(dead_code)]
#[path = "support/inputs.rs"]
mod inputs;

use std::sync::Arc;

use inputs::{random_bytes, text_like, XorShift64Star};
use larder_chunk::{keyed_thresholds, Chunker, ChunkerConfig, ChunkerKind, KeyedCdc};
use larder_crypto::{AesBackend, WindowPrf};
use proptest::prelude::*;

#[derive(Debug, Clone, Copy)]
struct Sizes {
    min: usize,
    avg: usize,
    max: usize,
    level: u8,
}

/// The window of position `i`: the 16 bytes ending at it.
fn window(data: &[u8], i: usize) -> &[u8; 16] {
    data[i - 15..=i].try_into().unwrap()
}

/// The natural-anchor test, written out again from the design doc.
fn natural(data: &[u8], i: usize) -> bool {
    let word = u32::from_le_bytes(data[i - 3..=i].try_into().unwrap());
    word.wrapping_mul(0x9E37_79B1) >> 27 == 31
}

/// The length of the chunk at the start of `data`, position by position.
fn reference_len(prf: &WindowPrf, s: Sizes, data: &[u8]) -> usize {
    let len = data.len();
    if len <= s.min {
        return len;
    }
    let end = len.min(s.max);
    let center = s.avg.min(end);
    let t = keyed_thresholds(s.avg, s.level);
    let mut anchor: Option<(usize, [u8; 16])> = None;
    for i in s.min - 1..end - 1 {
        let is_anchor = match anchor {
            None => true,
            Some((a, _)) => natural(data, i) || i - a == 16,
        };
        if is_anchor {
            anchor = Some((i, prf.stage1_block(window(data, i))));
        }
        let (a, block) = anchor.unwrap();
        assert!(i - a < 16);
        if u32::from(block[i - a]) < t.t1 {
            let t2 = if i + 1 < center {
                t.t2_strict
            } else {
                t.t2_loose
            };
            if u64::from(prf.stage2(window(data, i))) < t2 {
                return i + 1;
            }
        }
    }
    end
}

fn reference_lengths(prf: &WindowPrf, s: Sizes, mut data: &[u8]) -> Vec<usize> {
    let mut lengths = Vec::new();
    while !data.is_empty() {
        let len = reference_len(prf, s, data);
        lengths.push(len);
        data = &data[len..];
    }
    lengths
}

fn chunker(prf: Arc<WindowPrf>, s: Sizes) -> KeyedCdc {
    KeyedCdc::new(prf, s.min, s.avg, s.max, s.level)
}

fn assert_matches_reference(secret: &[u8; 32], s: Sizes, data: &[u8], what: &str) {
    let prf = Arc::new(WindowPrf::from_secret(secret));
    let want = reference_lengths(&prf, s, data);
    let got = chunker(prf, s).chunk_lengths(data);
    if got != want {
        let first = got.iter().zip(&want).take_while(|(g, w)| g == w).count();
        let offset: usize = want[..first].iter().sum();
        panic!(
            "{what}, {s:?}: chunk {first} at offset {offset} is {:?}, reference {:?}",
            got.get(first),
            want.get(first)
        );
    }
}

/// Data made of pieces that stress the anchors: random bytes, zero runs (natural at
/// every position), runs of a byte whose word is not natural (forced anchors with
/// equal windows), short periods, and repeats of earlier data.
fn mixed_data(seed: u64, len: usize) -> Vec<u8> {
    let mut rng = XorShift64Star::new(seed);
    let mut data = Vec::with_capacity(len + 4096);
    while data.len() < len {
        let piece = 1 + rng.below(3000);
        match rng.below(6) {
            0 => data.extend(random_bytes(rng.next_u64(), piece)),
            1 => data.resize(data.len() + piece, 0),
            2 => {
                let byte = [0xff, 0x41, 0x20, 0x01][rng.below(4)];
                data.resize(data.len() + piece, byte);
            }
            3 => {
                let period = random_bytes(rng.next_u64(), 1 + rng.below(40));
                data.extend(period.iter().cycle().take(piece));
            }
            4 if !data.is_empty() => {
                let from = rng.below(data.len());
                let take = piece.min(data.len() - from);
                data.extend_from_within(from..from + take);
            }
            _ => data.extend(text_like(rng.next_u64(), piece)),
        }
    }
    data.truncate(len);
    data
}

/// Sizes small enough for many chunks a case, with high cut probabilities (avg 256 at
/// level 3 passes one position in 8 through stage 1) as well as the default.
fn sizes() -> impl Strategy<Value = Sizes> {
    prop_oneof![
        Just((64usize, 256usize, 1024usize)),
        Just((64, 300, 1024)),
        Just((100, 256, 2000)),
        Just((256, 1024, 4096)),
        Just((1000, 1000, 1024)),
        Just((64, 1000, 1024)),
        Just((2048, 8192, 65536)),
        (64usize..600, 0usize..2000, 0usize..5000).prop_map(|(min, extra, more)| {
            let avg = (min + extra).max(256);
            (min, avg, (avg + more).max(1024))
        }),
    ]
    .prop_flat_map(|(min, avg, max)| {
        (0..=3u8).prop_map(move |level| Sizes {
            min,
            avg,
            max,
            level,
        })
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn fast_equals_reference_on_mixed_data(
        secret in any::<[u8; 32]>(),
        s in sizes(),
        seed in any::<u64>(),
        len in 0usize..40_000,
    ) {
        assert_matches_reference(&secret, s, &mixed_data(seed, len), "mixed data");
    }

    #[test]
    fn fast_equals_reference_on_random_data(
        secret in any::<[u8; 32]>(),
        s in sizes(),
        data in proptest::collection::vec(any::<u8>(), 0..20_000),
    ) {
        assert_matches_reference(&secret, s, &data, "random data");
    }
}

/// Runs of zeros, spaces and 0xff of every length around the run-skipping threshold
/// and the batch size, starting at every phase relative to the chunk's minimum and
/// average, under many keys: the run skip must judge the first loose candidate inside
/// a run, wherever the switch from strict to loose falls.
#[test]
fn runs_across_the_strict_to_loose_switch() {
    let s = Sizes {
        min: 64,
        avg: 256,
        max: 1024,
        level: 3,
    };
    for key in 0..64u8 {
        for run in [
            15, 16, 17, 31, 32, 33, 47, 48, 100, 255, 256, 257, 600, 5000,
        ] {
            for before in [0, 1, 50, 63, 100, 190, 250, 300] {
                let byte = [0, b' ', 0xff][usize::from(key) % 3];
                let mut data = random_bytes(u64::from(key) << 16 | before as u64, before);
                data.resize(before + run, byte);
                data.extend(random_bytes(7, 700));
                assert_matches_reference(&[key; 32], s, &data, "run");
            }
        }
    }
}

#[test]
fn uniform_and_periodic_inputs() {
    for key in 0..2u8 {
        for s in [
            Sizes {
                min: 64,
                avg: 256,
                max: 1024,
                level: 3,
            },
            Sizes {
                min: 2048,
                avg: 8192,
                max: 65536,
                level: 2,
            },
        ] {
            for byte in [0u8, 0xff, 0x41] {
                assert_matches_reference(&[key; 32], s, &vec![byte; 100_000], "uniform");
            }
            for period in (1..=20).chain([31, 32, 33, 64]) {
                let pattern = random_bytes(u64::from(key) * 100 + period as u64, period);
                let data: Vec<u8> = pattern.iter().copied().cycle().take(50_000).collect();
                assert_matches_reference(&[key; 32], s, &data, "periodic");
            }
        }
    }
}

#[test]
fn every_aes_backend_gives_the_same_cuts() {
    let data = mixed_data(3, 2 << 20);
    let s = Sizes {
        min: 2048,
        avg: 8192,
        max: 65536,
        level: 2,
    };
    let secret = [0x77; 32];
    let mut results = Vec::new();
    for backend in AesBackend::ALL.into_iter().filter(|b| b.is_supported()) {
        let prf = Arc::new(WindowPrf::from_secret_on(&secret, backend).unwrap());
        results.push((backend, chunker(prf, s).chunk_lengths(&data)));
    }
    for (backend, lengths) in &results {
        assert_eq!(lengths, &results[0].1, "{backend:?}");
    }
    let portable = WindowPrf::from_secret_on(&secret, AesBackend::Portable).unwrap();
    assert_eq!(results[0].1, reference_lengths(&portable, s, &data));
}

#[test]
fn the_config_builds_the_same_chunker() {
    let data = mixed_data(4, 300_000);
    let prf = Arc::new(WindowPrf::from_secret(&[5; 32]));
    let config = ChunkerConfig {
        kind: ChunkerKind::Keyed,
        min_size: 512,
        avg_size: 2048,
        max_size: 16384,
        level: 1,
        seed: 0,
    };
    let s = Sizes {
        min: 512,
        avg: 2048,
        max: 16384,
        level: 1,
    };
    assert_eq!(
        config.build_keyed(prf.clone()).chunk_lengths(&data),
        reference_lengths(&prf, s, &data)
    );
}

/// Natural anchors are one position in 32 on random data, so with forced ones an AES
/// block serves about 12.7 positions (`32 (1 - (31/32)^16)`).
#[test]
fn natural_anchor_density_is_one_in_32_on_random_data() {
    let data = random_bytes(31, 1 << 20);
    let naturals = (3..data.len()).filter(|&i| natural(&data, i)).count();
    let density = naturals as f64 / (data.len() - 3) as f64;
    assert!((density - 1.0 / 32.0).abs() < 0.0015, "{density}");
}

/// The run skip relies on it: a run of one byte has no natural position.
#[test]
fn no_run_of_one_byte_is_natural() {
    for b in 0..=255u8 {
        assert!(!natural(&[b; 4], 3), "byte {b:#04x}");
    }
}

/// On random data every position is judged independently with FastCDC's
/// probabilities, so chunks at level 2 average close to FastCDC 2020's at the same
/// sizes (`tests/chunk_sizes.rs` checks the exact mean at level 0). Over 6,000 chunks a
/// case: each mean has a sampling error near 1.3%.
#[test]
fn mean_chunk_sizes_follow_fastcdc_probabilities() {
    let data = random_bytes(32, 8 << 20);
    let prf = Arc::new(WindowPrf::from_secret(&[9; 32]));
    let mean = |chunker: &dyn Chunker| {
        let lengths = chunker.chunk_lengths(&data);
        let whole = &lengths[..lengths.len() - 1];
        whole.iter().sum::<usize>() as f64 / whole.len() as f64
    };
    for (min, avg, max) in [(256, 1024, 8192), (512, 2048, 16384)] {
        let keyed = KeyedCdc::new(prf.clone(), min, avg, max, 2);
        let fastcdc = larder_chunk::FastCdc2020::new(min, avg, max, 2);
        let (k, f) = (mean(&keyed), mean(&fastcdc));
        assert!(
            (k - f).abs() / f < 0.04,
            "{min}/{avg}/{max}: keyed {k}, fastcdc {f}"
        );
    }
}

/// The cuts depend on the key: two keys cut the same data differently, while one key
/// cuts repeated content alike (the point of deduplication).
#[test]
fn cuts_depend_on_the_key_and_repeat_with_the_content() {
    let block = random_bytes(40, 500_000);
    let s = Sizes {
        min: 2048,
        avg: 8192,
        max: 65536,
        level: 2,
    };
    let a = chunker(Arc::new(WindowPrf::from_secret(&[1; 32])), s);
    let b = chunker(Arc::new(WindowPrf::from_secret(&[2; 32])), s);
    assert_ne!(a.chunk_lengths(&block), b.chunk_lengths(&block));
    let mut twice = block.clone();
    twice.extend_from_slice(&block);
    let lengths = a.chunk_lengths(&twice);
    let ends: Vec<usize> = lengths
        .iter()
        .scan(0, |end, &len| {
            *end += len;
            Some(*end)
        })
        .collect();
    let first: Vec<usize> = ends.iter().copied().filter(|&e| e < 400_000).collect();
    let second: Vec<usize> = ends
        .iter()
        .filter(|&&e| e > 600_000 && e < 900_000)
        .map(|&e| e - 500_000)
        .collect();
    // Once resynchronised, the second copy is cut where the first was.
    assert!(!second.is_empty() && second.iter().all(|e| first.contains(e)));
}
