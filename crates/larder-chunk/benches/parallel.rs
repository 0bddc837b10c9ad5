//! Exact parallel chunking against sequential chunking: FastCDC 2020 at 2/8/64 KiB and
//! normalization level 2, on 256 MiB of real files (padded with pseudo-random bytes
//! where the system has too few). Whole buffer, and in 8 MiB blocks carrying the uncut
//! tail as the engine's pipeline does; then 8 MiB blocks on 2 threads at several segment
//! sizes, which chose `default_segment_size`.
//!
//! `cargo bench -p larder-chunk --bench parallel -- --warm-up-time 1 --measurement-time 5`

#[path = "../tests/support/real_files.rs"]
mod real_files;

use std::hint::black_box;
use std::num::NonZeroUsize;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use larder_chunk::{Chunker, FastCdc2020, ParallelChunker, ParallelStats};
use rayon::ThreadPool;

const CORPUS_LEN: usize = 256 << 20;
/// The engine's block size for large files (`larder-engine`, `BLOCK`).
const BLOCK: usize = 8 << 20;
const MIN: usize = 2048;
const AVG: usize = 8192;
const MAX: usize = 65536;
const LEVEL: u8 = 2;

fn corpus() -> Vec<u8> {
    let mut data = real_files::gather(&[
        real_files::Source {
            dir: "/usr/lib",
            bytes: 192 << 20,
        },
        real_files::Source {
            dir: "/usr/share",
            bytes: 64 << 20,
        },
    ]);
    let real = data.len();
    // splitmix64: padding only has to look random to a Gear hash.
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    while data.len() < CORPUS_LEN {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        data.extend_from_slice(&(z ^ (z >> 31)).to_le_bytes());
    }
    data.truncate(CORPUS_LEN);
    eprintln!(
        "corpus: {real} bytes of real files, {} of padding",
        CORPUS_LEN - real
    );
    data
}

fn pool(threads: usize) -> ThreadPool {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("a thread pool for the benchmark")
}

/// Chunks `data` in `BLOCK`-byte blocks, each starting with the previous block's uncut
/// tail: chunk count, length checksum and summed statistics.
fn chunk_in_blocks<C: Chunker + ?Sized>(
    chunker: &ParallelChunker<'_, C>,
    data: &[u8],
) -> (usize, usize, ParallelStats) {
    let (mut count, mut sum, mut stats) = (0, 0usize, ParallelStats::default());
    let mut start = 0;
    loop {
        let end = (start + BLOCK).min(data.len());
        let is_last = end == data.len();
        let block = chunker.chunk_block(&data[start..end], is_last);
        count += block.lengths.len();
        sum = block
            .lengths
            .iter()
            .fold(sum, |s, &len| s.wrapping_mul(31).wrapping_add(len));
        stats += block.stats;
        start += block.consumed;
        if is_last {
            return (count, sum, stats);
        }
    }
}

fn bench_parallel(c: &mut Criterion) {
    let data = corpus();
    let chunker = FastCdc2020::new(MIN, AVG, MAX, LEVEL);
    let pools = [pool(1), pool(2)];

    for pool in &pools {
        let parallel = ParallelChunker::new(&chunker, pool);
        eprintln!(
            "{} threads, segments of {}: whole buffer {:?}; in 8 MiB blocks {:?}",
            pool.current_num_threads(),
            parallel.segment_size(),
            parallel.chunk_lengths(&data).stats,
            chunk_in_blocks(&parallel, &data).2
        );
    }

    let mut group = c.benchmark_group("parallel-256MiB-2k8k64k-level2");
    group.throughput(Throughput::Bytes(data.len() as u64));
    group.sample_size(10);
    group.bench_function("sequential", |b| {
        b.iter(|| chunker.chunk_lengths(black_box(&data)))
    });
    // The ceiling for two threads: each chunks one half on its own (not exact: the
    // second half starts on no true cut).
    let (first_half, second_half) = data.split_at(data.len() / 2);
    group.bench_function("halves-independent/2", |b| {
        b.iter(|| {
            pools[1].join(
                || chunker.chunk_lengths(black_box(first_half)),
                || chunker.chunk_lengths(black_box(second_half)),
            )
        })
    });
    for pool in &pools {
        let threads = pool.current_num_threads();
        let parallel = ParallelChunker::new(&chunker, pool);
        group.bench_function(BenchmarkId::new("whole", threads), |b| {
            b.iter(|| parallel.chunk_lengths(black_box(&data)))
        });
        group.bench_function(BenchmarkId::new("blocks-8MiB", threads), |b| {
            b.iter(|| chunk_in_blocks(&parallel, black_box(&data)))
        });
    }
    group.finish();

    let mut group = c.benchmark_group("parallel-256MiB-blocks-8MiB-2-threads-segment-size");
    group.throughput(Throughput::Bytes(data.len() as u64));
    group.sample_size(10);
    for segment_kib in [256, 512, 1024, 2048, 4096] {
        let segment_size = NonZeroUsize::new(segment_kib << 10).expect("non-zero");
        let parallel = ParallelChunker::new(&chunker, &pools[1]).with_segment_size(segment_size);
        group.bench_function(
            BenchmarkId::from_parameter(format!("{segment_kib}KiB")),
            |b| b.iter(|| chunk_in_blocks(&parallel, black_box(&data))),
        );
    }
    group.finish();
}

criterion_group!(benches, bench_parallel);
criterion_main!(benches);
