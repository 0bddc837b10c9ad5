//! The keyed chunker: every cut decision is a pseudo-random function, under a secret
//! key, of the content around the position, so that chunk lengths tell someone
//! without the key nothing about the content beyond where it repeats.
//! `docs/design/chunking.md` (section `keyed`) specifies it byte by byte and gives the
//! security argument; this module is its fast form, and `tests/keyed.rs` checks it
//! against a position-by-position reference.
//!
//! Positions `i` in `min-1 .. end-1` are judged; a cut at `i` ends the chunk after
//! byte `i` (length `i + 1`), so lengths range as FastCDC's, `min .. end` or `end`.
//! Each position's 16-byte window `data[i-15..=i]` is judged in two stages:
//! 1. Stage 1: byte `i - a` of `AES_k1(window of a)`, where `a` is the position's
//!    anchor, must be below `T1`. Anchors are the first judged position, the
//!    *natural* positions (a public hash of the four bytes ending there has its top
//!    four bits zero: one position in 16 on random data) and forced ones 16 positions
//!    after the previous anchor, so one AES block serves up to 16 positions.
//! 2. Stage 2, for the positions that pass stage 1 (1 in 256 at 8 KiB, level 2): the
//!    first four bytes of `AES_k2(window of i)`, little-endian, must be below `T2`.
//!
//! Speed (`benches/chunk.rs`, `docs/performance.md`): positions are handled in
//! batches of [`BATCH`]: an AVX2 kernel marks the natural anchors of the batch
//! (`kernels::natural_anchors`), a scalar loop lists the anchors, the batch's windows
//! are encrypted together with many AES blocks in flight (`WindowPrf::stage1`), and
//! each anchor's 16 stage-1 bytes are compared at once. An anchor whose window equals
//! the previous anchor's reuses its AES output. Runs of one byte whose four-byte word
//! is natural (zero runs) are crossed at memory speed: every position in such a run is
//! an anchor with the same window, so all are judged alike.

use std::sync::Arc;

use larder_crypto::WindowPrf;

use crate::kernels::{self, is_natural_anchor};
use crate::Chunker;

/// Bytes in the window of a position: one AES block.
pub const KEYED_WINDOW: usize = 16;
/// A position is at most this far after its anchor (exclusive): forced anchors come
/// this many positions after the previous anchor.
pub const ANCHOR_SPACING: usize = 16;
/// The smallest minimum size the keyed chunker accepts: windows then lie inside the
/// chunk with room to spare (the first judged position is `min - 1`).
pub const KEYED_MIN_SIZE: usize = 64;
/// Positions judged per batch. Measured with `benches/chunk.rs`.
pub const BATCH: usize = 256;

/// The two stages' thresholds for an average size and normalization level.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyedThresholds {
    /// Stage 1 passes a byte below `t1`: a power of two in `1..=256`.
    pub t1: u32,
    /// Stage 2 cuts on a word below this, for positions `i` with `i + 1 < avg`.
    pub t2_strict: u64,
    /// Stage 2 cuts on a word below this, from `i + 1 >= avg` on.
    pub t2_loose: u64,
}

/// The thresholds that give FastCDC's normalized cut probabilities,
/// `p_strict = 1 / (avg 2^level)` and `p_loose = 2^level / avg`, as
/// `t1/256 * t2/2^32`:
/// - `t1` is the smallest power of two with `t1/256 >= 4 p_loose`, that is
///   `t1 avg >= 2^(10 + level)`, capped at 256;
/// - `t2 = round(p 2^40 / t1 / avg)`, rounding half up, exactly in integers:
///   `round(2^(40 - level) / (t1 avg))` and `round(2^(40 + level) / (t1 avg))`.
///
/// `avg >= 1` and `level <= 3`; for valid configs `t2 < 2^31`.
pub fn keyed_thresholds(avg: usize, level: u8) -> KeyedThresholds {
    let level = u32::from(level);
    let avg = avg.max(1) as u128;
    let mut t1: u128 = 1;
    while t1 < 256 && t1 * avg < 1 << (10 + level) {
        t1 *= 2;
    }
    let divisor = t1 * avg;
    let rounded = |numerator: u128| ((numerator + divisor / 2) / divisor).min(1 << 32) as u64;
    KeyedThresholds {
        t1: t1 as u32,
        t2_strict: rounded(1 << (40 - level)),
        t2_loose: rounded(1 << (40 + level)),
    }
}

/// The keyed chunker ([`crate::ChunkerKind::Keyed`]).
#[derive(Debug, Clone)]
pub struct KeyedCdc {
    prf: Arc<WindowPrf>,
    min_size: usize,
    avg_size: usize,
    max_size: usize,
    /// Stage 1 passes a byte at most this (`t1 - 1`).
    stage1_max: u8,
    t2_strict: u64,
    t2_loose: u64,
}

/// Flags an anchor whose window equals the previous anchor's: it reuses that AES
/// output. Positions are below 2^31 (chunks are at most 16 MiB).
const REUSE: u32 = 1 << 31;

