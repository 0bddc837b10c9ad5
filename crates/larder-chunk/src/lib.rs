//! Content-defined chunking for larder.
//!
//! Every algorithm implements [`Chunker`], a one-method interface: given the bytes
//! that start at the current chunk boundary, say how long the chunk is. The crate is
//! pure logic; callers own buffering and I/O (see `larder-engine`).
//!
//! One module per algorithm, each a sequential executable spec: FastCDC 2016 and 2020,
//! fixed-size, the keyed chunker of encrypted repositories (whose AES lives in
//! `larder-crypto`), and the baselines of the FastCDC and P-Dedupe papers (Rabin,
//! Adler, plain Gear, Asymmetric Extremum). `docs/design/chunking.md` specifies them
//! all.
//!
//! [`ParallelChunker`] finds the same cut points on several threads, for any chunker.

mod adler;
mod ae;
mod candidates;
mod config;
mod fastcdc2016;
mod fastcdc2020;
mod fixed;
mod gear_cdc;
mod gear_table;
pub mod kernels;
mod keyed;
mod masks;
mod parallel;
mod rabin;

pub use adler::{AdlerCdc, ADLER_MODULUS, ADLER_RESIDUE, ADLER_TABLE, ADLER_WINDOW};
pub use ae::{ae_window, AsymmetricExtremum, AE_VALUE_BYTES};
pub use candidates::{Candidate, CandidateChunker, WINDOW};
pub use config::{ChunkerConfig, ChunkerKind, ConfigError};
pub use fastcdc2016::FastCdc2016;
pub use fastcdc2020::FastCdc2020;
pub use fixed::FixedSize;
pub use gear_cdc::GearCdc;
pub use gear_table::GEAR;
pub use keyed::{
    keyed_thresholds, KeyedCdc, KeyedThresholds, ANCHOR_SPACING, KEYED_MIN_SIZE, KEYED_WINDOW,
};
pub use masks::{select_masks, MASKS};
pub use parallel::{
    chunk_block_sequential, cut_limit, default_segment_size, dirty_chunks, BlockChunks,
    ParallelChunker, ParallelStats,
};
pub use rabin::{RabinCdc, RABIN_POLYNOMIAL, RABIN_RESIDUE, RABIN_WINDOW};

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
            // A broken chunker would otherwise loop forever on an empty chunk.
            assert!(
                (1..=data.len()).contains(&len),
                "chunker returned {len} for {} bytes, outside the contract",
                data.len()
            );
            lengths.push(len);
            data = &data[len..];
        }
        lengths
    }
}
