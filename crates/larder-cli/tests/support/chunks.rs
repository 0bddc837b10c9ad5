//! The engine's test support for comparing repositories by their data chunks
//! (`larder-engine/tests/support/chunks.rs`), for repositories at a path.

use std::path::Path;

use larder_store::LockMode;

use super::open_store;

#[path = "../../../larder-engine/tests/support/chunks.rs"]
mod engine;
pub use engine::DataChunk;

/// The data chunks of the repository at `path` ([`engine::data_chunks`]).
pub fn data_chunks(path: &Path) -> Vec<Vec<DataChunk>> {
    engine::data_chunks(&open_store(path, LockMode::Shared))
}
