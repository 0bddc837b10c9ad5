//! Inserts and lookups per second: `CuckooIndex` against `hashbrown::HashMap` and
//! `dashmap::DashMap` holding the same keys (`[u8; 32]` fingerprints, each map with its
//! default hasher).
//!
//! ```text
//! cargo bench -p larder-index --bench index                      # 1 million keys
//! LARDER_BENCH_INDEX_MILLIONS=1,10,100 cargo bench -p larder-index --bench index
//! ```
//! Sizes are in millions of keys; 100 million needs about 12 GiB (the keys for the
//! batch inserts, then each structure in turn) and takes minutes per structure, so
//! only the default (1) runs unless asked. Inserts: one sample is a whole build of N
//! keys into a structure sized for N (`with_capacity`, `reserve`); at 100 million and
//! above each structure is built once and timed (printed, no criterion statistics).
//! Lookups: batches of 1024 keys, uniformly drawn from the N inserted keys (hits) or
//! from keys never inserted (misses).

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use dashmap::DashMap;
use larder_hash::Fingerprint;
use larder_index::{ChunkLocation, CuckooIndex, FingerprintIndex};

/// Keys looked up per measured iteration: the size of a backup's stage-3 batch.
const LOOKUP_BATCH: usize = 1024;
/// Distinct lookup keys cycled through, so that consecutive batches do not hit the
/// same cache lines.
const LOOKUP_KEYS: usize = 1 << 20;

/// Uniform fingerprint number `i` (splitmix64 of `4i .. 4i+3`).
fn fingerprint(i: u64) -> Fingerprint {
    let mut out = [0; 32];
    for (k, word) in out.chunks_exact_mut(8).enumerate() {
        let mut z = (i * 4 + k as u64).wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        word.copy_from_slice(&(z ^ (z >> 31)).to_le_bytes());
    }
    Fingerprint(out)
}

fn location(i: u64) -> ChunkLocation {
    ChunkLocation {
        container: 1 + i / 500,
        offset: 32 + (i % 500) as u32 * 8192,
        length: 8192,
    }
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

fn builds<'a>() -> Vec<Build<'a>> {
    vec![
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
    ]
}

fn inserts(c: &mut Criterion) {
    for n in sizes() {
        let items: Vec<_> = (0..n as u64)
            .map(|i| (fingerprint(i), location(i)))
            .collect();
        if n >= 100_000_000 {
            for (name, build) in builds() {
                let started = Instant::now();
                let built = build(&items);
                let elapsed = started.elapsed();
                drop(built);
                eprintln!(
                    "insert/{n}/{name}: one build, {:.3} s, {:.2} M inserts/s",
                    elapsed.as_secs_f64(),
                    n as f64 / elapsed.as_secs_f64() / 1e6
                );
            }
            continue;
        }
        let mut group = c.benchmark_group(format!("insert/{n}"));
        group.sample_size(10);
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
    for n in sizes() {
        let items: Vec<_> = (0..n as u64)
            .map(|i| (fingerprint(i), location(i)))
            .collect();
        let cuckoo = build_cuckoo(&items, 2);
        let hashbrown = build_hashbrown(&items);
        drop(items);
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
        bench_lookups(c, n, "hashbrown-get", &|keys| {
            keys.iter()
                .filter(|k| hashbrown.get(&k.0).is_some())
                .count()
        });
        drop((cuckoo, hashbrown));
        let items: Vec<_> = (0..n as u64)
            .map(|i| (fingerprint(i), location(i)))
            .collect();
        let dashmap = build_dashmap(&items, 2);
        drop(items);
        bench_lookups(c, n, "dashmap-get", &|keys| {
            keys.iter().filter(|k| dashmap.get(&k.0).is_some()).count()
        });
    }
}

criterion_group!(benches, lookups, inserts);
criterion_main!(benches);
