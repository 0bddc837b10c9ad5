//! FastCDC 2020 in two passes: a data-parallel scan for candidate cut points, then the
//! sequential selection of the true cut points among them.
//!
//! This is the form a wide device computes FastCDC in (larder-gpu scans on the device
//! and selects on the host), and the portable twin such a device path is checked
//! against. It gives exactly [`FastCdc2020`]'s cut points:
//!
//! - Both masks have bits only below bit 48 ([`crate::MASKS`]), and the 2016 Gear hash
//!   shifts one bit per byte, so the judged bits at byte `p` depend only on the
//!   [`WINDOW`] bytes ending at `p`, once at least that many have been hashed.
//! - FastCDC starts hashing at zero at `start + min_size`. From `start + min_size +
//!   WINDOW - 1` on, the hash therefore agrees with the *window hash* of the scan,
//!   which knows nothing about chunk starts: any byte range can be scanned on its own,
//!   given the `WINDOW - 1` bytes before it.
//! - Selection walks the chunks: it re-hashes the first `WINDOW - 1` judged bytes of
//!   each chunk (where the hash still depends on the start), then takes the first
//!   candidate of the right kind (strict before the normal size, loose after it),
//!   or cuts at the maximum size.
//!
//! `tests/candidates.rs` checks both against [`FastCdc2020`] and the scan of segments
//! against the scan of the whole.

use std::ops::Range;

use crate::gear_table::GEAR;
use crate::masks::select_masks;
use crate::FastCdc2020;

/// Bytes the judged bits of the hash depend on: masks use bits 0..48 only.
pub const WINDOW: usize = 48;

/// A byte whose window hash matches at least one of the two masks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Candidate {
    /// Offset of the byte in the scanned data; judging it there cuts before it.
    pub pos: usize,
    /// The window hash matches the strict mask (used before the normal size).
    pub strict: bool,
    /// The window hash matches the loose mask (used after the normal size).
    pub loose: bool,
}

/// FastCDC 2020's parameters, split into the scan and the selection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CandidateChunker {
    min_size: usize,
    avg_size: usize,
    max_size: usize,
    level: u8,
    mask_s: u64,
    mask_l: u64,
}

impl CandidateChunker {
    /// The same parameters as [`FastCdc2020::new`] (validated by
    /// [`crate::ChunkerConfig::validate`]); the Gear table is the unseeded one.
    pub fn new(min_size: usize, avg_size: usize, max_size: usize, level: u8) -> Self {
        let (mask_s, mask_l) = select_masks(avg_size, level);
        Self {
            min_size,
            avg_size,
            max_size,
            level,
            mask_s,
            mask_l,
        }
    }

    /// The sequential chunker whose cut points this one reproduces.
    pub fn sequential(&self) -> FastCdc2020 {
        FastCdc2020::new(self.min_size, self.avg_size, self.max_size, self.level)
    }

    /// The two masks, strict then loose: what a device scan needs.
    pub fn masks(&self) -> (u64, u64) {
        (self.mask_s, self.mask_l)
    }

    /// Appends the candidates among the bytes at `range` of `data`, in ascending order.
    /// A byte counts only with a full window behind it (`pos >= WINDOW - 1`), so the
    /// scan of consecutive ranges equals the scan of their union: each range is warmed
    /// up on the `WINDOW - 1` bytes before it.
    pub fn scan(&self, data: &[u8], range: Range<usize>, out: &mut Vec<Candidate>) {
        let first = range.start.max(WINDOW - 1);
        if first >= range.end {
            return;
        }
        let mut hash = 0u64;
        for &b in &data[first + 1 - WINDOW..first] {
            hash = (hash << 1).wrapping_add(GEAR[usize::from(b)]);
        }
        for (pos, &b) in data.iter().enumerate().take(range.end).skip(first) {
            hash = (hash << 1).wrapping_add(GEAR[usize::from(b)]);
            let strict = hash & self.mask_s == 0;
            let loose = hash & self.mask_l == 0;
            if strict || loose {
                out.push(Candidate { pos, strict, loose });
            }
        }
    }

    /// Cuts `data` from its start with the candidates of all of it (`scan` of
    /// `0..data.len()`), as [`crate::chunk_block_sequential`] does: with `is_last` to
    /// its end; otherwise a chunk is cut only while at least `max_size` bytes follow
    /// its start. Returns the chunk lengths and the bytes they cover.
    pub fn select(
        &self,
        data: &[u8],
        candidates: &[Candidate],
        is_last: bool,
    ) -> (Vec<usize>, usize) {
        let mut lengths = Vec::new();
        let mut start = 0;
        // Index of the first candidate not before `start`; only ever moves forward.
        let mut next = 0;
        loop {
            let rest = data.len() - start;
            if rest == 0 || (!is_last && rest < self.max_size) {
                return (lengths, start);
            }
            let len = self.chunk_at(data, start, candidates, &mut next);
            // The Chunker contract; an empty chunk would never end the loop.
            assert!(len > 0, "empty chunk at {start}");
            lengths.push(len);
            start += len;
        }
    }

    /// The length of the chunk at `start`, exactly as [`FastCdc2020`] cuts it.
    fn chunk_at(
        &self,
        data: &[u8],
        start: usize,
        candidates: &[Candidate],
        next: &mut usize,
    ) -> usize {
        let rest = data.len() - start;
        if rest <= self.min_size {
            return rest;
        }
        let end = rest.min(self.max_size);
        let center = self.avg_size.min(end) & !1;
        // Judged offsets are `first..judged_end`, pairs from an even offset as in
        // FastCdc2020; the hash starts at zero at `first`, and with `first == 0` byte 0
        // is hashed but not judged.
        let first = self.min_size & !1;
        let judged_end = end & !1;
        let mask_at = |offset: usize| match offset < center {
            true => self.mask_s,
            false => self.mask_l,
        };
        // Offsets where the hash has seen fewer than WINDOW bytes: hashed here.
        let full_from = (first + WINDOW - 1).min(judged_end);
        let mut hash = 0u64;
        for offset in first..full_from {
            hash = (hash << 1).wrapping_add(GEAR[usize::from(data[start + offset])]);
            if offset > 0 && hash & mask_at(offset) == 0 {
                return offset;
            }
        }
        // From `full_from` on the hash equals the window hash: take the candidates.
        let from = start + full_from;
        *next += candidates[*next..].partition_point(|c| c.pos < from);
        for c in &candidates[*next..] {
            let offset = c.pos - start;
            if offset >= judged_end {
                break;
            }
            let matches = match offset < center {
                true => c.strict,
                false => c.loose,
            };
            if matches {
                return offset;
            }
        }
        end
    }
}
