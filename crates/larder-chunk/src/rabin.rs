//! Rabin-fingerprint chunking as in LBFS (Muthitacharoen et al., SOSP'01), the baseline
//! of the FastCDC and P-Dedupe papers (their eq. 1 and 2, Table 1 and Table 4).
//!
//! The fingerprint of a window of bytes `B_1 .. B_n` is the window read as one
//! polynomial over GF(2), most significant bit of `B_1` first, reduced modulo
//! [`RABIN_POLYNOMIAL`]:
//!
//! ```text
//! fp(B_1 .. B_n) = (B_1(x) * x^(8(n-1)) + ... + B_n(x)) mod P        (degree < 63)
//! ```
//!
//! A chunk of length `L` may end where the fingerprint of its last [`RABIN_WINDOW`]
//! bytes (all of its bytes if it is shorter) satisfies `fp mod D == r`, with
//! `D = avg_size` (a power of two, so the test reads the lowest `log2(D)` bits) and
//! `r =` [`RABIN_RESIDUE`]. Leading zero bytes add nothing to a polynomial, so a short
//! window has the fingerprint of the same window padded with zeros in front.
//! `docs/design/chunking.md` is the full specification.

use crate::Chunker;

/// LBFS's irreducible polynomial of degree 63 over GF(2) (bit `k` is the coefficient
/// of `x^k`). `tests::polynomial_is_irreducible` proves irreducibility.
pub const RABIN_POLYNOMIAL: u64 = 0xbfe6_b8a5_bf37_8d83;

/// Bytes in the sliding window (LBFS and the FastCDC paper's baseline).
pub const RABIN_WINDOW: usize = 48;

/// The residue `r` in `fp mod D == r` (LBFS's 0x78).
pub const RABIN_RESIDUE: u64 = 0x78;

/// Degree of [`RABIN_POLYNOMIAL`]: fingerprints are below `2^DEGREE`.
const DEGREE: u32 = 63;

/// Fingerprints have `DEGREE` bits.
const FINGERPRINT_BITS: u64 = (1 << DEGREE) - 1;

/// `a * x mod P` for `a` of degree below 63.
const fn times_x(a: u64) -> u64 {
    let shifted = a << 1;
    if shifted >> DEGREE != 0 {
        shifted ^ RABIN_POLYNOMIAL
    } else {
        shifted
    }
}

/// `a * x^n mod P` for `a` of degree below 63.
const fn times_x_pow(mut a: u64, n: usize) -> u64 {
    let mut i = 0;
    while i < n {
        a = times_x(a);
        i += 1;
    }
    a
}

/// `table[b] = b(x) * x^n mod P` for every byte value `b`.
const fn byte_table(n: usize) -> [u64; 256] {
    let mut table = [0; 256];
    let mut b = 0;
    while b < 256 {
        table[b] = times_x_pow(b as u64, n);
        b += 1;
    }
    table
}

/// `OVERFLOW[t] = t(x) * x^63 mod P`: reduces the 8 bits that `fp * x^8` pushes to
/// degrees 63..=70.
const OVERFLOW: [u64; 256] = byte_table(DEGREE as usize);

/// `LEAVING[b] = b(x) * x^(8 * (RABIN_WINDOW - 1)) mod P`: the share of the oldest byte
/// of a full window in its fingerprint.
const LEAVING: [u64; 256] = byte_table(8 * (RABIN_WINDOW - 1));

/// `fp * x^8 + byte mod P`: the fingerprint of the window with `byte` appended.
#[inline(always)]
fn append(fp: u64, byte: u8) -> u64 {
    // fp * x^8 = (fp >> 55) * x^63 + (fp mod x^55) * x^8, with fp below 2^63.
    (((fp << 8) & FINGERPRINT_BITS) | u64::from(byte)) ^ OVERFLOW[(fp >> (DEGREE - 8)) as usize]
}

/// Rabin-fingerprint chunking over a 48-byte window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RabinCdc {
    min_size: usize,
    max_size: usize,
    /// `D - 1`: `fp mod D == fp & mask` since `D` is a power of two.
    mask: u64,
}

impl RabinCdc {
    /// Sizes must pass [`crate::ChunkerConfig::validate`]: `avg_size` a power of two
    /// above [`RABIN_RESIDUE`], `min_size <= avg_size <= max_size`, `max_size >= 1`.
    pub fn new(min_size: usize, avg_size: usize, max_size: usize) -> Self {
        debug_assert!(
            avg_size.is_power_of_two() && avg_size as u64 > RABIN_RESIDUE,
            "RabinCdc needs a power-of-two average size above the residue (got {avg_size})"
        );
        Self {
            min_size,
            max_size,
            mask: avg_size as u64 - 1,
        }
    }
}

