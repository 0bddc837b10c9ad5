//! Restoring a snapshot into a target directory, safely; all of it, or the entries
//! that `--include`/`--exclude` patterns choose (`select.rs`), with owners, extended
//! attributes, hard links and holes (docs/design/restore.md).
//!
//! Safety rules, each tested in `crates/larder-cli/tests/restore_safety.rs`:
//! - every entry path is relative and made of normal components (checked when the tree
//!   is decoded), so nothing is named outside the target;
//! - every parent directory between the target and an entry must be a real directory,
//!   not a symlink, so a restored or pre-existing symlink cannot redirect a write;
//! - files are created with `O_CREAT | O_EXCL` (`O_NOFOLLOW` semantics), so nothing
//!   existing is overwritten or followed, unless `overwrite` is set, in which case the
//!   old entry is removed first (never written through), and a removed directory is no
//!   longer trusted as a parent: what replaces it is checked like anything else.
//!
//! With several writers the rules hold because one thread, the coordinator, checks
//! parents and creates and removes every directory, in tree order; it removes one only
//! when no writer has work left (`restore/namespace.rs`), and writers create and
//! replace only what is not a directory, at the paths they are given
//! (`restore/writer.rs`).

mod links;
mod namespace;
mod stream;
mod writer;

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use larder_store::{EntryKind, Repository, TreeEntry};
use serde::Serialize;

use crate::assembly::{ReadStats, RestorePlan};
use crate::error::{EngineError, Result, Warning};
use crate::meta::{restore_metadata, Node, OwnerPolicy};
use crate::pattern::PatternList;
use crate::select::restore_selection;
use crate::tree_io::{load_tree, ChunkReader};
use crate::{NoProgress, Progress};
use links::{link_roles, LinkBoard, LinkRole};
use namespace::Namespace;
use stream::SliceStream;
use writer::{least_loaded, run_writer, Create, How, Shared, Tally, Task, QUEUE_DEPTH};

/// `RestoreOptions::cache_size` unless told otherwise.
pub const DEFAULT_RESTORE_CACHE: usize = 256 << 20;

/// Raw bytes assembled at a time: the unit the producer hands the coordinator, whose
/// files' pieces the writers take. Small enough that decoding one overlaps writing
/// others, large enough for long sequential writes (docs/performance.md, "Restore").
const SLICE_SIZE: u64 = 8 << 20;

/// Slice buffers in circulation: one being filled, the rest being handed out and
/// written; a buffer goes back to the producer when its last piece is written.
const SLICE_BUFFERS: usize = 4;

pub struct RestoreOptions {
    /// Replace entries that already exist in the target.
    pub overwrite: bool,
    /// Restore only what these patterns select (everything, if empty), with the
    /// parent directories of what they select (docs/design/patterns.md).
    pub include: PatternList,
    /// Do not restore what these patterns select; a selected directory is skipped whole.
    pub exclude: PatternList,
    /// Bytes of container data held in memory: the look-ahead window's container
    /// ranges (docs/design/restore.md). A window always takes at least one chunk,
    /// whatever this says; the slices of assembled data come on top.
    pub cache_size: usize,
    pub progress: Arc<dyn Progress>,
    /// Restore the recorded numeric owner and group. As root this always works; a
    /// user that is not root tries only where they differ from what the entry got,
    /// and a refusal is a warning.
    pub owners: bool,
    /// Writer threads creating and writing entries; 0 means one per core.
    pub threads: usize,
}

