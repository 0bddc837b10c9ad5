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
//!    five bits all ones: one position in 32 on random data, none in a run of one
//!    byte) and forced ones 16 positions after the previous anchor, so one AES block
//!    serves up to 16 positions.
//! 2. Stage 2, for the positions that pass stage 1 (1 in 256 at 8 KiB, level 2): the
//!    first four bytes of `AES_k2(window of i)`, little-endian, must be below `T2`.
//!
//! Speed (`examples/keyed-speed.rs`, `benches/chunk.rs`, `docs/performance.md`):
//! positions are handled in batches of [`BATCH`]. An AVX2 kernel marks the natural
//! positions (`kernels::natural_anchors`); the anchors of each 64 positions follow from
//! them by bit operations, without a branch on the data; the batch's anchor windows
//! are encrypted together, many AES blocks in flight (`WindowPrf::stage1`); each
//! anchor's 16 stage-1 bytes are compared at once (`kernels::stage1_pass_masks`) and a
//! vectorized pass keeps those of the positions it serves; only the rare passes go on
//! to stage 2. Where windows repeat, an anchor whose window equals the previous
//! anchor's reuses its AES output. Runs of one byte (zeros, spaces) are crossed at
//! memory speed: their anchors are forced ones with one window, so all are judged
//! alike ([`Scan::skip_run`]). The scan is compiled twice:
//! portably, and with AVX2, BMI and POPCNT where the CPU has them.

use std::sync::Arc;

use larder_crypto::WindowPrf;

#[cfg(target_arch = "x86_64")]
use crate::kernels::Avx2Kernels;
use crate::kernels::{self, KeyedKernels, PortableKernels};
use crate::Chunker;

/// Bytes in the window of a position: one AES block.
pub const KEYED_WINDOW: usize = 16;
/// A position is at most this far after its anchor (exclusive): forced anchors come
/// this many positions after the previous anchor.
pub const ANCHOR_SPACING: usize = 16;
/// The smallest minimum size the keyed chunker accepts: windows then lie inside the
/// chunk with room to spare (the first judged position is `min - 1`).
pub const KEYED_MIN_SIZE: usize = 64;
/// Positions judged per batch: 512 measured faster than 256 and no slower than 1024
/// (`examples/keyed-speed.rs`; `docs/performance.md`).
pub const BATCH: usize = 512;

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
    /// The AVX2 kernels, where the machine has them; else the scan runs portably.
    #[cfg(target_arch = "x86_64")]
    avx2: Option<Avx2Kernels>,
}

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
            #[cfg(target_arch = "x86_64")]
            avx2: Avx2Kernels::detect(),
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
fn stage1_passes(block: &[u8; 16], max: u8) -> u32 {
    let mut bits = [0u16; 1];
    PortableKernels.stage1_pass_masks(std::slice::from_ref(block), max, &mut bits);
    u32::from(bits[0])
}

/// The positions `0..count` (`1..=16`) of an anchor's block.
#[inline(always)]
fn first_positions(count: usize) -> u32 {
    (1u32 << count) - 1
}

/// One chunk's scan: where cuts may be, and the pending anchor, whose positions from
/// itself up to the next anchor have not been judged yet.
struct Scan<'a> {
    chunker: &'a KeyedCdc,
    data: &'a [u8],
    /// Positions `i + 1 < center` are strict.
    center: usize,
    /// The pending anchor and its stage-1 passes (bit `j`: position `anchor + j`).
    anchor: usize,
    passes: u32,
}

