//! Every content-defined chunker against a slow model written from its specification
//! (`docs/design/chunking.md`), independently of the implementation: each model
//! recomputes its hash from scratch over the window of every candidate cut, with no
//! rolling and no tables of its own, and states the cut rule declaratively.

#[path = "support/inputs.rs"]
mod inputs;

use inputs::{random_bytes, text_like};
use larder_chunk::{
    ae_window, AdlerCdc, AsymmetricExtremum, Chunker, ChunkerConfig, ChunkerKind, FastCdc2016,
    FastCdc2020, GearCdc, RabinCdc, ADLER_MODULUS, ADLER_RESIDUE, ADLER_TABLE, ADLER_WINDOW,
    AE_VALUE_BYTES, GEAR, MASKS, RABIN_POLYNOMIAL, RABIN_RESIDUE, RABIN_WINDOW,
};
use proptest::prelude::*;

#[derive(Debug, Clone, Copy)]
struct Sizes {
    min: usize,
    avg: usize,
    max: usize,
}

const fn sizes(min: usize, avg: usize, max: usize) -> Sizes {
    Sizes { min, avg, max }
}

/// Splits a whole stream with a model's `next_chunk_len`.
fn model_lengths(mut data: &[u8], next: impl Fn(&[u8]) -> usize) -> Vec<usize> {
    let mut lengths = Vec::new();
    while !data.is_empty() {
        let len = next(data);
        assert!((1..=data.len()).contains(&len), "model returned {len}");
        lengths.push(len);
        data = &data[len..];
    }
    lengths
}

/// The cut rule of Rabin, Adler and Gear: the chunk ends at the shortest length `len`
/// in `max(min, 1)..min(data.len(), max)` whose window (its last `window` bytes, or all
/// of them if fewer) is a cut; else at `min(data.len(), max)`.
fn first_window_cut(data: &[u8], s: Sizes, window: usize, is_cut: impl Fn(&[u8]) -> bool) -> usize {
    let end = data.len().min(s.max);
    (s.min.max(1)..end)
        .find(|&len| is_cut(&data[len.saturating_sub(window)..len]))
        .unwrap_or(end)
}

// ---- Rabin ----

/// LBFS's polynomial, written out here rather than imported.
const LBFS_POLYNOMIAL: u64 = 0xbfe6_b8a5_bf37_8d83;

/// The window as a polynomial over GF(2) modulo `LBFS_POLYNOMIAL`, by Horner's rule one
/// bit at a time: `fp = fp * x + bit`, subtracting the polynomial whenever the degree
/// reaches 63.
fn rabin_fingerprint(window: &[u8]) -> u64 {
    let mut fp = 0u64;
    for &byte in window {
        for bit in (0..8).rev() {
            fp = (fp << 1) | u64::from((byte >> bit) & 1);
            if fp >> 63 == 1 {
                fp ^= LBFS_POLYNOMIAL;
            }
        }
    }
    fp
}

fn rabin_model(data: &[u8], s: Sizes) -> usize {
    first_window_cut(data, s, 48, |window| {
        rabin_fingerprint(window) % s.avg as u64 == 0x78
    })
}

// ---- Adler ----

/// `A[b]`: the top 16 bits of `GEAR[b]` modulo 65521.
fn adler_a(byte: u8) -> u64 {
    (GEAR[usize::from(byte)] >> 48) % 65521
}

/// `S2 * 2^16 + S1` from the definitions: `S1` sums `A` over the window, `S2` weights
/// the `j`-th of `n` bytes by `n - j + 1`.
fn adler_hash(window: &[u8]) -> u64 {
    let n = window.len();
    let s1: u64 = window.iter().map(|&b| adler_a(b)).sum::<u64>() % 65521;
    let s2: u64 = window
        .iter()
        .enumerate()
        .map(|(j, &b)| (n - j) as u64 * adler_a(b))
        .sum::<u64>()
        % 65521;
    (s2 << 16) | s1
}

fn largest_prime_at_most(n: usize) -> usize {
    (2..=n)
        .rev()
        .find(|&p| (2..p).take_while(|d| d * d <= p).all(|d| p % d != 0))
        .expect("a prime below n")
}

fn adler_model(data: &[u8], s: Sizes) -> usize {
    let divisor = largest_prime_at_most(s.avg) as u64;
    first_window_cut(data, s, 48, |window| adler_hash(window) % divisor == 0x78)
}

// ---- Gear ----

/// `sum of GEAR[b] << k` over the window, `k` counting back from its last byte: the Gear
/// hash with every older byte shifted out.
fn gear_hash(window: &[u8]) -> u64 {
    window
        .iter()
        .rev()
        .enumerate()
        .fold(0u64, |h, (k, &b)| h.wrapping_add(GEAR[usize::from(b)] << k))
}

