//! The LRU fingerprint cache that prefetching fills (docs/design/disk-index.md).
//!
//! An open-addressing table whose slots are the entries themselves, one cache line
//! each, linked into a recency list by slot number: a hit reads the line of its home
//! slot (and, rarely, the next ones), which [`LruCache::prefetch`] can start loading
//! ahead of the lookup. A map of fingerprints to separately allocated nodes cost three
//! dependent misses per hit (the map's control bytes, its bucket, the node), which
//! dominated a node serving lookups from its partitions' caches (docs/performance.md,
//! "Cluster: lookup rate of one node").

use larder_hash::Fingerprint;

use crate::prefetch::prefetch_line;
use crate::ChunkLocation;

/// No slot: the end of the recency list.
const NIL: u32 = u32::MAX;

/// One slot of the table, one cache line.
#[repr(align(64))]
#[derive(Clone, Copy)]
struct Slot {
    fp: Fingerprint,
    location: ChunkLocation,
    /// Toward the most recently used end.
    newer: u32,
    /// Toward the least recently used end.
    older: u32,
    /// The cache's `pushes` when this entry was last made the newest. Wrapping: after
    /// 2^32 pushes an old entry may look recent and stay in place on a hit, which
    /// only bends the eviction order, never an answer.
    pushed: u32,
    full: bool,
}

const EMPTY: Slot = Slot {
    fp: Fingerprint([0; 32]),
    location: ChunkLocation {
        container: 0,
        offset: 0,
        length: 0,
    },
    newer: NIL,
    older: NIL,
    pushed: 0,
    full: false,
};

/// A fixed-capacity map from fingerprint to location that evicts the least recently
/// used entry, with one relaxation: a hit on an entry made the newest within the last
/// `capacity / 2` pushes leaves it where it is (it is in the newer half of the list
/// already). So an entry survives at least `capacity / 2` pushes after its last use
/// (`capacity` in a strict LRU), and a hit in the newer half writes no list links
/// (moving an entry touches its two neighbours' lines and the old head's).
///
/// Invariants: the table has 3/2 of `capacity` slots (at most two thirds full: a hit
/// probes two slots on average, one more line that is usually the next); linear probing from a fingerprint's home slot finds it before any empty
/// slot; the list from `newest` through `older` links visits every full slot once.
pub struct LruCache {
    slots: Vec<Slot>,
    len: usize,
    newest: u32,
    oldest: u32,
    capacity: usize,
    /// Entries made the newest so far (wrapping).
    pushes: u32,
    /// Hits on entries pushed fewer than this many pushes ago leave them in place.
    window: u32,
}

impl LruCache {
    /// Bytes of memory per cached fingerprint, counted for the budget: one and a half
    /// slots of a cache line each.
    pub const BYTES_PER_ENTRY: u64 = 3 * size_of::<Slot>() as u64 / 2;