impl Default for RestoreOptions {
    /// No overwriting, everything selected, the default cache, no progress, owners
    /// restored, one writer per core.
    fn default() -> Self {
        Self {
            overwrite: false,
            include: PatternList::default(),
            exclude: PatternList::default(),
            cache_size: DEFAULT_RESTORE_CACHE,
            progress: Arc::new(NoProgress),
            owners: true,
            threads: 0,
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct RestoreSummary {
    pub snapshot_id: String,
    /// Files restored, hard links included.
    pub files: u64,
    /// Of `files`, those restored as a hard link to another restored file.
    pub hard_links: u64,
    pub dirs: u64,
    pub symlinks: u64,
    /// FIFOs and device nodes.
    pub specials: u64,
    /// File data restored (hard links add none).
    pub bytes: u64,
    /// Entries of the snapshot left out by `include` and `exclude`.
    pub filtered_out: u64,
    /// What was read from the containers.
    pub reads: ReadStats,
    pub elapsed: Duration,
    /// In tree order.
    pub warnings: Vec<Warning>,
}

impl RestoreSummary {
    /// Reads of container chunk data per MB (10^6 bytes) of files restored; 0 when
    /// nothing was restored.
    pub fn container_reads_per_mb(&self) -> f64 {
        if self.bytes == 0 {
            0.0
        } else {
            self.reads.container_reads as f64 / (self.bytes as f64 / 1e6)
        }
    }
}

/// Restores snapshot `name` (an id prefix or `latest`) into `target`. Entries that
/// cannot be restored, and metadata that cannot be set, become warnings; the rest is
/// restored.
pub fn restore(
    repo: &Repository,
    name: &str,
    target: &Path,
    opts: &RestoreOptions,
) -> Result<RestoreSummary> {
    let started = Instant::now();
    let (snapshot_id, snapshot) = repo.find_snapshot(name)?;
    let mut reader = ChunkReader::new(repo);
    let all_entries = load_tree(&mut reader, &snapshot.tree.fingerprints()?)?;
    let wanted = restore_selection(&all_entries, &opts.include, &opts.exclude);
    let entries: Vec<&TreeEntry> = all_entries
        .iter()
        .zip(&wanted)
        .filter_map(|(entry, &wanted)| wanted.then_some(entry))
        .collect();
    fs::create_dir_all(target).map_err(|e| EngineError::io(target, e))?;
    let target = fs::canonicalize(target).map_err(|e| EngineError::io(target, e))?;
    let (tree_reads, tree_bytes) = reader.reads();
    let mut run = Run {
        repo,
        opts,
        entries: &entries,
        owners: OwnerPolicy::new(opts.owners),
        writers: match opts.threads {
            0 => std::thread::available_parallelism().map_or(2, |n| n.get()),
            n => n,
        },
        ns: Namespace::new(target, opts.overwrite),
        reads: ReadStats {
            tree_container_reads: tree_reads,
            bytes_read: tree_bytes,
            ..ReadStats::default()
        },
        total: 0,
        tally: Tally::default(),
        dirs: Vec::new(),
    };
    // Each pass restores what the last one left: the later names of hard links whose
    // first name was not restored, with their own data. Each pass takes at least the
    // first of what it is given, so passes end.
    let mut pass: Vec<usize> = (0..entries.len()).collect();
    while !pass.is_empty() {
        pass = run.pass(&pass);
    }
    // Directory metadata last, deepest first, so restoring children does not change
    // it (times, and a mode without write permission), and children created before a
    // default ACL was set do not inherit it.
    for (index, dest) in run.dirs.iter().rev() {
        if !run.ns.is_safe(dest) {
            continue;
        }
        for m in restore_metadata(Node::Path(dest), entries[*index], &run.owners, true) {
            let w = Warning::error(dest, m);
            opts.progress.warn(&w);
            run.tally.warnings.push((*index, w));
        }
    }
    let refused = run
        .owners
        .refused
        .load(std::sync::atomic::Ordering::Relaxed);
    if refused > 0 {
        let w = Warning::notice(
            &run.ns.target,
            format!(
                "the owners of {refused} entries were not restored: only root may give files \
                 to other users (restore as root to restore them, or pass --no-owner)"
            ),
        );
        opts.progress.warn(&w);
        run.tally.warnings.push((entries.len(), w));
    }
    let mut tally = run.tally;
    tally.warnings.sort_by_key(|(index, _)| *index);
    Ok(RestoreSummary {
        snapshot_id,
        files: tally.files,
        hard_links: tally.hard_links,
        dirs: run.ns.dirs,
        symlinks: tally.symlinks,
        specials: tally.specials,
        bytes: tally.bytes,
        filtered_out: (all_entries.len() - entries.len()) as u64,
        reads: run.reads,
        elapsed: started.elapsed(),
        warnings: tally.warnings.into_iter().map(|(_, w)| w).collect(),
    })
}

/// One restore's state across its passes.
struct Run<'r, 'e> {
    repo: &'r Repository,
    opts: &'r RestoreOptions,
    /// The selected entries, in tree order; tasks and warnings name them by index.
    entries: &'r [&'e TreeEntry],
    owners: OwnerPolicy,
    writers: usize,
    ns: Namespace,
    reads: ReadStats,
    /// Bytes of file data planned so far, for the progress total.
    total: u64,
    tally: Tally,
    /// Directories created or kept, in tree order, with their entry's index.
    dirs: Vec<(usize, PathBuf)>,
}

impl Run<'_, '_> {
    fn warn(&mut self, index: usize, dest: &Path, message: impl std::fmt::Display) {
        let w = Warning::error(dest, message);
        self.opts.progress.warn(&w);
        self.tally.warnings.push((index, w));
    }

    /// Restores entries `pass` (indices, ascending): plans their files' data, starts
    /// the producer and the writers, and hands the writers every entry that is not a
    /// directory, by parent directory. Returns the later names of hard links left to
    /// restore with their own data.
    fn pass(&mut self, pass: &[usize]) -> Vec<usize> {
        let entries = self.entries;
        let (roles, groups) = link_roles(pass.iter().map(|&i| entries[i]));
        // Later names of hard links are linked, never read.
        let files = pass.iter().zip(&roles).filter_map(|(&i, role)| {
            let e = entries[i];
            (e.kind == EntryKind::File && !matches!(role, LinkRole::Later(_)))
                .then_some((e.chunks.as_slice(), e.size))
        });
        let plan = RestorePlan::new(self.repo, files);
        self.total += plan
            .files
            .iter()
            .flatten()
            .map(|data| data.len)
            .sum::<u64>();
        self.opts.progress.set_total(self.total);
        self.reads.table_reads += plan.stats.table_reads;
        self.reads.bytes_read += plan.stats.bytes_read;
        self.reads.distinct_containers += plan.stats.distinct_containers;
        let board = LinkBoard::new(groups);
        let shared = Shared {
            overwrite: self.opts.overwrite,
            owners: self.owners.clone(),
            links: &board,
            progress: self.opts.progress.as_ref(),
            load: (0..self.writers).map(|_| AtomicUsize::new(0)).collect(),
        };
        let cache_size = self.opts.cache_size as u64;
        let (read, tallies) = std::thread::scope(|scope| {
            let (full_tx, full_rx) = mpsc::sync_channel(1);
            let (plan, repo, shared) = (&plan, self.repo, &shared);
            let producer = scope.spawn(move || {
                stream::produce(repo, plan, cache_size, SLICE_SIZE, SLICE_BUFFERS, full_tx)
            });
            let mut queues = Vec::with_capacity(self.writers);
            let mut writers = Vec::with_capacity(self.writers);
            for me in 0..self.writers {
                let (tx, rx) = mpsc::sync_channel(QUEUE_DEPTH);
                queues.push(tx);
                writers.push(scope.spawn(move || run_writer(me, shared, rx)));
            }
            let mut stream = SliceStream::new(full_rx);
            let mut owner_of: HashMap<PathBuf, usize> = HashMap::new();
            let mut planned = plan.files.iter();
            for (&index, role) in pass.iter().zip(&roles) {
                let entry = entries[index];
                let dest = self.ns.target.join(OsStr::from_bytes(&entry.path));
                let data = (entry.kind == EntryKind::File && !matches!(role, LinkRole::Later(_)))
                    .then(|| planned.next());
                if entry.kind == EntryKind::Dir {
                    match self.ns.dir(&dest, || quiesce(&queues)) {
                        Ok(()) => self.dirs.push((index, dest)),
                        Err(m) => self.warn(index, &dest, m),
                    }
                    continue;
                }
                let first = match role {
                    LinkRole::First(g) => Some(board.guard(*g)),
                    _ => None,
                };
                let checked = self
                    .ns
                    .check_parents(&dest)
                    .and_then(|()| self.ns.clear_directory_at(&dest, || quiesce(&queues)));
                if let Err(m) = checked {
                    self.warn(index, &dest, m);
                    continue;
                }
                let how = match (entry.kind, role, data) {
                    (EntryKind::File, LinkRole::Later(group), _) => How::Link { group: *group },
                    (EntryKind::File, _, Some(Some(Ok(data)))) => How::File {
                        len: data.len,
                        first,
                    },
                    (EntryKind::File, _, Some(Some(Err(reason)))) => {
                        self.warn(index, &dest, reason);
                        continue;
                    }
                    (EntryKind::File, _, _) => {
                        self.warn(index, &dest, "the restore plan lost this file");
                        continue;
                    }
                    (EntryKind::Symlink, _, _) => How::Symlink,
                    _ => How::Special,
                };
                let parent = dest.parent().unwrap_or(&self.ns.target);
                let w = match owner_of.get(parent) {
                    Some(&w) => w,
                    None => {
                        let w = least_loaded(&shared.load);
                        owner_of.insert(parent.to_path_buf(), w);
                        w
                    }
                };
                shared.load[w].fetch_add(1, Ordering::Relaxed);
                let file_data = match (&how, data) {
                    (How::File { .. }, Some(Some(Ok(data)))) => Some(*data),
                    _ => None,
                };
                // A send fails only if the writer panicked: joining it below says so.
                let queue = &queues[w];
                let _ = queue.send(Task::Create(Create {
                    index,
                    entry,
                    dest,
                    how,
                }));
                if let Some(data) = file_data {
                    let sent = stream.pieces(data, |piece| {
                        let _ = queue.send(Task::Data(piece));
                    });
                    let _ = queue.send(match sent {
                        Ok(()) => Task::Finish,
                        Err(reason) => Task::Damaged(reason),
                    });
                }
            }
            // Dropping the stream stops a producer that is ahead of what is wanted;
            // closing the queues ends the writers once they are done.
            drop(stream);
            drop(queues);
            let tallies: Vec<Tally> = writers
                .into_iter()
                .map(|w| w.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
                .collect();
            let read = producer
                .join()
                .unwrap_or_else(|p| std::panic::resume_unwind(p));
            (read, tallies)
        });
        self.reads.container_reads += read.container_reads;
        self.reads.range_reads += read.range_reads;
        self.reads.bytes_read += read.bytes_read;
        for t in tallies {
            self.tally.merge(t);
        }
        let mut left = std::mem::take(&mut self.tally.unlinked);
        left.sort_unstable();
        left
    }
}

/// Returns once every writer has done every task handed to it so far.
fn quiesce(queues: &[mpsc::SyncSender<Task<'_, '_>>]) {
    let (done_tx, done_rx) = mpsc::channel();
    let asked = queues
        .iter()
        .filter(|q| q.send(Task::Barrier(done_tx.clone())).is_ok())
        .count();
    drop(done_tx);
    for _ in 0..asked {
        // An error: a writer panicked; joining it reports that.
        if done_rx.recv().is_err() {
            break;
        }
    }
}
