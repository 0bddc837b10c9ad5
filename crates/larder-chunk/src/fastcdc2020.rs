//! FastCDC as revised in 2020 (Xia et al., IEEE TPDS): two bytes per step.
//!
//! After two steps the 2016 hash is `(h << 2) + (GEAR[a] << 1) + GEAR[b]`, and testing
//! `(h << 1) + GEAR[a]` is the 2016 test at byte `a`, so every even and odd position is
//! judged exactly as in 2016. The one difference, shared with the `fastcdc` crate's
//! `v2020`: when the stretch to judge ends on an odd length, its last byte is never a
//! cut candidate. That can only happen in the final chunk of a stream whose remaining
//! length is odd and below `max_size`.
//!
//! Speed: for a pair `(a, b)` after hash `h`, the doubled hash at `a` is
//! `t = (h << 2) + GEAR_LS[a]` (one `lea` from `h`), judged against `mask << 1`; the
//! hash at `b` is `t + GEAR[b]` (one `add` with a memory operand). Eight instructions a
//! pair, two on the loop-carried chain; `benches/chunk.rs` measures it against the
//! `fastcdc` crate (whose pair costs three chained instructions), and
//! `docs/performance.md` records the variants tried (off-chain pair sums, two
//! interleaved chains, AVX2 and AVX-512 gathers, vector tests), all slower on Zen 4.
//! `tests/differential.rs` and `tests/golden.rs` pin the cut points.

use crate::gear_table::{GEAR, GEAR_LS};
use crate::kernels;
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
        debug_assert!(
            [min_size, avg_size, max_size]
                .iter()
                .all(|s| s.is_multiple_of(2)),
            "FastCdc2020 needs even sizes (got {min_size}/{avg_size}/{max_size})"
        );
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

/// Bytes judged per unrolled loop step; 16 measured faster than 8 and 32.
const STEP: usize = 16;

/// For the pair `(a, b)` that follows `hash`: the doubled 2016 hash at `a` and the
/// 2016 hash at `b`. Since `mask` has no bit 63, `(2x) & (mask << 1) == 0` exactly when
/// `x & mask == 0`.
#[inline(always)]
fn pair_hashes(hash: u64, a: u8, b: u8) -> (u64, u64) {
    let doubled_a = (hash << 2).wrapping_add(opaque(GEAR_LS[usize::from(a)]));
    (doubled_a, doubled_a.wrapping_add(GEAR[usize::from(b)]))
}

/// Returns `v` unchanged, hiding where it came from. Without it LLVM folds the table
/// load into `(h << 2) + [mem]`, a `shl` and an `add` on the loop-carried chain instead
/// of one `lea`: three chained instructions a pair instead of two, 1.3x slower in
/// `benches/chunk.rs`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn opaque(mut v: u64) -> u64 {
    // SAFETY: the template is only a comment: it executes no instruction, reads and
    // writes no memory, stack or flags, and leaves `v` in its register unchanged.
    unsafe {
        core::arch::asm!("/* {0} */", inout(reg) v, options(pure, nomem, nostack, preserves_flags));
    }
    v
}

#[cfg(not(target_arch = "x86_64"))]
#[inline(always)]
fn opaque(v: u64) -> u64 {
    v
}

/// The hash after 64 or more zero bytes: `GEAR[0] * (2^64 - 1)`, the fixed point of
/// `h = (h << 1) + GEAR[0]`. Every further zero byte leaves it unchanged.
const ZERO_RUN_HASH: u64 = 0u64.wrapping_sub(GEAR[0]);

/// Judges every byte of `bytes` (an even number of them) against `mask`, continuing
/// the 2016 hash in `hash`: the offset of the first cut, or `None` with `hash` updated.
///
/// Zero runs (sparse files, disk images, padding) are crossed at memory speed: when a
/// step ends with the hash at [`ZERO_RUN_HASH`], that hash was just judged and did not
/// match, and it stays the same over every following zero byte, so none of them can
/// match; the scan jumps to the end of the run (an even number of bytes, keeping the
/// pairs aligned) with [`kernels::run_len`]. `tests/zero_runs.rs` checks the result
/// against `FastCdc2016`, which judges every byte.
#[inline(always)]
fn scan(bytes: &[u8], hash: &mut u64, mask: u64) -> Option<usize> {
    let mask_ls = mask << 1;
    let mut h = *hash;
    let mut pos = 0;
    while let Some(step) = bytes.get(pos..pos + STEP) {
        // A fixed trip count: unrolled, with no bounds checks.
        for (k, &[a, b]) in step.as_chunks::<2>().0.iter().enumerate() {
            let (doubled_a, at_b) = pair_hashes(h, a, b);
            if doubled_a & mask_ls == 0 {
                return Some(pos + k * 2);
            }
            if at_b & mask == 0 {
                return Some(pos + k * 2 + 1);
            }
            h = at_b;
        }
        pos += STEP;
        if h == ZERO_RUN_HASH {
            pos += kernels::run_len(&bytes[pos..], 0) & !1;
        }
    }
    for (k, &[a, b]) in bytes[pos..].as_chunks::<2>().0.iter().enumerate() {
        let (doubled_a, at_b) = pair_hashes(h, a, b);
        if doubled_a & mask_ls == 0 {
            return Some(pos + k * 2);
        }
        if at_b & mask == 0 {
            return Some(pos + k * 2 + 1);
        }
        h = at_b;
    }
    *hash = h;
    None
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
        // Whole pairs only; `min_size <= center & !1 <= end & !1` since sizes are even
        // and `min_size < end`, `min_size <= center <= end`.
        let judged = &data[..end & !1];
        let (strict, relaxed) = judged.split_at(center & !1);
        // The hash starts at zero at `min_size`: bytes before it are skipped, not hashed.
        let mut hash = 0u64;
        let mut first = self.min_size;
        if first == 0 && !strict.is_empty() {
            // Judging byte `i` yields a chunk of `i` bytes, so byte 0 is hashed but not
            // judged, as in FastCdc2016. `strict` is empty or at least a pair long:
            // `center & !1` is 0 or at least 2.
            hash = GEAR[usize::from(strict[0])];
            hash = (hash << 1).wrapping_add(GEAR[usize::from(strict[1])]);
            if hash & self.mask_s == 0 {
                return 1;
            }
            first = 2;
        }
        if let Some(cut) = scan(&strict[first..], &mut hash, self.mask_s) {
            return first + cut;
        }
        if let Some(cut) = scan(relaxed, &mut hash, self.mask_l) {
            return strict.len() + cut;
        }
        end
    }

    fn max_size(&self) -> usize {
        self.max_size
    }
}
