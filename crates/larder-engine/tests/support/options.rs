//! The backup options larder-engine's tests use: no excludes, no progress, host and
//! user "test", the pipeline (not serial mode).

use std::sync::Arc;

use larder_engine::{BackupOptions, NoProgress, PatternList};

/// Options for a backup on `threads` fingerprinting threads.
pub fn backup_options(threads: usize) -> BackupOptions {
    BackupOptions {
        threads,
        hostname: "test".into(),
        username: "test".into(),
        exclude: PatternList::default(),
        progress: Arc::new(NoProgress),
        serial: false,
    }
}
