//! The in-memory exact index: partitioned, bucketized two-table cuckoo hashing with
//! short tags (docs/design/index.md).
//!
//! A fingerprint's top 10 bits choose one of 1024 partitions. Each partition has two
//! tables of 4-slot buckets; a slot is 8 bytes: a 42-bit tag (more fingerprint bits,
//! half of which choose the bucket in each table) and the number of an entry. The
//! entry holds the rest of the fingerprint and the packed location, 35 bytes. A lookup
//! reads at most two buckets (one cache line each) and, on a tag match, one entry.

mod layout;
mod partition;

use larder_hash::Fingerprint;

use self::layout::{
    entry_of, fingerprint_of, slot_has_tag, stored_location, ContainerTable, Key, PackedLocation,
    StoredLocation, PARTITIONS,
};
use self::partition::Partition;
use crate::prefetch::{prefetch_line, prefetch_lines};
use crate::{ChunkLocation, FingerprintIndex};

/// Keys between two stages of `get_batch`'s pipeline: each stage fetches what a
/// later one, this many keys (or twice as many) later, reads.
const STAGE_DISTANCE: usize = 8;
/// Stages after the first (see `get_batch`).
const LATER_STAGES: usize = 5;
/// Probes `get_batch` keeps: more than `STAGE_DISTANCE * LATER_STAGES`, a power of two.
const PROBE_RING: usize = 64;

/// A lookup in flight in `get_batch`.
#[derive(Clone, Copy)]
struct Probe<'a> {
    fp: &'a Fingerprint,
    partition: &'a Partition,
    tag: u64,
    /// The numbers of the key's two buckets; `None` if the partition is empty.
    bucket_numbers: Option<[usize; 2]>,
    /// Set when table 0's bucket has no slot with the key's tag: table 1's is needed.
    in_table_1: bool,
    /// Once a bucket had a slot with the key's tag: that slot's entry.
    candidate: Option<usize>,
}

/// An exact fingerprint index in about 45 bytes of memory per fingerprint.
pub struct CuckooIndex {
    /// Exactly [`PARTITIONS`] partitions; partition `p` holds the fingerprints whose
    /// top bits are `p`.
    partitions: Box<[Partition]>,
    containers: ContainerTable,
    len: usize,
}

/// Counters and sizes of a [`CuckooIndex`].
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct IndexStats {
    pub fingerprints: usize,
    /// Slots in all tables.
    pub slots: usize,
    /// Fingerprints in stashes (both buckets full); 0 unless fingerprints collide.
    pub stashed: usize,
    /// Evictions made by inserts and growth, in all.
    pub kicks: u64,
    /// Times a partition's tables were rebuilt larger.
    pub growths: u64,
    /// Distinct containers the entries name.
    pub containers: usize,
    /// Bytes the index asked the allocator for (the allocator's own overhead aside).
    pub heap_bytes: usize,
}

impl IndexStats {
    /// Fraction of slots in use.
    pub fn load_factor(&self) -> f64 {
        (self.fingerprints - self.stashed) as f64 / self.slots.max(1) as f64
    }
}

impl Default for CuckooIndex {
    fn default() -> Self {
        Self::new()
    }
}

impl CuckooIndex {
    /// An empty index; partitions allocate their tables on their first insert.
    pub fn new() -> Self {
        Self::with_capacity(0)
    }

    /// An index sized for `fingerprints` entries: no table grows before about that
    /// many are inserted, and at that many the tables are about 90% full.
    pub fn with_capacity(fingerprints: usize) -> Self {
        let per_partition = fingerprints.div_ceil(PARTITIONS);
        Self {
            partitions: (0..PARTITIONS)
                .map(|_| Partition::with_capacity(per_partition))
                .collect(),
            containers: ContainerTable::default(),
            len: 0,
        }
    }

    pub fn stats(&self) -> IndexStats {
        let mut s = IndexStats {
            fingerprints: self.len,
            containers: self.containers.len(),
            heap_bytes: self.containers.heap_bytes()
                + self.partitions.len() * size_of::<Partition>(),
            ..IndexStats::default()
        };
        for p in self.partitions.iter() {
            s.slots += p.slot_count();
            s.stashed += p.stash_len();
            s.kicks += p.kicks;
            s.growths += p.growths;
            s.heap_bytes += p.heap_bytes();
        }
        s
    }

