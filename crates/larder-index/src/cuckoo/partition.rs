//! One partition: a two-table bucketized cuckoo hash of slots, the entries the slots
//! name, a stash for slots no bucket could take, and the locations too large for the
//! entry's fields.

use std::collections::{BTreeSet, HashMap};

use super::layout::{
    bucket_of, entry_of, slot_has_tag, slot_of, tag_of, Entry, Key, PackedLocation, ENTRY_LEN,
    MAX_ENTRIES,
};
use crate::prefetch::prefetch_line;
use crate::ChunkLocation;

pub(crate) const SLOTS_PER_BUCKET: usize = 4;
/// Bytes of a bucket, and its alignment: a bucket never straddles a cache line.
const BUCKET_ALIGN: usize = SLOTS_PER_BUCKET * 8;

/// Buckets are allocated in segments of this many (1 KiB), so that every table of
/// every partition is made of allocations of one size: a partition that grows frees
/// segments that the next growing partition reuses, and memory does not fragment.
pub(crate) const SEGMENT_BUCKETS: usize = 32;
/// A segment's slots, plus up to 24 bytes of lead-in that puts the first bucket on a
/// 32-byte boundary. The allocation itself asks only for 8-byte alignment: a request
/// for more would go to the allocator's aligned path, which pads each block and cannot
/// reuse freed segments for new ones (measured: about 1.7 bytes more resident memory
/// per fingerprint at 10 million, examples/index_memory.rs).
const SEGMENT_WORDS: usize = SEGMENT_BUCKETS * SLOTS_PER_BUCKET + 3;

/// A segment of buckets: slot `k` of bucket `b` is `words[lead_in + b * 4 + k]`.
struct Segment(Box<[u64; SEGMENT_WORDS]>);

impl Segment {
    fn new() -> Self {
        Self(Box::new([0; SEGMENT_WORDS]))
    }

    /// Words before the first 32-byte boundary (0 to 3).
    fn lead_in(&self) -> usize {
        (self.0.as_ptr() as usize).wrapping_neg() % BUCKET_ALIGN / 8
    }

    fn bucket(&self, b: usize) -> &[u64] {
        let start = self.lead_in() + b * SLOTS_PER_BUCKET;
        &self.0[start..start + SLOTS_PER_BUCKET]
    }

    fn bucket_mut(&mut self, b: usize) -> &mut [u64] {
        let start = self.lead_in() + b * SLOTS_PER_BUCKET;
        &mut self.0[start..start + SLOTS_PER_BUCKET]
    }

    fn slots(&self) -> &[u64] {
        let start = self.lead_in();
        &self.0[start..start + SEGMENT_BUCKETS * SLOTS_PER_BUCKET]
    }
}

/// Entries are allocated in blocks of this many (2240 bytes) and never move.
pub(crate) const BLOCK_ENTRIES: usize = 256;

pub(crate) struct EntryBlock([Entry; BLOCK_ENTRIES]);

/// Evictions one insert may make before its last evicted slot counts as homeless.
const MAX_KICKS: usize = 250;
/// A partition grows before an insert that would take its tables above this load:
/// above it random kick walks get long (examples/index_memory.rs reports kicks per
/// insert).
const MAX_LOAD: f64 = 0.95;
/// A partition also grows when a slot is homeless at this load or above; below it the
/// slot goes to the stash. Random fingerprints do not fail that early; fingerprints
/// crafted to share buckets do, and growing would not separate them.
const GROW_LOAD: f64 = 0.85;
/// Growth factor of a partition's bucket count, rounded to the nearest whole segment
/// (and at least one segment more).
const GROWTH_NUMERATOR: usize = 5;
const GROWTH_DENOMINATOR: usize = 4;
/// The load `with_capacity` sizes tables for: a margin below the load where random
/// kick walks start failing (about 0.95), for partitions that get more than their
/// share.
pub(crate) const TARGET_LOAD: f64 = 0.90;
/// The most that rounding to whole segments may raise that load to.
const ROUNDED_LOAD: f64 = 0.93;

