//! Why FastCDC's Gear kernel is scalar: the kernels tried for it, side by side, on the
//! same 64 MiB corpus as `benches/chunk.rs` (real files padded with pseudo-random bytes).
//!
//! Every variant judges every byte against the intersection of the two level-2 masks
//! at 8 KiB (so every cut candidate of either mask is found) and counts the hits; none
//! skips the minimum size, so they compare per-byte cost only:
//! - `shipped-pair`: the kernel of `FastCdc2020` (one `lea` and one `add` a pair);
//! - `two-chains`: the same over two halves interleaved, for more instruction-level
//!   parallelism;
//! - `avx2-gather` and `avx512-gather`: one Gear hash per SIMD lane, 4 or 8 segments of
//!   the buffer at once, the table read with gather instructions;
//! - `shifted-masks-4-lanes`: four segments at once, each hash kept shifted left by
//!   the distance to the end of an 8-byte block and judged against the mask shifted
//!   alike (`(h << k) & (mask << k)` is `h & mask` while `mask << k` fits 64 bits), so
//!   a byte costs three instructions (load, add from a per-shift table, test) and no
//!   shift: the fewest found;
//! - `lookups-only`: the same with no judging at all, an upper bound on any scalar
//!   kernel that reads each byte and its table entry.
//!
//! Measured (docs/performance.md): the shipped kernel is as fast as any; the gather
//! kernels are slower, and the scalar variants are bound by the two loads a byte
//! (the byte and its table entry), not by the hash's dependency chain.
//!
//! `cargo bench -p larder-chunk --bench gear_kernels -- --warm-up-time 1 --measurement-time 5`

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use larder_chunk::{select_masks, GEAR};

#[path = "support/corpus.rs"]
mod corpus;

/// `GEAR[i] << 1`: the even byte of a pair is judged on the doubled hash.
static GEAR_LS: [u64; 256] = {
    let mut table = [0u64; 256];
    let mut i = 0;
    while i < 256 {
        table[i] = GEAR[i] << 1;
        i += 1;
    }
    table
};

#[cold]
#[inline(never)]
fn count_hit(hits: &mut usize) {
    *hits += 1;
}

/// Hides where `v` came from, as `FastCdc2020` does, so that LLVM keeps the table
/// load out of the loop-carried chain (see `src/fastcdc2020.rs`).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn opaque(mut v: u64) -> u64 {
    // SAFETY: the template is only a comment: no instruction, memory, stack or flags.
    unsafe {
        std::arch::asm!("/* {0} */", inout(reg) v, options(pure, nomem, nostack, preserves_flags));
    }
    v
}

#[cfg(not(target_arch = "x86_64"))]
fn opaque(v: u64) -> u64 {
    v
}

/// Hits of `mask` over `data`, pair by pair as `FastCdc2020` does.
fn shipped_pair(data: &[u8], mask: u64) -> usize {
    let (mut hash, mask_ls, mut hits) = (0u64, mask << 1, 0usize);
    for &[a, b] in data.as_chunks::<2>().0 {
        let doubled_a = (hash << 2).wrapping_add(opaque(GEAR_LS[usize::from(a)]));
        if doubled_a & mask_ls == 0 {
            count_hit(&mut hits);
        }
        hash = doubled_a.wrapping_add(GEAR[usize::from(b)]);
        if hash & mask == 0 {
            count_hit(&mut hits);
        }
    }
    hits
}

