//! Exact fingerprint indexes: fingerprint to the place its chunk is stored.
//!
//! Exact means no false answers either way: a fingerprint that was inserted is always
//! found, and one that was not is never reported. [`CuckooIndex`] keeps everything in
//! memory (docs/design/index.md); the repository persists it as index segments (see
//! docs/design/format.md) and can rebuild it from the containers alone.
//! [`disk::DiskIndex`] keeps the fingerprints on disk within a memory budget, with eager
//! or lazy lookup (docs/design/disk-index.md).

mod cuckoo;
pub mod disk;
mod error;
pub mod prefetch;

pub use cuckoo::{CuckooIndex, IndexStats};
pub use error::{IndexError, Result};

use larder_hash::Fingerprint;

/// Where a chunk's bytes are: a container and a byte range inside it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkLocation {
    pub container: u64,
    pub offset: u32,
    pub length: u32,
}

/// An exact fingerprint index. Every implementation passes the shared suite in
/// `tests` below.
pub trait FingerprintIndex: Send {
    /// The location of `fp`, if it is indexed.
    fn get(&self, fp: &Fingerprint) -> Option<ChunkLocation>;

    /// The location of each of `fps`, in order: `get_batch(fps)[i] == get(&fps[i])`.
    /// Implementations overlap the memory accesses of consecutive lookups.
    fn get_batch(&self, fps: &[Fingerprint]) -> Vec<Option<ChunkLocation>>;

    /// Records `fp` at `loc` and returns `true`; if `fp` is already indexed, keeps the
    /// existing location (the first copy stays canonical) and returns `false`.
    fn insert(&mut self, fp: Fingerprint, loc: ChunkLocation) -> bool;

    /// Number of fingerprints indexed.
    fn len(&self) -> usize;

    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod suite {
    use super::*;
    use larder_hash::HashAlgo;

    fn fp(i: u64) -> Fingerprint {
        HashAlgo::Blake3.fingerprint(&i.to_le_bytes())
    }

    fn loc(i: u64) -> ChunkLocation {
        ChunkLocation {
            container: i / 100,
            offset: (i % 100) as u32 * 8192,
            length: 8192,
        }
    }

    /// The behaviour every [`FingerprintIndex`] must have.
    pub fn run(mut index: impl FingerprintIndex) {
        assert!(index.is_empty());
        for i in 0..10_000 {
            assert!(index.insert(fp(i), loc(i)));
        }
        assert_eq!(index.len(), 10_000);
        for i in 0..10_000 {
            assert_eq!(index.get(&fp(i)), Some(loc(i)), "lost fingerprint {i}");
        }
        for i in 10_000..20_000 {
            assert_eq!(index.get(&fp(i)), None, "phantom fingerprint {i}");
        }
        let mixed: Vec<Fingerprint> = (0..20_000).rev().step_by(3).map(fp).collect();
        let one_by_one: Vec<_> = mixed.iter().map(|f| index.get(f)).collect();
        assert_eq!(
            index.get_batch(&mixed),
            one_by_one,
            "get_batch differs from get"
        );
        assert_eq!(index.get_batch(&[]), Vec::new());
        assert!(
            !index.insert(fp(5), loc(99_999)),
            "second insert replaced the first"
        );
        assert_eq!(index.get(&fp(5)), Some(loc(5)));
        assert_eq!(index.len(), 10_000);
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn cuckoo_index_passes_the_shared_suite() {
        crate::suite::run(crate::CuckooIndex::new());
    }

    #[test]
    fn cuckoo_index_with_capacity_passes_the_shared_suite() {
        crate::suite::run(crate::CuckooIndex::with_capacity(10_000));
    }
}
