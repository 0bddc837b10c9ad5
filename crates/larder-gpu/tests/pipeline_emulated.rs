//! The pipeline (slots, warm-up, leftovers, carried candidates, offsets) on the CPU
//! emulation of the device (`EmulatedDevice`): the same code the GPU runs, checked
//! against the CPU path without a GPU. Zero runs overflow the scan's slots.

mod common;

use common::{cases, check, noise, Case};
use larder_gpu::{EmulatedDevice, GpuConfig};
use larder_hash::HashAlgo;

#[test]
fn emulated_pipeline_equals_the_cpu_path() {
    for case in cases(400, 1 << 20, None) {
        check(&EmulatedDevice, &case);
    }
}

#[test]
fn zero_runs_tiny_pushes_and_tiny_blocks() {
    let mut data = noise(600_000, 1);
    data[100_000..400_000].fill(0);
    for (block_size, piece) in [
        (1, 1000),
        (47, 47),
        (48, 4096),
        (4096, 1),
        (1 << 16, 100_000),
        (1 << 20, 1 << 20),
    ] {
        let config = GpuConfig {
            block_size,
            stretch: 512,
            slots: 2,
            streams: 2,
        };
        let len = if block_size < 48 || piece == 1 {
            200_000
        } else {
            data.len()
        };
        for algo in HashAlgo::ALL {
            let case = Case {
                data: data[..len].to_vec(),
                sizes: (2048, 8192, 65536),
                level: 2,
                algo,
                config,
                piece,
            };
            check(&EmulatedDevice, &case);
        }
    }
    let empty = Case {
        data: Vec::new(),
        sizes: (0, 256, 1024),
        level: 0,
        algo: HashAlgo::Blake3,
        config: GpuConfig::default(),
        piece: 1,
    };
    check(&EmulatedDevice, &empty);
}
