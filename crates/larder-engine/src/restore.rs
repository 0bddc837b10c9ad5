//! Restoring a snapshot into a target directory, safely; all of it, or the entries
//! that `--include`/`--exclude` patterns choose (`select.rs`).
//!
//! Safety rules, each tested in `tests/restore_safety.rs`:
//! - every entry path is relative and made of normal components (checked when the tree
//!   is decoded), so nothing is named outside the target;
//! - every parent directory between the target and an entry must be a real directory,
//!   not a symlink, so a restored or pre-existing symlink cannot redirect a write;
//! - files are created with `O_CREAT | O_EXCL` (`O_NOFOLLOW` semantics), so nothing
//!   existing is overwritten or followed, unless `overwrite` is set, in which case the
//!   old entry is removed first (never written through), and a removed directory is no
//!   longer trusted as a parent: what replaces it is checked like anything else.

use std::collections::HashSet;
use std::ffi::{CString, OsStr};
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::ops::Range;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use larder_store::{EntryKind, Repository, TreeEntry};
use serde::Serialize;

use crate::assembly::{FileData, ReadStats, RestorePlan};
use crate::error::{EngineError, Result, Warning};
use crate::pattern::PatternList;
use crate::select::restore_selection;
use crate::tree_io::{load_tree, ChunkReader};
use crate::Progress;

/// `RestoreOptions::cache_size` unless told otherwise.
pub const DEFAULT_RESTORE_CACHE: usize = 256 << 20;

/// Raw bytes assembled at a time: the unit the producer hands the writer. Two are in
/// memory; small enough that decoding one overlaps writing the other, large enough for
/// long sequential writes (docs/performance.md, "Restore").
const SLICE_SIZE: u64 = 8 << 20;

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
    /// whatever this says; two slices of assembled data come on top.
    pub cache_size: usize,
    pub progress: std::sync::Arc<dyn Progress>,
}

