//! Restoring a snapshot into a target directory, safely; all of it, or the entries
//! that `--include`/`--exclude` patterns choose (`select.rs`), with owners, extended
//! attributes, hard links and holes (docs/design/restore.md).
//!
//! Safety rules, each tested in `crates/larder-cli/tests/restore_safety.rs` and
//! `restore_races.rs`:
//! - every entry path is relative and made of plain names (checked when the tree is
//!   decoded, and again here), so nothing is named outside the target;
//! - every directory is reached through descriptors from the target's own, opened
//!   beneath it without following a symlink (`restore/fsops.rs`): neither a symlink of
//!   the snapshot, nor one in the target, nor one another user puts in a directory's
//!   place during the restore, ever redirects a create, a removal or a metadata call;
//! - entries are created by name in their open directory with `O_CREAT | O_EXCL`
//!   semantics, never following a symlink, so nothing existing is overwritten or
//!   followed, unless `overwrite` is set, in which case the old entry is removed first
//!   (never written through); a directory is removed to make room only if it is
//!   empty, or with `delete`;
//! - metadata is set through a descriptor of the entry the restore made
//!   (`meta/apply.rs`), never through a path looked up again.
//!
//! With several writers the rules hold because one thread, the coordinator, opens,
//! creates and removes every directory, in tree order; it removes one only when no
//! writer has work left (`restore/namespace.rs`), and writers create and replace only
//! what is not a directory, by name in the directory descriptor they are given
//! (`restore/writer.rs`).

mod fsops;
mod links;
mod namespace;
mod stream;
mod writer;

use std::collections::{HashMap, HashSet};
use std::fs;
use std::os::fd::AsFd;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Once};
use std::time::{Duration, Instant};

use larder_store::{is_safe_relative_path, EntryKind, Repository, TreeEntry};
use serde::Serialize;

use crate::assembly::{ReadStats, RestorePlan};
use crate::error::{EngineError, Result, Warning};
use crate::meta::{restore_metadata, Node, OwnerPolicy};
use crate::pattern::PatternList;
use crate::select::restore_selection;
use crate::tree_io::{load_tree, ChunkReader};
use crate::{NoProgress, Progress};
use links::{link_roles, LinkBoard, LinkRole};
use namespace::{split, Namespace};
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
    /// Replace entries that already exist in the target. A directory in the target is
    /// removed to make room for an entry that is not one only if it is empty (or with
    /// `delete`).
    pub overwrite: bool,
    /// Remove what the target holds below the restored directories that the snapshot
    /// does not hold (and the patterns select), like restic's `restore --delete`.
    pub delete: bool,
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
    /// and a refusal is a warning. A setuid or setgid bit is restored only with the
    /// recorded owner or group.
    pub owners: bool,
    /// Writer threads creating and writing entries; 0 means one per core.
    pub threads: usize,
}

impl Default for RestoreOptions {
    /// No overwriting or deleting, everything selected, the default cache, no
    /// progress, owners restored, one writer per core.
    fn default() -> Self {
        Self {
            overwrite: false,
            delete: false,
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
    /// Entries of the target removed: empty directories replaced with `overwrite`,
    /// and what the snapshot does not hold with `delete`.
    pub removed: u64,
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
    let entries = load_tree(&mut reader, &snapshot.tree.fingerprints()?)?;
    let (tree_reads, tree_bytes) = reader.reads();
    let mut summary = restore_entries(repo, &entries, target, opts)?;
    summary.snapshot_id = snapshot_id;
    summary.reads.tree_container_reads += tree_reads;
    summary.reads.bytes_read += tree_bytes;
    summary.elapsed = started.elapsed();
    Ok(summary)
}

/// Restores `all_entries`, a tree's entries in tree order whose files' chunks are in
/// `repo`, into `target`, as [`restore`] does with a snapshot's. An entry whose path
/// is not relative and made of plain names is refused with a warning (the tree
/// decoder already refuses a tree holding one; this is what the restore fuzz target
/// drives with hostile names).
pub fn restore_entries(
    repo: &Repository,
    all_entries: &[TreeEntry],
    target: &Path,
    opts: &RestoreOptions,
) -> Result<RestoreSummary> {
    let started = Instant::now();
    let wanted = restore_selection(all_entries, &opts.include, &opts.exclude);
    let entries: Vec<&TreeEntry> = all_entries
        .iter()
        .zip(&wanted)
        .filter_map(|(entry, &wanted)| wanted.then_some(entry))
        .collect();
    fs::create_dir_all(target).map_err(|e| EngineError::io(target, e))?;
    let root = fsops::open_target(target).map_err(|e| EngineError::io(target, e))?;
    // For messages only: every operation goes through `root`.
    let shown = fs::canonicalize(target).unwrap_or_else(|_| target.to_path_buf());
    raise_open_file_limit();
    let mut run = Run {
        repo,
        opts,
        entries: &entries,
        owners: OwnerPolicy::new(opts.owners),
        writers: match opts.threads {
            0 => std::thread::available_parallelism().map_or(2, |n| n.get()),
            n => n,
        },
        ns: Namespace::new(shown, root, opts.overwrite, opts.delete),
        reads: ReadStats::default(),
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
    if opts.delete {
        run.delete_extra(all_entries);
    }
    run.directory_metadata();
    let refused = run.owners.refused.load(Ordering::Relaxed);
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
        snapshot_id: String::new(),
        files: tally.files,
        hard_links: tally.hard_links,
        dirs: run.ns.dirs,
        symlinks: tally.symlinks,
        specials: tally.specials,
        bytes: tally.bytes,
        filtered_out: (all_entries.len() - entries.len()) as u64,
        removed: run.ns.removed,
        reads: run.reads,
        elapsed: started.elapsed(),
        warnings: tally.warnings.into_iter().map(|(_, w)| w).collect(),
    })
}

/// Raises this process's soft limit of open files to its hard limit, once: the
/// coordinator keeps up to 128 directories open, and each writer's queued tasks hold
/// their directories' descriptors (256 tasks a writer), above the 1,024 many systems
/// start a process with.
fn raise_open_file_limit() {
    static RAISED: Once = Once::new();
    RAISED.call_once(|| {
        use rustix::process::{getrlimit, setrlimit, Resource};
        let mut limit = getrlimit(Resource::Nofile);
        if limit.current < limit.maximum {
            limit.current = limit.maximum;
            // Best effort: without it, a very wide restore reports the directories
            // it could not open.
            let _ = setrlimit(Resource::Nofile, limit);
        }
    });
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
    /// The indices of the directories created or kept, in tree order.
    dirs: Vec<usize>,
}

impl<'e> Run<'_, 'e> {
    fn warn(&mut self, index: usize, path: &[u8], message: impl std::fmt::Display) {
        let w = Warning::error(self.ns.display(path), message);
        self.opts.progress.warn(&w);
        self.tally.warnings.push((index, w));
    }

