//! The scan kernel's decomposition, emulated thread by thread on the CPU
//! (`stretch::emulate_scan`) and decoded as the device path decodes it, equals
//! `CandidateChunker::scan` of the same range: stretch bounds, warm-up, slot overflow
//! and the host rescan are exact without a GPU.

#[path = "support/noise.rs"]
mod noise;

use larder_chunk::{CandidateChunker, WINDOW};
use larder_gpu::stretch::{decode, emulate_scan, ScanLayout};
use noise::noise;
use proptest::prelude::*;

/// Emulated scan + decode of `from..end`, against the portable scan; returns how many
/// stretches overflowed.
fn check(
    data: &[u8],
    chunker: &CandidateChunker,
    from: usize,
    stretch: usize,
    slots: usize,
) -> usize {
    let mut expected = Vec::new();
    chunker.scan(data, from..data.len(), &mut expected);
    let Some(layout) = ScanLayout::new(from, data.len(), stretch, slots) else {
        assert!(expected.is_empty());
        return 0;
    };
    let output = emulate_scan(data, &layout, chunker.masks());
    let mut got = Vec::new();
    let rescanned = decode(data, &layout, chunker, &output, &mut got);
    assert_eq!(got, expected, "from {from} stretch {stretch} slots {slots}");
    rescanned
}

#[test]
fn stretches_of_every_size_equal_the_portable_scan() {
    let data = noise(200_000, 3);
    let chunker = CandidateChunker::new(2048, 8192, 65536, 2);
    for stretch in [1, 2, 47, 48, 49, 1000, 4096, 65_536, 300_000] {
        for from in [WINDOW - 1, WINDOW, 1000, 199_999] {
            check(&data, &chunker, from, stretch, 16);
        }
    }
}

#[test]
fn overflowing_slots_are_rescanned_exactly() {
    // Small averages find many candidates; one slot overflows nearly every stretch.
    let data = noise(100_000, 11);
    let chunker = CandidateChunker::new(64, 256, 1024, 3);
    let rescanned = check(&data, &chunker, WINDOW - 1, 4096, 1);
    assert!(
        rescanned > 10,
        "only {rescanned} stretches overflowed: the test lost its point"
    );
    // Zeros: the window hash is a constant, so either every byte is a candidate or none.
    let zeros = vec![0u8; 50_000];
    for avg in [256, 1024, 8192, 65536] {
        check(
            &zeros,
            &CandidateChunker::new(avg / 4, avg, avg * 8, 1),
            WINDOW - 1,
            512,
            4,
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]
    #[test]
    fn emulated_kernel_equals_portable_scan(
        len in 48usize..20_000,
        seed in any::<u64>(),
        from_frac in 0.0f64..1.0,
        stretch in 1usize..3000,
        slots in 1usize..20,
        avg_log in 6u32..14,
        level in 0u8..4,
    ) {
        let data = noise(len, seed);
        let avg = 1usize << avg_log;
        let chunker = CandidateChunker::new(avg / 4, avg, avg * 8, level);
        let from = (WINDOW - 1) + ((len - WINDOW) as f64 * from_frac) as usize;
        check(&data, &chunker, from, stretch, slots);
    }
}