/// The shipped kernel over the two halves of `data` at once.
fn two_chains(data: &[u8], mask: u64) -> usize {
    let half = (data.len() / 2) & !1;
    let (x, y) = (
        data[..half].as_chunks::<2>().0,
        data[half..2 * half].as_chunks::<2>().0,
    );
    let (mut hx, mut hy, mask_ls, mut hits) = (0u64, 0u64, mask << 1, 0usize);
    for (&[a, b], &[c, d]) in x.iter().zip(y) {
        let doubled_a = (hx << 2).wrapping_add(opaque(GEAR_LS[usize::from(a)]));
        let doubled_c = (hy << 2).wrapping_add(opaque(GEAR_LS[usize::from(c)]));
        if doubled_a & mask_ls == 0 {
            count_hit(&mut hits);
        }
        if doubled_c & mask_ls == 0 {
            count_hit(&mut hits);
        }
        hx = doubled_a.wrapping_add(GEAR[usize::from(b)]);
        hy = doubled_c.wrapping_add(GEAR[usize::from(d)]);
        if hx & mask == 0 {
            count_hit(&mut hits);
        }
        if hy & mask == 0 {
            count_hit(&mut hits);
        }
    }
    hits
}

/// `GEAR[i] << k` for `k` in 0..8, table `k` at `k * 256`.
fn shifted_tables() -> Vec<u64> {
    (0..8)
        .flat_map(|k| GEAR.iter().map(move |&g| g << k))
        .collect()
}

/// Hits of `mask` over four quarters of `data` at once, hashes kept shifted (see the
/// module docs); with `judge` false, no hits are counted and the hashes are returned
/// folded, so that the loads are not optimized away.
fn shifted_masks_4_lanes(data: &[u8], mask: u64, tables: &[u64], judge: bool) -> usize {
    const LANES: usize = 4;
    let quarter = (data.len() / LANES) & !7;
    let lanes: [&[u8]; LANES] = std::array::from_fn(|j| &data[j * quarter..(j + 1) * quarter]);
    let masks: [u64; 8] = std::array::from_fn(|k| mask << k);
    let (mut hash, mut hits) = ([0u64; LANES], 0usize);
    for block in 0..quarter / 8 {
        for h in &mut hash {
            *h <<= 8;
        }
        for i in 0..8 {
            let shift = 7 - i;
            for (h, lane) in hash.iter_mut().zip(&lanes) {
                let byte = usize::from(lane[block * 8 + i]);
                *h = h.wrapping_add(tables[shift * 256 + byte]);
                if judge && *h & masks[shift] == 0 {
                    count_hit(&mut hits);
                }
            }
        }
    }
    if judge {
        hits
    } else {
        hash.iter().fold(0, |a, &h| a ^ h as usize)
    }
}

#[cfg(target_arch = "x86_64")]
mod gather {
    use std::arch::x86_64::*;

    use super::GEAR;

    /// One hash per 64-bit lane over 4 segments; the table read by `vpgatherqq`.
    #[target_feature(enable = "avx2")]
    pub fn avx2(data: &[u8], mask: u64) -> usize {
        let seg = (data.len() / 4) & !7;
        let starts = _mm256_setr_epi64x(0, seg as i64, 2 * seg as i64, 3 * seg as i64);
        let (mask_v, low_byte) = (_mm256_set1_epi64x(mask as i64), _mm256_set1_epi64x(0xff));
        let (mut hash, mut hits) = (_mm256_setzero_si256(), 0usize);
        for i in (0..seg).step_by(8) {
            let at = _mm256_add_epi64(starts, _mm256_set1_epi64x(i as i64));
            // SAFETY: every lane reads 8 bytes at `lane * seg + i`, with
            // `i + 8 <= seg` and `4 * seg <= data.len()`.
            let words = unsafe { _mm256_i64gather_epi64::<1>(data.as_ptr().cast(), at) };
            for k in 0..8 {
                let shift = _mm_cvtsi32_si128(8 * k);
                let byte = _mm256_and_si256(_mm256_srl_epi64(words, shift), low_byte);
                // SAFETY: every index is a byte value, below GEAR's 256 entries.
                let gear = unsafe { _mm256_i64gather_epi64::<8>(GEAR.as_ptr().cast(), byte) };
                hash = _mm256_add_epi64(_mm256_add_epi64(hash, hash), gear);
                let zero =
                    _mm256_cmpeq_epi64(_mm256_and_si256(hash, mask_v), _mm256_setzero_si256());
                hits += _mm256_movemask_pd(_mm256_castsi256_pd(zero)).count_ones() as usize;
            }
        }
        hits
    }

