//! What a backup reports: counts, bytes, and the time each stage worked.

use std::time::Duration;

use larder_index::disk::DiskIndexMetrics;
use serde::Serialize;

use crate::error::Warning;

/// Time each stage spent working (not waiting on its queues), summed over rounds.
#[derive(Debug, Clone, Default, Serialize)]
pub struct StageTimes {
    pub walk: Duration,
    /// Loading the previous snapshots' entries and deciding which files to read.
    pub previous: Duration,
    pub chunk: Duration,
    /// Summed over the fingerprinting threads.
    pub fingerprint: Duration,
    pub index: Duration,
    /// Compressing new chunks, summed over the compression threads.
    pub compress: Duration,
    /// Placing new chunks in containers and copying them in (compression excluded).
    pub write: Duration,
    /// Container writes and fsyncs, summed over syncer threads, plus the commits.
    pub sync: Duration,
}

#[derive(Debug, Clone, Serialize)]
pub struct BackupSummary {
    pub snapshot_id: String,
    /// Files in the snapshot: new, changed and unchanged together.
    pub files: u64,
    /// Files no previous snapshot held, files read again because something about
    /// them changed, and files whose recipe was reused without reading them.
    pub files_new: u64,
    pub files_changed: u64,
    pub files_unchanged: u64,
    pub dirs: u64,
    pub symlinks: u64,
    /// FIFOs and device nodes.
    pub specials: u64,
    /// Bytes of the files in the snapshot, read or not.
    pub bytes_in: u64,
    /// Bytes of file content read; `bytes_in - bytes_read` were skipped unread.
    pub bytes_read: u64,
    pub bytes_skipped: u64,
    /// Raw bytes of every chunk this backup stored (`chunks_new` and
    /// `chunks_unused`): what is left after dedup.
    pub bytes_new: u64,
    /// Stored bytes of the new chunks: after compression, without metadata.
    pub bytes_new_stored: u64,
    /// Bytes the repository grew by: containers, index segments and snapshots
    /// (checkpoints included).
    pub bytes_stored: u64,
    /// Chunks of the snapshot's files and tree, reused or not: every reference (a
    /// chunk two files hold counts twice).
    pub chunks: u64,
    /// The distinct chunks of the snapshot that this backup stored: those no earlier
    /// snapshot or backup had stored. Never more than `chunks`.
    pub chunks_new: u64,
    /// Chunks this backup stored that the snapshot does not hold: the trees of its
    /// checkpoints (where the final tree differs), and what was read of files that
    /// failed. They stay until `larder gc`.
    pub chunks_unused: u64,
    /// Of `chunks` and `chunks_new`, those of the tree stream.
    pub tree_chunks: u64,
    pub tree_chunks_new: u64,
    pub containers_written: u64,
    /// Checkpoints written while the backup ran (removed once it committed).
    pub checkpoints: u64,
    /// The snapshots whose entries files were compared with, newest first.
    pub parents: Vec<String>,
    /// Entries left out by exclude patterns or `.larderignore` files, unread; an
    /// excluded directory counts once, whatever it holds.
    pub excluded: u64,
    pub elapsed: Duration,
    pub stages: StageTimes,
    pub warnings: Vec<Warning>,
    /// What the disk index did during this backup (`None` for a memory index); the
    /// CLI writes it into `--json` itself.
    #[serde(skip)]
    pub disk_index: Option<DiskIndexMetrics>,
}

impl BackupSummary {
    /// Input bytes per byte left after dedup (`bytes_in / bytes_new`).
    pub fn dedup_ratio(&self) -> f64 {
        self.bytes_in as f64 / self.bytes_new.max(1) as f64
    }

    /// Bytes left after dedup per byte stored for them (`bytes_new /
    /// bytes_new_stored`); 1 without compression, or when nothing was new.
    pub fn compression_ratio(&self) -> f64 {
        match self.bytes_new_stored {
            0 => 1.0,
            stored => self.bytes_new as f64 / stored as f64,
        }
    }

    /// Input bytes per byte the repository grew by, metadata included.
    pub fn overall_ratio(&self) -> f64 {
        self.bytes_in as f64 / self.bytes_stored.max(1) as f64
    }

    /// Input bytes (read or skipped) per second.
    pub fn mb_per_sec(&self) -> f64 {
        self.bytes_in as f64 / 1e6 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// Whether some source could not be read completely.
    pub fn is_partial(&self) -> bool {
        self.warnings.iter().any(|w| w.is_error)
    }
}
