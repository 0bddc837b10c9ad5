//! Fingerprinting backup-sized chunks: BLAKE3 one chunk at a time (`blake3::hash`, what
//! a crate user writes), across chunks (`Blake3Batch`, what stage 2 of a backup does),
//! keyed likewise, SHA-256 one at a time, and BLAKE3 of the whole buffer at once (the
//! single-thread peak). The chunks are FastCDC 2020's at 2/8/64 KiB (the `fastcdc`
//! crate's cut points) over 64 MiB of real files from `/usr/lib`, or over
//! `LARDER_BENCH_CORPUS=FILE`.
//!
//! `cargo bench -p larder-hash --bench fingerprint -- --warm-up-time 1 --measurement-time 5`

use std::hint::black_box;
use std::path::Path;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use larder_hash::Blake3Batch;

const CORPUS_LEN: usize = 64 << 20;

/// Regular files under `dir`, in sorted order, appended until `out` holds `limit` bytes.
fn append_files(dir: &Path, out: &mut Vec<u8>, limit: usize) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut paths: Vec<_> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
    paths.sort();
    for path in paths {
        if out.len() >= limit {
            return;
        }
        match std::fs::symlink_metadata(&path) {
            Ok(meta) if meta.is_dir() => append_files(&path, out, limit),
            Ok(meta) if meta.is_file() => {
                if let Ok(mut data) = std::fs::read(&path) {
                    data.truncate(limit - out.len());
                    out.extend_from_slice(&data);
                }
            }
            _ => {}
        }
    }
}

fn corpus() -> Vec<u8> {
    if let Ok(file) = std::env::var("LARDER_BENCH_CORPUS") {
        return std::fs::read(&file).unwrap_or_else(|e| panic!("cannot read {file}: {e}"));
    }
    let mut data = Vec::with_capacity(CORPUS_LEN);
    append_files(Path::new("/usr/lib"), &mut data, CORPUS_LEN);
    // Pseudo-random padding where the system has too few files.
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    while data.len() < CORPUS_LEN {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        data.push((state >> 24) as u8);
    }
    data
}

fn bench_fingerprints(c: &mut Criterion) {
    let data = corpus();
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
