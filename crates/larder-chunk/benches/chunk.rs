//! Chunking throughput: larder's FastCDC against the `fastcdc` crate 5.0.0, and the
//! keyed chunker on each AES backend, at 2/8/64 KiB and normalization level 2, on 64 MiB
//! of real files (padded with pseudo-random bytes where the system has too few), next
//! to the single-core memory-read bandwidth on the same buffer; then FastCDC 2020 and
//! the keyed chunker on 64 MiB of pseudo-random bytes.
//!
//! `cargo bench -p larder-chunk --bench chunk -- --warm-up-time 1 --measurement-time 5`
//! (`LARDER_BENCH_CORPUS=FILE` chunks FILE instead: see `support/corpus.rs`)

use std::hint::black_box;
use std::sync::Arc;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use fastcdc::{v2016, v2020};
use larder_chunk::{Chunker, FastCdc2016, FastCdc2020, KeyedCdc};
use larder_crypto::{AesBackend, WindowPrf};

#[path = "support/corpus.rs"]
mod corpus;

const MIN: usize = 2048;
const AVG: usize = 8192;
const MAX: usize = 65536;
const LEVEL: u8 = 2;

/// Chunk count and a length checksum, so no cut can be optimized away.
fn chunk_all(chunker: &impl Chunker, mut data: &[u8]) -> (usize, usize) {
    let (mut count, mut sum) = (0usize, 0usize);
    while !data.is_empty() {
        let len = chunker.next_chunk_len(data);
        count += 1;
        sum = sum.wrapping_mul(31).wrapping_add(len);
        data = &data[len..];
    }
    (count, sum)
}

fn bench_chunking(c: &mut Criterion) {
    let data = corpus::corpus();
    let mut group = c.benchmark_group("chunk-2k8k64k-level2");
    group.throughput(Throughput::Bytes(data.len() as u64));
    group.sample_size(10);

    let larder_2020 = FastCdc2020::new(MIN, AVG, MAX, LEVEL);
    group.bench_function("larder-fastcdc2020", |b| {
        b.iter(|| chunk_all(&larder_2020, black_box(&data)))
    });
    group.bench_function("crate-v2020", |b| {
        b.iter(|| {
            v2020::FastCDC::with_level(
                black_box(&data),
                MIN,
                AVG,
                MAX,
                v2020::Normalization::Level2,
            )
            .fold((0usize, 0usize), |(n, s), c| {
                (n + 1, s.wrapping_mul(31).wrapping_add(c.length))
            })
        })
    });
    for backend in AesBackend::ALL.into_iter().filter(|b| b.is_supported()) {
        let keyed = keyed_on(backend);
        group.bench_function(format!("larder-keyed-{}", backend.name()), |b| {
            b.iter(|| chunk_all(&keyed, black_box(&data)))
        });
    }
    let larder_2016 = FastCdc2016::new(MIN, AVG, MAX, LEVEL);
    group.bench_function("larder-fastcdc2016", |b| {
        b.iter(|| chunk_all(&larder_2016, black_box(&data)))
    });
    group.bench_function("crate-v2016", |b| {
        b.iter(|| {
            v2016::FastCDC::with_level(
                black_box(&data),
                MIN,
                AVG,
                MAX,
                v2016::Normalization::Level2,
            )
            .fold((0usize, 0usize), |(n, s), c| {
                (n + 1, s.wrapping_mul(31).wrapping_add(c.length))
            })
        })
    });
    // The ceiling for any single-threaded chunker: reading every byte once.
    group.bench_function("memory-read-sum-u64", |b| {
        b.iter(|| {
            let (words, _) = black_box(&data[..]).as_chunks::<8>();
            words
                .iter()
                .map(|w| u64::from_le_bytes(*w))
                .fold(0u64, u64::wrapping_add)
        })
    });
    group.finish();
}

/// The keyed chunker at the bench's sizes, under a fixed secret, on `backend`.
fn keyed_on(backend: AesBackend) -> KeyedCdc {
    let prf = WindowPrf::from_secret_on(&[0x5e; 32], backend).expect("a supported backend");
    KeyedCdc::new(Arc::new(prf), MIN, AVG, MAX, LEVEL)
}

/// Random bytes: no zero runs or repeats, every position judged on fresh values.
fn bench_random(c: &mut Criterion) {
    let data = corpus::pseudo_random(64 << 20);
    let mut group = c.benchmark_group("random-2k8k64k-level2");
    group.throughput(Throughput::Bytes(data.len() as u64));
    group.sample_size(10);
    let larder_2020 = FastCdc2020::new(MIN, AVG, MAX, LEVEL);
    group.bench_function("larder-fastcdc2020", |b| {
        b.iter(|| chunk_all(&larder_2020, black_box(&data)))
    });
    let keyed = keyed_on(AesBackend::detect());
    group.bench_function("larder-keyed", |b| {
        b.iter(|| chunk_all(&keyed, black_box(&data)))
    });
    group.finish();
}

criterion_group!(benches, bench_chunking, bench_random);
criterion_main!(benches);