    /// Directory metadata last, deepest first, so restoring children does not change
    /// it (times, and a mode without write permission), and children created before a
    /// default ACL was set do not inherit it. Each directory's through its descriptor:
    /// one that is no longer the directory the restore made is left alone, with a
    /// warning.
    fn directory_metadata(&mut self) {
        let dirs = std::mem::take(&mut self.dirs);
        for &index in dirs.iter().rev() {
            let entry = self.entries[index];
            let messages = match self.ns.made_dir(&entry.path) {
                None => continue,
                Some(Err(m)) => vec![format!("metadata not restored: {m}")],
                Some(Ok(fd)) => restore_metadata(Node::Fd(fd.as_fd()), entry, &self.owners),
            };
            for m in messages {
                self.warn(index, &entry.path, m);
            }
        }
        self.dirs = dirs;
    }

    /// `delete`: removes what each restored directory holds that the snapshot does
    /// not (`all_entries`: the whole tree, selected or not), where the patterns would
    /// have selected it.
    fn delete_extra(&mut self, all_entries: &[TreeEntry]) {
        let in_snapshot: HashSet<&[u8]> = all_entries.iter().map(|e| e.path.as_slice()).collect();
        let opts = self.opts;
        let (include, exclude) = (&opts.include, &opts.exclude);
        let mut done: HashSet<&[u8]> = HashSet::new();
        for &index in &self.dirs.clone() {
            let entry = self.entries[index];
            if !done.insert(&entry.path) {
                continue;
            }
            let failed = self.ns.delete_extra(&entry.path, |child, is_dir| {
                in_snapshot.contains(child)
                    || !(include.is_empty() || include.selects(child, is_dir))
                    || exclude.selects(child, is_dir)
            });
            for (path, m) in failed {
                self.warn(index, &path, m);
            }
        }
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
        let target = self.ns.target.clone();
        let shared = Shared {
            target: &target,
            root: Arc::clone(&self.ns.root),
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
            let mut owner_of: HashMap<&[u8], usize> = HashMap::new();
            let mut planned = plan.files.iter();
            for (&index, role) in pass.iter().zip(&roles) {
                let entry = entries[index];
                let data = (entry.kind == EntryKind::File && !matches!(role, LinkRole::Later(_)))
                    .then(|| planned.next());
                // Dropped unresolved when the entry is skipped: its later names then
                // carry their own data.
                let first = match role {
                    LinkRole::First(g) => Some(board.guard(*g)),
                    _ => None,
                };
                if !is_safe_relative_path(&entry.path) {
                    self.warn(index, &entry.path, "unsafe path; not restored");
                    continue;
                }
                if entry.kind == EntryKind::Dir {
                    match self.ns.dir(&entry.path, || quiesce(&queues)) {
                        Ok(()) => self.dirs.push(index),
                        Err(m) => self.warn(index, &entry.path, m),
                    }
                    continue;
                }
                let (dir, name) = match self.ns.place(&entry.path, || quiesce(&queues)) {
                    Ok(placed) => placed,
                    Err(m) => {
                        self.warn(index, &entry.path, m);
                        continue;
                    }
                };
                let how = match (entry.kind, role, data) {
                    (EntryKind::File, LinkRole::Later(group), _) => How::Link { group: *group },
                    (EntryKind::File, _, Some(Some(Ok(data)))) => How::File {
                        len: data.len,
                        first,
                    },
                    (EntryKind::File, _, Some(Some(Err(reason)))) => {
                        self.warn(index, &entry.path, reason);
                        continue;
                    }
                    (EntryKind::File, _, _) => {
                        self.warn(index, &entry.path, "the restore plan lost this file");
                        continue;
                    }
                    (EntryKind::Symlink, _, _) => How::Symlink,
                    _ => How::Special,
                };
                let (parent, _) = split(&entry.path);
                let w = *owner_of
                    .entry(parent)
                    .or_insert_with(|| least_loaded(&shared.load));
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
                    dir,
                    name,
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