impl KeyedCdc {
    /// Sizes and level must pass [`crate::ChunkerConfig::validate`].
    ///
    /// # Panics
    /// If `min_size` is below [`KEYED_MIN_SIZE`].
    pub fn new(
        prf: Arc<WindowPrf>,
        min_size: usize,
        avg_size: usize,
        max_size: usize,
        level: u8,
    ) -> Self {
        assert!(
            min_size >= KEYED_MIN_SIZE,
            "the keyed chunker needs min_size >= {KEYED_MIN_SIZE} (got {min_size})"
        );
        let thresholds = keyed_thresholds(avg_size, level);
        Self {
            prf,
            min_size,
            avg_size,
            max_size,
            stage1_max: (thresholds.t1 - 1) as u8,
            t2_strict: thresholds.t2_strict,
            t2_loose: thresholds.t2_loose,
        }
    }

    /// The thresholds this chunker judges with.
    pub fn thresholds(&self) -> KeyedThresholds {
        KeyedThresholds {
            t1: u32::from(self.stage1_max) + 1,
            t2_strict: self.t2_strict,
            t2_loose: self.t2_loose,
        }
    }
}

/// The window that ends at `data[i]`; `i >= 15`.
#[inline(always)]
fn window(data: &[u8], i: usize) -> &[u8; KEYED_WINDOW] {
    match data[i + 1 - KEYED_WINDOW..].first_chunk() {
        Some(window) => window,
        None => panic!("position {i} is past the data"),
    }
}

#[inline(always)]
fn window_word(data: &[u8], i: usize) -> u128 {
    u128::from_ne_bytes(*window(data, i))
}

/// Bit `j` set where `block[j] <= max`: the stage-1 passes of an anchor's positions.
#[inline(always)]
fn stage1_passes(block: &[u8; 16], max: u8) -> u32 {
    block
        .iter()
        .enumerate()
        .fold(0, |bits, (j, &b)| bits | u32::from(b <= max) << j)
}

/// One chunk's scan: the judged range and the anchor whose positions are pending.
struct Scan<'a> {
    chunker: &'a KeyedCdc,
    data: &'a [u8],
    /// Positions `i + 1 < center` are strict.
    center: usize,
    /// The last anchor seen, and its stage-1 block.
    anchor: usize,
    block: [u8; 16],
}

impl Scan<'_> {
    /// Judges positions `anchor .. anchor + count` (`count <= 16`), which all use the
    /// pending anchor: the length of the chunk that ends at the first cut among them.
    #[inline(always)]
    fn judge_pending(&self, count: usize) -> Option<usize> {
        let mut passes = stage1_passes(&self.block, self.chunker.stage1_max)
            & (u32::MAX >> (32 - count.min(16)));
        while passes != 0 {
            let i = self.anchor + passes.trailing_zeros() as usize;
            passes &= passes - 1;
            let threshold = if i + 1 < self.center {
                self.chunker.t2_strict
            } else {
                self.chunker.t2_loose
            };
            if u64::from(self.chunker.prf.stage2(window(self.data, i))) < threshold {
                return Some(i + 1);
            }
        }
        None
    }

    /// Makes `i`, a later position within 16 of the pending anchor, the new anchor
    /// with the given stage-1 block, after judging the positions before it.
    #[inline(always)]
    fn advance(&mut self, i: usize, block: [u8; 16]) -> Option<usize> {
        let cut = self.judge_pending(i - self.anchor);
        self.anchor = i;
        self.block = block;
        cut
    }

    /// Crosses a run of one byte `b` whose four-byte word is natural, if the pending
    /// anchor is the position just before `start` and its window is 16 bytes `b`
    /// (zero runs: `0 * NATURAL_MULTIPLIER = 0`). Every position of the run is then a
    /// natural anchor with that same window, so each is judged on byte 0 of the same
    /// AES block and the same stage-2 word: only the pending anchor and the first loose
    /// position among them can decide anything. Returns the first position after the
    /// run (or `start` where there is none), or the cut.
    fn skip_natural_run(&mut self, start: usize, last: usize) -> Result<usize, usize> {
        if self.anchor + 1 != start {
            return Ok(start);
        }
        let b = self.data[self.anchor];
        if window_word(self.data, self.anchor) != u128::from_ne_bytes([b; 16])
            || !is_natural_anchor(self.data, self.anchor)
        {
            return Ok(start);
        }
        let run = kernels::run_len(&self.data[start..last], b);
        if run == 0 {
            return Ok(start);
        }
        if let Some(cut) = self.judge_pending(1) {
            return Err(cut);
        }
        // Positions `i + 1 < center` are strict; `switch` is the first loose one.
        let switch = self.center.saturating_sub(1);
        if self.anchor < switch && (start..start + run).contains(&switch) {
            self.anchor = switch;
            if let Some(cut) = self.judge_pending(1) {
                return Err(cut);
            }
        }
        // The run's last position stays pending, as an anchor would.
        self.anchor = start + run - 1;
        Ok(start + run)
    }
}

