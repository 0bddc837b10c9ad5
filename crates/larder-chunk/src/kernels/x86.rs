//! AVX2 and AVX-512 twins of `portable.rs`. Callers check CPU support first.

use std::arch::x86_64::*;

use super::portable;

/// [`portable::run_len`], 32 bytes a step.
///
/// # Safety
/// The CPU must support AVX2.
#[target_feature(enable = "avx2")]
pub unsafe fn run_len_avx2(data: &[u8], byte: u8) -> usize {
    let pattern = _mm256_set1_epi8(byte as i8);
    let (blocks, _) = data.as_chunks::<32>();
    for (i, block) in blocks.iter().enumerate() {
        // SAFETY: `block` is 32 readable bytes; the load is unaligned.
        let v = unsafe { _mm256_loadu_si256(block.as_ptr().cast()) };
        let equal = _mm256_movemask_epi8(_mm256_cmpeq_epi8(v, pattern)) as u32;
        if equal != u32::MAX {
            return i * 32 + (!equal).trailing_zeros() as usize;
        }
    }
    let done = blocks.len() * 32;
    done + portable::run_len(&data[done..], byte)
}

/// [`portable::run_len`], 64 bytes a step.
///
/// # Safety
/// The CPU must support AVX-512F and AVX-512BW.
#[target_feature(enable = "avx512f,avx512bw")]
pub unsafe fn run_len_avx512(data: &[u8], byte: u8) -> usize {
    let pattern = _mm512_set1_epi8(byte as i8);
    let (blocks, _) = data.as_chunks::<64>();
    for (i, block) in blocks.iter().enumerate() {
        // SAFETY: `block` is 64 readable bytes; the load is unaligned.
        let v = unsafe { _mm512_loadu_si512(block.as_ptr().cast()) };
        let differ = _mm512_cmpneq_epi8_mask(v, pattern);
        if differ != 0 {
            return i * 64 + differ.trailing_zeros() as usize;
        }
    }
    let done = blocks.len() * 64;
    done + portable::run_len(&data[done..], byte)
}

/// [`portable::natural_anchors`], 32 positions a step: four unaligned loads one byte
/// apart give, in their 32-bit lanes, the four-byte words ending at every position
/// (lane `k` of the load at offset `j` ends at position `4k + j`); the lane masks are
/// narrowed to byte `j` of each lane and merged, so that one `movemask` yields the 32
/// bits in position order.
///
/// # Safety
/// The CPU must support AVX2.
#[target_feature(enable = "avx2")]
pub unsafe fn natural_anchors_avx2(data: &[u8], start: usize, out: &mut [u64]) {
    assert!(
        start >= 3,
        "natural anchors need the 3 bytes before {start}"
    );
    let multiplier = _mm256_set1_epi32(portable::NATURAL_MULTIPLIER as i32);
    let zero = _mm256_setzero_si256();
    let top_bits = _mm256_set1_epi32(portable::NATURAL_TOP_BITS as i32);
    let byte = |j: i32| _mm256_set1_epi32(0xff << (8 * j));
    let lanes = [byte(0), byte(1), byte(2), byte(3)];
    for (w, word) in out.iter_mut().enumerate() {
        let base = start + 64 * w;
        let mut bits = 0u64;
        for half in 0..2 {
            let p = base + 32 * half;
            // Reads data[p - 3 .. p + 32].
            let Some(bytes) = data.get(p - 3..p + 32) else {
                let mut rest = [0u64; 1];
                portable::natural_anchors(data, p, &mut rest);
                bits |= (rest[0] & 0xffff_ffff) << (32 * half);
                continue;
            };
            let mut merged = zero;
            for (j, lane) in lanes.iter().enumerate() {
                // SAFETY: `bytes[j..j + 32]` lies inside the 35 bytes of `bytes`; the
                // load is unaligned.
                let v = unsafe { _mm256_loadu_si256(bytes[j..].as_ptr().cast()) };
                let hashed = _mm256_mullo_epi32(v, multiplier);
                let natural = _mm256_cmpeq_epi32(_mm256_srli_epi32::<27>(hashed), top_bits);
                merged = _mm256_or_si256(merged, _mm256_and_si256(natural, *lane));
            }
            let mask = _mm256_movemask_epi8(merged) as u32;
            bits |= u64::from(mask) << (32 * half);
        }
        *word = bits;
    }
}

/// [`portable::stage1_pass_masks`], two blocks a step: `min(b, max) == b` marks the
/// bytes at most `max`, and one `movemask` gives both blocks' 16 bits.
///
/// # Safety
/// The CPU must support AVX2.
#[target_feature(enable = "avx2")]
pub unsafe fn stage1_pass_masks_avx2(blocks: &[[u8; 16]], max: u8, out: &mut [u16]) {
    let limit = _mm256_set1_epi8(max as i8);
    let count = blocks.len().min(out.len());
    let (pairs, rest) = blocks[..count].as_chunks::<2>();
    let (out_pairs, out_rest) = out[..count].as_chunks_mut::<2>();
    for (pair, out) in pairs.iter().zip(out_pairs) {
        // SAFETY: `pair` is two consecutive 16-byte arrays, 32 readable bytes; the load
        // is unaligned.
        let v = unsafe { _mm256_loadu_si256(pair.as_ptr().cast()) };
        let passes = _mm256_cmpeq_epi8(_mm256_min_epu8(v, limit), v);
        let bits = _mm256_movemask_epi8(passes) as u32;
        *out = [bits as u16, (bits >> 16) as u16];
    }
    portable::stage1_pass_masks(rest, max, out_rest);
}
