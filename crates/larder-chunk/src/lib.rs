//! Content-defined chunking for larder.
//!
//! Every algorithm implements [`Chunker`], a one-method interface: given the bytes
//! that start at the current chunk boundary, say how long the chunk is. The crate is
//! pure logic; callers own buffering and I/O (see `larder-engine`).
//! [`ParallelChunker`] finds the same cut points on several threads, for any chunker.

mod config;
mod fastcdc2016;
mod fastcdc2020;
mod fixed;
mod gear;
mod masks;
mod parallel;

pub use config::{ChunkerConfig, ChunkerKind, ConfigError};
pub use fastcdc2016::FastCdc2016;
pub use fastcdc2020::FastCdc2020;
pub use fixed::FixedSize;
pub use gear::GEAR;
pub use masks::{select_masks, MASKS};
pub use parallel::{
    chunk_block_sequential, default_segment_size, dirty_chunks, BlockChunks, ParallelChunker,
    ParallelStats,
};

/// Finds chunk boundaries in a byte stream.
///
/// Contract, relied on by every caller:
/// - `data` starts at a chunk boundary and is non-empty;
/// - `data` is either everything left of the stream, or at least [`Chunker::max_size`]
///   bytes long (so no cut decision ever depends on bytes not yet seen);
/// - the result is in `1..=min(data.len(), max_size)`.
pub trait Chunker: Send + Sync {
    /// Length of the chunk that starts at `data[0]`.
    fn next_chunk_len(&self, data: &[u8]) -> usize;

    /// The largest chunk this chunker ever returns.
    fn max_size(&self) -> usize;

    /// Splits a whole in-memory stream into chunk lengths, in order.
    fn chunk_lengths(&self, mut data: &[u8]) -> Vec<usize> {
        let mut lengths = Vec::with_capacity(data.len() / 4096 + 1);
        while !data.is_empty() {
            let len = self.next_chunk_len(data);
            lengths.push(len);
            data = &data[len..];
        }
        lengths
    }
}
