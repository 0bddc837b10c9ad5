//! The two-pass form of FastCDC 2020 (`CandidateChunker`: a scan for candidate cut
//! points, then the selection among them) gives exactly `FastCdc2020`'s cut points, on
//! random and text-like data with zero runs, at every normalization level and over a
//! range of sizes down to a zero minimum; and a scan split into segments (as a device
//! scans them, each from the `WINDOW - 1` bytes before it) equals the scan of the whole.

// Each test binary uses part of the shared inputs.
#[allow(dead_code)]
#[path = "support/inputs.rs"]
mod inputs;

use inputs::{random_bytes, text_like, XorShift64Star};
use larder_chunk::{chunk_block_sequential, CandidateChunker, Chunker, WINDOW};
use proptest::prelude::*;

fn candidates(c: &CandidateChunker, data: &[u8]) -> Vec<larder_chunk::Candidate> {
    let mut out = Vec::new();
    c.scan(data, 0..data.len(), &mut out);
    out
}

fn check(data: &[u8], (min, avg, max): (usize, usize, usize), level: u8) {
    let c = CandidateChunker::new(min, avg, max, level);
    let sequential = c.sequential();
    let found = candidates(&c, data);
    let (lengths, consumed) = c.select(data, &found, true);
    assert_eq!(consumed, data.len());
    assert_eq!(
        lengths,
        sequential.chunk_lengths(data),
        "whole stream, sizes {min}/{avg}/{max} level {level}, {} bytes",
        data.len()
    );
    let (block, block_consumed) = c.select(data, &found, false);
    let (expected, expected_consumed) = chunk_block_sequential(&sequential, data, false);
    assert_eq!(
        (block, block_consumed),
        (expected, expected_consumed),
        "block"
    );
}

/// Data made of random or text-like stretches and zero runs.
fn mixed(seed: u64, len: usize) -> Vec<u8> {
    let mut rng = XorShift64Star::new(seed);
    let mut data = Vec::with_capacity(len);
    while data.len() < len {
        let take = (rng.below(40_000) + 1).min(len - data.len());
        match rng.below(3) {
            0 => data.extend(random_bytes(rng.next_u64(), take)),
            1 => data.extend(text_like(rng.next_u64(), take)),
            _ => data.extend(std::iter::repeat_n(0u8, take)),
        }
    }
    data
}

#[test]
fn default_sizes_at_every_level_on_mixed_data() {
    for level in 0..=3 {
        for seed in 0..4 {
            check(&mixed(seed, 600_000), (2048, 8192, 65536), level);
        }
    }
}

#[test]
fn every_short_length_around_the_minimum_and_the_window() {
    let data = mixed(9, 4096);
    for len in 0..700 {
        check(&data[..len], (256, 512, 2048), 2);
        check(&data[..len], (0, 64, 256), 1);
    }
}

#[test]
fn scan_of_segments_equals_scan_of_the_whole() {
    let data = mixed(3, 300_000);
    let c = CandidateChunker::new(2048, 8192, 65536, 2);
    let whole = candidates(&c, &data);
    for segment in [1, WINDOW - 1, WINDOW, 4093, 65536] {
        let mut parts = Vec::new();
        for start in (0..data.len()).step_by(segment) {
            c.scan(&data, start..(start + segment).min(data.len()), &mut parts);
        }
        assert_eq!(parts, whole, "segments of {segment}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn any_sizes_and_level_give_fastcdc2020s_cuts(
        seed in any::<u64>(),
        len in 0usize..200_000,
        min_half in 0usize..2048,
        avg_extra in 32usize..8192,
        max_extra in 0usize..65536,
        level in 0u8..=3,
        odd in any::<(bool, bool, bool)>(),
    ) {
        // Odd sizes too: both judge pairs from `min & !1`.
        let min = min_half * 2 + usize::from(odd.0);
        // Masks exist for averages of 64 B to 16 MiB at every level (2^(6+3)).
        let avg = (min + avg_extra * 2).max(512) + usize::from(odd.1);
        let max = avg + max_extra * 2 + usize::from(odd.2);
        check(&mixed(seed, len), (min, avg, max), level);
    }
}

/// The hash FastCDC judges at `data[end - 1]`, hashing from `data[0]`.
fn gear_hash(data: &[u8]) -> u64 {
    data.iter().fold(0u64, |h, &b| {
        (h << 1).wrapping_add(larder_chunk::GEAR[usize::from(b)])
    })
}

#[test]
fn the_last_judged_byte_before_a_full_window_is_rehashed() {
    // A chunk whose byte at min + WINDOW - 2 matches the strict mask on the 47 bytes
    // hashed so far, while the window hash there (which also takes in the byte
    // before min) does not: only re-hashing that offset finds the cut.
    let (min, avg, max) = (2048, 8192, 65536);
    let c = CandidateChunker::new(min, avg, max, 2);
    let (mask_s, _) = c.masks();
    assert_ne!(
        mask_s & (1 << 47),
        0,
        "the test needs bit 47 in the strict mask"
    );
    let odd = (0..=255u8)
        .find(|&b| larder_chunk::GEAR[usize::from(b)] & 1 == 1)
        .unwrap();
    let mut rng = XorShift64Star::new(5);
    let mut data = random_bytes(1, 3 * max);
    // Re-draw the bytes from `min` on until the first judged offset that matches is
    // min + WINDOW - 2, the last one hashed on fewer than WINDOW bytes.
    loop {
        for b in &mut data[min..min + WINDOW - 1] {
            *b = rng.next_u64() as u8;
        }
        let first_match = (1..WINDOW).find(|&n| gear_hash(&data[min..min + n]) & mask_s == 0);
        if first_match == Some(WINDOW - 1) {
            break;
        }
    }
    data[min - 1] = odd;
    let window = gear_hash(&data[min - 1..min + WINDOW - 1]);
    assert_ne!(window & mask_s, 0, "the window hash must not match here");
    let expected = c.sequential().chunk_lengths(&data);
    assert_eq!(
        expected[0],
        min + WINDOW - 2,
        "the sequential cut is the crafted one"
    );
    check(&data, (min, avg, max), 2);
}

#[test]
fn with_a_zero_minimum_the_first_byte_is_hashed_but_never_a_cut() {
    // First bytes whose hash alone matches the strict mask: a chunk of 0 bytes would
    // be cut if byte 0 were judged.
    let c = CandidateChunker::new(0, 512, 2048, 0);
    let (mask_s, _) = c.masks();
    let matching: Vec<u8> = (0..=255u8)
        .filter(|&b| larder_chunk::GEAR[usize::from(b)] & mask_s == 0)
        .collect();
    assert!(!matching.is_empty(), "no byte value matches on its own");
    for &b in &matching {
        let mut data = mixed(u64::from(b), 10_000);
        data[0] = b;
        check(&data, (0, 512, 2048), 0);
    }
}
