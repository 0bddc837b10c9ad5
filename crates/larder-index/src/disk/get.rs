//! Lookups that only read, for the repository's read paths (restore, check, cat,
//! diff): unlike `submit`, a fingerprint found nowhere is answered `None` and leaves no
//! trace (it does not become pending).

use larder_hash::Fingerprint;

use super::io::IndexIo;
use super::DiskIndex;
use crate::{ChunkLocation, Result};

impl<I: IndexIo, T> DiskIndex<I, T> {
    /// Where `fp` is stored, if it is indexed: the Bloom filter, the cache, the insert
    /// buffer, then the bucket's chain on disk; a hit on disk prefetches the N records
    /// that follow it, as the eager lookup does, so that reading a file's chunks in
    /// order mostly hits the cache.
    pub fn get(&mut self, fp: &Fingerprint) -> Result<Option<ChunkLocation>> {
        if !self.store.may_contain(fp) {
            return Ok(None);
        }
        if let Some(location) = self.cache.get(fp) {
            return Ok(Some(location));
        }
        if let Some(found) = self.store.buffered(fp) {
            return Ok(Some(found.location));
        }
        let Some(found) = self.store.lookup_one(fp)? else {
            return Ok(None);
        };
        self.cache.insert(*fp, found.location);
        let n = self.config.prefetch;
        self.prefetch(found.position..found.position.saturating_add(n))?;
        Ok(Some(found.location))
    }
}

#[cfg(test)]
mod tests {
    use larder_hash::HashAlgo;

    use super::super::{DiskIndexConfig, Lookup, MemIo};
    use super::*;

    #[test]
    fn get_finds_what_was_inserted_and_nothing_else() {
        let config = DiskIndexConfig {
            memory_budget: 1 << 20,
            expected_fingerprints: 5_000,
            prefetch: 64,
            ..DiskIndexConfig::default()
        };
        let fp = |i: u64| HashAlgo::Blake3.fingerprint(&i.to_le_bytes());
        let loc = |i: u64| ChunkLocation {
            container: i / 7,
            offset: i as u32,
            length: 100,
        };
        let mut index =
            DiskIndex::<MemIo, u64>::create(MemIo::new(), config.clone(), Lookup::Eager).unwrap();
        for i in 0..3_000 {
            index.submit(fp(i), i).unwrap();
            let answer = index.poll().unwrap();
            assert_eq!(answer.answer, super::super::Answer::New);
            index.insert(fp(i), loc(i)).unwrap();
        }
        let io = index.close().unwrap();
        let mut index = DiskIndex::<MemIo, u64>::open(io, config, Lookup::Lazy).unwrap();
        for i in (0..3_000).rev() {
            assert_eq!(index.get(&fp(i)).unwrap(), Some(loc(i)), "fingerprint {i}");
        }
        for i in 3_000..6_000 {
            assert_eq!(index.get(&fp(i)).unwrap(), None, "phantom {i}");
        }
        assert_eq!(index.awaiting_insert(), 0);
        assert_eq!(index.unresolved(), 0);
    }
}
