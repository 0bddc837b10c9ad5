//! Inserts and lookups per second: `CuckooIndex` against `hashbrown::HashMap` and
//! `dashmap::DashMap` holding the same keys (`[u8; 32]` fingerprints, each map with its
//! default hasher).
//!
//! ```text
//! cargo bench -p larder-index --bench index                      # 1 million keys
//! LARDER_BENCH_INDEX_MILLIONS=1,10,100 cargo bench -p larder-index --bench index
//! LARDER_BENCH_INDEX_MILLIONS=100 LARDER_BENCH_INDEX_STRUCTURES=cuckoo \
//!     cargo bench -p larder-index --bench index
//! ```
//! Sizes are in millions of keys; only the default (1) runs unless asked.
//! `LARDER_BENCH_INDEX_STRUCTURES` (comma-separated `cuckoo`, `hashbrown`, `dashmap`;
//! default all three) chooses the structures and `LARDER_BENCH_INDEX_OPS`
//! (`insert`, `lookup`; default both) the measurements, so that the 100 million runs can hold one
//! structure at a time: the keys of the batch inserts take 4.8 GB, hashbrown 6.6 GB,
//! the cuckoo index 4.5 GB. Every structure is built, measured and dropped before the
//! next is built. Inserts: one sample is a whole build of N keys into a structure sized
//! for N (`with_capacity`, `reserve`); at 100 million and above each structure is built
//! three times and each build's time printed with the median (no criterion
//! statistics: a build takes tens of seconds). Lookups: batches of 1024 keys, uniformly
//! drawn from the N inserted keys (hits) or from keys never inserted (misses); every
//! structure is asked for the same keys in the same order.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{
    criterion_group, criterion_main, BenchmarkId, Criterion, SamplingMode, Throughput,
};
use dashmap::DashMap;
use larder_hash::Fingerprint;
use larder_index::{ChunkLocation, CuckooIndex, FingerprintIndex};

#[path = "common/keys.rs"]
mod keys;
use keys::{fingerprint, location};

/// Keys looked up per measured iteration: the size of a backup's stage-3 batch.
const LOOKUP_BATCH: usize = 1024;
/// Distinct lookup keys cycled through, so that consecutive batches do not hit the
/// same cache lines.
const LOOKUP_KEYS: usize = 1 << 20;

/// Builds at 100 million keys and above, each timed on its own.
const LARGE_BUILDS: usize = 3;

/// True if the environment variable `var` is unset or its comma-separated list names
/// `name`.
fn listed(var: &str, name: &str) -> bool {
    std::env::var(var).map_or(true, |list| list.split(',').any(|s| s.trim() == name))
}

fn selected(structure: &str) -> bool {
    listed("LARDER_BENCH_INDEX_STRUCTURES", structure)
}

fn items(n: usize) -> Vec<(Fingerprint, ChunkLocation)> {
    (0..n as u64)
        .map(|i| (fingerprint(i), location(i)))
        .collect()
}

fn sizes() -> Vec<usize> {
    std::env::var("LARDER_BENCH_INDEX_MILLIONS")
        .unwrap_or_else(|_| "1".into())
        .split(',')
        .filter_map(|m| m.trim().parse::<usize>().ok())
        .map(|m| m * 1_000_000)
        .collect()
}

/// `count` keys drawn from `range` by a fixed xorshift sequence.
fn sample(range: std::ops::Range<u64>, count: usize) -> Vec<Fingerprint> {
    let mut x = 0x2545_f491_4f6c_dd1du64;
    (0..count)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            fingerprint(range.start + x % (range.end - range.start))
        })
        .collect()
}

fn build_cuckoo(items: &[(Fingerprint, ChunkLocation)], threads: usize) -> CuckooIndex {
    let mut index = CuckooIndex::with_capacity(items.len());
    if threads == 0 {
        for (fp, loc) in items {
            index.insert(*fp, *loc);
        }
    } else {
        index.insert_batch(items, threads);
    }
    index
}

fn build_hashbrown(
    items: &[(Fingerprint, ChunkLocation)],
) -> hashbrown::HashMap<[u8; 32], ChunkLocation> {
    let mut map = hashbrown::HashMap::new();
    map.reserve(items.len());
    for (fp, loc) in items {
        map.insert(fp.0, *loc);
    }
    map
}

fn build_dashmap(
    items: &[(Fingerprint, ChunkLocation)],
    threads: usize,
) -> DashMap<[u8; 32], ChunkLocation> {
    let map = DashMap::with_capacity(items.len());
    std::thread::scope(|s| {
        for part in items.chunks(items.len().div_ceil(threads)) {
            let map = &map;
            s.spawn(move || {
                for (fp, loc) in part {
                    map.insert(fp.0, *loc);
                }
            });
        }
    });
    map
}

/// The builds compared, by name.
type Build<'a> = (
    &'a str,
    Box<dyn Fn(&[(Fingerprint, ChunkLocation)]) -> Box<dyn Send> + 'a>,
);

