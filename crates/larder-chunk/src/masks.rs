//! FastCDC's zero-padded judgement masks and their selection.
//!
//! `MASKS[b]` has `b` one-bits spread over bits 4..48, so that `hash & MASKS[b] == 0`
//! holds with probability `2^-b` and depends on the last 48 bytes hashed (a 48-byte
//! window, as in LBFS's Rabin chunking). Entries 6..=24 are the values of the FastCDC
//! reference implementation (destor) and of the `fastcdc` crate; 5 and 25 exist only
//! for normalization level 3 at the extreme average sizes. Frozen: changing any value
//! changes released cut points.

#[rustfmt::skip]
pub const MASKS: [u64; 26] = [
    0, 0, 0, 0, 0,
    0x0000_0000_0180_4110, // 5
    0x0000_0000_0180_3110, // 6: 64 B
    0x0000_0000_1803_5100, // 7: 128 B
    0x0000_0018_0003_5300, // 8: 256 B
    0x0000_0190_0035_3000, // 9: 512 B
    0x0000_5900_0353_0000, // 10: 1 KiB
    0x0000_d900_0353_0000, // 11: 2 KiB
    0x0000_d901_0353_0000, // 12: 4 KiB
    0x0000_d903_0353_0000, // 13: 8 KiB
    0x0000_d903_1353_0000, // 14: 16 KiB
    0x0000_d90f_0353_0000, // 15: 32 KiB
    0x0000_d903_0353_7000, // 16: 64 KiB
    0x0000_d907_0353_7000, // 17: 128 KiB
    0x0000_d907_0753_7000, // 18: 256 KiB
    0x0000_d917_0753_7000, // 19: 512 KiB
    0x0000_d917_4753_7000, // 20: 1 MiB
    0x0000_d917_6753_7000, // 21: 2 MiB
    0x0000_d937_6753_7000, // 22: 4 MiB
    0x0000_d937_7753_7000, // 23: 8 MiB
    0x0000_d937_7757_7000, // 24: 16 MiB
    0x0000_db37_7757_7000, // 25
];

/// The strict mask (used before the average size) and the relaxed mask (after it).
///
/// `bits` is log2 of the average size rounded to the nearest integer, as in the
/// `fastcdc` crate; normalization level `n` uses `bits + n` and `bits - n` one-bits.
/// Callers validate `avg_size` and `level` first (see `ChunkerConfig::validate`), which
/// keeps both indices in `5..=25`.
pub fn select_masks(avg_size: usize, level: u8) -> (u64, u64) {
    let bits = (avg_size as f64).log2().round() as usize;
    let level = usize::from(level);
    (MASKS[bits + level], MASKS[bits - level])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mask_bit_counts_match_their_index() {
        for (bits, mask) in MASKS.iter().enumerate().skip(6).take(19) {
            assert_eq!(mask.count_ones() as usize, bits, "MASKS[{bits}]");
        }
    }

    #[test]
    fn levels_widen_the_gap_between_masks() {
        assert_eq!(select_masks(8192, 0), (MASKS[13], MASKS[13]));
        assert_eq!(select_masks(8192, 2), (MASKS[15], MASKS[11]));
        assert_eq!(select_masks(11_000, 1), (MASKS[14], MASKS[12]));
    }
}
