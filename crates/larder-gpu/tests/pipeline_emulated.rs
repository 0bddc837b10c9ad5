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

/// One hasher, several streams one after another (`end_stream` between them): each is
/// chunked as if it were alone, with its slots reused.
#[test]
fn streams_back_to_back_are_each_chunked_alone() {
    use larder_chunk::{CandidateChunker, Chunker};
    use larder_gpu::ChunkerHasher;

    let data = noise(3 << 20, 7);
    let config = GpuConfig {
        block_size: 1 << 18,
        stretch: 4096,
        slots: 4,
        streams: 3,
    };
    let chunker = CandidateChunker::new(2048, 8192, 65536, 2);
    let mut hasher =
        ChunkerHasher::new(&EmulatedDevice, chunker, 65536, HashAlgo::Blake3, config).unwrap();
    // Streams of 1 MiB + 5, an empty one, 100 bytes and the rest, pushed in odd pieces.
    let bounds = [0, (1 << 20) + 5, (1 << 20) + 5, (1 << 20) + 105, data.len()];
    for w in bounds.windows(2) {
        let stream = &data[w[0]..w[1]];
        let mut got = Vec::new();
        for part in stream.chunks(300_001) {
            got.extend(hasher.push(part).unwrap());
        }
        got.extend(hasher.end_stream().unwrap());
        let lengths: Vec<usize> = got.iter().map(|c| c.len).collect();
        assert_eq!(lengths, chunker.sequential().chunk_lengths(stream), "{w:?}");
        let mut at = 0;
        for c in &got {
            assert_eq!(
                c.fingerprint,
                HashAlgo::Blake3.fingerprint(&stream[at..at + c.len])
            );
            at += c.len;
        }
    }
}
