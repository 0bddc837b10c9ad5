//! Copying snapshots from one repository into another (`larder copy`,
//! docs/design/copy.md).
//!
//! Each snapshot is copied on one of two paths. When the destination fingerprints
//! chunks and cuts streams exactly as the source does ([`same_chunks`]), its chunks
//! keep their fingerprints: `fast` sends the chunks the destination lacks, decoded
//! and verified in the source and encoded again with the destination's codec, and the
//! tree stream is kept as it is. Otherwise `rechunk` streams every file's bytes from
//! the source through the backup pipeline, so the files are cut, fingerprinted and
//! stored as a backup of them into the destination would, and a new tree stream names
//! the new recipes. Either way a snapshot is committed as a backup's is
//! (docs/design/format.md, "Commit order"): its containers durable, then their index
//! segment, then the snapshot, which records the source snapshot's id as `original`.

mod fast;
mod rechunk;

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use larder_store::{IdentifiedSnapshot, Repository, SegmentContainer, Snapshot, TreeRef};
use serde::Serialize;

use crate::error::{EngineError, Result, Warning};
use crate::tree_io::{load_tree, ChunkReader};
use crate::{NoProgress, Progress};

pub struct CopyOptions {
    /// Source snapshots to copy: id prefixes or `latest`. Empty: every complete
    /// snapshot (checkpoints are copied only when named).
    pub snapshots: Vec<String>,
    /// Threads of the re-chunking pipeline; 0 means one per core.
    pub threads: usize,
    pub progress: Arc<dyn Progress>,
}

impl Default for CopyOptions {
    /// Every complete snapshot, one thread per core, no progress.
    fn default() -> Self {
        Self {
            snapshots: Vec::new(),
            threads: 0,
            progress: Arc::new(NoProgress),
        }
    }
}

/// A snapshot copied: its id in the source and in the destination.
#[derive(Debug, Clone, Serialize)]
pub struct CopiedSnapshot {
    pub source: String,
    pub destination: String,
    /// Chunks written into the destination's containers for it, and their raw bytes.
    pub chunks_sent: u64,
    pub bytes_sent: u64,
}

