//! Fingerprint index rates: `CuckooIndex` (larder-index) against hashbrown's
//! `HashMap`, inserts and lookups of hits and misses, at sizes that fit a report's time
//! budget. The criterion benches in `crates/larder-index/benches` go further (larger
//! sizes, dashmap); this gives the report its own side-by-side figures.

use std::time::Instant;

use larder_hash::Fingerprint;
use larder_index::{ChunkLocation, CuckooIndex, FingerprintIndex};
use serde::Serialize;

use crate::plot::Spread;

/// Keys looked up per `get_batch` call: the backup's stage 3 asks a batch at a time.
const BATCH: usize = 1024;

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct IndexPlan {
    /// Keys inserted, per size measured.
    pub sizes: Vec<usize>,
    pub runs: usize,
    /// Threads of `CuckooIndex::insert_batch`.
    pub threads: usize,
}

impl IndexPlan {
    pub fn new(quick: bool, threads: usize) -> Self {
        Self {
            sizes: if quick {
                vec![1_000_000]
            } else {
                vec![1_000_000, 10_000_000]
            },
            runs: if quick { 3 } else { 5 },
            threads: threads.max(1),
        }
    }
}

/// Millions of operations per second of one operation on one structure.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct IndexRate {
    pub size: usize,
    pub structure: &'static str,
    pub operation: &'static str,
    pub mops: Spread,
}

/// The structures, named by the calls measured: `insert` one key at a time, or
/// `insert_batch` on `IndexPlan::threads` threads; `get_batch` in batches of 1024, or
/// `get` one key at a time.
pub const CUCKOO: &str = "Cuckoo insert, get_batch";
pub const CUCKOO_PARALLEL: &str = "Cuckoo insert_batch, get";
pub const HASHBROWN: &str = "hashbrown insert, get";
pub const INSERT: &str = "insert";
pub const HIT: &str = "lookup, hit";
pub const MISS: &str = "lookup, miss";

/// Uniform fingerprint `i` (splitmix64 of `4i .. 4i+3`): what BLAKE3 digests look
/// like to an index, without hashing.
pub(crate) fn key(i: u64) -> Fingerprint {
    let mut out = [0; 32];
    for (k, word) in out.chunks_exact_mut(8).enumerate() {
        let mut z = (i * 4 + k as u64).wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        word.copy_from_slice(&(z ^ (z >> 31)).to_le_bytes());
    }
    Fingerprint(out)
}

/// Where a backup of 8 KiB chunks would put chunk `i`: 500 to a 4 MiB container.
pub(crate) fn location(i: u64) -> ChunkLocation {
    ChunkLocation {
        container: 1 + i / 500,
        offset: 32 + (i % 500) as u32 * 8192,
        length: 8192,
    }
}

/// One timed operation; returns seconds and how many keys it inserted or found
/// (checked, so that the work cannot be skipped and a broken index shows). A build
/// is timed from allocating the structure to its last insert, never its drop.
type Op<'a> = Box<dyn FnMut() -> (f64, usize) + 'a>;