    /// One hash per 64-bit lane over 8 segments; the table read by `vpgatherqq`.
    #[target_feature(enable = "avx512f")]
    pub fn avx512(data: &[u8], mask: u64) -> usize {
        let seg = (data.len() / 8) & !7;
        let s = seg as i64;
        let starts = _mm512_setr_epi64(0, s, 2 * s, 3 * s, 4 * s, 5 * s, 6 * s, 7 * s);
        let (mask_v, low_byte) = (_mm512_set1_epi64(mask as i64), _mm512_set1_epi64(0xff));
        let (mut hash, mut hits) = (_mm512_setzero_si512(), 0usize);
        for i in (0..seg).step_by(8) {
            let at = _mm512_add_epi64(starts, _mm512_set1_epi64(i as i64));
            // SAFETY: every lane reads 8 bytes at `lane * seg + i`, with
            // `i + 8 <= seg` and `8 * seg <= data.len()`.
            let words = unsafe { _mm512_i64gather_epi64::<1>(at, data.as_ptr().cast()) };
            for k in 0..8 {
                let byte =
                    _mm512_and_si512(_mm512_srl_epi64(words, _mm_cvtsi32_si128(8 * k)), low_byte);
                // SAFETY: every index is a byte value, below GEAR's 256 entries.
                let gear = unsafe { _mm512_i64gather_epi64::<8>(byte, GEAR.as_ptr().cast()) };
                hash = _mm512_add_epi64(_mm512_add_epi64(hash, hash), gear);
                hits += _mm512_testn_epi64_mask(hash, mask_v).count_ones() as usize;
            }
        }
        hits
    }
}

fn bench_kernels(c: &mut Criterion) {
    let data = corpus::corpus();
    let (mask_s, mask_l) = select_masks(8192, 2);
    let mask = mask_s & mask_l;
    let mut group = c.benchmark_group("gear-kernels-64MiB");
    group.throughput(Throughput::Bytes(data.len() as u64));
    group.sample_size(10);
    group.bench_function("shipped-pair", |b| {
        b.iter(|| shipped_pair(black_box(&data), mask))
    });
    group.bench_function("two-chains", |b| {
        b.iter(|| two_chains(black_box(&data), mask))
    });
    let tables = shifted_tables();
    group.bench_function("shifted-masks-4-lanes", |b| {
        b.iter(|| shifted_masks_4_lanes(black_box(&data), mask, &tables, true))
    });
    group.bench_function("lookups-only", |b| {
        b.iter(|| shifted_masks_4_lanes(black_box(&data), mask, &tables, false))
    });
    assert_eq!(
        shifted_masks_4_lanes(&data, mask, &tables, true),
        (0..4)
            .map(|j| {
                let quarter = (data.len() / 4) & !7;
                shipped_pair(&data[j * quarter..(j + 1) * quarter], mask)
            })
            .sum::<usize>(),
        "the shifted-mask kernel finds the shipped kernel's hits"
    );
    #[cfg(target_arch = "x86_64")]
    {
        if is_x86_feature_detected!("avx2") {
            // SAFETY: AVX2 was detected at run time.
            group.bench_function("avx2-gather", |b| {
                b.iter(|| unsafe { gather::avx2(black_box(&data), mask) })
            });
        }
        if is_x86_feature_detected!("avx512f") {
            // SAFETY: AVX-512F was detected at run time.
            group.bench_function("avx512-gather", |b| {
                b.iter(|| unsafe { gather::avx512(black_box(&data), mask) })
            });
        }
    }
    group.finish();
}

criterion_group!(benches, bench_kernels);
criterion_main!(benches);