/// A source snapshot not copied, and why.
#[derive(Debug, Clone, Serialize)]
pub struct SkippedSnapshot {
    pub source: String,
    pub reason: SkipReason,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum SkipReason {
    /// The destination holds it, or a copy of it (its `original`).
    AlreadyCopied,
    /// A checkpoint, which only a copy that names it takes.
    Checkpoint,
}

/// What a copy did.
#[derive(Debug, Clone, Serialize)]
pub struct CopySummary {
    pub copied: Vec<CopiedSnapshot>,
    pub skipped: Vec<SkippedSnapshot>,
    /// Whether the files were cut again with the destination's chunker (the
    /// destination fingerprints or cuts differently), rather than their chunks sent
    /// as they are.
    pub rechunked: bool,
    /// Chunks written into the destination's containers, and their raw bytes: only
    /// those it lacked.
    pub chunks_sent: u64,
    pub bytes_sent: u64,
    /// What the destination's containers hold for them: after compression and
    /// sealing, container headers and padding excluded.
    pub bytes_stored: u64,
    pub containers_written: u64,
    /// File bytes read from the source to be cut again (0 on the fast path).
    pub bytes_rechunked: u64,
    /// Printed by the CLI in seconds.
    #[serde(skip)]
    pub elapsed: Duration,
}

/// What sending one snapshot's chunks stored: the containers to commit, the
/// snapshot's tree and chunk count in the destination, and the counters.
pub(crate) struct Sent {
    pub written: Vec<SegmentContainer>,
    pub tree: TreeRef,
    /// Chunks of the files' recipes and of the tree stream.
    pub chunks: u64,
    pub chunks_sent: u64,
    pub bytes_sent: u64,
    pub bytes_stored: u64,
    pub bytes_rechunked: u64,
    /// Files that could not be read from the source: the snapshot is not copied.
    pub warnings: Vec<Warning>,
}

/// Copies snapshots of `src` into `dst` (opened with the exclusive lock), skipping
/// those `dst` already holds. Both keys must be full: the source's snapshots are
/// read, and the destination's are read to know what it holds. A failure stops the
/// copy; the snapshots copied before it stay.
pub fn copy(src: &Repository, dst: &mut Repository, opts: &CopyOptions) -> Result<CopySummary> {
    let started = Instant::now();
    src.require_full_key("read the snapshots to copy")?;
    dst.require_full_key(
        "receive copies (copy reads the destination's snapshots to skip those it holds)",
    )?;
    let mut held = held_ids(dst)?;
    let rechunked = !same_chunks(src, dst);
    let progress = Cumulative {
        inner: opts.progress.as_ref(),
        done: AtomicU64::new(0),
        total: AtomicU64::new(0),
    };
    let mut summary = CopySummary {
        copied: Vec::new(),
        skipped: Vec::new(),
        rechunked,
        chunks_sent: 0,
        bytes_sent: 0,
        bytes_stored: 0,
        containers_written: 0,
        bytes_rechunked: 0,
        elapsed: Duration::ZERO,
    };
    for (id, snap) in chosen(src, &opts.snapshots)? {
        let original = snap.original.clone().unwrap_or_else(|| id.clone());
        if held.contains(&original) || held.contains(&id) {
            summary.skipped.push(SkippedSnapshot {
                source: id,
                reason: SkipReason::AlreadyCopied,
            });
            continue;
        }
        if snap.partial && opts.snapshots.is_empty() {
            summary.skipped.push(SkippedSnapshot {
                source: id,
                reason: SkipReason::Checkpoint,
            });
            continue;
        }
        let sent = send(src, dst, &snap, rechunked, opts.threads, &progress)?;
        progress.next_snapshot();
        summary.containers_written += sent.written.len() as u64;
        // Rules 1 and 2 of the commit order, then rule 3. What was written is
        // committed even when the snapshot cannot be: the next copy reuses it.
        dst.commit(sent.written)?;
        if let Some(first) = sent.warnings.first() {
            return Err(EngineError::CopyFailed {
                snapshot: id[..8.min(id.len())].to_string(),
                reason: format!(
                    "{} file(s) could not be read from the source, the first {first}",
                    sent.warnings.len()
                ),
            });
        }
        let copy = Snapshot {
            version: Snapshot::VERSION,
            tree: sent.tree,
            summary: larder_store::SnapshotSummary {
                chunks: sent.chunks,
                ..snap.summary.clone()
            },
            // The parents are the source's snapshots: ids the destination lacks.
            parents: Vec::new(),
            original: Some(original.clone()),
            ..snap
        };
        let destination = dst.save_snapshot(&copy)?;
        held.insert(original);
        held.insert(destination.clone());
        summary.chunks_sent += sent.chunks_sent;
        summary.bytes_sent += sent.bytes_sent;
        summary.bytes_stored += sent.bytes_stored;
        summary.bytes_rechunked += sent.bytes_rechunked;
        summary.copied.push(CopiedSnapshot {
            source: id,
            destination,
            chunks_sent: sent.chunks_sent,
            bytes_sent: sent.bytes_sent,
        });
    }
    summary.elapsed = started.elapsed();
    Ok(summary)
}

/// Whether `dst` gives every chunk the fingerprint `src` gave it and cuts every
/// stream where `src` cut it: the same fingerprint function (the same hash, both
/// plaintext, or the same fingerprint key) and the same chunker (the same config,
/// and for the keyed chunker the same secret). Only then may `src`'s recipes and
/// tree streams be used in `dst` as they are, deduplicating with what `dst`'s own
/// backups store.
fn same_chunks(src: &Repository, dst: &Repository) -> bool {
    let (a, b) = (src.config(), dst.config());
    let fingerprints = match (src.keys(), dst.keys()) {
        (None, None) => a.hash == b.hash,
        (Some(k), Some(l)) => a.hash == b.hash && k.same_fingerprints(l),
        _ => false,
    };
    let cuts = a.chunker == b.chunker
        && (!a.chunker.kind.needs_key()
            || matches!((src.keys(), dst.keys()), (Some(k), Some(l)) if k.same_chunker_secret(l)));
    fingerprints && cuts
}

/// The ids of `dst`'s snapshots and the originals they were copied from.
fn held_ids(dst: &Repository) -> Result<HashSet<String>> {
    let (all, unreadable) = dst.snapshots()?;
    if let Some(e) = unreadable.into_iter().next() {
        // An unreadable snapshot may be a copy: copying again could duplicate it.
        return Err(e.into());
    }
    Ok(all
        .into_iter()
        .flat_map(|(id, s)| std::iter::once(id).chain(s.original))
        .collect())
}

/// The source snapshots `names` select (each once, in the order named), or every
/// snapshot, oldest first, when there are none.
fn chosen(src: &Repository, names: &[String]) -> Result<Vec<IdentifiedSnapshot>> {
    if names.is_empty() {
        let (all, unreadable) = src.snapshots()?;
        if let Some(e) = unreadable.into_iter().next() {
            return Err(e.into());
        }
        return Ok(all);
    }
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    for name in names {
        let found = src.find_snapshot(name)?;
        if seen.insert(found.0.clone()) {
            out.push(found);
        }
    }
    Ok(out)
}

/// Sends the chunks of `snap` that `dst` lacks, on the fast path or cut again.
fn send(
    src: &Repository,
    dst: &mut Repository,
    snap: &Snapshot,
    rechunk: bool,
    threads: usize,
    progress: &dyn Progress,
) -> Result<Sent> {
    let tree_fps = snap.tree.fingerprints()?;
    let entries = load_tree(&mut ChunkReader::new(src), &tree_fps)?;
    if rechunk {
        rechunk::send(src, dst, entries, threads, progress)
    } else {
        fast::send(src, dst, &snap.tree, &entries, threads, progress)
    }
}

/// The progress of a whole copy: each snapshot's total adds to those of the
/// snapshots before it, so that one bar runs once over all of them.
struct Cumulative<'p> {
    inner: &'p dyn Progress,
    /// The totals of the snapshots done, and of the one being copied.
    done: AtomicU64,
    total: AtomicU64,
}

impl Cumulative<'_> {
    fn next_snapshot(&self) {
        self.done
            .fetch_add(self.total.swap(0, Ordering::Relaxed), Ordering::Relaxed);
    }
}

impl Progress for Cumulative<'_> {
    fn set_total(&self, bytes: u64) {
        self.total.store(bytes, Ordering::Relaxed);
        self.inner
            .set_total(self.done.load(Ordering::Relaxed) + bytes);
    }

    fn advance(&self, bytes: u64) {
        self.inner.advance(bytes);
    }

    fn warn(&self, warning: &Warning) {
        self.inner.warn(warning);
    }
}
