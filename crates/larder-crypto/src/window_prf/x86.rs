//! The AES-NI and VAES backends. Callers check CPU support first (`AesBackend`).
//!
//! AES-NI's `aesenc` has a latency of several cycles and issues more than once a cycle,
//! so blocks are encrypted in groups that stay in flight together: eight 128-bit
//! blocks (AES-NI) or eight 256-bit registers of two blocks each (VAES). A batch's
//! remainder goes through the 128-bit path, eight and then one at a time.

use std::arch::x86_64::*;

use zeroize::Zeroize;

use super::{check_anchors, WINDOW_LEN};

/// Rounds of AES-128; `ROUNDS + 1` round keys.
const ROUNDS: usize = 10;

/// The FIPS-197 key schedule of one key: round key `r` at `[r]`. Zeroed on drop.
pub struct RoundKeys([[u8; 16]; ROUNDS + 1]);

impl Drop for RoundKeys {
    fn drop(&mut self) {
        self.0.zeroize();
    }
}

/// The round keys of both stages.
pub struct Keys {
    pub stage1: RoundKeys,
    pub stage2: RoundKeys,
}

impl Keys {
    /// # Safety
    /// The CPU must support AES-NI.
    #[target_feature(enable = "aes")]
    pub unsafe fn expand(k1: &[u8; 16], k2: &[u8; 16]) -> Self {
        Self {
            stage1: expand_key(k1),
            stage2: expand_key(k2),
        }
    }
}

/// One step of FIPS-197's key expansion (section 5.2) for AES-128: `RCON` is the round
/// constant; `aeskeygenassist` computes `SubWord(RotWord(w3)) ^ RCON` in its top word,
/// broadcast here to all four, and the shifts and xors chain `w0..w3`.
#[target_feature(enable = "aes")]
fn expand_step<const RCON: i32>(key: __m128i) -> __m128i {
    let assist = _mm_shuffle_epi32::<0xff>(_mm_aeskeygenassist_si128::<RCON>(key));
    let mut k = key;
    k = _mm_xor_si128(k, _mm_slli_si128::<4>(k));
    k = _mm_xor_si128(k, _mm_slli_si128::<4>(k));
    k = _mm_xor_si128(k, _mm_slli_si128::<4>(k));
    _mm_xor_si128(k, assist)
}

#[target_feature(enable = "aes")]
fn expand_key(key: &[u8; 16]) -> RoundKeys {
    // SAFETY: `key` is 16 readable bytes; the load is unaligned.
    let mut k = unsafe { _mm_loadu_si128(key.as_ptr().cast()) };
    let mut schedule = [k; ROUNDS + 1];
    k = expand_step::<0x01>(k);
    schedule[1] = k;
    k = expand_step::<0x02>(k);
    schedule[2] = k;
    k = expand_step::<0x04>(k);
    schedule[3] = k;
    k = expand_step::<0x08>(k);
    schedule[4] = k;
    k = expand_step::<0x10>(k);
    schedule[5] = k;
    k = expand_step::<0x20>(k);
    schedule[6] = k;
    k = expand_step::<0x40>(k);
    schedule[7] = k;
    k = expand_step::<0x80>(k);
    schedule[8] = k;
    k = expand_step::<0x1b>(k);
    schedule[9] = k;
    k = expand_step::<0x36>(k);
    schedule[10] = k;
    let mut keys = RoundKeys([[0; 16]; ROUNDS + 1]);
    for (out, round) in keys.0.iter_mut().zip(&mut schedule) {
        // SAFETY: `out` is 16 writable bytes; the store is unaligned.
        unsafe { _mm_storeu_si128(out.as_mut_ptr().cast(), *round) };
        // The register copies leave no key bytes on the stack.
        *round = _mm_setzero_si128();
    }
    keys
}

#[target_feature(enable = "aes")]
fn load_keys(keys: &RoundKeys) -> [__m128i; ROUNDS + 1] {
    // SAFETY: every round key is 16 readable bytes; the loads are unaligned.
    keys.0
        .map(|round| unsafe { _mm_loadu_si128(round.as_ptr().cast()) })
}

/// The window that ends at `data[anchor]`, loaded unaligned.
///
/// # Safety
/// `15 <= anchor < data.len()`: the public kernels check every anchor of a batch
/// first ([`check_anchors`]).
#[target_feature(enable = "aes")]
unsafe fn load_window(data: &[u8], anchor: u32) -> __m128i {
    // SAFETY: the 16 bytes `data[anchor - 15 ..= anchor]` are in bounds (caller).
    unsafe { _mm_loadu_si128(data.as_ptr().add(anchor as usize - (WINDOW_LEN - 1)).cast()) }
}

