//! Making a round durable (rules 1 to 3 of the commit order, docs/design/format.md)
//! and writing its snapshot: a checkpoint after every round but the last, the
//! backup's own after the last. Once the backup's snapshot is durable, its
//! checkpoints, and those older killed runs left for the same paths, are removed.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Instant, SystemTime};

use larder_hash::Fingerprint;
use larder_index::ChunkLocation;
use larder_store::{EntryKind, Repository, Snapshot, SnapshotSummary, TreeRef};

use super::index_stage::{to_acknowledge, Indexer};
use super::previous::{Decisions, FileStatus};
use super::round::RoundOutput;
use super::walk::{normalize, Item};
use super::{lock, BackupOptions, BackupSummary, StageTimes};
use crate::error::{Result, Warning};
use crate::time::rfc3339;

/// What the backup's commits have done so far.
pub(super) struct Committer<'o> {
    opts: &'o BackupOptions,
    paths: &'o [String],
    /// When the backup began: the time of each of its snapshots.
    began: SystemTime,
    decisions: &'o Decisions,
    /// This backup's newest checkpoint, removed when the next snapshot is written.
    checkpoint: Option<String>,
    checkpoints: u64,
    containers_written: u64,
    bytes_new_stored: u64,
    /// Containers, segments and snapshot files written.
    bytes_stored: u64,
    /// The tree chunks this backup stored, every round's.
    tree_written: HashSet<Fingerprint>,
    /// The backup's own snapshot, once written: id, summary and its tree's chunks.
    done: Option<(String, SnapshotSummary, TreeCount)>,
}

impl<'o> Committer<'o> {
    pub fn new(
        opts: &'o BackupOptions,
        paths: &'o [String],
        began: SystemTime,
        decisions: &'o Decisions,
    ) -> Self {
        Self {
            opts,
            paths,
            began,
            decisions,
            checkpoint: None,
            checkpoints: 0,
            containers_written: 0,
            bytes_new_stored: 0,
            bytes_stored: 0,
            tree_written: HashSet::new(),
            done: None,
        }
    }

    /// Commits a round's containers, then writes its snapshot: the backup's own when
    /// `complete`, a checkpoint otherwise.
    #[allow(clippy::too_many_arguments)]
    pub fn commit_round(
        &mut self,
        repo: &mut Repository,
        items: &[Item],
        out: RoundOutput,
        indexer: &mut Indexer,
        warnings: &Mutex<Vec<Warning>>,
        complete: bool,
        stages: &mut StageTimes,
    ) -> Result<()> {
        let started = Instant::now();
        self.containers_written += out.written.len() as u64;
        self.bytes_new_stored += out.bytes_new_stored;
        self.tree_written.extend(out.tree.new.iter().copied());
        if !out.written.is_empty() {
            self.bytes_stored += out.container_bytes + repo.segment_file_len(&out.written);
        }
        // What the syncers could not acknowledge (the remote index failed them): again.
        let acknowledgements: Vec<(Fingerprint, ChunkLocation)> = match &self.opts.remote {
            Some(_) => out
                .written
                .iter()
                .filter(|c| !out.acked.contains(&c.id))
                .flat_map(|c| to_acknowledge(c, &indexer.zero_chunk))
                .collect(),
            None => Vec::new(),
        };
        repo.commit(out.written)?;
        // The round's new chunks are in the index now.
        indexer.new_chunks.clear();
        if let Some(remote) = &self.opts.remote {
            // Durable now (rules 1 and 2): the cluster may hand these locations out.
            // On a failure the owners' locks expire and later copies are stored
            // again; nothing committed is lost.
            if let Err(e) = remote.acknowledge(&acknowledgements) {
                let w = Warning::error(
                    repo.location(),
                    format!("acknowledging new chunks to the cluster: {e}"),
                );
                self.opts.progress.warn(&w);
                lock(warnings).push(w);
            }
        }
        let prefix = &items[..out.upto];
        let tree = TreeCount::of(&out.tree.fps, &self.tree_written);
        let mut summary = counts(prefix, indexer, self.decisions, tree);
        summary.errors = lock(warnings).iter().filter(|w| w.is_error).count() as u64;
        let snapshot = Snapshot {
            version: Snapshot::VERSION,
            time: rfc3339(self.began),
            hostname: self.opts.hostname.clone(),
            username: self.opts.username.clone(),
            paths: self.paths.to_vec(),
            tree: TreeRef {
                size: out.tree.size,
                chunks: out.tree.fps.iter().map(|f| f.to_hex()).collect(),
            },
            summary: summary.clone(),
            partial: !complete,
            parents: self.decisions.parents.clone(),
            original: None,
            repaired_from: None,
        };
        self.bytes_stored += repo.snapshot_file_len(&snapshot);
        let id = repo.save_snapshot(&snapshot)?;
        // The new snapshot holds everything the previous checkpoint did.
        if let Some(old) = self.checkpoint.take() {
            self.remove(repo, &old, warnings);
        }
        if complete {
            self.remove_stale_checkpoints(repo, warnings)?;
            self.done = Some((id, summary, tree));
        } else {
            self.checkpoint = Some(id);
            self.checkpoints += 1;
        }
        stages.sync += started.elapsed();
        Ok(())
    }

