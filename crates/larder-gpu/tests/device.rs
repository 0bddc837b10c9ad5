//! Differential tests of the device path against the CPU path (issue 8, acceptance 1):
//! cut points and fingerprints, over 1,000 chunk-size and input-length cases on random
//! data and on real data when `LARDER_GPU_REAL_DATA` names a file. They run whenever a
//! GPU can be opened and are skipped with the reason printed otherwise;
//! LARDER_REQUIRE_GPU=1 turns the skip into a failure (for GPU machines).

use larder_chunk::{CandidateChunker, Chunker};
use larder_gpu::{Gpu, GpuChunkerHasher, GpuConfig};
use larder_hash::HashAlgo;

fn open() -> Option<Gpu> {
    match Gpu::open(0) {
        Ok(gpu) => Some(gpu),
        Err(e) => {
            let required = std::env::var("LARDER_REQUIRE_GPU").is_ok_and(|v| v == "1");
            assert!(!required, "LARDER_REQUIRE_GPU=1 but no GPU: {e}");
            eprintln!("SKIPPED: {e}");
            None
        }
    }
}

fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// The device path's chunks of `data`, fed in `piece`-byte pushes, against FastCDC 2020
/// and the CPU fingerprints.
fn check(
    gpu: &Gpu,
    data: &[u8],
    sizes: (usize, usize, usize),
    level: u8,
    algo: HashAlgo,
    config: GpuConfig,
    piece: usize,
) {
    let (min, avg, max) = sizes;
    let chunker = CandidateChunker::new(min, avg, max, level);
    let mut hasher = GpuChunkerHasher::new(gpu, chunker, max, algo, config).unwrap();
    let mut got = Vec::new();
    for part in data.chunks(piece.max(1)) {
        got.extend(hasher.push(part).unwrap());
    }
    got.extend(hasher.finish().unwrap().0);
    let lengths = chunker.sequential().chunk_lengths(data);
    let ctx = format!(
        "{} bytes, sizes {sizes:?}, level {level}, {}, {config:?}, pieces of {piece}",
        data.len(),
        algo.name()
    );
    assert_eq!(
        got.iter().map(|c| c.len).collect::<Vec<_>>(),
        lengths,
        "cut points: {ctx}"
    );
    let mut at = 0;
    for c in &got {
        assert_eq!(
            c.fingerprint,
            algo.fingerprint(&data[at..at + c.len]),
            "fingerprint at {at}: {ctx}"
        );
        at += c.len;
    }
}

#[test]
fn thousand_cases_equal_the_cpu_path() {
    let Some(gpu) = open() else { return };
    let real = std::env::var("LARDER_GPU_REAL_DATA")
        .ok()
        .map(|p| std::fs::read(p).unwrap());
    let mut rng = 0x5eed_u64;
    let mut next = |n: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % n
    };
    for case in 0..1000u64 {
        let avg = 1usize << (8 + next(9));
        let sizes = (
            avg / 4 * next(2) as usize,
            avg,
            avg * (2 + next(7) as usize),
        );
        let len = match next(4) {
            0 => next(4096) as usize,
            1 => next(1 << 20) as usize,
            _ => next(8 << 20) as usize,
        };
        let data = match &real {
            Some(real) if case % 2 == 1 => {
                let start = next(real.len().saturating_sub(len).max(1) as u64) as usize;
                real[start..(start + len).min(real.len())].to_vec()
            }
            _ => noise(len, case),
        };
        let config = GpuConfig {
            block_size: [1 << 16, 1 << 20, 4 << 20][next(3) as usize].max(sizes.2),
            stretch: [64, 4096, 65_536][next(3) as usize],
            slots: 1 + next(16) as usize,
            streams: 2 + next(3) as usize,
            ..GpuConfig::default()
        };
        let algo = HashAlgo::ALL[case as usize % 3];
        let level = next(4) as u8;
        check(
            &gpu,
            &data,
            sizes,
            level,
            algo,
            config,
            1 + next(3 << 20) as usize,
        );
    }
}

#[test]
fn zero_runs_and_tiny_pushes_equal_the_cpu_path() {
    let Some(gpu) = open() else { return };
    let mut data = noise(3 << 20, 1);
    data[1 << 20..2 << 20].fill(0);
    let config = GpuConfig {
        block_size: 1 << 16,
        ..GpuConfig::default()
    };
    for piece in [1, 47, 48, 1000, 1 << 16, 1 << 22] {
        check(
            &gpu,
            &data[..(piece * 300).min(data.len())],
            (2048, 8192, 65536),
            2,
            HashAlgo::Blake3,
            config,
            piece,
        );
    }
    // The empty stream has no chunk.
    let chunker = CandidateChunker::new(2048, 8192, 65536, 2);
    let hasher = GpuChunkerHasher::new(&gpu, chunker, 65536, HashAlgo::Blake3, config).unwrap();
    assert!(hasher.finish().unwrap().0.is_empty());
}