/// `N` blocks encrypted side by side, round by round.
#[target_feature(enable = "aes")]
fn encrypt_n<const N: usize>(rk: &[__m128i; ROUNDS + 1], mut b: [__m128i; N]) -> [__m128i; N] {
    for block in &mut b {
        *block = _mm_xor_si128(*block, rk[0]);
    }
    for round in &rk[1..ROUNDS] {
        for block in &mut b {
            *block = _mm_aesenc_si128(*block, *round);
        }
        round_done_xmm(&mut b);
    }
    for block in &mut b {
        *block = _mm_aesenclast_si128(*block, rk[ROUNDS]);
    }
    b
}

/// AES of one 16-byte block.
///
/// # Safety
/// The CPU must support AES-NI.
#[target_feature(enable = "aes")]
pub unsafe fn encrypt_block(keys: &RoundKeys, block: &[u8; 16]) -> [u8; 16] {
    let rk = load_keys(keys);
    // SAFETY: `block` is 16 readable bytes; the load is unaligned.
    let b = unsafe { _mm_loadu_si128(block.as_ptr().cast()) };
    let [c] = encrypt_n(&rk, [b]);
    let mut out = [0u8; 16];
    // SAFETY: `out` is 16 writable bytes; the store is unaligned.
    unsafe { _mm_storeu_si128(out.as_mut_ptr().cast(), c) };
    out
}

/// The first `N` (`N <= 8`) windows of a group of eight through [`encrypt_n`].
///
/// # Safety
/// The CPU must support AES-NI; the first `N` anchors are valid ([`load_window`]).
#[target_feature(enable = "aes")]
unsafe fn group_xmm<const N: usize>(
    rk: &[__m128i; ROUNDS + 1],
    data: &[u8],
    anchors: &[u32; 8],
    out: &mut [[u8; 16]; 8],
) {
    // SAFETY: `k < N <= 8`, and the first `N` anchors are valid (caller).
    let windows = std::array::from_fn::<_, N, _>(|k| unsafe { load_window(data, anchors[k]) });
    for (block, out) in encrypt_n(rk, windows).into_iter().zip(out) {
        // SAFETY: `out` is 16 writable bytes; the store is unaligned.
        unsafe { _mm_storeu_si128(out.as_mut_ptr().cast(), block) };
    }
}

/// The 128-bit path over a whole batch: eight blocks at a time, then the remainder as
/// one group of its own width (padded with copies of its last window), so that even a
/// short batch keeps several blocks in flight.
///
/// # Safety
/// The CPU must support AES-NI; every anchor is valid ([`load_window`]).
#[target_feature(enable = "aes")]
unsafe fn encrypt_windows_xmm(
    rk: &[__m128i; ROUNDS + 1],
    data: &[u8],
    anchors: &[u32],
    out: &mut [[u8; 16]],
) {
    let (groups, rest) = anchors.as_chunks::<8>();
    let (out_groups, out_rest) = out.as_chunks_mut::<8>();
    for (group, out) in groups.iter().zip(out_groups) {
        // SAFETY: the anchors are valid (caller).
        unsafe { group_xmm::<8>(rk, data, group, out) };
    }
    let Some(&last) = rest.last() else {
        return;
    };
    let mut padded = [last; 8];
    padded[..rest.len()].copy_from_slice(rest);
    let mut blocks = [[0u8; 16]; 8];
    // SAFETY: the anchors, and so their copies, are valid (caller).
    unsafe {
        match rest.len() {
            1 => group_xmm::<1>(rk, data, &padded, &mut blocks),
            2 => group_xmm::<2>(rk, data, &padded, &mut blocks),
            3 => group_xmm::<3>(rk, data, &padded, &mut blocks),
            4 => group_xmm::<4>(rk, data, &padded, &mut blocks),
            5 => group_xmm::<5>(rk, data, &padded, &mut blocks),
            6 => group_xmm::<6>(rk, data, &padded, &mut blocks),
            _ => group_xmm::<7>(rk, data, &padded, &mut blocks),
        }
    }
    out_rest.copy_from_slice(&blocks[..rest.len()]);
}

/// `out[k] = AES(window ending at anchors[k])` with AES-NI; lengths checked by the
/// caller. Panics where a window does not lie inside `data`.
///
/// # Safety
/// The CPU must support AES-NI.
#[target_feature(enable = "aes")]
pub unsafe fn encrypt_windows_aesni(
    keys: &RoundKeys,
    data: &[u8],
    anchors: &[u32],
    out: &mut [[u8; 16]],
) {
    check_anchors(data, anchors);
    // SAFETY: every anchor was just checked.
    unsafe { encrypt_windows_xmm(&load_keys(keys), data, anchors, out) };
}

/// [`round_done`] for 128-bit registers.
#[target_feature(enable = "aes")]
fn round_done_xmm<const N: usize>(blocks: &mut [__m128i; N]) {
    for block in blocks {
        // SAFETY: as in `round_done`: a comment, no instruction, the register unchanged.
        unsafe {
            std::arch::asm!(
                "/* {0} */",
                inout(xmm_reg) * block,
                options(nomem, nostack, preserves_flags)
            );
        }
    }
}