impl Scan<'_> {
    /// Stage 2 for the positions `anchor + j` of the set bits `j` of `passes`, which
    /// passed stage 1: the length of the chunk that ends at the first that cuts.
    /// Rare: one position in 256 at 8 KiB, level 2.
    #[cold]
    #[inline(never)]
    fn stage2(&self, anchor: usize, mut passes: u32) -> Option<usize> {
        while passes != 0 {
            let i = anchor + passes.trailing_zeros() as usize;
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

    /// Judges the pending anchor's first `count` positions (`1..=16`).
    #[inline(always)]
    fn judge_pending(&self, count: usize) -> Option<usize> {
        let passes = self.passes & first_positions(count);
        if passes == 0 {
            return None;
        }
        self.stage2(self.anchor, passes)
    }

    /// Crosses a run of one byte `b` (zeros, spaces) at memory speed, if the pending
    /// anchor `a` lies in it with its whole window (16 bytes `b`). No single-byte word
    /// is natural ([`crate::kernels::is_natural_anchor`]), so the run's anchors are forced ones,
    /// `a + 16 k`, all with the window of `a`: every one has the passes of `a`, and
    /// every position in the run the same stage-2 word. Of the positions
    /// `a .. a + 16 m` (the last such anchor, `a + 16 m`, stays pending) only two can
    /// decide anything: the first candidate (a stage-1 pass), judged with the pending
    /// anchor's first 16 positions, and the first loose candidate, since a word that
    /// does not cut there cuts at no later loose position. Returns the position after
    /// the new pending anchor (or `start` where there is no run), or the cut.
    fn skip_run(&mut self, start: usize, last: usize) -> Result<usize, usize> {
        let a = self.anchor;
        let b = self.data[a];
        if window_word(self.data, a) != u128::from_ne_bytes([b; 16]) {
            return Ok(start);
        }
        let run = kernels::run_len(&self.data[a + 1..last], b);
        let periods = run / ANCHOR_SPACING;
        if periods < 2 {
            return Ok(start);
        }
        let passes = self.passes & first_positions(ANCHOR_SPACING);
        if passes != 0 {
            if let Some(cut) = self.stage2(a, passes) {
                return Err(cut);
            }
            // The first loose candidate (judged again if it was among the first 16).
            let loose = self.center.saturating_sub(1).max(a);
            let phase = (loose - a) % ANCHOR_SPACING;
            let rotated = (passes | passes << ANCHOR_SPACING) >> phase;
            let i = loose + rotated.trailing_zeros() as usize;
            if i < a + ANCHOR_SPACING * periods {
                if let Some(cut) = self.stage2(i, 1) {
                    return Err(cut);
                }
            }
        }
        self.anchor = a + ANCHOR_SPACING * periods;
        Ok(self.anchor + 1)
    }
}

/// The anchors of one batch and what they need, on the stack. Sized for the worst
/// case: every position an anchor, plus the slack of the forced-anchor stores.
struct Batch {
    naturals: [u64; BATCH / 64],
    /// `anchors[0]`: the pending anchor, carried in; then the batch's anchors,
    /// ascending (and room for the unconditional stores of their listing).
    anchors: [u32; BATCH + 1 + 16],
    /// `passes[k]`: the stage-1 passes of `anchors[k]`.
    passes: [u16; BATCH + 1],
    /// `judged[k]`: the passes of the positions `anchors[k]` serves, those before
    /// `anchors[k + 1]`.
    judged: [u32; BATCH],
    /// AES outputs, a slice of the batch at a time.
    blocks: [[u8; 16]; AES_SLICE],
    /// Where anchors reuse blocks: the windows to encrypt (those that differ from the
    /// previous anchor's), the passes of each, and for each anchor the index of its
    /// window among them.
    unique: [u32; BATCH],
    unique_passes: [u16; BATCH + 1],
    source: [u16; BATCH],
}

/// Windows encrypted per call of `WindowPrf::stage1`: several full pipelines of the
/// VAES kernel, and a small buffer.
const AES_SLICE: usize = 64;

/// A batch with more anchors than this looks for windows equal to the previous
/// anchor's (runs, short periods). Random data has about `0.079 BATCH` anchors, and
/// never equal windows; only data with a natural position every `p < 8` bytes has more.
const REUSE_ABOVE: usize = BATCH / 8;

impl Batch {
    fn new() -> Self {
        Self {
            naturals: [0; BATCH / 64],
            anchors: [0; BATCH + 1 + 16],
            passes: [0; BATCH + 1],
            judged: [0; BATCH],
            blocks: [[0; 16]; AES_SLICE],
            unique: [0; BATCH],
            unique_passes: [0; BATCH + 1],
            source: [0; BATCH],
        }
    }

    /// Lists the anchors of positions `start..stop` after the pending anchor
    /// `anchors[0]` (`stop - start <= BATCH`, `anchors[0] < start`,
    /// `start - anchors[0] <= 16`) into `anchors[1..]`, ascending: every natural
    /// position, and forced ones 16 after the previous anchor. Returns their number.
    ///
    /// Without branches on the data, 64 positions at a time. Call the natural
    /// positions and the anchors before these 64 positions *seeds*. A position is an
    /// anchor exactly when it is a seed, or some seed lies `16 k` positions before it
    /// (`k >= 1`) with no seed in between (the forced anchors of that chain fill the
    /// gap 16 apart). Every 16 consecutive positions hold an anchor, so the last
    /// anchor before the 64 positions is at most 16 before them, and `k <= 4`. With
    /// `e_k` = "no seed among the `16 k - 1` positions before", the anchors are
    /// `seeds | OR_k (seeds << 16 k) & e_k`; `e_1` comes from smearing the seeds, and
    /// `e_(k+1) = e_k & !(seeds << 16 k) & (e_1 << 16 k)`. The positions are then read
    /// off the anchor bits, eight at a time unconditionally.
    #[inline(always)]
    fn list_anchors(&mut self, start: usize, stop: usize) -> usize {
        let pending = self.anchors[0] as usize;
        // The 64 positions before `start`, as bits: only the pending anchor.
        let mut previous_anchors = 1u64 << (64 - (start - pending));
        let mut n = 1;
        for (w, &naturals) in self.naturals.iter().enumerate() {
            let base = start + 64 * w;
            // Positions from `stop` on belong to the next batch.
            let keep = match stop.saturating_sub(base) {
                0 => 0,
                k if k >= 64 => u64::MAX,
                k => (1u64 << k) - 1,
            };
            // Bit `64 + p`: position `base + p`; the low half is the previous 64.
            let seeds = u128::from(previous_anchors) | u128::from(naturals & keep) << 64;
            let mut near = seeds << 1;
            near |= near << 1;
            near |= near << 2;
            near |= near << 4;
            near |= near << 7;
            let e1 = !near;
            let e2 = e1 & !(seeds << 16) & (e1 << 16);
            let e3 = e2 & !(seeds << 32) & (e1 << 32);
            let e4 = e3 & !(seeds << 48) & (e1 << 48);
            let anchors = seeds
                | (seeds << 16 & e1)
                | (seeds << 32 & e2)
                | (seeds << 48 & e3)
                | (seeds << 64 & e4);
            let anchors = (anchors >> 64) as u64 & keep;
            let count = anchors.count_ones() as usize;
            let mut bits = anchors;
            // Eight stores whatever the count (5 anchors in 64 positions on random
            // data), eight more past 8 (short periods with a natural phase), then one
            // at a time.
            for slot in &mut self.anchors[n..n + 8] {
                *slot = (base + bits.trailing_zeros() as usize) as u32;
                bits &= bits.wrapping_sub(1);
            }
            if count > 8 {
                for slot in &mut self.anchors[n + 8..n + 16] {
                    *slot = (base + bits.trailing_zeros() as usize) as u32;
                    bits &= bits.wrapping_sub(1);
                }
                for k in 16..count {
                    self.anchors[n + k] = (base + bits.trailing_zeros() as usize) as u32;
                    bits &= bits - 1;
                }
            }
            n += count;
            previous_anchors = anchors;
        }
        n - 1
    }

    /// The stage-1 passes of `anchors[1..=n]` into `passes[1..=n]`: their windows
    /// encrypted a slice at a time.
    #[inline(always)]
    fn encrypt<K: KeyedKernels>(&mut self, kernels: K, chunker: &KeyedCdc, data: &[u8], n: usize) {
        let windows = self.anchors[1..=n].chunks(AES_SLICE);
        let passes = self.passes[1..=n].chunks_mut(AES_SLICE);
        for (windows, passes) in windows.zip(passes) {
            let blocks = &mut self.blocks[..windows.len()];
            chunker.prf.stage1(data, windows, blocks);
            kernels.stage1_pass_masks(blocks, chunker.stage1_max, passes);
        }
    }

    /// As [`Batch::encrypt`], but an anchor whose window equals the previous anchor's
    /// reuses its passes instead of encrypting the same window again.
    fn encrypt_reusing<K: KeyedKernels>(
        &mut self,
        kernels: K,
        chunker: &KeyedCdc,
        data: &[u8],
        n: usize,
    ) {
        // A sample of 16 anchors spread over the batch first: where hardly any
        // window repeats, comparing every window costs more than it saves.
        let repeats = (0..16).any(|k| {
            let at = 1 + k * n / 16;
            window_word(data, self.anchors[at - 1] as usize)
                == window_word(data, self.anchors[at] as usize)
        });
        if !repeats {
            self.encrypt(kernels, chunker, data, n);
            return;
        }
        let mut previous = window_word(data, self.anchors[0] as usize);
        let mut m = 0;
        for (&anchor, source) in self.anchors[1..=n].iter().zip(&mut self.source[..n]) {
            let w = window_word(data, anchor as usize);
            self.unique[m] = anchor;
            m += usize::from(w != previous);
            *source = m as u16;
            previous = w;
        }
        if m == n {
            // No window repeats.
            self.encrypt(kernels, chunker, data, n);
            return;
        }
        self.unique_passes[0] = self.passes[0];
        let windows = self.unique[..m].chunks(AES_SLICE);
        let passes = self.unique_passes[1..=m].chunks_mut(AES_SLICE);
        for (windows, passes) in windows.zip(passes) {
            let blocks = &mut self.blocks[..windows.len()];
            chunker.prf.stage1(data, windows, blocks);
            kernels.stage1_pass_masks(blocks, chunker.stage1_max, passes);
        }
        for (passes, &source) in self.passes[1..=n].iter_mut().zip(&self.source[..n]) {
            *passes = self.unique_passes[usize::from(source)];
        }
    }

    /// `judged[k]` for `k < n`: the passes of `anchors[k]` at its positions before
    /// `anchors[k + 1]` (1 to 16 of them). Vectorizable: no branch.
    #[inline(always)]
    fn judge(&mut self, n: usize) {
        let spans = self.anchors[..=n].windows(2);
        for ((judged, &passes), span) in self.judged[..n].iter_mut().zip(&self.passes).zip(spans) {
            *judged = u32::from(passes) & first_positions((span[1] - span[0]) as usize);
        }
    }
}

impl KeyedCdc {
    /// [`KeyedCdc::scan`] compiled with AVX2, BMI1, BMI2, POPCNT and LZCNT, which
    /// `kernels` proves the CPU has.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,bmi1,bmi2,popcnt,lzcnt")]
    fn scan_avx2(&self, kernels: Avx2Kernels, data: &[u8]) -> usize {
        self.scan(kernels, data)
    }

    /// The length of the chunk at the start of `data`, with `kernels`.
    #[inline(always)]
    fn scan<K: KeyedKernels>(&self, kernels: K, data: &[u8]) -> usize {
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
        let first_block = self.prf.stage1_block(window(data, first));
        let mut scan = Scan {
            chunker: self,
            data,
            center: self.avg_size.min(end),
            anchor: first,
            passes: stage1_passes(&first_block, self.stage1_max),
        };
        let mut batch = Batch::new();
        let mut start = first + 1;
        while start < last {
            start = match scan.skip_run(start, last) {
                Ok(next) => next,
                Err(cut) => return cut,
            };
            if start >= last {
                break;
            }
            kernels.natural_anchors(data, start, &mut batch.naturals);
            let stop = (start + BATCH).min(last);
            batch.anchors[0] = scan.anchor as u32;
            batch.passes[0] = scan.passes as u16;
            let n = batch.list_anchors(start, stop);
            if n > REUSE_ABOVE {
                batch.encrypt_reusing(kernels, self, data, n);
            } else {
                batch.encrypt(kernels, self, data, n);
            }
            batch.judge(n);
            // The anchors whose positions passed stage 1, in order: rare.
            for (group, judged) in batch.judged[..n].chunks(8).enumerate() {
                if judged.iter().fold(0, |any, &j| any | j) == 0 {
                    continue;
                }
                for (k, &j) in judged.iter().enumerate() {
                    if j != 0 {
                        let anchor = batch.anchors[8 * group + k] as usize;
                        if let Some(cut) = scan.stage2(anchor, j) {
                            return cut;
                        }
                    }
                }
            }
            scan.anchor = batch.anchors[n] as usize;
            scan.passes = u32::from(batch.passes[n]);
            start = stop;
        }
        scan.judge_pending(last - scan.anchor).unwrap_or(end)
    }
}

impl Chunker for KeyedCdc {
    fn next_chunk_len(&self, data: &[u8]) -> usize {
        #[cfg(target_arch = "x86_64")]
        if let Some(kernels) = self.avx2 {
            // SAFETY: an `Avx2Kernels` exists only where the CPU has every feature
            // `scan_avx2` is compiled with.
            return unsafe { self.scan_avx2(kernels, data) };
        }
        self.scan(PortableKernels, data)
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
