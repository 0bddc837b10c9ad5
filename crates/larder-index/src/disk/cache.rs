//! The LRU fingerprint cache that prefetching fills (docs/design/disk-index.md).

use std::collections::HashMap;

use larder_hash::Fingerprint;

use super::FingerprintHasher;
use crate::ChunkLocation;

/// No node: the end of the recency list.
const NIL: u32 = u32::MAX;

struct Node {
    fp: Fingerprint,
    location: ChunkLocation,
    /// Toward the most recently used end.
    newer: u32,
    /// Toward the least recently used end.
    older: u32,
}

/// A fixed-capacity map from fingerprint to location that evicts the least recently
/// used entry. Invariant: `map` and the list starting at `newest` hold the same
/// nodes, `map.len() <= capacity`.
pub struct LruCache {
    map: HashMap<Fingerprint, u32, FingerprintHasher>,
    nodes: Vec<Node>,
    newest: u32,
    oldest: u32,
    capacity: usize,
}

impl LruCache {
    /// Bytes of memory per cached fingerprint, counted for the budget: the node (56)
    /// and the map's slot (36) with its slack.
    pub const BYTES_PER_ENTRY: u64 = 112;

    pub fn new(capacity: usize) -> Self {
        let capacity = capacity.clamp(1, NIL as usize - 1);
        Self {
            map: HashMap::with_capacity_and_hasher(capacity, FingerprintHasher),
            nodes: Vec::with_capacity(capacity),
            newest: NIL,
            oldest: NIL,
            capacity,
        }
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    fn unlink(&mut self, i: u32) {
        let (newer, older) = (self.nodes[i as usize].newer, self.nodes[i as usize].older);
        match newer {
            NIL => self.newest = older,
            n => self.nodes[n as usize].older = older,
        }
        match older {
            NIL => self.oldest = newer,
            o => self.nodes[o as usize].newer = newer,
        }
    }

    fn push_newest(&mut self, i: u32) {
        self.nodes[i as usize].newer = NIL;
        self.nodes[i as usize].older = self.newest;
        match self.newest {
            NIL => self.oldest = i,
            n => self.nodes[n as usize].newer = i,
        }
        self.newest = i;
    }

    /// The location of `fp`, marking it most recently used.
    pub fn get(&mut self, fp: &Fingerprint) -> Option<ChunkLocation> {
        let i = *self.map.get(fp)?;
        if self.newest != i {
            self.unlink(i);
            self.push_newest(i);
        }
        Some(self.nodes[i as usize].location)
    }

    /// Caches `fp` at `location` as most recently used, evicting the least recently
    /// used entry when full. A fingerprint already cached keeps its location (the first
    /// copy is canonical) and is only marked used.
    pub fn insert(&mut self, fp: Fingerprint, location: ChunkLocation) {
        if self.get(&fp).is_some() {
            return;
        }
        let i = if self.map.len() < self.capacity {
            self.nodes.push(Node {
                fp,
                location,
                newer: NIL,
                older: NIL,
            });
            (self.nodes.len() - 1) as u32
        } else {
            let victim = self.oldest;
            self.unlink(victim);
            self.map.remove(&self.nodes[victim as usize].fp);
            let node = &mut self.nodes[victim as usize];
            node.fp = fp;
            node.location = location;
            victim
        };
        self.map.insert(fp, i);
        self.push_newest(i);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::VecDeque;

    fn fp(i: u8) -> Fingerprint {
        let mut b = [0u8; 32];
        b[0] = i;
        b[9] = i.wrapping_mul(37);
        Fingerprint(b)
    }

    fn loc(i: u8) -> ChunkLocation {
        ChunkLocation {
            container: u64::from(i),
            offset: 0,
            length: 1,
        }
    }

    proptest! {
        /// The cache answers like a model LRU: a deque ordered by last use.
        #[test]
        fn behaves_like_a_model_lru(capacity in 1usize..8, ops in proptest::collection::vec((any::<bool>(), 0u8..16), 0..300)) {
            let mut cache = LruCache::new(capacity);
            let mut model: VecDeque<(u8, ChunkLocation)> = VecDeque::new();
            for (is_insert, key) in ops {
                let pos = model.iter().position(|(k, _)| *k == key);
                if is_insert {
                    cache.insert(fp(key), loc(key));
                    match pos {
                        Some(p) => { let e = model.remove(p).unwrap(); model.push_front(e); }
                        None => {
                            if model.len() == capacity { model.pop_back(); }
                            model.push_front((key, loc(key)));
                        }
                    }
                } else {
                    let got = cache.get(&fp(key));
                    prop_assert_eq!(got, pos.map(|p| model[p].1));
                    if let Some(p) = pos { let e = model.remove(p).unwrap(); model.push_front(e); }
                }
                prop_assert_eq!(cache.len(), model.len());
            }
        }
    }
}
