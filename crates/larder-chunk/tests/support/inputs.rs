//! Deterministic inputs for the chunker tests and the `regen-golden` example.
//!
//! Frozen: `testdata/chunk/golden.json` records the FNV-1a digest of every input it
//! was cut from, so a change here fails `tests/golden.rs` with its own message.

/// xorshift64* (Vigna, 2016): a seedable generator that needs no dependency.
pub struct XorShift64Star(u64);

impl XorShift64Star {
    /// `seed` may be anything; zero, the one fixed point of xorshift, is remapped.
    pub fn new(seed: u64) -> Self {
        Self(if seed == 0 {
            0x9e37_79b9_7f4a_7c15
        } else {
            seed
        })
    }

    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform enough in `0..n` for test data (modulo bias is irrelevant here).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

/// `len` pseudo-random bytes.
pub fn random_bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut rng = XorShift64Star::new(seed);
    let mut data = Vec::with_capacity(len + 8);
    while data.len() < len {
        data.extend_from_slice(&rng.next_u64().to_le_bytes());
    }
    data.truncate(len);
    data
}

/// `len` bytes of English-like prose: lower-case words from a small vocabulary,
/// separated by spaces, with a sentence end and occasional line breaks.
pub fn text_like(seed: u64, len: usize) -> Vec<u8> {
    const WORDS: [&str; 24] = [
        "the",
        "backup",
        "chunk",
        "of",
        "data",
        "is",
        "stored",
        "once",
        "and",
        "a",
        "repository",
        "holds",
        "every",
        "snapshot",
        "in",
        "containers",
        "with",
        "an",
        "index",
        "that",
        "maps",
        "each",
        "fingerprint",
        "to",
    ];
    let mut rng = XorShift64Star::new(seed);
    let mut text = Vec::with_capacity(len + 16);
    while text.len() < len {
        text.extend_from_slice(WORDS[rng.below(WORDS.len())].as_bytes());
        text.extend_from_slice(match rng.below(16) {
            0 => b".\n",
            1 => b". ",
            2 => b", ",
            _ => b" ",
        });
    }
    text.truncate(len);
    text
}