#[derive(Debug, Clone, Serialize)]
pub struct RestoreSummary {
    pub snapshot_id: String,
    pub files: u64,
    pub dirs: u64,
    pub symlinks: u64,
    /// FIFOs and device nodes.
    pub specials: u64,
    pub bytes: u64,
    /// Entries of the snapshot left out by `include` and `exclude`.
    pub filtered_out: u64,
    /// What was read from the containers.
    pub reads: ReadStats,
    pub elapsed: Duration,
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
/// cannot be restored become warnings; the rest is restored.
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
    let files = entries.iter().filter(|e| e.kind == EntryKind::File);
    let plan = RestorePlan::new(repo, files.map(|e| (e.chunks.as_slice(), e.size)));
    opts.progress
        .set_total(plan.files.iter().flatten().map(|data| data.len).sum());
    fs::create_dir_all(target).map_err(|e| EngineError::io(target, e))?;
    let target = fs::canonicalize(target).map_err(|e| EngineError::io(target, e))?;
    let (tree_reads, tree_bytes) = reader.reads();
    let mut r = Restorer {
        target,
        overwrite: opts.overwrite,
        safe_dirs: HashSet::new(),
        summary: RestoreSummary {
            snapshot_id,
            files: 0,
            dirs: 0,
            symlinks: 0,
            specials: 0,
            bytes: 0,
            filtered_out: (all_entries.len() - entries.len()) as u64,
            reads: ReadStats {
                tree_container_reads: tree_reads,
                bytes_read: plan.stats.bytes_read + tree_bytes,
                ..plan.stats
            },
            elapsed: Duration::ZERO,
            warnings: Vec::new(),
        },
    };
    let windows = plan.windows(opts.cache_size as u64);
    let algo = repo.algo();
    let mut dirs = Vec::new();
    let read_stats = std::thread::scope(|scope| {
        // Two slice buffers circulate: the producer fills one while the writer (this
        // thread) writes the other.
        let (full_tx, full_rx) = mpsc::sync_channel::<AssembledSlice>(1);
        let (free_tx, free_rx) = mpsc::channel::<Vec<u8>>();
        for _ in 0..2 {
            let _ = free_tx.send(Vec::new());
        }
        let plan = &plan;
        let producer = scope.spawn(move || {
            let mut stats = ReadStats::default();
            let mut start = 0u64;
            for window in windows {
                let data = plan.window_data(window);
                // The reader thread reads the window's containers while this thread
                // assembles slices from those already read.
                let (read, more) = std::thread::scope(|scope| {
                    let reader = scope.spawn(|| data.read_all(repo));
                    let mut more = true;
                    for slice in plan.slices(&data, SLICE_SIZE) {
                        let Ok(mut buf) = free_rx.recv() else {
                            more = false;
                            break;
                        };
                        let damaged = plan.fill_slice(&data, slice, algo, &mut buf);
                        let len = buf.len() as u64;
                        let assembled = AssembledSlice {
                            start,
                            buf,
                            damaged,
                        };
                        if full_tx.send(assembled).is_err() {
                            more = false;
                            break;
                        }
                        start += len;
                    }
                    let read = reader
                        .join()
                        .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
                    (read, more)
                });
                stats.container_reads += read.container_reads;
                stats.range_reads += read.range_reads;
                stats.bytes_read += read.bytes_read;
                if !more {
                    break;
                }
            }
            stats
        });
        let mut stream = SliceStream {
            full: full_rx,
            free: free_tx,
            current: None,
        };
        let mut planned = plan.files.iter();
        for &entry in &entries {
            let dest = r.target.join(OsStr::from_bytes(&entry.path));
            let result = match entry.kind {
                EntryKind::Dir => r.dir(&dest).map(|()| dirs.push((dest.clone(), entry))),
                EntryKind::File => match planned.next() {
                    Some(Ok(data)) => {
                        r.file(&dest, entry, *data, &mut stream, opts.progress.as_ref())
                    }
                    Some(Err(reason)) => Err(reason.clone()),
                    None => Err("the restore plan lost this file".into()),
                },
                EntryKind::Symlink => r.symlink(&dest, entry),
                EntryKind::Fifo | EntryKind::CharDevice | EntryKind::BlockDevice => {
                    r.special(&dest, entry)
                }
            };
            if let Err(message) = result {
                let w = Warning::error(&dest, message);
                opts.progress.warn(&w);
                r.summary.warnings.push(w);
            }
        }
        // Dropping the stream stops a producer that is ahead of what is still wanted.
        drop(stream);
        producer
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    });
    r.summary.reads.container_reads = read_stats.container_reads;
    r.summary.reads.range_reads = read_stats.range_reads;
    r.summary.reads.bytes_read += read_stats.bytes_read;
    // Directory times last, deepest first, so restoring children does not change them.
    // Only directories still in `safe_dirs`: one that a later entry replaced (by a
    // symlink, say) must not have its metadata set through that replacement.
    for (dest, entry) in dirs.iter().rev() {
        if !r.safe_dirs.contains(dest) {
            continue;
        }
        let mode = fs::Permissions::from_mode(entry.mode & 0o7777);
        if let Err(e) = fs::set_permissions(dest, mode).and_then(|()| set_times(dest, entry, false))
        {
            r.summary
                .warnings
                .push(Warning::error(dest, format!("cannot set metadata: {e}")));
        }
    }
    r.summary.elapsed = started.elapsed();
    Ok(r.summary)
}

/// A slice the producer assembled: the restore stream's bytes from `start`.
struct AssembledSlice {
    start: u64,
    buf: Vec<u8>,
    /// Ranges of `buf` whose chunks failed to read, decode or verify, with the error.
    damaged: Vec<(Range<usize>, String)>,
}

impl AssembledSlice {
    fn end(&self) -> u64 {
        self.start + self.buf.len() as u64
    }
}

/// The writer's side of the restore stream: slices arrive in stream order and go back
/// to the producer once the writer has moved past them.
struct SliceStream {
    full: mpsc::Receiver<AssembledSlice>,
    free: mpsc::Sender<Vec<u8>>,
    current: Option<AssembledSlice>,
}

