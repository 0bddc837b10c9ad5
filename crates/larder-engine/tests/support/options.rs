//! The options larder-engine's tests use: backups with no excludes, no progress, host
//! and user "test", the pipeline (not serial mode); restores of everything; checks.

// Each test binary uses a different part of this module.
#![allow(dead_code)]

use std::sync::Arc;

use larder_engine::{BackupOptions, CheckOptions, NoProgress, RestoreOptions};

/// Options for a backup on `threads` fingerprinting threads.
pub fn backup_options(threads: usize) -> BackupOptions {
    BackupOptions {
        threads,
        hostname: "test".into(),
        username: "test".into(),
        ..BackupOptions::default()
    }
}

/// Options for restoring a whole snapshot into an empty target, with `cache_size`
/// bytes for container data.
pub fn restore_options(cache_size: usize) -> RestoreOptions {
    RestoreOptions {
        cache_size,
        ..RestoreOptions::default()
    }
}

/// Options for `check`, reading and verifying every chunk when `read_data`.
pub fn check_options(read_data: bool) -> CheckOptions {
    CheckOptions {
        read_data,
        progress: Arc::new(NoProgress),
    }
}
