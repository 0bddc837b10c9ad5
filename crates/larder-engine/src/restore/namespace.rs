//! The coordinator's view of the target: open descriptors of the directories below
//! it, and the operations that create or remove directories. Only the coordinator
//! (one thread, in tree order) calls these; it hands each writer the descriptor of an
//! entry's directory and the entry's name there, and the writer creates only in it
//! (`writer.rs`).
//!
//! Every directory is reached from the target's descriptor through descriptors
//! (`fsops.rs`), so a directory that another user renames away, or replaces by a
//! symlink, never leads a create outside the target: what is already open stays the
//! directory the restore made, and what is opened again is opened beneath the target
//! without following a symlink, and must be the directory the restore made (same
//! device and inode) or is refused.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;
use std::sync::Arc;

use rustix::fs::FileType;

use super::fsops::{self, DevIno};

/// An open directory below the target, shared with the writers that create in it.
pub(super) type DirFd = Arc<OwnedFd>;

/// Directory descriptors the coordinator keeps open at most (writers hold those of
/// the entries queued for them on top): in tree order the ones it needs again are
/// the ancestors of the current entry, which it keeps; others are opened again.
const OPEN_DIRS: usize = 128;

pub(super) struct Namespace {
    /// The target as the user named it: for messages only.
    pub target: PathBuf,
    /// The target's descriptor, opened once: every directory is opened beneath it.
    pub root: DirFd,
    overwrite: bool,
    delete: bool,
    /// Open directories below the target, by path relative to it.
    open: HashMap<Vec<u8>, DirFd>,
    /// The snapshot's directories that this restore created or kept, by relative
    /// path, with their identity: a directory opened again must be the same one.
    made: HashMap<Vec<u8>, DevIno>,
    /// Directories created or kept for the snapshot's directory entries.
    pub dirs: u64,
    /// Entries removed to make room for the snapshot's (`--delete`).
    pub removed: u64,
}

/// The directory part of a relative path and its last name.
pub(super) fn split(path: &[u8]) -> (&[u8], &[u8]) {
    match path.iter().rposition(|&b| b == b'/') {
        Some(at) => (&path[..at], &path[at + 1..]),
        None => (&[], path),
    }
}

impl Namespace {
    pub fn new(target: PathBuf, root: OwnedFd, overwrite: bool, delete: bool) -> Self {
        Self {
            target,
            root: Arc::new(root),
            overwrite,
            delete,
            open: HashMap::new(),
            made: HashMap::new(),
            dirs: 0,
            removed: 0,
        }
    }

    /// Where relative path `rel` is, for messages.
    pub fn display(&self, rel: &[u8]) -> PathBuf {
        use std::os::unix::ffi::OsStrExt;
        self.target.join(std::ffi::OsStr::from_bytes(rel))
    }

    /// The open directory `rel` (empty: the target), opened beneath the nearest open
    /// ancestor if it is not open; a directory this restore made must still be it.
    pub fn dir_fd(&mut self, rel: &[u8]) -> Result<DirFd, String> {
        if rel.is_empty() {
            return Ok(Arc::clone(&self.root));
        }
        if let Some(fd) = self.open.get(rel) {
            return Ok(Arc::clone(fd));
        }
        let (base, below) = self.nearest_open(rel);
        let fd = fsops::open_beneath(base.as_fd(), below).map_err(|e| self.refusal(rel, &e))?;
        if let Some(&made) = self.made.get(rel) {
            let st = fsops::stat(fd.as_fd()).map_err(|e| e.to_string())?;
            if fsops::dev_ino(&st) != made {
                return Err("was replaced during the restore by another directory; \
                            refusing to restore into it"
                    .into());
            }
        }
        Ok(self.keep_open(rel, fd))
    }

