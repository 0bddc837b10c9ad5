//! The parameters mean what they say: on random data, every chunker's mean chunk size
//! is within [`TOLERANCE`] of what `docs/design/chunking.md` promises.
//!
//! - Rabin, Adler and FastCDC at normalization level 0 judge each position with
//!   probability `1/D` after skipping the minimum, so chunks average `min + D`, less a
//!   negligible share cut off by `max` (`max = 8 avg` here). `D` is `avg` itself for
//!   Rabin and FastCDC (powers of two), and the largest prime not above `avg` for
//!   Adler (within 1% of `avg` for every average below).
//! - Plain Gear averages `min + 1.052 avg`: its judged bits are all zero with
//!   probability `0.9502 / avg`, not `1 / avg`, because only 121 of the 256 `GEAR`
//!   entries are even. [`gear_cut_probability`] computes it exactly.
//! - The keyed chunker at level 0 cuts each judged position with probability `1/avg`
//!   exactly (its thresholds are not rounded to a power of two), so it averages
//!   `min + avg - 1`; its minimum is raised to 64 where a case asks less.
//! - AE averages `min + 1.037 avg` (see `src/ae.rs`: `w = avg / (e - 1)` and a mean of
//!   about `1.781 w`), plus up to 7 bytes when `min < 7`: the values at positions
//!   below 7 have leading zero bytes and are almost never the maximum.
//!
//! Each case cuts enough random bytes for over 10,000 chunks, which puts the sampling
//! error near 1%; the inputs are fixed, so the outcome is deterministic.

// Shared with the other test files; this one needs only `random_bytes`.
#[allow(dead_code)]
#[path = "support/inputs.rs"]
mod inputs;

use std::sync::Arc;

use inputs::random_bytes;
use larder_chunk::{ChunkerConfig, ChunkerKind, GEAR, KEYED_MIN_SIZE};
use larder_crypto::WindowPrf;

/// Largest allowed relative difference between the measured and the promised mean.
const TOLERANCE: f64 = 0.03;

/// AE's mean chunk size beyond the minimum, as a multiple of `avg`: `1.781 / (e - 1)`.
const AE_MEAN_FACTOR: f64 = 1.037;

/// Plain Gear's mean distance between cuts, as a multiple of `avg`.
const GEAR_MEAN_FACTOR: f64 = 1.052;

/// The probability that the lowest `bits` bits of the Gear hash of `bits` uniformly
/// random bytes are all zero: the distribution of `h mod 2^bits`, rolled one byte at a
/// time over every `GEAR` entry.
fn gear_cut_probability(bits: u32) -> f64 {
    let modulus = 1usize << bits;
    let mut distribution = vec![0.0; modulus];
    distribution[0] = 1.0;
    for _ in 0..bits {
        let mut next = vec![0.0; modulus];
        for (h, &p) in distribution.iter().enumerate() {
            if p > 0.0 {
                for &g in &GEAR {
                    next[((h << 1) + (g as usize % modulus)) % modulus] += p / 256.0;
                }
            }
        }
        distribution = next;
    }
    distribution[0]
}

#[test]
fn gear_mean_factor_is_exact() {
    for bits in [8, 9, 10, 13] {
        let factor = 1.0 / (gear_cut_probability(bits) * f64::from(1u32 << bits));
        assert!(
            (factor - GEAR_MEAN_FACTOR).abs() < 0.001,
            "2^{bits}: mean distance {factor} avg"
        );
    }
    assert_eq!(GEAR.iter().filter(|&&g| g % 2 == 0).count(), 121);
}

fn promised_mean(kind: ChunkerKind, min: usize, avg: usize) -> f64 {
    let avg = avg as f64;
    match kind {
        ChunkerKind::Ae => min.max(7) as f64 + AE_MEAN_FACTOR * avg,
        ChunkerKind::Gear => min as f64 + GEAR_MEAN_FACTOR * avg,
        ChunkerKind::Fixed => avg,
        _ => min as f64 + avg,
    }
}

fn measured_mean(config: &ChunkerConfig, data: &[u8]) -> (f64, usize) {
    let prf = Arc::new(WindowPrf::from_secret(&[0x21; 32]));
    let lengths = config.build_keyed(prf).chunk_lengths(data);
    // The last chunk is cut by the end of the data, not by the chunker.
    let whole = &lengths[..lengths.len() - 1];
    let total: usize = whole.iter().sum();
    (total as f64 / whole.len() as f64, whole.len())
}

#[test]
fn mean_chunk_size_is_what_the_parameters_promise() {
    let data = random_bytes(21, 16 << 20);
    let mut failures = Vec::new();
    for kind in ChunkerKind::ALL {
        for (min, avg) in [(0usize, 512usize), (256, 1024), (64, 700)] {
            // The keyed chunker's windows need 64 bytes.
            let min = match kind {
                ChunkerKind::Keyed => min.max(KEYED_MIN_SIZE),
                _ => min,
            };
            let power_of_two_only = matches!(
                kind,
                ChunkerKind::Rabin
                    | ChunkerKind::Gear
                    | ChunkerKind::Fastcdc2016
                    | ChunkerKind::Fastcdc2020
            );
            if power_of_two_only && !avg.is_power_of_two() {
                continue;
            }
            let config = ChunkerConfig {
                kind,
                min_size: min,
                avg_size: avg,
                max_size: 8 * avg,
                level: 0,
                seed: 0,
            };
            config.validate().expect("test sizes are valid");
            let (mean, chunks) = measured_mean(&config, &data);
            let promised = promised_mean(kind, min, avg);
            assert!(chunks > 10_000, "{config:?}: only {chunks} chunks");
            let error = (mean - promised).abs() / promised;
            if error > TOLERANCE {
                failures.push(format!(
                    "  {kind:?} {min}/{avg}/{}: mean {mean:.1}, promised {promised:.1} \
                     ({:+.1}%)",
                    8 * avg,
                    100.0 * (mean - promised) / promised
                ));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "mean chunk sizes off by more than {}%:\n{}",
        100.0 * TOLERANCE,
        failures.join("\n")
    );
}
