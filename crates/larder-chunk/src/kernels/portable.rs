//! The portable kernels: the spec the SIMD twins in `x86.rs` are tested against.

/// How many leading bytes of `data` equal `byte`; eight bytes a step.
pub fn run_len(data: &[u8], byte: u8) -> usize {
    let pattern = u64::from_ne_bytes([byte; 8]);
    let (words, tail) = data.as_chunks::<8>();
    for (i, word) in words.iter().enumerate() {
        let diff = u64::from_le_bytes(*word) ^ pattern;
        if diff != 0 {
            // Little-endian load: the first differing byte is the lowest set byte.
            return i * 8 + (diff.trailing_zeros() / 8) as usize;
        }
    }
    words.len() * 8 + tail.iter().take_while(|&&b| b == byte).count()
}

/// The multiplier of the keyed chunker's natural-anchor test (`keyed.rs`): the 32-bit
/// golden-ratio constant, odd, so that every one of the 2^32 four-byte values maps to
/// a distinct product.
pub const NATURAL_MULTIPLIER: u32 = 0x9E37_79B1;

/// The top five bits of a natural position's product ([`is_natural_anchor`]).
pub const NATURAL_TOP_BITS: u32 = 31;

/// Whether position `i` of `data` is a natural anchor of the keyed chunker: the four
/// bytes ending at it, read little-endian, times [`NATURAL_MULTIPLIER`] (mod 2^32),
/// have their top five bits all ones: one position in 32 on random data, and no
/// position inside a run of one byte (the run skip of `keyed.rs` relies on it).
/// `i >= 3`.
#[inline(always)]
pub fn is_natural_anchor(data: &[u8], i: usize) -> bool {
    let word = u32::from_le_bytes([data[i - 3], data[i - 2], data[i - 1], data[i]]);
    word.wrapping_mul(NATURAL_MULTIPLIER) >> 27 == NATURAL_TOP_BITS
}

/// Bit `k % 64` of `out[k / 64]` says whether position `start + k` of `data` is a
/// natural anchor ([`is_natural_anchor`]); positions at or past `data.len()` get 0.
/// `start >= 3`.
pub fn natural_anchors(data: &[u8], start: usize, out: &mut [u64]) {
    for (w, word) in out.iter_mut().enumerate() {
        let base = start + 64 * w;
        let mut bits = 0u64;
        for k in 0..64 {
            let i = base + k;
            if i < data.len() && is_natural_anchor(data, i) {
                bits |= 1 << k;
            }
        }
        *word = bits;
    }
}

/// `out[k]` has bit `j` set where `blocks[k][j] <= max`: which of the (up to) 16
/// positions an anchor's stage-1 block serves pass the keyed chunker's stage 1.
pub fn stage1_pass_masks(blocks: &[[u8; 16]], max: u8, out: &mut [u16]) {
    for (block, out) in blocks.iter().zip(out) {
        *out = block
            .iter()
            .enumerate()
            .fold(0, |bits, (j, &b)| bits | u16::from(b <= max) << j);
    }
}
