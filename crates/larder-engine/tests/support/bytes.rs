//! Seeded test data shared by larder-engine's tests.

/// `len` pseudo-random bytes from `seed`: the same seed, the same bytes.
pub fn bytes(seed: u64, len: usize) -> Vec<u8> {
    larder_gen::seeded_bytes(seed, len)
}