    pub fn new(capacity: usize) -> Self {
        let capacity = capacity.clamp(1, (NIL as usize - 1) / 2);
        Self {
            slots: vec![EMPTY; capacity + capacity.div_ceil(2)],
            len: 0,
            newest: NIL,
            oldest: NIL,
            capacity,
            pushes: 0,
            window: (capacity / 2) as u32,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// `fp`'s home slot: the high bits of its bytes 24..32 times the table's size
    /// (uniform bytes; the disk table's buckets and the cluster's partitions use
    /// others).
    fn home(&self, fp: &Fingerprint) -> usize {
        let h = u64::from_le_bytes(fp.0[24..32].try_into().expect("8 bytes"));
        ((u128::from(h) * self.slots.len() as u128) >> 64) as usize
    }

    fn next(&self, i: usize) -> usize {
        if i + 1 == self.slots.len() {
            0
        } else {
            i + 1
        }
    }

    /// The slot holding `fp`, if cached.
    fn find(&self, fp: &Fingerprint) -> Option<usize> {
        let mut i = self.home(fp);
        loop {
            let slot = &self.slots[i];
            if !slot.full {
                return None;
            }
            if slot.fp == *fp {
                return Some(i);
            }
            i = self.next(i);
        }
    }

    /// Starts loading the line of `fp`'s home slot, so that a `get` or `insert` of it
    /// soon after does not wait for memory. A hint: no effect on results.
    pub fn prefetch(&self, fp: &Fingerprint) {
        prefetch_line(&self.slots[self.home(fp)..]);
    }

    fn unlink(&mut self, i: u32) {
        let (newer, older) = (self.slots[i as usize].newer, self.slots[i as usize].older);
        match newer {
            NIL => self.newest = older,
            n => self.slots[n as usize].older = older,
        }
        match older {
            NIL => self.oldest = newer,
            o => self.slots[o as usize].newer = newer,
        }
    }

    fn push_newest(&mut self, i: u32) {
        let slot = &mut self.slots[i as usize];
        slot.newer = NIL;
        slot.older = self.newest;
        slot.pushed = self.pushes;
        self.pushes = self.pushes.wrapping_add(1);
        match self.newest {
            NIL => self.oldest = i,
            n => self.slots[n as usize].newer = i,
        }
        self.newest = i;
    }

    /// The location of `fp`, marking it most recently used unless it is in the newer
    /// half of the list already.
    pub fn get(&mut self, fp: &Fingerprint) -> Option<ChunkLocation> {
        let i = self.find(fp)?;
        if self.pushes.wrapping_sub(self.slots[i].pushed) >= self.window {
            self.unlink(i as u32);
            self.push_newest(i as u32);
        }
        Some(self.slots[i].location)
    }

    /// Caches `fp` at `location` as most recently used, evicting the least recently
    /// used entry when full. A fingerprint already cached keeps its location (the first
    /// copy is canonical) and is only marked used.
    pub fn insert(&mut self, fp: Fingerprint, location: ChunkLocation) {
        if self.get(&fp).is_some() {
            return;
        }
        if self.len == self.capacity {
            self.remove(self.oldest as usize);
        }
        let mut i = self.home(&fp);
        while self.slots[i].full {
            i = self.next(i);
        }
        self.slots[i] = Slot {
            fp,
            location,
            full: true,
            ..EMPTY
        };
        self.len += 1;
        self.push_newest(i as u32);
    }

    /// Empties slot `hole` and closes the gap: each entry after it up to the next empty
    /// slot moves back into the hole when that keeps it reachable from its home slot
    /// (its home is not between the hole and it), and its list neighbours are told
    /// its new slot.
    fn remove(&mut self, mut hole: usize) {
        self.unlink(hole as u32);
        self.slots[hole].full = false;
        self.len -= 1;
        let n = self.slots.len();
        let mut j = self.next(hole);
        while self.slots[j].full {
            let home = self.home(&self.slots[j].fp);
            // Probe distances, cyclic: from its home to it, and from the hole to it.
            if (j + n - home) % n >= (j + n - hole) % n {
                self.relocate(j, hole);
                hole = j;
            }
            j = self.next(j);
        }
    }

    /// Moves the entry in slot `from` to the empty slot `to`, relinking its neighbours.
    fn relocate(&mut self, from: usize, to: usize) {
        let slot = self.slots[from];
        self.slots[to] = slot;
        self.slots[from].full = false;
        let to32 = to as u32;
        match slot.newer {
            NIL => self.newest = to32,
            n => self.slots[n as usize].older = to32,
        }
        match slot.older {
            NIL => self.oldest = to32,
            o => self.slots[o as usize].newer = to32,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::VecDeque;

    /// Distinct fingerprints whose home slots collide often in small tables (byte 31
    /// is the top of the home hash).
    fn fp(i: u8) -> Fingerprint {
        let mut b = [0u8; 32];
        b[0] = i;
        b[31] = i.wrapping_mul(151) & 0xe0;
        Fingerprint(b)
    }

    impl LruCache {
        /// The invariants: every full slot is on the recency list once, in both
        /// directions, and is found from its home slot.
        fn check(&self) {
            let mut seen = 0;
            let (mut i, mut newer) = (self.newest, NIL);
            while i != NIL {
                let slot = &self.slots[i as usize];
                assert!(slot.full, "the list reaches an empty slot {i}");
                assert_eq!(slot.newer, newer, "slot {i} links back wrong");
                assert_eq!(self.find(&slot.fp), Some(i as usize));
                seen += 1;
                (newer, i) = (i, slot.older);
            }
            assert_eq!(self.oldest, newer);
            assert_eq!(seen, self.len);
            assert_eq!(self.slots.iter().filter(|s| s.full).count(), self.len);
        }
    }

    fn loc(i: u8) -> ChunkLocation {
        ChunkLocation {
            container: u64::from(i),
            offset: 0,
            length: 1,
        }
    }

    /// The model: entries ordered newest first, each with the push count when it was
    /// made the newest; a hit moves an entry to the front unless it was pushed within
    /// the last `capacity / 2` pushes.
    struct Model {
        entries: VecDeque<(u8, ChunkLocation, u32)>,
        pushes: u32,
        capacity: usize,
    }

    impl Model {
        fn touch(&mut self, key: u8) -> Option<ChunkLocation> {
            let p = self.entries.iter().position(|(k, _, _)| *k == key)?;
            let location = self.entries[p].1;
            if self.pushes - self.entries[p].2 >= (self.capacity / 2) as u32 {
                self.entries.remove(p);
                self.entries.push_front((key, location, self.pushes));
                self.pushes += 1;
            }
            Some(location)
        }

        fn insert(&mut self, key: u8, location: ChunkLocation) {
            if self.touch(key).is_some() {
                return;
            }
            if self.entries.len() == self.capacity {
                self.entries.pop_back();
            }
            self.entries.push_front((key, location, self.pushes));
            self.pushes += 1;
        }
    }

    proptest! {
        /// The cache answers and evicts like the model.
        #[test]
        fn behaves_like_the_model(capacity in 1usize..12, ops in proptest::collection::vec((any::<bool>(), 0u8..24), 0..400)) {
            let mut cache = LruCache::new(capacity);
            let mut model = Model { entries: VecDeque::new(), pushes: 0, capacity };
            for (is_insert, key) in ops {
                if is_insert {
                    cache.insert(fp(key), loc(key));
                    model.insert(key, loc(key));
                } else {
                    prop_assert_eq!(cache.get(&fp(key)), model.touch(key));
                }
                prop_assert_eq!(cache.len(), model.entries.len());
                cache.check();
            }
            // Same entries, evicted in the same order: fill with fresh keys and check
            // that each old key leaves when the model says it does.
            for fresh in 100u8..(100 + capacity as u8) {
                cache.insert(fp(fresh), loc(fresh));
                model.insert(fresh, loc(fresh));
                for key in 0u8..24 {
                    let cached = model.entries.iter().any(|(k, _, _)| *k == key);
                    prop_assert_eq!(cache.find(&fp(key)).is_some(), cached);
                }
                cache.check();
            }
        }
    }
}
