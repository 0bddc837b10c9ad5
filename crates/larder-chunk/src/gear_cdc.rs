//! Plain Gear-based chunking (Ddelta, Xia et al. 2014), the baseline that FastCDC
//! improves on (FastCDC paper, sections 3 and 5.2, "GC" in Table 3).
//!
//! The Gear hash is `h = (h << 1) + GEAR[b]` over 64-bit words. A chunk may end where
//! `h & (D - 1) == 0`, with `D = avg_size` a power of two: the judged mask is the
//! lowest `log2(D)` bits, contiguous and unpadded. Bit `k` of `h` depends only on the
//! last `k + 1` bytes hashed, so the judgement sees a window of only `log2(D)` bytes
//! (13 at 8 KiB, where Rabin sees 48): the weakness the FastCDC paper measures as a
//! lower dedup ratio than Rabin's and fixes with zero-padded masks (see
//! [`crate::MASKS`]). Written out over the window `b_1 .. b_n`, `n = log2(D)`:
//!
//! ```text
//! h mod 2^n = (GEAR[b_n] + 2 * GEAR[b_(n-1)] + ... + 2^(n-1) * GEAR[b_1]) mod 2^n
//! ```
//!
//! `docs/design/chunking.md` is the full specification.

use crate::gear_table::GEAR;
use crate::Chunker;

/// Plain Gear-based chunking with a low-bit mask.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GearCdc {
    min_size: usize,
    max_size: usize,
    /// `D - 1`: the lowest `log2(D)` bits.
    mask: u64,
    /// `log2(D)`: the bytes that decide a judgement.
    window: usize,
}

impl GearCdc {
    /// Sizes must pass [`crate::ChunkerConfig::validate`]: `avg_size` a power of two,
    /// `min_size <= avg_size <= max_size`.
    pub fn new(min_size: usize, avg_size: usize, max_size: usize) -> Self {
        debug_assert!(
            avg_size.is_power_of_two() && avg_size > 1,
            "GearCdc needs a power-of-two average size (got {avg_size})"
        );
        Self {
            min_size,
            max_size,
            mask: avg_size as u64 - 1,
            window: avg_size.trailing_zeros() as usize,
        }
    }

    /// The bytes a judgement depends on: `log2(avg_size)`.
    pub fn window(&self) -> usize {
        self.window
    }
}

impl Chunker for GearCdc {
    fn next_chunk_len(&self, data: &[u8]) -> usize {
        let end = data.len().min(self.max_size);
        // The shortest chunk that may end at a cut; a chunk is never empty.
        let first = self.min_size.max(1);
        if end <= first {
            return end;
        }
        // Cut-point skipping: bytes before the window of the first candidate are not
        // read. Older bytes shift out of the judged bits by themselves, so the hash
        // needs no explicit removal.
        let start = first.saturating_sub(self.window);
        let mut hash = data[start..first]
            .iter()
            .fold(0u64, |h, &b| (h << 1).wrapping_add(GEAR[usize::from(b)]));
        for (i, &b) in data[first..end].iter().enumerate() {
            if hash & self.mask == 0 {
                return first + i;
            }
            hash = (hash << 1).wrapping_add(GEAR[usize::from(b)]);
        }
        end
    }

    fn max_size(&self) -> usize {
        self.max_size
    }
}
