//! larder's engine: the backup pipeline, restore and check, above `larder-store`.
//!
//! The pipeline follows P-Dedupe (docs/design/pipeline.md): chunk, fingerprint, index
//! and write run as separate stages joined by bounded queues; fingerprinting runs on
//! several threads and keeps stream order; small files are read and chunked in
//! parallel across files.

mod backup;
mod check;
mod error;
mod restore;
mod tree_io;
mod walk;

pub use backup::{backup, BackupOptions, BackupSummary, StageTimes};
pub use check::{check, CheckOptions, CheckReport, Damage};
pub use error::{EngineError, Result, Warning};
pub use restore::{restore, RestoreOptions, RestoreSummary};
pub use tree_io::{load_tree, ChunkReader};

/// Receives progress as work advances; the CLI draws a bar from it.
pub trait Progress: Send + Sync {
    /// Total input bytes, once known.
    fn set_total(&self, _bytes: u64) {}
    /// `bytes` more input bytes are done.
    fn advance(&self, _bytes: u64) {}
    /// A non-fatal problem, as it happens.
    fn warn(&self, _warning: &Warning) {}
}

/// Progress that goes nowhere.
pub struct NoProgress;

impl Progress for NoProgress {}