#[derive(Default)]
pub(crate) struct Partition {
    /// Table 0 is buckets `0..buckets_per_table`, table 1 the next `buckets_per_table`;
    /// bucket `b` is `segments[b / SEGMENT_BUCKETS].0[b % SEGMENT_BUCKETS]`.
    segments: Vec<Segment>,
    /// A multiple of [`SEGMENT_BUCKETS`]; 0 until the first insert.
    buckets_per_table: usize,
    /// Entry `e` is `blocks[e / BLOCK_ENTRIES].0[e % BLOCK_ENTRIES]`; entries
    /// `0..len` are written, each named by exactly one slot in the tables or the stash.
    blocks: Vec<Box<EntryBlock>>,
    len: usize,
    /// Slots in the tables (the others are in the stash).
    in_tables: usize,
    /// Slots that neither of their buckets could take, ordered (by tag first), so that
    /// even a stash that crafted fingerprints filled is searched in logarithmic time.
    /// Empty for random fingerprints (see `GROW_LOAD`).
    stash: BTreeSet<u64>,
    /// Locations of entries whose fields say overflow, by entry number.
    overflow: HashMap<usize, ChunkLocation>,
    pub kicks: u64,
    pub growths: u64,
    /// State of the xorshift generator that picks eviction victims.
    random: u64,
}

impl Partition {
    /// A partition sized for `expected` entries at about [`TARGET_LOAD`] (the bucket
    /// count rounded to the nearest whole segment).
    pub fn with_capacity(expected: usize) -> Self {
        let mut p = Self::default();
        if expected > 0 {
            let buckets = expected as f64 / TARGET_LOAD / (2 * SLOTS_PER_BUCKET) as f64;
            let mut segments = (buckets / SEGMENT_BUCKETS as f64).round().max(1.0) as usize;
            let segment_slots = SEGMENT_BUCKETS * SLOTS_PER_BUCKET;
            if expected as f64 > (2 * segments * segment_slots) as f64 * ROUNDED_LOAD {
                segments += 1;
            }
            p.allocate(segments * SEGMENT_BUCKETS);
            p.blocks.reserve_exact(expected.div_ceil(BLOCK_ENTRIES));
        }
        p
    }

    fn allocate(&mut self, buckets_per_table: usize) {
        let segments = 2 * buckets_per_table / SEGMENT_BUCKETS;
        self.segments = (0..segments).map(|_| Segment::new()).collect();
        self.buckets_per_table = buckets_per_table;
        self.in_tables = 0;
    }

    pub fn slot_count(&self) -> usize {
        2 * self.buckets_per_table * SLOTS_PER_BUCKET
    }

    pub fn stash_len(&self) -> usize {
        self.stash.len()
    }

    /// Bytes this partition asked the allocator for.
    pub fn heap_bytes(&self) -> usize {
        self.segments.capacity() * 8
            + self.segments.len() * SEGMENT_WORDS * 8
            + self.blocks.capacity() * 8
            + self.blocks.len() * size_of::<EntryBlock>()
            + self.stash.len() * 8
            + self.overflow.capacity() * (8 + size_of::<ChunkLocation>())
    }

    /// Bucket `index` of `table`: its four slots.
    fn bucket(&self, table: usize, index: usize) -> &[u64] {
        let b = table * self.buckets_per_table + index;
        self.segments[b / SEGMENT_BUCKETS].bucket(b % SEGMENT_BUCKETS)
    }

    fn bucket_mut(&mut self, table: usize, index: usize) -> &mut [u64] {
        let b = table * self.buckets_per_table + index;
        self.segments[b / SEGMENT_BUCKETS].bucket_mut(b % SEGMENT_BUCKETS)
    }

    /// The bucket of `table` that may hold `tag`. Only for a partition with tables
    /// (one that is not empty).
    pub fn bucket_for(&self, table: usize, tag: u64) -> &[u64] {
        self.bucket(table, bucket_of(table, tag, self.buckets_per_table))
    }

