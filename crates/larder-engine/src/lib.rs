//! larder's engine: the backup pipeline, restore and check, above `larder-store`.
//!
//! The pipeline follows P-Dedupe (docs/design/pipeline.md): chunk, fingerprint, index
//! and write run as separate stages joined by bounded queues; fingerprinting runs on
//! several threads and keeps stream order; small files are read and chunked in
//! parallel across files.
//!
//! Besides backup, restore and check: `repair` (salvaging damaged containers and
//! rewriting the snapshots that lost data, docs/design/repair.md); `copy` (snapshots from one repository into
//! another, docs/design/copy.md); `forget` (retention policies) and `gc`'s mark
//! (docs/design/gc.md); reading snapshots back (`browse`: `ls` and `cat`; `diff`;
//! `file_read`: any byte range of one file, for `mount`), and the path patterns that
//! select what backup and restore take (`pattern`, docs/design/patterns.md).

mod assembly;
mod backup;
mod block_buf;
mod browse;
mod check;
mod copy;
mod diff;
mod error;
mod file_read;
mod forget;
mod gc;
mod meta;
mod names;
mod pattern;
mod repair;
mod restore;
mod select;
mod time;
mod tree_io;

pub use assembly::ReadStats;
#[cfg(feature = "gpu")]
pub use backup::GpuChunkDevice;
pub use backup::{
    backup, backup_stdin, check_device, BackupOptions, BackupSummary, ChunkDevice, ExcludeTag,
    Parents, RemoteAnswers, RemoteIndex, RemoteLookup, RemoteReply, SkipRules, StageTimes,
    RACY_WINDOW,
};
pub use browse::{SnapshotPath, SnapshotTree};
pub use check::{check, CheckOptions, CheckReport, Damage, RepairedCopy};
pub use copy::{copy, CopiedSnapshot, CopyOptions, CopySummary, SkipReason, SkippedSnapshot};
pub use diff::{diff_snapshots, diff_trees, Change, ChangeKind, ChangedField, TreeDiff};
pub use error::{EngineError, Result, Warning};
pub use file_read::{ChunkCache, FileLayout};
pub use forget::{
    apply_policy, forget, plan_forget, plan_forget_named, ForgetDecision, KeepReason,
    RetentionPolicy,
};
pub use gc::{gc, gc_preview, mark, GcSummary};
pub use larder_store::user_name;
pub use meta::read_xattrs;
pub use names::{display_path, escape_controls, escape_name, BytesField};
pub use pattern::{parse_pattern_file, Pattern, PatternList};
pub use repair::{
    repair, LostFile, RepairOptions, RepairReport, RepairedContainer, SnapshotLoss, TreeLoss,
};
pub use restore::{
    restore, restore_entries, RestoreOptions, RestoreSummary, DEFAULT_RESTORE_CACHE,
};
pub use time::{local_offset, parse_utc_rfc3339, utc_rfc3339};
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