impl SliceStream {
    /// Hands the stream's bytes `data` to `sink`, one piece per slice they span. Fails
    /// before handing over a piece that holds a damaged chunk, with that chunk's
    /// error. Calls must come in stream order.
    fn copy(
        &mut self,
        data: FileData,
        mut sink: impl FnMut(&[u8]) -> Result<(), String>,
    ) -> Result<(), String> {
        let end = data.start + data.len;
        let mut pos = data.start;
        while pos < end {
            let slice = self.slice_at(pos)?;
            let piece = (pos - slice.start) as usize..(end.min(slice.end()) - slice.start) as usize;
            if let Some((_, reason)) = slice
                .damaged
                .iter()
                .find(|(r, _)| r.start < piece.end && piece.start < r.end)
            {
                return Err(reason.clone());
            }
            sink(&slice.buf[piece.clone()])?;
            pos += piece.len() as u64;
        }
        Ok(())
    }

    /// The slice holding stream byte `pos`, receiving slices up to it.
    fn slice_at(&mut self, pos: u64) -> Result<&AssembledSlice, String> {
        while self.current.as_ref().is_none_or(|a| a.end() <= pos) {
            if let Some(done) = self.current.take() {
                let _ = self.free.send(done.buf);
            }
            let next = self
                .full
                .recv()
                .map_err(|_| "the restore stream ended before this file".to_string())?;
            self.current = Some(next);
        }
        match &self.current {
            Some(slice) if slice.start <= pos => Ok(slice),
            _ => Err("the restore stream went past this file".into()),
        }
    }
}

struct Restorer {
    target: PathBuf,
    overwrite: bool,
    /// Directories verified to be real directories inside the target.
    safe_dirs: HashSet<PathBuf>,
    summary: RestoreSummary,
}

impl Restorer {
    /// Checks that every ancestor of `dest` below the target is a real directory.
    fn check_parents(&mut self, dest: &Path) -> Result<(), String> {
        let parent = dest.parent().ok_or("entry has no parent")?;
        if parent == self.target || self.safe_dirs.contains(parent) {
            return Ok(());
        }
        let rel = parent
            .strip_prefix(&self.target)
            .map_err(|_| "entry escapes the target")?;
        let mut cur = self.target.clone();
        for c in rel.components() {
            cur.push(c);
            if self.safe_dirs.contains(&cur) {
                continue;
            }
            match fs::symlink_metadata(&cur) {
                Ok(m) if m.file_type().is_dir() => {
                    self.safe_dirs.insert(cur.clone());
                }
                Ok(_) => {
                    return Err(format!(
                        "refusing to restore through {}: not a directory (symlink?)",
                        cur.display()
                    ))
                }
                Err(e) => return Err(format!("parent {} is missing: {e}", cur.display())),
            }
        }
        Ok(())
    }

    /// Makes room for a new entry at `dest`; fails if something is there and
    /// overwriting was not asked for. A removed directory and everything below it
    /// leave `safe_dirs`: whatever replaces it must be checked again.
    fn make_room(&mut self, dest: &Path) -> Result<(), String> {
        match fs::symlink_metadata(dest) {
            Err(_) => return Ok(()),
            Ok(_) if !self.overwrite => {
                return Err("already exists; not overwritten (use --overwrite)".into())
            }
            Ok(m) if m.file_type().is_dir() => {
                fs::remove_dir_all(dest).map_err(|e| e.to_string())?;
            }
            Ok(_) => fs::remove_file(dest).map_err(|e| e.to_string())?,
        }
        self.safe_dirs.retain(|d| !d.starts_with(dest));
        Ok(())
    }

    fn dir(&mut self, dest: &Path) -> Result<(), String> {
        self.check_parents(dest)?;
        match fs::symlink_metadata(dest) {
            Ok(m) if m.file_type().is_dir() => {}
            Ok(_) => {
                self.make_room(dest)?;
                fs::create_dir(dest).map_err(|e| e.to_string())?;
            }
            Err(_) => fs::create_dir(dest).map_err(|e| e.to_string())?,
        }
        self.safe_dirs.insert(dest.to_path_buf());
        self.summary.dirs += 1;
        Ok(())
    }