    /// Every (fingerprint, location) pair, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (Fingerprint, ChunkLocation)> + '_ {
        self.partitions
            .iter()
            .enumerate()
            .flat_map(move |(number, partition)| {
                partition.slots().map(move |slot| {
                    let e = entry_of(slot);
                    let entry = partition.entry(e);
                    (
                        fingerprint_of(number, slot, entry),
                        self.location(partition, e),
                    )
                })
            })
    }

    /// Inserts every pair of `items` in order, with the result of calling
    /// [`FingerprintIndex::insert`] on each in turn, on up to `threads` threads that
    /// own disjoint ranges of partitions. Returns how many were new.
    pub fn insert_batch(
        &mut self,
        items: &[(Fingerprint, ChunkLocation)],
        threads: usize,
    ) -> usize {
        // Containers are numbered here, on one thread, in item order; a duplicate's
        // container may get a number no entry uses, which costs 8 bytes and is harmless.
        let packed: Vec<PackedLocation> = items
            .iter()
            .map(|(_, loc)| self.containers.pack(*loc))
            .collect();
        let per_thread = PARTITIONS.div_ceil(threads.clamp(1, PARTITIONS));
        let packed = &packed;
        let (mut inserted, unspawned) = std::thread::scope(|scope| {
            let mut ranges = self.partitions.chunks_mut(per_thread).enumerate();
            let mut spawned = Vec::new();
            let mut unspawned = Vec::new();
            // The first range is done on this thread, the others on spawned ones.
            let first = ranges.next();
            for (number, range) in ranges {
                let first_partition = number * per_thread;
                let spawn = std::thread::Builder::new()
                    .name(format!("larder-index-{number}"))
                    .spawn_scoped(scope, move || {
                        insert_into_range(range, first_partition, items, packed)
                    });
                match spawn {
                    Ok(handle) => spawned.push(handle),
                    Err(_) => unspawned.push(first_partition),
                }
            }
            let mut inserted =
                first.map_or(0, |(_, range)| insert_into_range(range, 0, items, packed));
            for handle in spawned {
                // A worker's panic (only the capacity assertion can panic) passes on.
                inserted += handle
                    .join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            }
            (inserted, unspawned)
        });
        // Ranges whose thread could not be started are done here, after the others.
        for first_partition in unspawned {
            let end = PARTITIONS.min(first_partition + per_thread);
            let range = &mut self.partitions[first_partition..end];
            inserted += insert_into_range(range, first_partition, items, packed);
        }
        self.len += inserted;
        inserted
    }

    fn location(&self, partition: &Partition, e: usize) -> ChunkLocation {
        match stored_location(partition.entry(e)) {
            StoredLocation::Fields {
                container_number,
                offset,
                length,
            } => ChunkLocation {
                container: self.containers.id(container_number),
                offset,
                length,
            },
            // Invariant: `Partition::insert_new` records the location of every entry
            // whose fields say overflow, and entries are never removed.
            StoredLocation::Overflow => partition
                .overflow_location(e)
                .expect("an overflow entry always has its location recorded"),
        }
    }
}

/// Inserts the items whose partition is in `range` (partitions `first..`), in item
/// order; returns how many were new.
fn insert_into_range(
    range: &mut [Partition],
    first: usize,
    items: &[(Fingerprint, ChunkLocation)],
    packed: &[PackedLocation],
) -> usize {
    let mut inserted = 0;
    for ((fp, loc), &packed) in items.iter().zip(packed) {
        let key = Key::new(fp);
        let Some(partition) = key
            .partition
            .checked_sub(first)
            .and_then(|p| range.get_mut(p))
        else {
            continue;
        };
        if partition.find(&key).is_none() {
            partition.insert_new(&key, packed, *loc);
            inserted += 1;
        }
    }
    inserted
}

impl FingerprintIndex for CuckooIndex {
    fn get(&self, fp: &Fingerprint) -> Option<ChunkLocation> {
        let key = Key::new(fp);
        let partition = &self.partitions[key.partition];
        partition.find(&key).map(|e| self.location(partition, e))
    }

