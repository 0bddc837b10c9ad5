//! Differential tests of the GPU pipeline against the CPU path:
//! cut points and fingerprints over 1,000 cases of chunk sizes, levels, input lengths,
//! block sizes, stretches, slots, streams, push sizes and hashes, on random data and,
//! when `LARDER_GPU_REAL_DATA` names a file, on slices of it for every other case.
//! They run whenever a GPU opens and print SKIPPED with the reason otherwise;
//! LARDER_REQUIRE_GPU=1 turns the skip into a failure (for GPU machines).

mod common;

use common::{cases, check, noise, Case};
use larder_gpu::{Gpu, GpuConfig};
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

#[test]
fn thousand_cases_equal_the_cpu_path() {
    let Some(gpu) = open() else { return };
    let real = std::env::var("LARDER_GPU_REAL_DATA")
        .ok()
        .map(|p| std::fs::read(p).unwrap());
    for case in cases(1000, 8 << 20, real.as_deref()) {
        check(&gpu, &case);
    }
}

#[test]
fn zero_runs_and_large_blocks_equal_the_cpu_path() {
    let Some(gpu) = open() else { return };
    let mut data = noise(300 << 20, 1);
    data[10 << 20..60 << 20].fill(0);
    for algo in HashAlgo::ALL {
        let case = Case {
            data: data.clone(),
            sizes: (2048, 8192, 65536),
            level: 2,
            algo,
            config: GpuConfig::default(),
            piece: 100 << 20,
        };
        check(&gpu, &case);
    }
}
