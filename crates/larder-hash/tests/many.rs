//! `Blake3Batch` against `blake3::hash` and `blake3::keyed_hash`, message by message:
//! every length class of BLAKE3's tree (empty, inside one block, one chunk exactly,
//! one byte past it, powers of two of chunks and one either side, odd numbers of
//! chunks), mixed in one batch so that lanes hold different messages, on the detected
//! SIMD platform and on the portable one.

use larder_hash::{Blake3Batch, Fingerprint, HashAlgo};
use proptest::prelude::*;

const KEY: [u8; 32] = [0x5a; 32];

/// `len` pseudo-random bytes from `seed` (BLAKE3's extendable output), so that no two
/// chunks of a message are alike.
fn bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut out = vec![0u8; len];
    let mut hasher = blake3::Hasher::new();
    hasher.update(&seed.to_le_bytes());
    hasher.finalize_xof().fill(&mut out);
    out
}

fn boundary_lengths() -> Vec<usize> {
    let mut lengths = vec![0, 1, 63, 64, 65, 1000];
    for chunks in [1usize, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 64] {
        let n = chunks * 1024;
        lengths.extend([n - 1, n, n + 1, n + 64, n + 1023]);
    }
    lengths
}

/// The hash a batcher must equal, message by message.
type Reference = fn(&[u8]) -> [u8; 32];

/// Every batcher: unkeyed and keyed, SIMD and portable, with the reference hash.
fn batchers() -> Vec<(&'static str, Blake3Batch, Reference)> {
    vec![
        ("unkeyed", Blake3Batch::new(), |m| {
            *blake3::hash(m).as_bytes()
        }),
        ("unkeyed portable", Blake3Batch::new().portable(), |m| {
            *blake3::hash(m).as_bytes()
        }),
        ("keyed", Blake3Batch::keyed(&KEY), |m| {
            *blake3::keyed_hash(&KEY, m).as_bytes()
        }),
        ("keyed portable", Blake3Batch::keyed(&KEY).portable(), |m| {
            *blake3::keyed_hash(&KEY, m).as_bytes()
        }),
    ]
}

fn check(messages: &[Vec<u8>]) {
    let refs: Vec<&[u8]> = messages.iter().map(Vec::as_slice).collect();
    for (name, batch, reference) in batchers() {
        let got = batch.hash(&refs);
        assert_eq!(got.len(), refs.len(), "{name}");
        for (message, hash) in refs.iter().zip(&got) {
            assert_eq!(*hash, reference(message), "{name}, {} bytes", message.len());
        }
    }
}

#[test]
fn every_length_class_matches_blake3_alone_and_mixed() {
    let lengths = boundary_lengths();
    let messages: Vec<Vec<u8>> = lengths
        .iter()
        .enumerate()
        .map(|(i, &len)| bytes(len, i as u64))
        .collect();
    // Each alone (one lane), then all in one batch, then in reverse order.
    for message in &messages {
        check(std::slice::from_ref(message));
    }
    check(&messages);
    let reversed: Vec<Vec<u8>> = messages.iter().rev().cloned().collect();
    check(&reversed);
    check(&[]);
}

#[test]
fn fingerprint_many_and_batch_equal_one_at_a_time() {
    let messages: Vec<Vec<u8>> = (0..600).map(|i| bytes(i * 37 % 20_000, i as u64)).collect();
    let refs: Vec<&[u8]> = messages.iter().map(Vec::as_slice).collect();
    for algo in HashAlgo::ALL {
        let one: Vec<Fingerprint> = refs.iter().map(|m| algo.fingerprint(m)).collect();
        assert_eq!(algo.fingerprint_many(&refs), one, "{algo:?}");
        assert_eq!(algo.fingerprint_batch(&refs), one, "{algo:?}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn random_batches_match_blake3(lengths in proptest::collection::vec(0usize..40_000, 0..24), seed in any::<u64>()) {
        let messages: Vec<Vec<u8>> = lengths
            .iter()
            .enumerate()
            .map(|(i, &len)| bytes(len, seed.wrapping_add(i as u64)))
            .collect();
        check(&messages);
    }
}