/// The selected builds (`LARDER_BENCH_INDEX_STRUCTURES`).
fn builds<'a>() -> Vec<Build<'a>> {
    let all: Vec<Build<'a>> = vec![
        ("cuckoo/insert", Box::new(|i| Box::new(build_cuckoo(i, 0)))),
        (
            "cuckoo/insert_batch-1-thread",
            Box::new(|i| Box::new(build_cuckoo(i, 1))),
        ),
        (
            "cuckoo/insert_batch-2-threads",
            Box::new(|i| Box::new(build_cuckoo(i, 2))),
        ),
        (
            "hashbrown/insert",
            Box::new(|i| Box::new(build_hashbrown(i))),
        ),
        (
            "dashmap/insert-1-thread",
            Box::new(|i| Box::new(build_dashmap(i, 1))),
        ),
        (
            "dashmap/insert-2-threads",
            Box::new(|i| Box::new(build_dashmap(i, 2))),
        ),
    ];
    all.into_iter()
        .filter(|(name, _)| name.split('/').next().is_some_and(selected))
        .collect()
}

fn inserts(c: &mut Criterion) {
    if !listed("LARDER_BENCH_INDEX_OPS", "insert") {
        return;
    }
    for n in sizes() {
        let items = items(n);
        if n >= 100_000_000 {
            for (name, build) in builds() {
                let mut seconds: Vec<f64> = (0..LARGE_BUILDS)
                    .map(|_| {
                        let started = Instant::now();
                        let built = build(&items);
                        let elapsed = started.elapsed().as_secs_f64();
                        drop(built);
                        eprintln!("insert/{n}/{name}: build {elapsed:.3} s");
                        elapsed
                    })
                    .collect();
                seconds.sort_by(f64::total_cmp);
                let median = seconds[LARGE_BUILDS / 2];
                eprintln!(
                    "insert/{n}/{name}: median of {LARGE_BUILDS} builds {median:.3} s, {:.2} M inserts/s",
                    n as f64 / median / 1e6
                );
            }
            continue;
        }
        let mut group = c.benchmark_group(format!("insert/{n}"));
        group.sample_size(10);
        // One build per sample: linear sampling would make 55 builds.
        group.sampling_mode(SamplingMode::Flat);
        group.throughput(Throughput::Elements(n as u64));
        group.warm_up_time(Duration::from_millis(100));
        for (name, build) in builds() {
            group.bench_function(name, |b| {
                b.iter_custom(|iters| {
                    let mut total = Duration::ZERO;
                    for _ in 0..iters {
                        let started = Instant::now();
                        let built = build(&items);
                        total += started.elapsed();
                        drop(built);
                    }
                    total
                })
            });
        }
        group.finish();
    }
}

/// Benches `lookup` over batches of hits and of misses of a structure holding `n` keys.
fn bench_lookups(
    c: &mut Criterion,
    n: usize,
    name: &str,
    lookup: &dyn Fn(&[Fingerprint]) -> usize,
) {
    let hits = sample(0..n as u64, LOOKUP_KEYS);
    let misses = sample(n as u64..2 * n as u64, LOOKUP_KEYS);
    let mut group = c.benchmark_group(format!("lookup/{n}"));
    group.sample_size(20);
    group.throughput(Throughput::Elements(LOOKUP_BATCH as u64));
    for (kind, keys) in [("hits", &hits), ("misses", &misses)] {
        let mut batches = keys.chunks_exact(LOOKUP_BATCH).cycle();
        group.bench_function(BenchmarkId::new(name, kind), |b| {
            b.iter(|| {
                let batch = batches.next().unwrap_or(&[]);
                black_box(lookup(black_box(batch)))
            })
        });
    }
    group.finish();
}

fn lookups(c: &mut Criterion) {
    if !listed("LARDER_BENCH_INDEX_OPS", "lookup") {
        return;
    }
    for n in sizes() {
        if selected("cuckoo") {
            let cuckoo = build_cuckoo(&items(n), 2);
            bench_lookups(c, n, "cuckoo-get", &|keys| {
                keys.iter().filter(|k| cuckoo.get(k).is_some()).count()
            });
            bench_lookups(c, n, "cuckoo-get_batch", &|keys| {
                cuckoo
                    .get_batch(keys)
                    .iter()
                    .filter(|l| l.is_some())
                    .count()
            });
        }
        if selected("hashbrown") {
            let hashbrown = build_hashbrown(&items(n));
            bench_lookups(c, n, "hashbrown-get", &|keys| {
                keys.iter()
                    .filter(|k| hashbrown.get(&k.0).is_some())
                    .count()
            });
        }
        if selected("dashmap") {
            let dashmap = build_dashmap(&items(n), 2);
            bench_lookups(c, n, "dashmap-get", &|keys| {
                keys.iter().filter(|k| dashmap.get(&k.0).is_some()).count()
            });
        }
    }
}

criterion_group!(benches, lookups, inserts);
criterion_main!(benches);