fn gear_model(data: &[u8], s: Sizes) -> usize {
    let bits = s.avg.trailing_zeros() as usize;
    first_window_cut(data, s, bits, |window| {
        gear_hash(window) & (s.avg as u64 - 1) == 0
    })
}

// ---- AE ----

/// The 8 bytes ending at `p` as a big-endian integer, missing bytes (before the data)
/// read as zeros.
fn ae_value(data: &[u8], p: usize) -> u64 {
    let from = p.saturating_sub(7);
    let mut bytes = [0u8; 8];
    bytes[8 - (p + 1 - from)..].copy_from_slice(&data[from..=p]);
    u64::from_be_bytes(bytes)
}

/// AE stated declaratively: scanning from position `min`, the chunk ends after the first
/// position `p` such that `m = p - w` is the first position where the maximum of the
/// values over `min..=p` occurs.
fn ae_model(data: &[u8], s: Sizes) -> usize {
    let end = data.len().min(s.max);
    if end <= s.min {
        return end;
    }
    let w = (s.avg as f64 / (std::f64::consts::E - 1.0)).round() as usize;
    let values: Vec<u64> = (s.min..end).map(|p| ae_value(data, p)).collect();
    (w..values.len())
        .find(|&q| {
            let m = q - w;
            values[m + 1..=q].iter().all(|&v| v <= values[m])
                && values[..m].iter().all(|&v| v < values[m])
        })
        .map_or(end, |q| s.min + q + 1)
}

// ---- FastCDC ----

/// Algorithm 1 of the FastCDC paper in one loop, for any minimum: the hash starts at
/// byte `min`; judging byte `i` (strict mask before the average size, relaxed after)
/// ends the chunk before byte `i`, so byte 0 is never a cut. `pairs` is the 2020 form,
/// which judges only bytes below the stretch's even length.
fn fastcdc_model(data: &[u8], s: Sizes, level: u8, pairs: bool) -> usize {
    if data.len() <= s.min {
        return data.len();
    }
    let bits = (s.avg as f64).log2().round() as usize;
    let level = usize::from(level);
    let (strict, relaxed) = (MASKS[bits + level], MASKS[bits - level]);
    let end = data.len().min(s.max);
    let center = s.avg.min(end);
    let judged = if pairs { end & !1 } else { end };
    let mut hash = 0u64;
    for i in s.min..judged {
        hash = (hash << 1).wrapping_add(GEAR[usize::from(data[i])]);
        let mask = if i < center { strict } else { relaxed };
        if i > 0 && hash & mask == 0 {
            return i;
        }
    }
    end
}

/// A model's `next_chunk_len`.
type Model = fn(&[u8], Sizes) -> usize;

/// Each kind's chunker and model for one set of sizes.
fn chunker_and_model(kind: ChunkerKind, s: Sizes) -> (Box<dyn Chunker>, Model) {
    let chunker: Box<dyn Chunker> = match kind {
        ChunkerKind::Rabin => Box::new(RabinCdc::new(s.min, s.avg, s.max)),
        ChunkerKind::Adler => Box::new(AdlerCdc::new(s.min, s.avg, s.max)),
        ChunkerKind::Gear => Box::new(GearCdc::new(s.min, s.avg, s.max)),
        ChunkerKind::Ae => Box::new(AsymmetricExtremum::new(s.min, s.avg, s.max)),
        other => panic!("no window model for {other:?}"),
    };
    let model: Model = match kind {
        ChunkerKind::Rabin => rabin_model,
        ChunkerKind::Adler => adler_model,
        ChunkerKind::Gear => gear_model,
        _ => ae_model,
    };
    (chunker, model)
}

const BASELINES: [ChunkerKind; 4] = [
    ChunkerKind::Rabin,
    ChunkerKind::Adler,
    ChunkerKind::Gear,
    ChunkerKind::Ae,
];

fn assert_matches_model(kind: ChunkerKind, s: Sizes, data: &[u8]) {
    let (chunker, model) = chunker_and_model(kind, s);
    let expected = model_lengths(data, |d| model(d, s));
    let actual = chunker.chunk_lengths(data);
    if expected != actual {
        let first = expected
            .iter()
            .zip(&actual)
            .position(|(e, a)| e != a)
            .unwrap_or(expected.len().min(actual.len()));
        panic!(
            "{kind:?} {s:?} on {} bytes: chunk {first} is {:?}, model says {:?}",
            data.len(),
            actual.get(first),
            expected.get(first)
        );
    }
}

