//! A small seeded generator for the kill tests, so that trees and kill moments repeat.

/// SplitMix64 (larder-gen's): a small seeded generator, so that trees and kill moments
/// repeat.
pub struct Rng(pub larder_gen::SplitMix64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(larder_gen::SplitMix64::new(seed))
    }

    pub fn next(&mut self) -> u64 {
        self.0.next_u64()
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    pub fn bytes(&mut self, len: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(len + 8);
        while out.len() < len {
            out.extend_from_slice(&self.next().to_le_bytes());
        }
        out.truncate(len);
        out
    }
}
