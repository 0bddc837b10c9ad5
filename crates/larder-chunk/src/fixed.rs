//! Fixed-size chunking (FSC): every chunk is `size` bytes except the last.

use crate::Chunker;

/// Cuts the stream every `size` bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FixedSize {
    size: usize,
}

impl FixedSize {
    /// `size` must be non-zero; [`crate::ChunkerConfig::validate`] checks it.
    pub fn new(size: usize) -> Self {
        assert!(size > 0, "fixed chunk size must be non-zero");
        Self { size }
    }
}

impl Chunker for FixedSize {
    fn next_chunk_len(&self, data: &[u8]) -> usize {
        data.len().min(self.size)
    }

    fn max_size(&self) -> usize {
        self.size
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuts_every_size_bytes_and_keeps_the_tail() {
        let c = FixedSize::new(4096);
        assert_eq!(c.chunk_lengths(&[7u8; 10_000]), vec![4096, 4096, 1808]);
        assert_eq!(c.chunk_lengths(&[]), Vec::<usize>::new());
        assert_eq!(c.chunk_lengths(&[1u8; 4096]), vec![4096]);
    }
}