fn assert_fastcdc_matches_model(s: Sizes, level: u8, data: &[u8]) {
    let l2016 = FastCdc2016::new(s.min, s.avg, s.max, level).chunk_lengths(data);
    let m2016 = model_lengths(data, |d| fastcdc_model(d, s, level, false));
    assert_eq!(
        l2016,
        m2016,
        "FastCdc2016 {s:?} level {level}, {} bytes",
        data.len()
    );
    if [s.min, s.avg, s.max].iter().all(|n| n % 2 == 0) {
        let l2020 = FastCdc2020::new(s.min, s.avg, s.max, level).chunk_lengths(data);
        let m2020 = model_lengths(data, |d| fastcdc_model(d, s, level, true));
        assert_eq!(
            l2020,
            m2020,
            "FastCdc2020 {s:?} level {level}, {} bytes",
            data.len()
        );
    }
}

#[test]
fn public_constants_are_the_specified_ones() {
    assert_eq!(RABIN_POLYNOMIAL, LBFS_POLYNOMIAL);
    assert_eq!((RABIN_WINDOW, RABIN_RESIDUE), (48, 0x78));
    assert_eq!(
        (ADLER_WINDOW, ADLER_MODULUS, ADLER_RESIDUE),
        (48, 65521, 0x78)
    );
    for b in 0..=255u8 {
        assert_eq!(u64::from(ADLER_TABLE[usize::from(b)]), adler_a(b), "A[{b}]");
    }
    assert_eq!(AE_VALUE_BYTES, 8);
    for avg in [256, 1000, 8192, 12345, 4 << 20] {
        let w = (avg as f64 / (std::f64::consts::E - 1.0)).round() as usize;
        assert_eq!(ae_window(avg), w, "avg {avg}");
        assert_eq!(AsymmetricExtremum::new(0, avg, 4 << 20).window(), w);
    }
    assert_eq!(AdlerCdc::new(0, 8192, 65536).divisor(), 8191);
    assert_eq!(GearCdc::new(0, 8192, 65536).window(), 13);
}

/// Known answers of the model's arithmetic: a short window is its own bytes as a
/// polynomial; `x^63` reduces to the polynomial minus its leading term.
#[test]
fn rabin_fingerprint_model_known_answers() {
    assert_eq!(rabin_fingerprint(&[]), 0);
    assert_eq!(rabin_fingerprint(&[0x12, 0x34]), 0x1234);
    assert_eq!(rabin_fingerprint(&[0, 0, 0x12, 0x34]), 0x1234);
    assert_eq!(
        rabin_fingerprint(&[0x80, 0, 0, 0, 0, 0, 0, 0]),
        LBFS_POLYNOMIAL ^ (1 << 63)
    );
}

/// Lengths around every size that matters, on data that cuts often (random), never
/// (constant) and in between (text), for the papers' sizes and small ones.
#[test]
fn baselines_match_their_models_at_boundary_lengths() {
    let random = random_bytes(11, 140_000);
    let text = text_like(12, 140_000);
    let zeros = vec![0u8; 140_000];
    let all_sizes = [
        sizes(0, 256, 1024),
        sizes(1, 256, 1024),
        sizes(47, 256, 1024),
        sizes(48, 256, 1024),
        sizes(49, 512, 2048),
        sizes(256, 256, 1024),
        sizes(1024, 1024, 1024),
        sizes(100, 2048, 8192),
    ];
    for kind in BASELINES {
        for s in all_sizes {
            let mut lengths = vec![0, 1, 2, 3, 47, 48, 49];
            for base in [s.min, s.avg, s.max, 2 * s.max] {
                lengths.extend(base.saturating_sub(2)..=base + 2);
            }
            for data in [&random, &text, &zeros] {
                for &len in &lengths {
                    assert_matches_model(kind, s, &data[..len]);
                }
            }
        }
    }
}

/// The papers' sizes on longer streams: many chunks, and zeros, whose constant window
/// hash makes every chunk alike.
#[test]
fn baselines_match_their_models_on_long_streams() {
    let random = random_bytes(13, 400_001);
    let text = text_like(14, 200_001);
    let zeros = vec![0u8; 3 * 65536 + 7];
    for kind in BASELINES {
        for s in [sizes(2048, 8192, 65536), sizes(0, 4096, 16384)] {
            assert_matches_model(kind, s, &random);
            assert_matches_model(kind, s, &text);
            assert_matches_model(kind, s, &zeros);
        }
    }
}

#[test]
fn fastcdc_matches_its_model_at_small_minimums() {
    let random = random_bytes(15, 100_001);
    let text = text_like(16, 50_001);
    for s in [
        sizes(0, 256, 1024),
        sizes(2, 256, 1024),
        sizes(0, 8192, 65536),
        sizes(1, 300, 1025),
        sizes(63, 1000, 4001),
    ] {
        for level in 0..=3 {
            for len in [0, 1, 2, 3, 4, 5, 255, 256, 257, 1023, 1024, 1025] {
                assert_fastcdc_matches_model(s, level, &random[..len]);
            }
            assert_fastcdc_matches_model(s, level, &random);
            assert_fastcdc_matches_model(s, level, &text);
        }
    }
}