impl Chunker for RabinCdc {
    fn next_chunk_len(&self, data: &[u8]) -> usize {
        let end = data.len().min(self.max_size);
        // The shortest chunk that may end at a cut; a chunk is never empty.
        let first = self.min_size.max(1);
        if end <= first {
            return end;
        }
        // Cut-point skipping: bytes before the window of the first candidate are not
        // read. The window of a candidate `len` is `data[len.saturating_sub(48)..len]`.
        let start = first.saturating_sub(RABIN_WINDOW);
        let mut fp = data[start..first].iter().fold(0, |fp, &b| append(fp, b));
        let mut len = first;
        // The chunk is still shorter than a window: nothing leaves it yet.
        while len < end.min(RABIN_WINDOW) {
            if fp & self.mask == RABIN_RESIDUE {
                return len;
            }
            fp = append(fp, data[len]);
            len += 1;
        }
        // Full window: `data[len - 48]` leaves as `data[len]` enters. Candidates from
        // `len` up to `end` (excluded) are judged; `end` itself needs no judgement.
        let leaving = &data[len.saturating_sub(RABIN_WINDOW)..end.saturating_sub(RABIN_WINDOW)];
        for (i, (&old, &new)) in leaving.iter().zip(&data[len..end]).enumerate() {
            if fp & self.mask == RABIN_RESIDUE {
                return len + i;
            }
            fp = append(fp ^ LEAVING[usize::from(old)], new);
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

    /// `a * b mod P`, bit by bit.
    fn mul_mod(a: u64, mut b: u64) -> u64 {
        let (mut product, mut a) = (0, a);
        while b != 0 {
            if b & 1 == 1 {
                product ^= a;
            }
            a = times_x(a);
            b >>= 1;
        }
        product
    }

    /// `x^(2^k) mod P`.
    fn x_pow_pow2(k: u32) -> u64 {
        (0..k).fold(0b10, |a, _| mul_mod(a, a))
    }

    /// Polynomial gcd over GF(2).
    fn gcd(mut a: u128, mut b: u128) -> u128 {
        while b != 0 {
            while a != 0 && a.ilog2() >= b.ilog2() {
                a ^= b << (a.ilog2() - b.ilog2());
            }
            (a, b) = (b, a);
        }
        a
    }

    /// Rabin's test: a polynomial `P` of degree `n` is irreducible iff `x^(2^n) = x`
    /// mod `P` and `gcd(x^(2^(n/q)) - x, P) = 1` for every prime `q` dividing `n`
    /// (63 = 3 * 3 * 7).
    #[test]
    fn polynomial_is_irreducible() {
        assert_eq!(RABIN_POLYNOMIAL.ilog2(), DEGREE);
        assert_eq!(x_pow_pow2(DEGREE), 0b10);
        for q in [3, 7] {
            let reduced = x_pow_pow2(DEGREE / q) ^ 0b10;
            assert_eq!(
                gcd(u128::from(RABIN_POLYNOMIAL), u128::from(reduced)),
                1,
                "q = {q}"
            );
        }
    }

    #[test]
    fn sliding_equals_fingerprint_of_the_window() {
        let data: Vec<u8> = (0..200u32).map(|i| (i * 37 + 11) as u8).collect();
        let fingerprint = |window: &[u8]| window.iter().fold(0, |fp, &b| append(fp, b));
        let mut fp = fingerprint(&data[..RABIN_WINDOW]);
        for end in RABIN_WINDOW..data.len() {
            assert_eq!(
                fp,
                fingerprint(&data[end - RABIN_WINDOW..end]),
                "window ending {end}"
            );
            fp = append(
                fp ^ LEAVING[usize::from(data[end - RABIN_WINDOW])],
                data[end],
            );
        }
    }

    #[test]
    fn leading_zeros_do_not_change_a_fingerprint() {
        let fingerprint = |window: &[u8]| window.iter().fold(0, |fp, &b| append(fp, b));
        let mut padded = vec![0u8; 30];
        padded.extend_from_slice(b"eighteen bytes....");
        assert_eq!(fingerprint(&padded), fingerprint(&padded[30..]));
    }
}
