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
//!
//! Odd sizes are judged as the crate judges them: pairs start at the even offset
//! `min_size & !1` (so an odd minimum lets a chunk end one byte before it), and the
//! last pair before the normal size or the maximum ends at an even offset. The Remote
//! Execution API's FastCDC parameters use such a maximum (65535); `tests/reapi.rs`
//! checks its published vectors.

use crate::gear_table::GearTables;
use crate::kernels;
use crate::masks::select_masks;
use crate::Chunker;

/// FastCDC, 2020 form.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FastCdc2020 {
    min_size: usize,
    avg_size: usize,
    max_size: usize,
    mask_s: u64,
    mask_l: u64,
    tables: &'static GearTables,
}

impl FastCdc2020 {
    /// Sizes and level must pass [`crate::ChunkerConfig::validate`].
    pub fn new(min_size: usize, avg_size: usize, max_size: usize, level: u8) -> Self {
        Self::with_seed(min_size, avg_size, max_size, level, 0)
    }

    /// With every Gear table entry XORed with `seed`, as the `fastcdc` crate's
    /// `with_level_and_seed`.
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
            tables: GearTables::for_seed(seed),
        }
    }

    /// The 64-bit Gear value at the cut that [`Chunker::next_chunk_len`] made in
    /// `data` at `len`: the "fingerprint" of the Remote Execution API's FastCDC 2020
    /// test vectors, which the `fastcdc` crate's `v2020` reports with each chunk.
    /// - 0 when `data` is no longer than the minimum;
    /// - for a judged cut, the hash through byte `len` (the first byte after the
    ///   chunk), doubled when `len` is even (even bytes are judged on the doubled
    ///   hash);
    /// - otherwise the hash through the last judged byte, from the first pair on. The
    ///   crate since 5.0.0 also folds in the unjudged last byte of an odd-length chunk
    ///   (`h << 1` plus its table entry); the API's vectors, made before that, do not,
    ///   and larder follows the vectors.
    ///
    /// A second, scalar pass over the chunk: for reports, not for backups.
    pub fn cut_fingerprint(&self, data: &[u8], len: usize) -> u64 {
        if data.len() <= self.min_size {
            return 0;
        }
        let end = data.len().min(self.max_size);
        let judged = len < end;
        let last = if judged { len + 1 } else { end & !1 };
        let gear = &self.tables.gear;
        let hash = data[self.min_size & !1..last]
            .iter()
            .fold(0u64, |h, &b| (h << 1).wrapping_add(gear[usize::from(b)]));
        if judged && len.is_multiple_of(2) {
            hash << 1
        } else {
            hash
        }
    }
}

/// Bytes judged per unrolled loop step; 16 measured faster than 8 and 32.
const STEP: usize = 16;

/// For the pair `(a, b)` that follows `hash`: the doubled 2016 hash at `a` and the
/// 2016 hash at `b`. Since `mask` has no bit 63, `(2x) & (mask << 1) == 0` exactly when
/// `x & mask == 0`.
#[inline(always)]
fn pair_hashes(tables: &GearTables, hash: u64, a: u8, b: u8) -> (u64, u64) {
    let doubled_a = (hash << 2).wrapping_add(opaque(tables.gear_ls[usize::from(a)]));
    (
        doubled_a,
        doubled_a.wrapping_add(tables.gear[usize::from(b)]),
    )
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

/// Judges every byte of `bytes` (an even number of them) against `mask`, continuing
/// the 2016 hash in `hash`: the offset of the first cut, or `None` with `hash` updated.
///
/// Zero runs (sparse files, disk images, padding) are crossed at memory speed: when a
/// step ends with the hash at [`GearTables::zero_run_hash`], that hash was just judged and did not
/// match, and it stays the same over every following zero byte, so none of them can
/// match; the scan jumps to the end of the run (an even number of bytes, keeping the
/// pairs aligned) with [`kernels::run_len`]. `tests/zero_runs.rs` checks the result
/// against `FastCdc2016`, which judges every byte.
#[inline(always)]
fn scan(tables: &GearTables, bytes: &[u8], hash: &mut u64, mask: u64) -> Option<usize> {
    let mask_ls = mask << 1;
    let zero_run_hash = tables.zero_run_hash();
    let mut h = *hash;
    let mut pos = 0;
    while let Some(step) = bytes.get(pos..pos + STEP) {
        // A fixed trip count: unrolled, with no bounds checks.
        for (k, &[a, b]) in step.as_chunks::<2>().0.iter().enumerate() {
            let (doubled_a, at_b) = pair_hashes(tables, h, a, b);
            if doubled_a & mask_ls == 0 {
                return Some(pos + k * 2);
            }
            if at_b & mask == 0 {
                return Some(pos + k * 2 + 1);
            }
            h = at_b;
        }
        pos += STEP;
        if h == zero_run_hash {
            pos += kernels::run_len(&bytes[pos..], 0) & !1;
        }
    }
    for (k, &[a, b]) in bytes[pos..].as_chunks::<2>().0.iter().enumerate() {
        let (doubled_a, at_b) = pair_hashes(tables, h, a, b);
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
        // Whole pairs from an even offset: `min_size & !1 <= center & !1 <= end & !1`
        // since `min_size < end` and `min_size <= center <= end`.
        let judged = &data[..end & !1];
        let (strict, relaxed) = judged.split_at(center & !1);
        let gear = &self.tables.gear;
        // The hash starts at zero at the first pair: bytes before it are skipped.
        let mut hash = 0u64;
        let mut first = self.min_size & !1;
        if first == 0 && !strict.is_empty() {
            // Judging byte `i` yields a chunk of `i` bytes, so byte 0 is hashed but not
            // judged, as in FastCdc2016. `strict` is empty or at least a pair long:
            // `center & !1` is 0 or at least 2.
            hash = gear[usize::from(strict[0])];
            hash = (hash << 1).wrapping_add(gear[usize::from(strict[1])]);
            if hash & self.mask_s == 0 {
                return 1;
            }
            first = 2;
        }
        if let Some(cut) = scan(self.tables, &strict[first..], &mut hash, self.mask_s) {
            return first + cut;
        }
        if let Some(cut) = scan(self.tables, relaxed, &mut hash, self.mask_l) {
            return strict.len() + cut;
        }
        end
    }

    fn max_size(&self) -> usize {
        self.max_size
    }
}
