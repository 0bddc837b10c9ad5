//! FastCDC as revised in 2020 (Xia et al., IEEE TPDS): two bytes per step.
//!
//! After two steps the 2016 hash is `(h << 2) + (GEAR[a] << 1) + GEAR[b]`. Testing
//! `(h << 2) + GEAR_LS[a]` against `mask << 1` is the 2016 test at byte `a` (no mask
//! uses bit 63), so every even and odd position is judged exactly as in 2016. The one
//! difference, shared with the `fastcdc` crate's `v2020`: when the stretch to judge
//! ends on an odd length, its last byte is never a cut candidate. That can only happen
//! in the final chunk of a stream whose remaining length is odd and below `max_size`.

use crate::gear::{GEAR, GEAR_LS};
use crate::masks::select_masks;
use crate::Chunker;

/// FastCDC, 2020 form. Sizes must be even.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FastCdc2020 {
    min_size: usize,
    avg_size: usize,
    max_size: usize,
    mask_s: u64,
    mask_l: u64,
}

impl FastCdc2020 {
    /// Sizes and level must pass [`crate::ChunkerConfig::validate`] (sizes even).
    pub fn new(min_size: usize, avg_size: usize, max_size: usize, level: u8) -> Self {
        let (mask_s, mask_l) = select_masks(avg_size, level);
        Self {
            min_size,
            avg_size,
            max_size,
            mask_s,
            mask_l,
        }
    }
}

impl Chunker for FastCdc2020 {
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
        let data = &data[..end];
        let (mask_s, mask_l) = (self.mask_s, self.mask_l);
        let (mask_s_ls, mask_l_ls) = (mask_s << 1, mask_l << 1);
        let mut hash = 0u64;
        let mut pair = self.min_size / 2;
        while pair < center / 2 {
            let a = pair * 2;
            hash = (hash << 2).wrapping_add(GEAR_LS[usize::from(data[a])]);
            if hash & mask_s_ls == 0 {
                return a;
            }
            hash = hash.wrapping_add(GEAR[usize::from(data[a + 1])]);
            if hash & mask_s == 0 {
                return a + 1;
            }
            pair += 1;
        }
        while pair < end / 2 {
            let a = pair * 2;
            hash = (hash << 2).wrapping_add(GEAR_LS[usize::from(data[a])]);
            if hash & mask_l_ls == 0 {
                return a;
            }
            hash = hash.wrapping_add(GEAR[usize::from(data[a + 1])]);
            if hash & mask_l == 0 {
                return a + 1;
            }
            pair += 1;
        }
        end
    }

    fn max_size(&self) -> usize {
        self.max_size
    }
}
