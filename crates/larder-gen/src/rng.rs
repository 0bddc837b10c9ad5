//! The generator's deterministic pseudo-random numbers: SplitMix64 (seeding, and
//! deriving independent seeds from a seed and a label) and xoshiro256** (everything
//! else). Both are the published algorithms of Vigna and Blackman, written here so
//! that the bytes of a workload depend on nothing outside this crate.

/// SplitMix64: one 64-bit state advanced by a Weyl increment, then mixed. Every
/// output of a different state is different (the mix is a bijection).
#[derive(Clone, Debug)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        mix64(self.0)
    }
}

/// `len` pseudo-random bytes from `seed`, the same for the same seed: SplitMix64 from
/// a scrambled seed, 8 little-endian bytes an output. The one seeded byte generator of
/// larder's tests (they use it through their own `bytes` or `pseudo_random`).
pub fn seeded_bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut rng = SplitMix64::new(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03);
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        out.extend_from_slice(&rng.next_u64().to_le_bytes());
    }
    out.truncate(len);
    out
}

/// SplitMix64's output function: a bijection of u64 that spreads every input bit.
#[inline]
pub fn mix64(x: u64) -> u64 {
    let mut z = x;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A seed for one purpose (`label`) and one index (a client, a block) derived from the
/// workload's seed, so that the streams of different purposes never coincide.
#[inline]
pub fn derive_seed(seed: u64, label: u64, index: u64) -> u64 {
    mix64(mix64(seed ^ mix64(label)).wrapping_add(index))
}

/// xoshiro256**: 256 bits of state, period 2^256 - 1, passes BigCrush.
#[derive(Clone, Debug)]
pub struct Xoshiro256 {
    s: [u64; 4],
}

impl Xoshiro256 {
    /// The state is four SplitMix64 outputs, as the authors recommend; it is never all
    /// zero because SplitMix64 outputs four different values from consecutive states.
    pub fn new(seed: u64) -> Self {
        let mut sm = SplitMix64::new(seed);
        Self {
            s: [sm.next_u64(), sm.next_u64(), sm.next_u64(), sm.next_u64()],
        }
    }

    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        let s = &mut self.s;
        let result = s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }

    /// Uniform in [0, 1): the top 53 bits.
    #[inline]
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in (0, 1]: never zero, so its logarithm is finite.
    #[inline]
    pub fn next_f64_nonzero(&mut self) -> f64 {
        ((self.next_u64() >> 11) + 1) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in `lo..=hi` (`lo <= hi`); the modulo bias is below 2^-40 for the
    /// ranges used here (at most a few thousand values).
    #[inline]
    pub fn range_inclusive(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next_u64() % (hi - lo + 1)
    }

    /// A standard normal deviate (Box-Muller; the second deviate is dropped so that a
    /// draw uses a fixed number of outputs).
    pub fn next_normal(&mut self) -> f64 {
        let r = (-2.0 * self.next_f64_nonzero().ln()).sqrt();
        r * (std::f64::consts::TAU * self.next_f64()).cos()
    }

    /// An exponential deviate with this mean.
    pub fn next_exp(&mut self, mean: f64) -> f64 {
        -self.next_f64_nonzero().ln() * mean
    }

    /// Fills `out` with the next outputs, 8 little-endian bytes each (a trailing part
    /// of fewer than 8 bytes takes the first bytes of one more output).
    #[inline]
    pub fn fill(&mut self, out: &mut [u8]) {
        let mut words = out.chunks_exact_mut(8);
        for w in &mut words {
            w.copy_from_slice(&self.next_u64().to_le_bytes());
        }
        let rest = words.into_remainder();
        if !rest.is_empty() {
            let last = self.next_u64().to_le_bytes();
            rest.copy_from_slice(&last[..rest.len()]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The first outputs of SplitMix64 seeded with 1234567, from the reference C
    /// implementation (splitmix64.c, Vigna).
    #[test]
    fn splitmix64_matches_the_reference() {
        let mut sm = SplitMix64::new(1_234_567);
        assert_eq!(sm.next_u64(), 6_457_827_717_110_365_317);
        assert_eq!(sm.next_u64(), 3_203_168_211_198_807_973);
        assert_eq!(sm.next_u64(), 9_817_491_932_198_370_423);
    }

    #[test]
    fn xoshiro_is_deterministic_and_seed_sensitive() {
        let a: Vec<u64> = {
            let mut r = Xoshiro256::new(7);
            (0..64).map(|_| r.next_u64()).collect()
        };
        let b: Vec<u64> = {
            let mut r = Xoshiro256::new(7);
            (0..64).map(|_| r.next_u64()).collect()
        };
        let c: Vec<u64> = {
            let mut r = Xoshiro256::new(8);
            (0..64).map(|_| r.next_u64()).collect()
        };
        assert_eq!(a, b);
        assert!(a.iter().zip(&c).all(|(x, y)| x != y));
    }

    #[test]
    fn fill_writes_whole_outputs_then_a_prefix() {
        let mut buf = [0u8; 21];
        Xoshiro256::new(3).fill(&mut buf);
        let mut r = Xoshiro256::new(3);
        let mut expect = Vec::new();
        for _ in 0..3 {
            expect.extend_from_slice(&r.next_u64().to_le_bytes());
        }
        assert_eq!(&buf[..], &expect[..21]);
    }

    #[test]
    fn uniform_and_exponential_moments() {
        let mut r = Xoshiro256::new(11);
        let n = 200_000;
        let mean_u = (0..n).map(|_| r.next_f64()).sum::<f64>() / n as f64;
        let mean_e = (0..n).map(|_| r.next_exp(3.0)).sum::<f64>() / n as f64;
        let normals: Vec<f64> = (0..n).map(|_| r.next_normal()).collect();
        let mean_n = normals.iter().sum::<f64>() / n as f64;
        let var_n = normals.iter().map(|x| x * x).sum::<f64>() / n as f64;
        assert!((mean_u - 0.5).abs() < 0.005, "{mean_u}");
        assert!((mean_e - 3.0).abs() < 0.05, "{mean_e}");
        assert!(mean_n.abs() < 0.01, "{mean_n}");
        assert!((var_n - 1.0).abs() < 0.02, "{var_n}");
    }
}
