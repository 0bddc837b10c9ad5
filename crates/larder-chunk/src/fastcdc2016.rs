//! FastCDC as published in 2016 (Xia et al., USENIX ATC'16, Algorithm 1).
//!
//! Gear rolling hash, zero-padded masks, sub-minimum cut-point skipping and normalized
//! chunking. One byte per step. This is the executable spec that [`crate::FastCdc2020`]
//! is checked against; cut points equal those of the `fastcdc` crate's `v2016` module
//! wherever that crate accepts the sizes (`min_size >= 64`). Smaller minimums, down to
//! 0 for the paper's Fig. 11 study, follow the same algorithm: hashing starts at byte
//! `min_size`, and judging byte `i` ends the chunk before it, so with `min_size` 0 byte
//! 0 is hashed but never judged (a chunk is never empty).

use crate::gear_table::GearTables;
use crate::masks::select_masks;
use crate::Chunker;

/// FastCDC, 2016 form.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FastCdc2016 {
    min_size: usize,
    avg_size: usize,
    max_size: usize,
    mask_s: u64,
    mask_l: u64,
    gear: &'static [u64; 256],
}

impl FastCdc2016 {
    /// Sizes and level must pass [`crate::ChunkerConfig::validate`].
    pub fn new(min_size: usize, avg_size: usize, max_size: usize, level: u8) -> Self {
        Self::with_seed(min_size, avg_size, max_size, level, 0)
    }

    /// With every Gear table entry XORed with `seed`: for even sizes, the cut points
    /// of [`crate::FastCdc2020::with_seed`].
    pub fn with_seed(
        min_size: usize,
        avg_size: usize,
        max_size: usize,
        level: u8,
        seed: u64,
    ) -> Self {
        let (mask_s, mask_l) = select_masks(avg_size, level);
        Self {
            min_size,
            avg_size,
            max_size,
            mask_s,
            mask_l,
            gear: &GearTables::for_seed(seed).gear,
        }
    }
}

impl Chunker for FastCdc2016 {
    fn next_chunk_len(&self, data: &[u8]) -> usize {
        let mut end = data.len();
        if end <= self.min_size {
            return end;
        }
        let mut center = self.avg_size;
        if end > self.max_size {
            end = self.max_size;
        } else if end < center {
            center = end;
        }
        // The hash starts at zero at `min_size`: bytes before it are skipped, not hashed.
        // Judging byte `i` yields a chunk of `i` bytes, so with `min_size` 0 byte 0 is
        // hashed but not judged: a chunk is never empty.
        let mut hash = 0u64;
        let mut i = self.min_size;
        if i == 0 {
            hash = self.gear[usize::from(data[0])];
            i = 1;
        }
        while i < center {
            hash = (hash << 1).wrapping_add(self.gear[usize::from(data[i])]);
            if hash & self.mask_s == 0 {
                return i;
            }
            i += 1;
        }
        while i < end {
            hash = (hash << 1).wrapping_add(self.gear[usize::from(data[i])]);
            if hash & self.mask_l == 0 {
                return i;
            }
            i += 1;
        }
        end
    }

    fn max_size(&self) -> usize {
        self.max_size
    }
}