impl Chunker for KeyedCdc {
    fn next_chunk_len(&self, data: &[u8]) -> usize {
        let len = data.len();
        if len <= self.min_size {
            return len;
        }
        let end = len.min(self.max_size);
        // Positions `first .. last` are judged.
        let (first, last) = (self.min_size - 1, end - 1);
        if first >= last {
            return end;
        }
        let mut scan = Scan {
            chunker: self,
            data,
            center: self.avg_size.min(end),
            anchor: first,
            block: self.prf.stage1_block(window(data, first)),
        };
        let mut naturals = [0u64; BATCH / 64];
        let mut anchors = [0u32; BATCH];
        let mut unique = [0u32; BATCH];
        let mut blocks = [[0u8; 16]; BATCH];
        let mut start = first + 1;
        while start < last {
            start = match scan.skip_natural_run(start, last) {
                Ok(next) => next,
                Err(cut) => return cut,
            };
            if start >= last {
                break;
            }
            let stop = (start + BATCH).min(last);
            kernels::natural_anchors(data, start, &mut naturals);
            // List the anchors of `start..stop`, flagging those that reuse the
            // previous anchor's block; `unique` gets the windows to encrypt.
            let (mut n, mut m) = (0, 0);
            let mut previous = scan.anchor;
            let mut previous_window = window_word(data, previous);
            let mut push = |a: usize, previous: &mut usize, previous_window: &mut u128| {
                let w = window_word(data, a);
                if w == *previous_window {
                    anchors[n] = a as u32 | REUSE;
                } else {
                    anchors[n] = a as u32;
                    unique[m] = a as u32;
                    m += 1;
                }
                n += 1;
                *previous = a;
                *previous_window = w;
            };
            for (w, &word) in naturals.iter().enumerate() {
                let mut bits = word;
                while bits != 0 {
                    let a = start + 64 * w + bits.trailing_zeros() as usize;
                    bits &= bits - 1;
                    if a >= stop {
                        break;
                    }
                    while previous + ANCHOR_SPACING < a {
                        let forced = previous + ANCHOR_SPACING;
                        push(forced, &mut previous, &mut previous_window);
                    }
                    push(a, &mut previous, &mut previous_window);
                }
            }
            while previous + ANCHOR_SPACING < stop {
                let forced = previous + ANCHOR_SPACING;
                push(forced, &mut previous, &mut previous_window);
            }
            self.prf.stage1(data, &unique[..m], &mut blocks[..m]);
            let mut next_block = 0;
            for &anchor in &anchors[..n] {
                let block = if anchor & REUSE != 0 {
                    scan.block
                } else {
                    next_block += 1;
                    blocks[next_block - 1]
                };
                if let Some(cut) = scan.advance((anchor & !REUSE) as usize, block) {
                    return cut;
                }
            }
            start = stop;
        }
        scan.judge_pending(last - scan.anchor).unwrap_or(end)
    }

    fn max_size(&self) -> usize {
        self.max_size
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thresholds_at_8_kib_level_2() {
        let t = keyed_thresholds(8192, 2);
        // p_loose = 4/8192 = 1/2048; 4 p_loose = 1/512 <= 1/256.
        assert_eq!(t.t1, 1);
        // 1/256 * t2/2^32 = 1/2048 and 1/32768.
        assert_eq!(t.t2_loose, 1 << 29);
        assert_eq!(t.t2_strict, 1 << 25);
    }

    #[test]
    fn thresholds_give_fastcdc_probabilities_for_every_valid_average_and_level() {
        for avg in [256, 300, 1000, 4096, 8192, 12_000, 65_536, 1 << 20, 4 << 20] {
            for level in 0..=3u8 {
                let t = keyed_thresholds(avg, level);
                assert!(t.t1.is_power_of_two() && t.t1 <= 256, "{avg} {level}");
                let stage1 = f64::from(t.t1) / 256.0;
                let p_loose = f64::from(1u32 << level) / avg as f64;
                assert!(stage1 >= 4.0 * p_loose, "{avg} {level}");
                assert!(t.t1 == 1 || stage1 / 2.0 < 4.0 * p_loose, "{avg} {level}");
                let p_strict = 1.0 / (avg as f64 * f64::from(1u32 << level));
                for (t2, p) in [(t.t2_strict, p_strict), (t.t2_loose, p_loose)] {
                    assert!(t2 < 1 << 31, "{avg} {level}");
                    let got = stage1 * t2 as f64 / 2f64.powi(32);
                    // Rounding t2 changes the probability by at most half a step.
                    let step = stage1 / 2f64.powi(32);
                    assert!((got - p).abs() <= step / 2.0 + 1e-18, "{avg} {level}");
                }
            }
        }
    }

    #[test]
    fn stage1_passes_compares_every_byte() {
        let mut block = [9u8; 16];
        block[3] = 0;
        block[15] = 3;
        assert_eq!(stage1_passes(&block, 0), 1 << 3);
        assert_eq!(stage1_passes(&block, 3), 1 << 3 | 1 << 15);
        assert_eq!(stage1_passes(&block, 255), 0xffff);
    }
}