/// Keeps the rounds of a group in program order, round after round. Without it LLVM
/// schedules each register's ten rounds back to back (to spare registers), a chain of
/// dependent `vaesenc` the out-of-order core only partly overlaps with the next
/// register's; `docs/performance.md` ("Keyed chunker") measured the difference.
#[target_feature(enable = "avx2")]
fn round_done<const N: usize>(blocks: &mut [__m256i; N]) {
    for block in blocks {
        // SAFETY: the template is only a comment: it executes no instruction, reads and
        // writes no memory, stack or flags, and leaves the register unchanged. Not
        // `pure`, so that LLVM keeps it in place, a boundary its scheduler does not
        // move instructions across.
        unsafe {
            std::arch::asm!(
                "/* {0} */",
                inout(ymm_reg) * block,
                options(nomem, nostack, preserves_flags)
            );
        }
    }
}

/// The first `2 N` (`N <= 8`) windows of a group of sixteen, in `N` 256-bit registers
/// of two blocks each.
///
/// # Safety
/// The CPU must support AES-NI, AVX2 and VAES; the first `2 N` anchors are valid
/// ([`load_window`]).
#[target_feature(enable = "aes,avx2,vaes")]
unsafe fn group_ymm<const N: usize>(
    rk: &[__m256i; ROUNDS + 1],
    data: &[u8],
    anchors: &[u32; 16],
    out: &mut [[u8; 16]; 16],
) {
    let mut b: [__m256i; N] = std::array::from_fn(|k| {
        // SAFETY: `2 k + 1 < 2 N <= 16`, and those anchors are valid (caller).
        let (lo, hi) = unsafe {
            (
                load_window(data, anchors[2 * k]),
                load_window(data, anchors[2 * k + 1]),
            )
        };
        _mm256_set_m128i(hi, lo)
    });
    for block in &mut b {
        *block = _mm256_xor_si256(*block, rk[0]);
    }
    for round in &rk[1..ROUNDS] {
        for block in &mut b {
            *block = _mm256_aesenc_epi128(*block, *round);
        }
        round_done(&mut b);
    }
    for block in &mut b {
        *block = _mm256_aesenclast_epi128(*block, rk[ROUNDS]);
    }
    let (pairs, _) = out.as_chunks_mut::<2>();
    for (block, pair) in b.into_iter().zip(pairs) {
        // SAFETY: `pair` is two consecutive 16-byte arrays, 32 writable bytes; the
        // store is unaligned.
        unsafe { _mm256_storeu_si256(pair.as_mut_ptr().cast(), block) };
    }
}

/// As [`encrypt_windows_aesni`], sixteen blocks at a time in eight 256-bit registers, then the
/// rest as one group of just enough registers (padded with copies of its last
/// window), so that the tail of a batch keeps several blocks in flight too.
///
/// Panics where a window does not lie inside `data`.
///
/// # Safety
/// The CPU must support AES-NI, AVX2 and VAES.
#[target_feature(enable = "aes,avx2,vaes")]
pub unsafe fn encrypt_windows_vaes(
    keys: &RoundKeys,
    data: &[u8],
    anchors: &[u32],
    out: &mut [[u8; 16]],
) {
    check_anchors(data, anchors);
    let rk = load_keys(keys).map(|k| _mm256_broadcastsi128_si256(k));
    let (groups, rest) = anchors.as_chunks::<16>();
    let (out_groups, out_rest) = out.as_chunks_mut::<16>();
    for (group, out) in groups.iter().zip(out_groups) {
        // SAFETY: every anchor was checked above.
        unsafe { group_ymm::<8>(&rk, data, group, out) };
    }
    let Some(&last) = rest.last() else {
        return;
    };
    let mut padded = [last; 16];
    padded[..rest.len()].copy_from_slice(rest);
    let mut blocks = [[0u8; 16]; 16];
    // SAFETY: every anchor, and so every copy, was checked above.
    unsafe {
        match rest.len().div_ceil(2) {
            1 => group_ymm::<1>(&rk, data, &padded, &mut blocks),
            2 => group_ymm::<2>(&rk, data, &padded, &mut blocks),
            3 => group_ymm::<3>(&rk, data, &padded, &mut blocks),
            4 => group_ymm::<4>(&rk, data, &padded, &mut blocks),
            5 => group_ymm::<5>(&rk, data, &padded, &mut blocks),
            6 => group_ymm::<6>(&rk, data, &padded, &mut blocks),
            7 => group_ymm::<7>(&rk, data, &padded, &mut blocks),
            _ => group_ymm::<8>(&rk, data, &padded, &mut blocks),
        }
    }
    out_rest.copy_from_slice(&blocks[..rest.len()]);
}
