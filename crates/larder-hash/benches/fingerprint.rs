//! Fingerprinting backup-sized chunks: BLAKE3 one chunk at a time (`blake3::hash`, what
//! a crate user writes), across chunks (`Blake3Batch`, what stage 2 of a backup does),
//! keyed likewise, SHA-256 one at a time, and BLAKE3 of the whole buffer at once (the
//! single-thread peak). The chunks are FastCDC 2020's at 2/8/64 KiB (the `fastcdc`
//! crate's cut points) over the chunking benchmarks' corpus: 64 MiB of real files
//! from `/usr/lib` and `/usr/share`, or `LARDER_BENCH_CORPUS=FILE`.
//!
//! `cargo bench -p larder-hash --bench fingerprint -- --warm-up-time 1 --measurement-time 5`

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use larder_hash::Blake3Batch;

/// The chunking benchmarks' corpus: 64 MiB of real files, or `LARDER_BENCH_CORPUS`.
#[path = "../../larder-chunk/benches/support/corpus.rs"]
mod corpus;

fn bench_fingerprints(c: &mut Criterion) {
    let data = corpus::corpus();
    let chunks: Vec<&[u8]> = fastcdc::v2020::FastCDC::with_level(
        &data,
        2048,
        8192,
        65536,
        fastcdc::v2020::Normalization::Level2,
    )
    .map(|chunk| &data[chunk.offset..chunk.offset + chunk.length])
    .collect();
    let key = [7u8; 32];
    let mut group = c.benchmark_group("fingerprint-2k8k64k");
    group.throughput(Throughput::Bytes(data.len() as u64));
    group.sample_size(10);
    group.bench_function("blake3-one-at-a-time", |b| {
        b.iter(|| {
            let chunks = black_box(&chunks);
            chunks
                .iter()
                .fold(0u8, |x, c| x ^ blake3::hash(c).as_bytes()[0])
        })
    });
    group.bench_function("blake3-batch", |b| {
        let batch = Blake3Batch::new();
        b.iter(|| {
            black_box(&chunks)
                .chunks(larder_hash::BATCH_SLICE)
                .map(|slice| batch.hash(slice).len())
                .sum::<usize>()
        })
    });
    group.bench_function("keyed-blake3-one-at-a-time", |b| {
        b.iter(|| {
            let chunks = black_box(&chunks);
            chunks
                .iter()
                .fold(0u8, |x, c| x ^ blake3::keyed_hash(&key, c).as_bytes()[0])
        })
    });
    group.bench_function("keyed-blake3-batch", |b| {
        let batch = Blake3Batch::keyed(&key);
        b.iter(|| {
            black_box(&chunks)
                .chunks(larder_hash::BATCH_SLICE)
                .map(|slice| batch.hash(slice).len())
                .sum::<usize>()
        })
    });
    group.bench_function("sha256-one-at-a-time", |b| {
        use sha2::Digest;
        b.iter(|| {
            let chunks = black_box(&chunks);
            chunks
                .iter()
                .fold(0u8, |x, c| x ^ sha2::Sha256::digest(c)[0])
        })
    });
    group.bench_function("blake3-whole-buffer", |b| {
        b.iter(|| blake3::hash(black_box(&data)))
    });
    group.finish();
}

criterion_group!(benches, bench_fingerprints);
criterion_main!(benches);
