//! Asymmetric Extremum chunking (AE; Zhang et al., INFOCOM 2015), the non-hashing
//! baseline of the FastCDC paper (sections 2 and 5.2).
//!
//! AE reads one value per byte position and keeps the running maximum; a chunk ends
//! `w` positions after a maximum that none of those `w` values exceeds. Its window is
//! asymmetric (nothing before the maximum matters, `w` positions after it do) and
//! unbounded: the maximum can date from the first position scanned, so the cut depends
//! on where the chunk started.
//!
//! - The value at position `p` is the 8 bytes ending at `p`, big-endian (the byte at
//!   `p` least significant), or the bytes of the chunk so far when it has fewer:
//!   `v(p) = (v(p - 1) << 8 | data[p]) mod 2^64`. One byte per position would take
//!   only 256 values: the maximum would reach 255 within a few hundred bytes and stay,
//!   making every chunk about "first 255, plus `w`" long. Eight bytes make ties rare
//!   on real data, which AE's analysis assumes. Compared as integers, the values are
//!   the 8-byte strings compared lexicographically.
//! - A value replaces the maximum only when strictly greater (AE's `>` test).
//! - `w = round(avg_size / (e - 1))`, as the AE paper derives it. The paper's mean
//!   chunk size, `(e - 1) w`, is an approximation: for distinct random values the
//!   exact expectation of `w + 1 +` (position of the final maximum) tends to about
//!   `1.781 w`, so chunks average about `min_size + 1.037 avg_size` on random data
//!   (`tests/chunk_sizes.rs` checks it).
//! - Cut-point skipping: the first `min_size` positions are not scanned; the first
//!   value compared is `v(min_size)`. So the shortest chunk that ends at a cut is
//!   `min_size + w + 1` bytes.
//!
//! `docs/design/chunking.md` is the full specification.

use crate::Chunker;

/// Bytes that make one value.
pub const AE_VALUE_BYTES: usize = 8;

/// `w` for an average size: `round(avg_size / (e - 1))`, at least 1.
pub fn ae_window(avg_size: usize) -> usize {
    ((avg_size as f64 / (std::f64::consts::E - 1.0)).round() as usize).max(1)
}

/// Asymmetric Extremum chunking with 8-byte values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AsymmetricExtremum {
    min_size: usize,
    max_size: usize,
    /// `w`: positions after the maximum that must not exceed it.
    window: usize,
}

impl AsymmetricExtremum {
    /// Sizes must pass [`crate::ChunkerConfig::validate`]: `min_size <= avg_size <=
    /// max_size`.
    pub fn new(min_size: usize, avg_size: usize, max_size: usize) -> Self {
        Self {
            min_size,
            max_size,
            window: ae_window(avg_size),
        }
    }

    /// `w`.
    pub fn window(&self) -> usize {
        self.window
    }
}

impl Chunker for AsymmetricExtremum {
    fn next_chunk_len(&self, data: &[u8]) -> usize {
        let end = data.len().min(self.max_size);
        if end <= self.min_size {
            return end;
        }
        let first = self.min_size;
        // The value at `first` holds the bytes before it (up to 7 of them).
        let start = first.saturating_sub(AE_VALUE_BYTES - 1);
        let mut value = data[start..=first]
            .iter()
            .fold(0u64, |v, &b| (v << 8) | u64::from(b));
        let (mut max_value, mut max_position) = (value, first);
        for (i, &b) in data[first + 1..end].iter().enumerate() {
            let position = first + 1 + i;
            value = (value << 8) | u64::from(b);
            if value > max_value {
                (max_value, max_position) = (value, position);
            } else if position == max_position + self.window {
                return position + 1;
            }
        }
        end
    }

    fn max_size(&self) -> usize {
        self.max_size
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn window_of_the_usual_averages() {
        assert_eq!(ae_window(8192), 4768);
        assert_eq!(ae_window(4096), 2384);
        assert_eq!(ae_window(256), 149);
    }

    #[test]
    fn constant_data_cuts_w_after_the_first_position() {
        let ae = AsymmetricExtremum::new(100, 256, 1024);
        assert_eq!(ae.next_chunk_len(&[7u8; 2000]), 100 + 149 + 1);
    }

    #[test]
    fn rising_data_never_cuts() {
        let rising: Vec<u8> = (0..=255).collect();
        let ae = AsymmetricExtremum::new(0, 256, 1024);
        assert_eq!(ae.next_chunk_len(&rising), 256);
    }
}