    pub fn entry(&self, e: usize) -> &Entry {
        &self.blocks[e / BLOCK_ENTRIES].0[e % BLOCK_ENTRIES]
    }

    /// The entry number of `key`'s fingerprint, if this partition holds it.
    pub fn find(&self, key: &Key) -> Option<usize> {
        let buckets = self.buckets_for(key.tag)?;
        // Both buckets are requested before either is read, so their misses overlap.
        buckets.iter().for_each(|b| prefetch_line(b));
        buckets
            .into_iter()
            .flatten()
            .chain(
                self.stash
                    .range(slot_of(key.tag, 0)..=slot_of(key.tag, MAX_ENTRIES - 1)),
            )
            .filter(|&&slot| slot_has_tag(slot, key.tag))
            .map(|&slot| entry_of(slot))
            .find(|&e| key.matches(self.entry(e)))
    }

    /// `tag`'s two buckets, table 0's first; `None` for a partition without tables.
    pub fn buckets_for(&self, tag: u64) -> Option<[&[u64]; 2]> {
        (self.buckets_per_table > 0).then(|| [self.bucket_for(0, tag), self.bucket_for(1, tag)])
    }

    /// The numbers (across both tables) of `tag`'s two buckets; `None` for a
    /// partition without tables. For [`Partition::segment_of`] and
    /// [`Partition::bucket_numbered`].
    pub fn bucket_numbers(&self, tag: u64) -> Option<[usize; 2]> {
        let n = self.buckets_per_table;
        (n > 0).then(|| [bucket_of(0, tag, n), n + bucket_of(1, tag, n)])
    }

    /// Where the pointer to bucket `b`'s segment is kept (to prefetch it).
    pub fn segment_of(&self, b: usize) -> &[impl Sized] {
        std::slice::from_ref(&self.segments[b / SEGMENT_BUCKETS])
    }

    pub fn bucket_numbered(&self, b: usize) -> &[u64] {
        self.segments[b / SEGMENT_BUCKETS].bucket(b % SEGMENT_BUCKETS)
    }

    /// Where the pointer to entry `e`'s block is kept (to prefetch it).
    pub fn block_of(&self, e: usize) -> &[impl Sized] {
        std::slice::from_ref(&self.blocks[e / BLOCK_ENTRIES])
    }

    /// The location overflow entry `e` was inserted with.
    pub fn overflow_location(&self, e: usize) -> Option<ChunkLocation> {
        self.overflow.get(&e).copied()
    }

    /// Adds `key`'s fingerprint, which this partition must not hold yet.
    pub fn insert_new(&mut self, key: &Key, packed: PackedLocation, loc: ChunkLocation) {
        let e = self.len;
        assert!(
            e < MAX_ENTRIES,
            "a cuckoo index partition holds at most {MAX_ENTRIES} fingerprints"
        );
        if e.is_multiple_of(BLOCK_ENTRIES) {
            self.blocks
                .push(Box::new(EntryBlock([[0; ENTRY_LEN]; BLOCK_ENTRIES])));
        }
        self.blocks[e / BLOCK_ENTRIES].0[e % BLOCK_ENTRIES] = key.entry(packed);
        if packed.is_overflow() {
            self.overflow.insert(e, loc);
        }
        self.len += 1;
        if self.buckets_per_table == 0 {
            self.allocate(SEGMENT_BUCKETS);
        }
        self.place(slot_of(key.tag, e));
    }

    /// Puts `slot` in the tables, growing them first if they are full enough, or in the
    /// stash if kicks fail below [`GROW_LOAD`].
    fn place(&mut self, slot: u64) {
        if self.load_with_one_more() > MAX_LOAD {
            self.grow();
        }
        let Err(homeless) = self.try_place(slot) else {
            return;
        };
        if self.load_with_one_more() >= GROW_LOAD {
            self.grow();
            if let Err(still_homeless) = self.try_place(homeless) {
                self.stash.insert(still_homeless);
            }
        } else {
            self.stash.insert(homeless);
        }
    }