    fn file(
        &mut self,
        dest: &Path,
        entry: &TreeEntry,
        data: FileData,
        stream: &mut SliceStream,
        progress: &dyn Progress,
    ) -> Result<(), String> {
        self.check_parents(dest)?;
        self.make_room(dest)?;
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .custom_flags(libc::O_NOFOLLOW)
            .mode(0o600)
            .open(dest)
            .map_err(|e| format!("cannot create: {e}"))?;
        let copied = stream.copy(data, |piece| {
            f.write_all(piece)
                .map_err(|e| format!("cannot write: {e}"))?;
            progress.advance(piece.len() as u64);
            Ok(())
        });
        if let Err(reason) = copied {
            // Only what this restore created is removed: the file holds a verified
            // prefix at most, and leaving it would pass it off as restored.
            drop(f);
            let _ = fs::remove_file(dest);
            return Err(format!("{reason} (not restored)"));
        }
        f.set_permissions(fs::Permissions::from_mode(entry.mode & 0o7777))
            .map_err(|e| e.to_string())?;
        set_file_times(&f, entry).map_err(|e| e.to_string())?;
        self.summary.files += 1;
        self.summary.bytes += data.len;
        Ok(())
    }

    fn symlink(&mut self, dest: &Path, entry: &TreeEntry) -> Result<(), String> {
        self.check_parents(dest)?;
        self.make_room(dest)?;
        std::os::unix::fs::symlink(OsStr::from_bytes(&entry.target), dest)
            .map_err(|e| e.to_string())?;
        set_times(dest, entry, true).map_err(|e| e.to_string())?;
        self.summary.symlinks += 1;
        Ok(())
    }
}

impl Restorer {
    /// Creates a FIFO or device node (`mknod`; devices need privilege).
    fn special(&mut self, dest: &Path, entry: &TreeEntry) -> Result<(), String> {
        self.check_parents(dest)?;
        self.make_room(dest)?;
        let kind = match entry.kind {
            EntryKind::Fifo => libc::S_IFIFO,
            EntryKind::CharDevice => libc::S_IFCHR,
            _ => libc::S_IFBLK,
        };
        let c = CString::new(dest.as_os_str().as_bytes()).map_err(|e| e.to_string())?;
        // SAFETY: `c` is a valid NUL-terminated path; mknod retains nothing.
        let rc = unsafe { libc::mknod(c.as_ptr(), kind | (entry.mode & 0o7777), entry.rdev) };
        if rc != 0 {
            return Err(format!(
                "cannot create: {}",
                std::io::Error::last_os_error()
            ));
        }
        set_times(dest, entry, true).map_err(|e| e.to_string())?;
        self.summary.specials += 1;
        Ok(())
    }
}

fn set_file_times(f: &File, entry: &TreeEntry) -> std::io::Result<()> {
    let t = mtime(entry);
    f.set_times(fs::FileTimes::new().set_modified(t).set_accessed(t))
}

fn mtime(entry: &TreeEntry) -> std::time::SystemTime {
    let base = std::time::SystemTime::UNIX_EPOCH;
    if entry.mtime_sec >= 0 {
        base + Duration::new(entry.mtime_sec as u64, entry.mtime_nsec.min(999_999_999))
    } else {
        base - Duration::from_secs(entry.mtime_sec.unsigned_abs())
            + Duration::from_nanos(u64::from(entry.mtime_nsec.min(999_999_999)))
    }
}

/// Sets atime and mtime by path; `nofollow` sets them on a symlink itself.
fn set_times(path: &Path, entry: &TreeEntry, nofollow: bool) -> std::io::Result<()> {
    let c = CString::new(path.as_os_str().as_bytes())?;
    let ts = libc::timespec {
        tv_sec: entry.mtime_sec as libc::time_t,
        tv_nsec: i64::from(entry.mtime_nsec.min(999_999_999)) as libc::c_long,
    };
    let times = [ts, ts];
    let flags = if nofollow {
        libc::AT_SYMLINK_NOFOLLOW
    } else {
        0
    };
    // SAFETY: `c` is a valid NUL-terminated path and `times` points to two timespecs,
    // as utimensat requires; neither is retained after the call.
    let rc = unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), times.as_ptr(), flags) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}