    /// Looks keys up in a software pipeline of six stages, each [`STAGE_DISTANCE`]
    /// keys behind the one before, so that the cache misses of consecutive lookups
    /// overlap instead of following one another, and a key found in table 0 costs
    /// one bucket read, not two:
    ///
    /// 1. prefetch the pointers to both tables' bucket segments (table 1's is read
    ///    in stage 3 for every key table 0 does not settle: all misses);
    /// 2. read it, prefetch table 0's bucket;
    /// 3. scan it for the tag: on a match prefetch the pointer to the entry's block,
    ///    otherwise prefetch table 1's bucket;
    /// 4. after a table-0 match prefetch the entry; otherwise scan table 1's bucket
    ///    and on a match prefetch the pointer to the entry's block;
    /// 5. after a table-1 match prefetch the entry;
    /// 6. compare the entry and decode the location.
    fn get_batch(&self, fps: &[Fingerprint]) -> Vec<Option<ChunkLocation>> {
        const D: usize = STAGE_DISTANCE;
        let Some(first) = fps.first() else {
            return Vec::new();
        };
        // Slot `k % PROBE_RING` holds key `k`'s probe from stage 1 to stage 6.
        let mut ring = [Probe {
            fp: first,
            partition: &self.partitions[0],
            tag: 0,
            bucket_numbers: None,
            in_table_1: false,
            candidate: None,
        }; PROBE_RING];
        let mut out = Vec::with_capacity(fps.len());
        // The ring slot of the key `behind` stages back at step `i`, if there is one.
        let stage = |i: usize, behind: usize| {
            i.checked_sub(behind * D)
                .filter(|&k| k < fps.len())
                .map(|k| k % PROBE_RING)
        };
        let scan = |bucket: &[u64], tag: u64| {
            bucket
                .iter()
                .find(|&&slot| slot_has_tag(slot, tag))
                .map(|&slot| entry_of(slot))
        };
        for i in 0..fps.len() + D * LATER_STAGES {
            if let Some(fp) = fps.get(i) {
                let key = Key::new(fp);
                let partition = &self.partitions[key.partition];
                let bucket_numbers = partition.bucket_numbers(key.tag);
                if let Some([b0, b1]) = bucket_numbers {
                    prefetch_line(partition.segment_of(b0));
                    prefetch_line(partition.segment_of(b1));
                }
                ring[i % PROBE_RING] = Probe {
                    fp,
                    partition,
                    tag: key.tag,
                    bucket_numbers,
                    in_table_1: false,
                    candidate: None,
                };
            }
            if let Some(k) = stage(i, 1) {
                let p = &ring[k];
                if let Some([b0, _]) = p.bucket_numbers {
                    prefetch_line(p.partition.bucket_numbered(b0));
                }
            }
            if let Some(k) = stage(i, 2) {
                let p = &mut ring[k];
                if let Some([b0, b1]) = p.bucket_numbers {
                    p.candidate = scan(p.partition.bucket_numbered(b0), p.tag);
                    match p.candidate {
                        Some(e) => prefetch_line(p.partition.block_of(e)),
                        None => {
                            p.in_table_1 = true;
                            prefetch_line(p.partition.bucket_numbered(b1));
                        }
                    }
                }
            }
            if let Some(k) = stage(i, 3) {
                let p = &mut ring[k];
                match (p.candidate, p.bucket_numbers) {
                    (Some(e), _) => prefetch_lines(p.partition.entry(e)),
                    (None, Some([_, b1])) if p.in_table_1 => {
                        p.candidate = scan(p.partition.bucket_numbered(b1), p.tag);
                        if let Some(e) = p.candidate {
                            prefetch_line(p.partition.block_of(e));
                        }
                    }
                    _ => {}
                }
            }
            if let Some(k) = stage(i, 4) {
                let p = &ring[k];
                if let (Some(e), true) = (p.candidate, p.in_table_1) {
                    prefetch_lines(p.partition.entry(e));
                }
            }
            if let Some(k) = stage(i, 5) {
                let p = &ring[k];
                let key = Key::new(p.fp);
                let found = match p.candidate {
                    // The usual hit: the prefetched entry is the fingerprint's.
                    Some(e) if key.matches(p.partition.entry(e)) => Some(e),
                    // The usual miss: no slot of either bucket has the tag.
                    None if p.partition.stash_len() == 0 => None,
                    // A tag that matched another fingerprint, or a stash to search.
                    _ => p.partition.find(&key),
                };
                out.push(found.map(|e| self.location(p.partition, e)));
            }
        }
        out
    }

    fn insert(&mut self, fp: Fingerprint, loc: ChunkLocation) -> bool {
        let key = Key::new(&fp);
        if self.partitions[key.partition].find(&key).is_some() {
            return false;
        }
        let packed = self.containers.pack(loc);
        self.partitions[key.partition].insert_new(&key, packed, loc);
        self.len += 1;
        true
    }

    fn len(&self) -> usize {
        self.len
    }
}
