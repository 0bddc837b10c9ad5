//! The coordinator's view of the target: which directories are verified to be real
//! directories inside it, and the operations that create or remove directories. Only
//! the coordinator (one thread, in tree order) calls these, so the set of verified
//! directories changes in one place; writers create only below directories verified
//! here (`writer.rs`).

use std::collections::HashSet;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

pub(super) struct Namespace {
    pub target: PathBuf,
    overwrite: bool,
    /// Directories verified to be real directories inside the target.
    safe_dirs: HashSet<PathBuf>,
    /// Directories created or kept for the snapshot's directory entries.
    pub dirs: u64,
}

impl Namespace {
    pub fn new(target: PathBuf, overwrite: bool) -> Self {
        Self {
            target,
            overwrite,
            safe_dirs: HashSet::new(),
            dirs: 0,
        }
    }

    /// Whether `dir` is still a verified directory: one that a later entry replaced (by
    /// a symlink, say) must not have its metadata set through that replacement.
    pub fn is_safe(&self, dir: &Path) -> bool {
        self.safe_dirs.contains(dir)
    }

    /// Checks that every ancestor of `dest` below the target is a real directory.
    pub fn check_parents(&mut self, dest: &Path) -> Result<(), String> {
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

    /// Creates directory `dest`, or keeps the directory already there. Something else
    /// in its place is replaced with `--overwrite` (after `quiesce`, which returns
    /// once no writer has work left), and refused without.
    pub fn dir(&mut self, dest: &Path, quiesce: impl FnOnce()) -> Result<(), String> {
        self.check_parents(dest)?;
        match fs::create_dir(dest) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                match fs::symlink_metadata(dest) {
                    Ok(m) if m.file_type().is_dir() => {}
                    Ok(_) if !self.overwrite => {
                        return Err("already exists; not overwritten (use --overwrite)".into())
                    }
                    Ok(_) => {
                        quiesce();
                        fs::remove_file(dest).map_err(|e| e.to_string())?;
                        fs::create_dir(dest).map_err(|e| e.to_string())?;
                    }
                    Err(e) => return Err(e.to_string()),
                }
            }
            Err(e) => return Err(e.to_string()),
        }
        self.safe_dirs.insert(dest.to_path_buf());
        self.dirs += 1;
        Ok(())
    }

    /// With `--overwrite`, removes a directory that stands where an entry of another
    /// kind goes (writers replace only what is not a directory), after `quiesce`: no
    /// task queued for a writer may name a path through it. The removed directory and
    /// everything below it are no longer trusted as parents.
    pub fn clear_directory_at(
        &mut self,
        dest: &Path,
        quiesce: impl FnOnce(),
    ) -> Result<(), String> {
        if !self.overwrite {
            return Ok(());
        }
        match fs::symlink_metadata(dest) {
            Ok(m) if m.file_type().is_dir() => {
                quiesce();
                fs::remove_dir_all(dest).map_err(|e| format!("cannot replace: {e}"))?;
                self.safe_dirs.retain(|d| !d.starts_with(dest));
                Ok(())
            }
            _ => Ok(()),
        }
    }
}