    fn load_with_one_more(&self) -> f64 {
        (self.in_tables + 1) as f64 / self.slot_count() as f64
    }

    /// Cuckoo insertion: a free slot in either bucket; else, from a full bucket, move
    /// one of its slots whose bucket in the other table has room (the four candidate
    /// buckets are fetched together), or failing that evict a random one and go on
    /// from its full bucket in the other table, up to [`MAX_KICKS`] times. On failure
    /// returns the slot left without a place, which may be any slot of the chain;
    /// every other slot is in the tables.
    fn try_place(&mut self, slot: u64) -> Result<(), u64> {
        let tag = tag_of(slot);
        for table in 0..2 {
            if self.put_in_free_slot(table, tag, slot) {
                return Ok(());
            }
        }
        let n = self.buckets_per_table;
        let mut homeless = slot;
        let mut table = (self.next_random() & 1) as usize;
        for _ in 0..MAX_KICKS {
            let index = bucket_of(table, tag_of(homeless), n);
            if self.put_in_free_slot(table, tag_of(homeless), homeless) {
                return Ok(());
            }
            let other = table ^ 1;
            let mut residents = [0; SLOTS_PER_BUCKET];
            residents.copy_from_slice(self.bucket(table, index));
            for &r in &residents {
                prefetch_line(self.bucket(other, bucket_of(other, tag_of(r), n)));
            }
            for (position, &r) in residents.iter().enumerate() {
                if self.put_in_free_slot(other, tag_of(r), r) {
                    self.bucket_mut(table, index)[position] = homeless;
                    self.kicks += 1;
                    return Ok(());
                }
            }
            let victim = (self.next_random() % SLOTS_PER_BUCKET as u64) as usize;
            std::mem::swap(&mut homeless, &mut self.bucket_mut(table, index)[victim]);
            self.kicks += 1;
            table = other;
        }
        Err(homeless)
    }

    fn put_in_free_slot(&mut self, table: usize, tag: u64, slot: u64) -> bool {
        let index = bucket_of(table, tag, self.buckets_per_table);
        match self.bucket_mut(table, index).iter_mut().find(|s| **s == 0) {
            Some(free) => {
                *free = slot;
                self.in_tables += 1;
                true
            }
            None => false,
        }
    }

    /// Rebuilds the tables with more buckets and places every slot again, the stash's
    /// included. Slots carry their bucket choices in their tags, so the entries are not
    /// read.
    fn grow(&mut self) {
        let old_buckets = self.buckets_per_table;
        let target = old_buckets * GROWTH_NUMERATOR / GROWTH_DENOMINATOR;
        let nearest_whole_segments = (target + SEGMENT_BUCKETS / 2) / SEGMENT_BUCKETS;
        let grown = (nearest_whole_segments * SEGMENT_BUCKETS).max(old_buckets + SEGMENT_BUCKETS);
        let old_segments = std::mem::take(&mut self.segments);
        let old_stash = std::mem::take(&mut self.stash);
        self.allocate(grown);
        self.growths += 1;
        let old_slots = old_segments
            .iter()
            .flat_map(Segment::slots)
            .copied()
            .filter(|&s| s != 0);
        for slot in old_slots.chain(old_stash) {
            if let Err(homeless) = self.try_place(slot) {
                self.stash.insert(homeless);
            }
        }
    }

    /// Every occupied slot: the tables', then the stash's.
    pub fn slots(&self) -> impl Iterator<Item = u64> + '_ {
        self.segments
            .iter()
            .flat_map(Segment::slots)
            .copied()
            .filter(|&s| s != 0)
            .chain(self.stash.iter().copied())
    }

    fn next_random(&mut self) -> u64 {
        if self.random == 0 {
            self.random = 0x9e37_79b9_7f4a_7c15;
        }
        self.random ^= self.random << 13;
        self.random ^= self.random >> 7;
        self.random ^= self.random << 17;
        self.random
    }
}
