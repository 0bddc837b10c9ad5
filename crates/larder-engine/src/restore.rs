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
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use larder_store::{error_chain, EntryKind, Repository, TreeEntry};
use serde::Serialize;

use crate::error::{EngineError, Result, Warning};
use crate::pattern::PatternList;
use crate::select::restore_selection;
use crate::tree_io::{load_tree, ChunkReader};
use crate::Progress;

pub struct RestoreOptions {
    /// Replace entries that already exist in the target.
    pub overwrite: bool,
    /// Restore only what these patterns select (everything, if empty), with the
    /// parent directories of what they select (docs/design/patterns.md).
    pub include: PatternList,
    /// Do not restore what these patterns select; a selected directory is skipped whole.
    pub exclude: PatternList,
    pub progress: std::sync::Arc<dyn Progress>,
}

#[derive(Debug, Clone, Serialize)]
pub struct RestoreSummary {
    pub snapshot_id: String,
    pub files: u64,
    pub dirs: u64,
    pub symlinks: u64,
    pub bytes: u64,
    /// Entries of the snapshot left out by `include` and `exclude`.
    pub filtered_out: u64,
    pub elapsed: Duration,
    pub warnings: Vec<Warning>,
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
    opts.progress.set_total(
        entries
            .iter()
            .filter(|e| e.kind == EntryKind::File)
            .map(|e| e.size)
            .sum(),
    );
    fs::create_dir_all(target).map_err(|e| EngineError::io(target, e))?;
    let target = fs::canonicalize(target).map_err(|e| EngineError::io(target, e))?;
    let mut r = Restorer {
        target,
        overwrite: opts.overwrite,
        safe_dirs: HashSet::new(),
        summary: RestoreSummary {
            snapshot_id,
            files: 0,
            dirs: 0,
            symlinks: 0,
            bytes: 0,
            filtered_out: (all_entries.len() - entries.len()) as u64,
            elapsed: Duration::ZERO,
            warnings: Vec::new(),
        },
    };
    let mut dirs = Vec::new();
    for &entry in &entries {
        let dest = r.target.join(OsStr::from_bytes(&entry.path));
        let result = match entry.kind {
            EntryKind::Dir => r.dir(&dest).map(|()| dirs.push((dest.clone(), entry))),
            EntryKind::File => r.file(&dest, entry, &mut reader, opts.progress.as_ref()),
            EntryKind::Symlink => r.symlink(&dest, entry),
        };
        if let Err(message) = result {
            let w = Warning::error(&dest, message);
            opts.progress.warn(&w);
            r.summary.warnings.push(w);
        }
    }
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
        reader: &mut ChunkReader<'_>,
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
        let mut buf = Vec::with_capacity(128 << 10);
        let mut written = 0u64;
        for fp in &entry.chunks {
            buf.clear();
            reader
                .read_into(fp, &mut buf)
                .map_err(|e| error_chain(&e))?;
            f.write_all(&buf)
                .map_err(|e| format!("cannot write: {e}"))?;
            written += buf.len() as u64;
            progress.advance(buf.len() as u64);
        }
        if written != entry.size {
            return Err(format!(
                "restored {written} bytes but the snapshot recorded {}",
                entry.size
            ));
        }
        f.set_permissions(fs::Permissions::from_mode(entry.mode & 0o7777))
            .map_err(|e| e.to_string())?;
        set_file_times(&f, entry).map_err(|e| e.to_string())?;
        self.summary.files += 1;
        self.summary.bytes += written;
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
