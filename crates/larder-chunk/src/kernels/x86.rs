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
