//! Seeded pseudo-random bytes (xorshift64): the chunking experiments' probe and the
//! unit tests' inputs.

/// `len` bytes from `seed`; the same seed gives the same bytes.
pub(crate) fn xorshift_bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut state = seed | 1;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 56) as u8
        })
        .collect()
}
