//! Adler-style rolling-checksum chunking, as the P-Dedupe paper tabulates it (Table 4:
//! `S1 += A(b); S2 += S1; hash = (S2 << 16) | S1`) and the FastCDC paper lists it
//! (Table 1) as a slow alternative to Gear.
//!
//! Over the last [`ADLER_WINDOW`] bytes `b_1 .. b_n` of a chunk (all of its bytes if it
//! is shorter), with `A` = [`ADLER_TABLE`] and `M` = [`ADLER_MODULUS`]:
//!
//! ```text
//! S1 = (A(b_1) + ... + A(b_n)) mod M
//! S2 = (n * A(b_1) + (n - 1) * A(b_2) + ... + 1 * A(b_n)) mod M
//! hash = S2 * 2^16 + S1                                      (32 bits)
//! ```
//!
//! A chunk may end where `hash mod D == r`, with `r =` [`ADLER_RESIDUE`] and `D` the
//! largest prime not above `avg_size`. A prime, not a power of two: `hash mod 2^k`
//! would read only the low bits of `S1`, a plain sum that ignores the order of the
//! bytes in the window, while `hash mod D` for an odd `D` mixes in `S2`.
//! `docs/design/chunking.md` is the full specification.

use crate::gear_table::GEAR;
use crate::Chunker;

/// Bytes in the sliding window: LBFS's 48, as for [`crate::RabinCdc`].
pub const ADLER_WINDOW: usize = 48;

/// Adler-32's modulus, the largest prime below `2^16`; `S1` and `S2` stay below it.
pub const ADLER_MODULUS: u32 = 65_521;

/// The residue `r` in `hash mod D == r` (LBFS's 0x78, as for Rabin).
pub const ADLER_RESIDUE: u32 = 0x78;

/// The table `A` of P-Dedupe's pseudocode: `A[b]` is the top 16 bits of `GEAR[b]`,
/// reduced modulo [`ADLER_MODULUS`]. A table rather than the byte itself (as in zlib's
/// Adler-32) so that the sum of a window is spread over all residues even for text,
/// whose bytes span a narrow range.
pub const ADLER_TABLE: [u32; 256] = {
    let mut table = [0; 256];
    let mut b = 0;
    while b < 256 {
        table[b] = (GEAR[b] >> 48) as u32 % ADLER_MODULUS;
        b += 1;
    }
    table
};

/// The largest prime `<= n`, for `n >= 2`.
pub(crate) fn largest_prime_at_most(n: usize) -> usize {
    let is_prime = |p: usize| {
        p >= 2
            && (2..)
                .take_while(|d| d * d <= p)
                .all(|d| !p.is_multiple_of(d))
    };
    (2..=n).rev().find(|&p| is_prime(p)).unwrap_or(2)
}

/// The window's `(S1, S2)`, rolled forward one byte at a time.
#[derive(Debug, Clone, Copy, Default)]
struct Sums {
    s1: u32,
    s2: u32,
}

impl Sums {
    /// Appends `new` to a window that has fewer than [`ADLER_WINDOW`] bytes: every
    /// byte's weight grows by one and `new` enters with weight 1.
    #[inline(always)]
    fn grow(self, new: u8) -> Self {
        let s1 = (self.s1 + ADLER_TABLE[usize::from(new)]) % ADLER_MODULUS;
        Self {
            s1,
            s2: (self.s2 + s1) % ADLER_MODULUS,
        }
    }

    /// Appends `new` to a full window whose oldest byte, `old`, leaves with weight
    /// [`ADLER_WINDOW`]. Operands stay below `2^32`: `48 * 65521 < 2^22`.
    #[inline(always)]
    fn slide(self, old: u8, new: u8) -> Self {
        let (m, w) = (ADLER_MODULUS, ADLER_WINDOW as u32);
        let leaving = ADLER_TABLE[usize::from(old)];
        let s1 = (self.s1 + (m - leaving) + ADLER_TABLE[usize::from(new)]) % m;
        Self {
            s1,
            s2: (self.s2 + (w * m - w * leaving) + s1) % m,
        }
    }

    #[inline(always)]
    fn hash(self) -> u32 {
        (self.s2 << 16) | self.s1
    }
}

/// Adler-style rolling-checksum chunking over a 48-byte window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdlerCdc {
    min_size: usize,
    max_size: usize,
    /// `D`, the largest prime not above the average size.
    divisor: u32,
}

impl AdlerCdc {
    /// Sizes must pass [`crate::ChunkerConfig::validate`]: `min_size <= avg_size <=
    /// max_size`, `avg_size` above [`ADLER_RESIDUE`] and below `2^32`.
    pub fn new(min_size: usize, avg_size: usize, max_size: usize) -> Self {
        let divisor = largest_prime_at_most(avg_size);
        debug_assert!(
            divisor > ADLER_RESIDUE as usize && u32::try_from(divisor).is_ok(),
            "AdlerCdc needs an average size in 0x79..2^32 (got {avg_size})"
        );
        Self {
            min_size,
            max_size,
            divisor: divisor as u32,
        }
    }

    /// `D`: the expected distance between cut candidates.
    pub fn divisor(&self) -> u32 {
        self.divisor
    }

    #[inline(always)]
    fn is_cut(&self, sums: Sums) -> bool {
        sums.hash() % self.divisor == ADLER_RESIDUE
    }
}

impl Chunker for AdlerCdc {
    fn next_chunk_len(&self, data: &[u8]) -> usize {
        let end = data.len().min(self.max_size);
        // The shortest chunk that may end at a cut; a chunk is never empty.
        let first = self.min_size.max(1);
        if end <= first {
            return end;
        }
        // Cut-point skipping: bytes before the window of the first candidate are not
        // read. The window of a candidate `len` is `data[len.saturating_sub(48)..len]`.
        let start = first.saturating_sub(ADLER_WINDOW);
        let mut sums = data[start..first]
            .iter()
            .fold(Sums::default(), |sums, &b| sums.grow(b));
        let mut len = first;
        // The chunk is still shorter than a window: nothing leaves it yet.
        while len < end.min(ADLER_WINDOW) {
            if self.is_cut(sums) {
                return len;
            }
            sums = sums.grow(data[len]);
            len += 1;
        }
        // Full window: `data[len - 48]` leaves as `data[len]` enters.
        let leaving = &data[len.saturating_sub(ADLER_WINDOW)..end.saturating_sub(ADLER_WINDOW)];
        for (i, (&old, &new)) in leaving.iter().zip(&data[len..end]).enumerate() {
            if self.is_cut(sums) {
                return len + i;
            }
            sums = sums.slide(old, new);
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
    fn largest_primes_of_the_usual_sizes() {
        assert_eq!(largest_prime_at_most(256), 251);
        assert_eq!(largest_prime_at_most(4096), 4093);
        assert_eq!(largest_prime_at_most(8192), 8191);
        assert_eq!(largest_prime_at_most(16384), 16381);
        assert_eq!(largest_prime_at_most(65521), 65521);
    }

    #[test]
    fn hash_mod_a_prime_depends_on_the_order_of_the_bytes() {
        let sums = |bytes: &[u8]| bytes.iter().fold(Sums::default(), |s, &b| s.grow(b));
        let (ab, ba) = (sums(b"ab"), sums(b"ba"));
        assert_eq!(ab.s1, ba.s1);
        assert_ne!(ab.hash() % 8191, ba.hash() % 8191);
    }
}
