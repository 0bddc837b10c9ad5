//! The Bloom filter in front of the disk: sized from an expected count and a target
//! false-positive rate, capped by a memory share (docs/design/disk-index.md).

use larder_hash::Fingerprint;

use crate::prefetch::prefetch_line;

use super::format::BLOOM_BITS_PER_PAGE;

/// A Bloom filter over fingerprints with `k` probes `h1 + j * h2` (double hashing on
/// fingerprint bytes 24 .. 32 and 16 .. 24: neither the bytes that pick the disk
/// index's bucket (0 .. 8) nor those that pick a cluster's partition (8 .. 16), so that
/// every probe of a partition's filter is independent of the partition).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BloomFilter {
    words: Vec<u64>,
    hashes: u32,
    added: u64,
}

impl BloomFilter {
    /// A filter for `expected` fingerprints at false-positive rate `target`, using at
    /// most `max_bytes` (rounded down to whole pages, at least one page).
    pub fn with_rate(expected: u64, target: f64, max_bytes: u64) -> Self {
        let expected = expected.max(1) as f64;
        let ln2 = std::f64::consts::LN_2;
        let wanted = (-expected * target.clamp(1e-12, 0.5).ln() / (ln2 * ln2)).ceil() as u64;
        let cap = (max_bytes.saturating_mul(8) / BLOOM_BITS_PER_PAGE).max(1) * BLOOM_BITS_PER_PAGE;
        let bits = wanted
            .div_ceil(BLOOM_BITS_PER_PAGE)
            .max(1)
            .saturating_mul(BLOOM_BITS_PER_PAGE)
            .min(cap);
        let hashes = ((bits as f64 / expected) * ln2).round().clamp(1.0, 16.0) as u32;
        Self::from_parts(vec![0; (bits / 64) as usize], hashes, 0)
    }

    /// A filter from its stored parts (the Bloom file); `words.len() * 64` is its bit
    /// count, a nonzero multiple of a page's bits, and `hashes` is 1 to 16.
    pub fn from_parts(words: Vec<u64>, hashes: u32, added: u64) -> Self {
        debug_assert!(!words.is_empty() && (1..=16).contains(&hashes));
        Self {
            words,
            hashes,
            added,
        }
    }

    pub fn bits(&self) -> u64 {
        self.words.len() as u64 * 64
    }

    pub fn hashes(&self) -> u32 {
        self.hashes
    }

    /// Fingerprints added (each counted once per `insert`).
    pub fn added(&self) -> u64 {
        self.added
    }

    pub fn words(&self) -> &[u64] {
        &self.words
    }

    pub fn bytes(&self) -> u64 {
        self.words.len() as u64 * 8
    }

    /// Bit `j` of `fp`'s probes is `(h1 + j * h2) mod m`.
    fn probe_base(fp: &Fingerprint) -> (u64, u64) {
        let b = fp.as_bytes();
        let h1 = u64::from_le_bytes(b[24..32].try_into().expect("8 bytes"));
        let h2 = u64::from_le_bytes(b[16..24].try_into().expect("8 bytes")) | 1;
        (h1, h2)
    }

    pub fn insert(&mut self, fp: &Fingerprint) {
        let (h1, h2) = Self::probe_base(fp);
        let bits = self.bits();
        for j in 0..u64::from(self.hashes) {
            let bit = h1.wrapping_add(j.wrapping_mul(h2)) % bits;
            self.words[(bit / 64) as usize] |= 1 << (bit % 64);
        }
        self.added += 1;
    }

    /// Starts loading the words a `may_contain(fp)` reads. A hint.
    pub fn prefetch(&self, fp: &Fingerprint) {
        let (h1, h2) = Self::probe_base(fp);
        let bits = self.bits();
        for j in 0..u64::from(self.hashes) {
            let bit = h1.wrapping_add(j.wrapping_mul(h2)) % bits;
            prefetch_line(&self.words[(bit / 64) as usize..]);
        }
    }

    /// `false` only if `fp` was never inserted.
    pub fn may_contain(&self, fp: &Fingerprint) -> bool {
        let (h1, h2) = Self::probe_base(fp);
        let bits = self.bits();
        (0..u64::from(self.hashes)).all(|j| {
            let bit = h1.wrapping_add(j.wrapping_mul(h2)) % bits;
            self.words[(bit / 64) as usize] & (1 << (bit % 64)) != 0
        })
    }

    /// The false-positive rate with `n` fingerprints in it: `(1 - e^(-k n / m))^k`.
    pub fn false_positive_rate(&self, n: u64) -> f64 {
        let k = f64::from(self.hashes);
        (1.0 - (-k * n as f64 / self.bits() as f64).exp()).powf(k)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use larder_hash::HashAlgo;

    fn fp(i: u64) -> Fingerprint {
        HashAlgo::Blake3.fingerprint(&i.to_le_bytes())
    }

    #[test]
    fn no_false_negatives_and_the_rate_matches_the_formula() {
        let n = 100_000;
        let mut bloom = BloomFilter::with_rate(n, 0.01, u64::MAX);
        for i in 0..n {
            bloom.insert(&fp(i));
        }
        assert!((0..n).all(|i| bloom.may_contain(&fp(i))));
        let trials = 200_000;
        let false_positives = (n..n + trials)
            .filter(|&i| bloom.may_contain(&fp(i)))
            .count();
        let measured = false_positives as f64 / trials as f64;
        let predicted = bloom.false_positive_rate(n);
        assert!(predicted < 0.011, "sized for 1%, predicts {predicted}");
        assert!(
            (measured - predicted).abs() < predicted * 0.25,
            "measured {measured}, predicted {predicted}"
        );
    }

    #[test]
    fn the_memory_cap_wins_and_raises_the_rate() {
        let bloom = BloomFilter::with_rate(1_000_000, 0.01, 64 * 1024);
        assert_eq!(bloom.bytes(), 64 * 1024);
        assert!(bloom.false_positive_rate(1_000_000) > 0.5);
        let tiny = BloomFilter::with_rate(10, 0.01, 0);
        assert_eq!(tiny.bits(), BLOOM_BITS_PER_PAGE);
    }
}
