//! The portable kernels: the spec the SIMD twins in `x86.rs` are tested against.

/// How many leading bytes of `data` equal `byte`; eight bytes a step.
pub fn run_len(data: &[u8], byte: u8) -> usize {
    let pattern = u64::from_ne_bytes([byte; 8]);
    let (words, tail) = data.as_chunks::<8>();
    for (i, word) in words.iter().enumerate() {
        let diff = u64::from_le_bytes(*word) ^ pattern;
        if diff != 0 {
            // Little-endian load: the first differing byte is the lowest set byte.
            return i * 8 + (diff.trailing_zeros() / 8) as usize;
        }
    }
    words.len() * 8 + tail.iter().take_while(|&&b| b == byte).count()
}
