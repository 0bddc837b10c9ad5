//! The in-memory exact index: a hash map keyed by fingerprint.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use larder_hash::Fingerprint;

use crate::{ChunkLocation, FingerprintIndex};

/// Fingerprints are uniformly distributed already, so the map uses their first 8
/// bytes as the hash instead of hashing them again.
#[derive(Default)]
struct PrefixHasher(u64);

impl Hasher for PrefixHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only reached for keys other than `Fingerprint`; fold them in FNV-style.
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
        }
    }

    fn write_u64(&mut self, v: u64) {
        self.0 = v;
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
struct Key(Fingerprint);

impl std::hash::Hash for Key {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.0.prefix_u64());
    }
}

/// All fingerprints in one hash map.
#[derive(Default)]
pub struct MemIndex {
    map: HashMap<Key, ChunkLocation, BuildHasherDefault<PrefixHasher>>,
}

impl MemIndex {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn with_capacity(n: usize) -> Self {
        Self {
            map: HashMap::with_capacity_and_hasher(n, BuildHasherDefault::default()),
        }
    }

    /// Every (fingerprint, location) pair, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (Fingerprint, ChunkLocation)> + '_ {
        self.map.iter().map(|(k, v)| (k.0, *v))
    }
}

impl FingerprintIndex for MemIndex {
    fn get(&self, fp: &Fingerprint) -> Option<ChunkLocation> {
        self.map.get(&Key(*fp)).copied()
    }

    fn insert(&mut self, fp: Fingerprint, loc: ChunkLocation) -> bool {
        match self.map.entry(Key(fp)) {
            std::collections::hash_map::Entry::Occupied(_) => false,
            std::collections::hash_map::Entry::Vacant(v) => {
                v.insert(loc);
                true
            }
        }
    }

    fn len(&self) -> usize {
        self.map.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passes_the_shared_index_suite() {
        crate::suite::run(MemIndex::new());
    }
}