/// Min 0 hashes byte 0 but never cuts before it. Regression guard: judging byte 0 like
/// any other would return an empty chunk whenever its hash alone passes the strict mask,
/// which `GEAR[192]` does at 256 bytes, level 0.
#[test]
fn fastcdc_min_zero_never_returns_an_empty_chunk() {
    let cases: Vec<(usize, u8, u8)> = [256, 512, 1024]
        .into_iter()
        .flat_map(|avg| (0..=3u8).map(move |level| (avg, level)))
        .flat_map(|(avg, level)| {
            let (strict, _) = larder_chunk::select_masks(avg, level);
            (0..=255u8)
                .filter(move |&b| GEAR[usize::from(b)] & strict == 0)
                .map(move |b| (avg, level, b))
        })
        .collect();
    assert!(!cases.is_empty(), "no byte passes a strict mask alone");
    for (avg, level, byte) in cases {
        let s = sizes(0, avg, 4 * avg);
        let mut data = random_bytes(17, 3 * s.max + 1);
        data[0] = byte;
        for chunker in [
            Box::new(FastCdc2016::new(s.min, s.avg, s.max, level)) as Box<dyn Chunker>,
            Box::new(FastCdc2020::new(s.min, s.avg, s.max, level)),
        ] {
            let first = chunker.next_chunk_len(&data);
            assert!((1..=s.max).contains(&first), "{s:?} level {level}: {first}");
        }
        assert_fastcdc_matches_model(s, level, &data);
    }
}

/// Sizes for the proptests: minimums from 0 (often) to the average, and lengths
/// around the minimum and maximum as well as random ones.
fn sizes_and_data(power_of_two_avg: bool) -> impl Strategy<Value = (Sizes, Vec<u8>)> {
    let avg = if power_of_two_avg {
        prop_oneof![Just(256usize), Just(512), Just(1024)].boxed()
    } else {
        (256usize..=1500).boxed()
    };
    (avg, 0usize..=3, 0usize..=2048)
        .prop_flat_map(|(avg, min_kind, extra_max)| {
            let min = match min_kind {
                0 => Just(0).boxed(),
                1 => (0usize..=64).boxed(),
                _ => (0usize..=avg).boxed(),
            };
            (min, Just(avg), Just((avg + extra_max).max(1024)))
        })
        .prop_flat_map(|(min, avg, max)| {
            let len = prop_oneof![
                0..3 * max,
                Just(min.saturating_sub(1)),
                Just(min),
                Just(min + 1),
                Just(max),
                Just(max + 1),
            ];
            (Just(sizes(min, avg, max)), len, any::<u64>(), any::<bool>())
        })
        .prop_map(|(s, len, seed, tiny_alphabet)| {
            let mut data = random_bytes(seed, len);
            if tiny_alphabet {
                data.iter_mut().for_each(|b| *b %= 3);
            }
            (s, data)
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn prop_rabin_matches_model((s, data) in sizes_and_data(true)) {
        assert_matches_model(ChunkerKind::Rabin, s, &data);
    }

    #[test]
    fn prop_gear_matches_model((s, data) in sizes_and_data(true)) {
        assert_matches_model(ChunkerKind::Gear, s, &data);
    }

    #[test]
    fn prop_adler_matches_model((s, data) in sizes_and_data(false)) {
        assert_matches_model(ChunkerKind::Adler, s, &data);
    }

    #[test]
    fn prop_ae_matches_model((s, data) in sizes_and_data(false)) {
        assert_matches_model(ChunkerKind::Ae, s, &data);
    }

    #[test]
    fn prop_fastcdc_small_minimums_match_model((s, data) in sizes_and_data(false), level in 0u8..=3) {
        assert_fastcdc_matches_model(s, level, &data);
    }

    /// Built through `ChunkerConfig`, as a repository does.
    #[test]
    fn prop_configs_build_the_modelled_chunker((s, data) in sizes_and_data(true), k in 0usize..4) {
        let kind = BASELINES[k];
        let config = ChunkerConfig { kind, min_size: s.min, avg_size: s.avg, max_size: s.max, level: 2, seed: 0 };
        config.validate().expect("strategy sizes are valid");
        let (_, model) = chunker_and_model(kind, s);
        prop_assert_eq!(
            config.build().chunk_lengths(&data),
            model_lengths(&data, |d| model(d, s))
        );
    }
}