/// Every structure and operation at one size, the rounds interleaved. Panics if a
/// structure answers wrongly: a benchmark of a broken index would be meaningless.
fn measure_size(size: usize, plan: &IndexPlan, progress: &mut dyn FnMut(&str)) -> Vec<IndexRate> {
    let items: Vec<(Fingerprint, ChunkLocation)> =
        (0..size as u64).map(|i| (key(i), location(i))).collect();
    let hits: Vec<Fingerprint> = items.iter().map(|(k, _)| *k).collect();
    let misses: Vec<Fingerprint> = (size as u64..2 * size as u64).map(key).collect();
    // Filled by the insert runs, read by the lookup runs.
    let cuckoo = std::cell::RefCell::new(CuckooIndex::new());
    let map = std::cell::RefCell::new(hashbrown::HashMap::<Fingerprint, ChunkLocation>::new());
    let timed = |f: &mut dyn FnMut() -> usize| {
        let started = Instant::now();
        let n = f();
        (started.elapsed().as_secs_f64(), n)
    };
    let get_batch = |keys: &[Fingerprint]| -> usize {
        let index = cuckoo.borrow();
        keys.chunks(BATCH)
            .map(|b| index.get_batch(b).iter().filter(|l| l.is_some()).count())
            .sum()
    };
    let mut ops: Vec<(&'static str, &'static str, usize, Op<'_>)> = vec![
        (
            CUCKOO,
            INSERT,
            size,
            Box::new(|| {
                // The previous build is dropped before the clock starts.
                drop(cuckoo.take());
                let started = Instant::now();
                let mut index = CuckooIndex::with_capacity(size);
                let n = items.iter().filter(|(k, l)| index.insert(*k, *l)).count();
                let seconds = started.elapsed().as_secs_f64();
                *cuckoo.borrow_mut() = index;
                (seconds, n)
            }),
        ),
        (
            CUCKOO_PARALLEL,
            INSERT,
            size,
            Box::new(|| {
                let started = Instant::now();
                let mut index = CuckooIndex::with_capacity(size);
                let n = index.insert_batch(&items, plan.threads);
                let seconds = started.elapsed().as_secs_f64();
                drop(index);
                (seconds, n)
            }),
        ),
        (
            HASHBROWN,
            INSERT,
            size,
            Box::new(|| {
                drop(map.take());
                let started = Instant::now();
                let mut m = hashbrown::HashMap::with_capacity(size);
                for (k, l) in &items {
                    m.insert(*k, *l);
                }
                let seconds = started.elapsed().as_secs_f64();
                let n = m.len();
                *map.borrow_mut() = m;
                (seconds, n)
            }),
        ),
        (
            CUCKOO,
            HIT,
            size,
            Box::new(|| timed(&mut || get_batch(&hits))),
        ),
        (
            CUCKOO,
            MISS,
            0,
            Box::new(|| timed(&mut || get_batch(&misses))),
        ),
        (
            CUCKOO_PARALLEL,
            HIT,
            size,
            Box::new(|| {
                timed(&mut || {
                    let index = cuckoo.borrow();
                    hits.iter().filter(|k| index.get(k).is_some()).count()
                })
            }),
        ),
        (
            CUCKOO_PARALLEL,
            MISS,
            0,
            Box::new(|| {
                timed(&mut || {
                    let index = cuckoo.borrow();
                    misses.iter().filter(|k| index.get(k).is_some()).count()
                })
            }),
        ),
        (
            HASHBROWN,
            HIT,
            size,
            Box::new(|| {
                timed(&mut || {
                    let m = map.borrow();
                    hits.iter().filter(|k| m.contains_key(*k)).count()
                })
            }),
        ),
        (
            HASHBROWN,
            MISS,
            0,
            Box::new(|| {
                timed(&mut || {
                    let m = map.borrow();
                    misses.iter().filter(|k| m.contains_key(*k)).count()
                })
            }),
        ),
    ];
    let mut seconds = vec![Vec::new(); ops.len()];
    let runs = plan.runs.max(1);
    for round in 1..=runs {
        progress(&format!(
            "index, {size} keys: round {round}/{runs} of {} operations",
            ops.len()
        ));
        for (i, (structure, operation, expected, op)) in ops.iter_mut().enumerate() {
            let (s, found) = op();
            assert_eq!(found, *expected, "{structure} {operation}: wrong answers");
            seconds[i].push(s);
        }
    }
    ops.iter()
        .zip(seconds)
        .map(|((structure, operation, _, _), s)| {
            let rates: Vec<f64> = s.iter().map(|&t| size as f64 / 1e6 / t.max(1e-9)).collect();
            IndexRate {
                size,
                structure,
                operation,
                mops: Spread::of(&rates),
            }
        })
        .collect()
}

/// Every size of the plan.
pub fn run_index_bench(plan: &IndexPlan, progress: &mut dyn FnMut(&str)) -> Vec<IndexRate> {
    plan.sizes
        .iter()
        .flat_map(|&size| measure_size(size, plan, progress))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_structure_and_operation_is_measured_and_answers_right() {
        let plan = IndexPlan {
            sizes: vec![5000],
            runs: 2,
            threads: 2,
        };
        let rates = run_index_bench(&plan, &mut |_| {});
        assert_eq!(rates.len(), 9);
        for r in &rates {
            assert!(r.mops.median > 0.0, "{r:?}");
            assert!(r.mops.min <= r.mops.median && r.mops.median <= r.mops.max);
        }
        for s in [CUCKOO, CUCKOO_PARALLEL, HASHBROWN] {
            for o in [INSERT, HIT, MISS] {
                assert!(rates.iter().any(|r| r.structure == s && r.operation == o));
            }
        }
    }
}