    /// The nearest open ancestor of `rel` (the target at least) and the rest of the
    /// path below it.
    fn nearest_open<'p>(&self, rel: &'p [u8]) -> (DirFd, &'p [u8]) {
        let mut at = rel.len();
        while let Some(slash) = rel[..at].iter().rposition(|&b| b == b'/') {
            if let Some(fd) = self.open.get(&rel[..slash]) {
                return (Arc::clone(fd), &rel[slash + 1..]);
            }
            at = slash;
        }
        (Arc::clone(&self.root), rel)
    }

    /// Keeps `fd` open as directory `rel`, first closing every open directory that is
    /// not an ancestor of `rel` if [`OPEN_DIRS`] are open.
    fn keep_open(&mut self, rel: &[u8], fd: OwnedFd) -> DirFd {
        if self.open.len() >= OPEN_DIRS {
            self.open
                .retain(|k, _| rel.starts_with(k) && rel.get(k.len()) == Some(&b'/'));
            if self.open.len() >= OPEN_DIRS {
                self.open.clear();
            }
        }
        let fd = Arc::new(fd);
        self.open.insert(rel.to_vec(), Arc::clone(&fd));
        fd
    }

    /// Why directory `rel` could not be opened, naming the first component that is
    /// not a directory.
    fn refusal(&self, rel: &[u8], e: &io::Error) -> String {
        let culprit = |end: usize| {
            format!(
                "refusing to restore through {}: not a directory (symlink?)",
                self.display(&rel[..end]).display()
            )
        };
        match e.raw_os_error() {
            Some(libc::ELOOP | libc::ENOTDIR) => {
                let mut cur: Option<OwnedFd> = None;
                let mut end = 0;
                for name in rel.split(|&b| b == b'/') {
                    end += name.len();
                    let base = cur.as_ref().map_or(self.root.as_fd(), |fd| fd.as_fd());
                    match fsops::open_dir(base, name) {
                        Ok(next) => cur = Some(next),
                        Err(_) => return culprit(end),
                    }
                    end += 1;
                }
                culprit(rel.len())
            }
            Some(libc::ENOENT) => format!("parent {} is missing: {e}", self.display(rel).display()),
            _ => format!("cannot open {}: {e}", self.display(rel).display()),
        }
    }

    /// The open directory an entry at `path` goes in, and its name there.
    pub fn parent_of<'p>(&mut self, path: &'p [u8]) -> Result<(DirFd, &'p [u8]), String> {
        let (dir, name) = split(path);
        Ok((self.dir_fd(dir)?, name))
    }

    /// Creates directory `path`, or keeps the directory already there, and opens it.
    /// Something else in its place is replaced with `--overwrite` (after `quiesce`,
    /// which returns once no writer has work left), and refused without.
    pub fn dir(&mut self, path: &[u8], quiesce: impl FnOnce()) -> Result<(), String> {
        let (parent, name) = self.parent_of(path)?;
        let parent = parent.as_fd();
        let created = match fsops::make_dir(parent, name) {
            Ok(()) => true,
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {
                match fsops::stat_at(parent, name) {
                    Ok(st) if is_dir(&st) => false,
                    Ok(_) if !self.overwrite => {
                        return Err("already exists; not overwritten (use --overwrite)".into())
                    }
                    Ok(_) => {
                        quiesce();
                        fsops::remove_entry(parent, name).map_err(|e| e.to_string())?;
                        fsops::make_dir(parent, name).map_err(|e| e.to_string())?;
                        true
                    }
                    Err(e) => return Err(e.to_string()),
                }
            }
            Err(e) => return Err(e.to_string()),
        };
        let fd = fsops::open_dir(parent, name).map_err(|e| self.refusal(path, &e))?;
        let st = fsops::stat(fd.as_fd()).map_err(|e| e.to_string())?;
        // What this restore just made is its own; anything else was put in its place.
        if created && st.st_uid != fsops::euid() {
            return Err("was replaced during the restore; refusing to restore into it".into());
        }
        self.made.insert(path.to_vec(), fsops::dev_ino(&st));
        self.keep_open(path, fd);
        self.dirs += 1;
        Ok(())
    }

    /// The open directory `path` that this restore made, opened again if need be
    /// (beneath the target, and only if it is still the same directory); `None` if
    /// the restore made none there or replaced it by something else since.
    pub fn made_dir(&mut self, path: &[u8]) -> Option<Result<DirFd, String>> {
        self.made.contains_key(path).then(|| self.dir_fd(path))
    }

    /// Makes room at `path` for an entry that is not a directory: with `--overwrite`,
    /// an empty directory there is removed, and a directory holding entries only with
    /// `--delete` (they are not in the snapshot: it holds something else at `path`);
    /// both after `quiesce`, so that no queued task refers to it. Returns the open
    /// directory the entry goes in and its name there.
    pub fn place<'p>(
        &mut self,
        path: &'p [u8],
        quiesce: impl FnOnce(),
    ) -> Result<(DirFd, &'p [u8]), String> {
        let (parent, name) = self.parent_of(path)?;
        if !self.overwrite || !fsops::stat_at(parent.as_fd(), name).is_ok_and(|st| is_dir(&st)) {
            return Ok((parent, name));
        }
        quiesce();
        self.forget(path);
        match fsops::remove_empty_dir(parent.as_fd(), name) {
            Ok(()) => self.removed += 1,
            Err(e) if e.raw_os_error() == Some(libc::ENOTEMPTY) && self.delete => {
                self.removed += fsops::remove_tree(parent.as_fd(), name, true)
                    .map_err(|e| format!("cannot replace the directory there: {e}"))?;
            }
            Err(e) if e.raw_os_error() == Some(libc::ENOTEMPTY) => {
                return Err(
                    "is a directory holding entries in the target; not replaced \
                            (larder replaces only an empty directory by what the snapshot \
                            holds, unless --delete is given)"
                        .into(),
                )
            }
            Err(e) => return Err(format!("cannot replace the directory there: {e}")),
        }
        Ok((parent, name))
    }

    /// Forgets directory `path` and everything below it: it is gone or going.
    fn forget(&mut self, path: &[u8]) {
        let below = |k: &Vec<u8>| {
            k.as_slice() == path || (k.starts_with(path) && k.get(path.len()) == Some(&b'/'))
        };
        self.open.retain(|k, _| !below(k));
        self.made.retain(|k, _| !below(k));
    }

    /// Removes what directory `path` (one this restore made) holds that `keep` says
    /// the snapshot does not: `keep(child, is_dir)` for each entry's relative path.
    /// Returns a message per entry that could not be removed.
    pub fn delete_extra(
        &mut self,
        path: &[u8],
        mut keep: impl FnMut(&[u8], bool) -> bool,
    ) -> Vec<(Vec<u8>, String)> {
        let dir = match self.made_dir(path) {
            None => return Vec::new(),
            Some(Err(m)) => return vec![(path.to_vec(), m)],
            Some(Ok(dir)) => dir,
        };
        let names = match fsops::list(dir.as_fd()) {
            Ok(names) => names,
            Err(e) => return vec![(path.to_vec(), format!("cannot list: {e}"))],
        };
        let mut failed = Vec::new();
        for (name, is_dir) in names {
            let mut child = path.to_vec();
            child.push(b'/');
            child.extend_from_slice(&name);
            if keep(&child, is_dir) {
                continue;
            }
            match fsops::remove_tree(dir.as_fd(), &name, is_dir) {
                Ok(n) => self.removed += n,
                Err(e) => failed.push((child, format!("cannot delete: {e}"))),
            }
        }
        failed
    }
}

fn is_dir(st: &rustix::fs::Stat) -> bool {
    FileType::from_raw_mode(st.st_mode) == FileType::Directory
}