    fn remove(&self, repo: &Repository, id: &str, warnings: &Mutex<Vec<Warning>>) {
        if let Err(e) = repo.remove_snapshot(id) {
            let w = Warning::notice(
                repo.location(),
                format!(
                    "cannot remove checkpoint {}: {e}; `larder forget` removes it",
                    &id[..8]
                ),
            );
            self.opts.progress.warn(&w);
            lock(warnings).push(w);
        }
    }

    /// Removes the checkpoints of killed backups of this host whose paths this
    /// backup's cover: this complete snapshot holds all they did and more.
    fn remove_stale_checkpoints(
        &self,
        repo: &Repository,
        warnings: &Mutex<Vec<Warning>>,
    ) -> Result<()> {
        if repo.keys().is_some_and(|k| !k.is_full()) {
            // A write-only key neither reads nor removes snapshots (and wrote no
            // checkpoints).
            return Ok(());
        }
        let ours: Vec<PathBuf> = self.paths.iter().map(|p| normalize(Path::new(p))).collect();
        let (all, _) = repo.snapshots()?;
        for (id, s) in all {
            let covered = s
                .paths
                .iter()
                .all(|p| ours.iter().any(|o| normalize(Path::new(p)).starts_with(o)));
            if s.partial && s.hostname == self.opts.hostname && covered {
                self.remove(repo, &id, warnings);
            }
        }
        Ok(())
    }

    /// The backup's summary, once its snapshot is written.
    pub fn summary(self, indexer: &Indexer, warnings: Vec<Warning>) -> BackupSummary {
        let decisions = self.decisions;
        let (snapshot_id, s, tree) = self.done.unwrap_or_default();
        BackupSummary {
            snapshot_id,
            files: s.files,
            files_new: s.files_new,
            files_changed: s.files_changed,
            files_unchanged: s.files_unchanged,
            dirs: s.dirs,
            symlinks: s.symlinks,
            specials: s.specials,
            bytes_in: s.bytes_in,
            bytes_read: indexer.bytes_read,
            bytes_skipped: decisions.bytes_skipped,
            bytes_new: indexer.bytes_new,
            bytes_new_stored: self.bytes_new_stored,
            bytes_stored: self.bytes_stored,
            chunks: s.chunks,
            chunks_new: s.chunks_new,
            // What the snapshot counts new is a part of all that was stored.
            chunks_unused: indexer.chunks_new.saturating_sub(s.chunks_new),
            tree_chunks: tree.chunks,
            tree_chunks_new: tree.new,
            containers_written: self.containers_written,
            checkpoints: self.checkpoints,
            parents: decisions.parents.clone(),
            excluded: 0,
            elapsed: std::time::Duration::ZERO,
            stages: StageTimes::default(),
            warnings,
            disk_index: None,
        }
    }
}

/// A snapshot's tree chunks, and how many distinct ones of them this backup stored
/// (in this round or an earlier one's checkpoint tree).
#[derive(Clone, Copy, Default)]
struct TreeCount {
    chunks: u64,
    new: u64,
}

impl TreeCount {
    fn of(fps: &[Fingerprint], written: &HashSet<Fingerprint>) -> Self {
        let new: HashSet<&Fingerprint> = fps.iter().filter(|fp| written.contains(fp)).collect();
        Self {
            chunks: fps.len() as u64,
            new: new.len() as u64,
        }
    }
}

/// Counts of the entries a snapshot of `items` (a prefix of the walk) holds, and of
/// the chunks of its files and `tree`: `chunks` every reference, `chunks_new` those of
/// them this backup stored, each once; so `chunks_new <= chunks`. Chunks stored for
/// what the snapshot does not hold (a file that failed, an earlier checkpoint's tree)
/// are in neither. A file counts once it is stored (it has a recipe), as new, changed
/// or unchanged.
fn counts(
    items: &[Item],
    indexer: &Indexer,
    decisions: &Decisions,
    tree: TreeCount,
) -> SnapshotSummary {
    let mut s = SnapshotSummary {
        bytes_read: indexer.bytes_read,
        bytes_new: indexer.bytes_new,
        chunks: tree.chunks,
        chunks_new: tree.new,
        ..SnapshotSummary::default()
    };
    for (i, item) in items.iter().enumerate() {
        match item.entry.kind {
            EntryKind::File => {
                if let Some(recipe) = &indexer.recipes[i] {
                    s.files += 1;
                    s.bytes_in += indexer.sizes[i];
                    s.chunks += recipe.len() as u64;
                    s.chunks_new += indexer.chunks_new_by_item[i];
                    match decisions.status[i] {
                        Some(FileStatus::New) => s.files_new += 1,
                        Some(FileStatus::Changed) => s.files_changed += 1,
                        Some(FileStatus::Unchanged) => s.files_unchanged += 1,
                        None => {}
                    }
                }
            }
            EntryKind::Dir => s.dirs += 1,
            EntryKind::Symlink => s.symlinks += 1,
            EntryKind::Fifo | EntryKind::CharDevice | EntryKind::BlockDevice => s.specials += 1,
        }
    }
    s
}
