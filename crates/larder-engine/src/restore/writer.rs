//! The writers: threads that create the entries other than directories (files,
//! symlinks, FIFOs, device nodes, hard links), write files' data, and set their
//! metadata. The coordinator (`restore.rs`) hands each writer the entries of the
//! directories it owns, in tree order, through a bounded queue, each with the open
//! descriptor of its directory and its name there; a file's data follows its
//! creation as pieces of the shared slices (`stream.rs`).
//!
//! What a writer may do to the target (the rest of restore's safety rules rely on it):
//! - create an entry only as the name of a task in the task's open directory, with
//!   `openat(O_CREAT | O_EXCL | O_NOFOLLOW)`, `symlinkat`, `mknodat` or `linkat`, all
//!   of which fail on anything already there and none of which follows a symlink;
//! - with `--overwrite`, remove what has that name if it is not a directory
//!   (`unlinkat`, which fails on a directory), and only then create. A writer never
//!   removes a directory: only the coordinator does, after every writer has finished
//!   what it was given;
//! - write only through the descriptor of a file it created, and set metadata only
//!   through a descriptor of the entry it created (`meta/apply.rs`).

use std::ffi::OsStr;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};

use larder_store::{EntryKind, TreeEntry};
use rustix::fs::FileType;

use super::fsops;
use super::links::{FirstGuard, FirstOutcome, LinkBoard};
use super::namespace::{split, DirFd};
use super::stream::Piece;
use crate::error::Warning;
use crate::meta::{restore_metadata, Node, OwnerPolicy};
use crate::Progress;

/// Tasks a writer's queue holds at most: enough that a writer rarely waits for the
/// coordinator while the coordinator hands out other directories' entries; the data
/// they refer to is bounded by the slice buffers, not by this.
pub(super) const QUEUE_DEPTH: usize = 256;

/// File-offset-aligned blocks of this size that hold only zeros are not written: they
/// stay holes of the sparse file (a file system's block is 4 KiB or a divisor of it).
const HOLE_BLOCK: usize = 4096;

/// What the coordinator hands a writer. For a file: `Create`, its data in `Data`
/// pieces in order, then `Finish`, or `Damaged` instead of the rest.
pub(super) enum Task<'e, 'b> {
    Create(Create<'e, 'b>),
    Data(Piece),
    Finish,
    /// The rest of the file's bytes cannot be restored, for this reason.
    Damaged(String),
    /// Reply once every task before this one is done.
    Barrier(mpsc::Sender<()>),
}

/// Create the entry `entry` (not a directory), number `index` of the restore, as
/// `name` in the open directory `dir`.
pub(super) struct Create<'e, 'b> {
    pub index: usize,
    pub entry: &'e TreeEntry,
    pub dir: DirFd,
    pub name: &'e [u8],
    pub how: How<'b>,
}

pub(super) enum How<'b> {
    /// A file with `len` bytes of data; if the first name of a link group, the group's
    /// promise to its later names.
    File {
        len: u64,
        first: Option<FirstGuard<'b>>,
    },
    /// A later name of hard link group `group`.
    Link {
        group: usize,
    },
    Symlink,
    Special,
}

/// What a writer did, merged into the restore's summary.
#[derive(Default)]
pub(super) struct Tally {
    pub files: u64,
    pub hard_links: u64,
    pub symlinks: u64,
    pub specials: u64,
    pub bytes: u64,
    /// With the index of the entry each is about, to report them in tree order.
    pub warnings: Vec<(usize, Warning)>,
    /// Later names of link groups whose first was not restored: restored with their
    /// own data in another pass.
    pub unlinked: Vec<usize>,
}

impl Tally {
    pub fn merge(&mut self, other: Tally) {
        self.files += other.files;
        self.hard_links += other.hard_links;
        self.symlinks += other.symlinks;
        self.specials += other.specials;
        self.bytes += other.bytes;
        self.warnings.extend(other.warnings);
        self.unlinked.extend(other.unlinked);
    }
}

/// What every writer shares.
pub(super) struct Shared<'a> {
    /// The target as the user named it (for messages) and its descriptor.
    pub target: &'a Path,
    pub root: DirFd,
    pub overwrite: bool,
    pub owners: OwnerPolicy,
    pub links: &'a LinkBoard,
    pub progress: &'a dyn Progress,
    /// Per writer: entries handed to it and not yet done (the coordinator gives a new
    /// directory to the least loaded writer).
    pub load: Vec<AtomicUsize>,
}

/// The file a writer is writing.
struct OpenFile<'e, 'b> {
    index: usize,
    entry: &'e TreeEntry,
    dir: DirFd,
    name: &'e [u8],
    len: u64,
    first: Option<FirstGuard<'b>>,
    /// `None` once creating or writing failed: the rest of its data is dropped.
    file: Option<File>,
    /// Whether this restore created the file (so may remove it).
    created: bool,
    /// Next file offset to write at; where the last written byte ended.
    pos: u64,
    written_end: u64,
    error: Option<String>,
}

/// Runs writer `me`: takes tasks until the queue closes; returns what it did.
pub(super) fn run_writer<'e, 'b>(
    me: usize,
    shared: &Shared<'b>,
    tasks: mpsc::Receiver<Task<'e, 'b>>,
) -> Tally {
    let mut w = Writer {
        me,
        shared,
        tally: Tally::default(),
        open: None,
    };
    for task in tasks {
        match task {
            Task::Create(c) => w.create(c),
            Task::Data(piece) => w.data(&piece),
            Task::Finish => w.finish(None),
            Task::Damaged(reason) => w.finish(Some(reason)),
            Task::Barrier(done) => {
                let _ = done.send(());
            }
        }
    }
    // A file left open means the coordinator stopped in the middle of it.
    w.finish(Some("the restore ended before this file's data".into()));
    w.tally
}

struct Writer<'s, 'e, 'b> {
    me: usize,
    shared: &'s Shared<'b>,
    tally: Tally,
    open: Option<OpenFile<'e, 'b>>,
}

impl<'e, 'b> Writer<'_, 'e, 'b> {
    fn warn(&mut self, index: usize, entry: &TreeEntry, message: impl std::fmt::Display) {
        let w = Warning::error(self.dest(entry), message);
        self.shared.progress.warn(&w);
        self.tally.warnings.push((index, w));
    }

    /// Where `entry` is restored, for messages.
    fn dest(&self, entry: &TreeEntry) -> PathBuf {
        self.shared.target.join(OsStr::from_bytes(&entry.path))
    }

    fn done(&self) {
        self.shared.load[self.me].fetch_sub(1, Ordering::Relaxed);
    }

    fn create(&mut self, c: Create<'e, 'b>) {
        let Create {
            index,
            entry,
            dir,
            name,
            how,
        } = c;
        let failed = match how {
            How::File { len, first } => {
                let (file, error) = match self
                    .make_at(dir.as_fd(), name, || fsops::create_file(dir.as_fd(), name))
                {
                    Ok(f) => (Some(f), None),
                    Err(e) => (None, Some(e.to_string())),
                };
                self.open = Some(OpenFile {
                    index,
                    entry,
                    dir,
                    name,
                    len,
                    first,
                    created: file.is_some(),
                    file,
                    pos: 0,
                    written_end: 0,
                    error,
                });
                // Done in `finish`.
                return;
            }
            // A link shares the metadata of its first name, already set.
            How::Link { group } => self
                .link(index, dir.as_fd(), name, group)
                .err()
                .into_iter()
                .collect(),
            How::Symlink => self.symlink(dir.as_fd(), name, entry),
            How::Special => self.special(dir.as_fd(), name, entry),
        };
        for m in failed {
            self.warn(index, entry, m);
        }
        self.done();
    }

    /// Runs `make` (which creates entry `name` in `dir`, failing if anything is
    /// there); with `--overwrite`, if something that is not a directory is in the way,
    /// removes it and runs `make` again.
    fn make_at<T>(
        &self,
        dir: BorrowedFd<'_>,
        name: &[u8],
        mut make: impl FnMut() -> io::Result<T>,
    ) -> Result<T, MakeError> {
        match make() {
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                if !self.shared.overwrite {
                    return Err(MakeError::Exists);
                }
                match fsops::remove_entry(dir, name) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    Err(e) if e.raw_os_error() == Some(libc::EISDIR) => {
                        return Err(MakeError::Failed(
                            "a directory took its place; not replaced".into(),
                        ))
                    }
                    Err(e) => return Err(MakeError::Failed(format!("cannot replace: {e}"))),
                }
                make().map_err(|e| MakeError::Failed(format!("cannot create: {e}")))
            }
            other => other.map_err(|e| MakeError::Failed(format!("cannot create: {e}"))),
        }
    }

    fn data(&mut self, piece: &Piece) {
        let Some(open) = self.open.as_mut() else {
            return;
        };
        let bytes = piece.bytes();
        if let Some(f) = &open.file {
            match write_sparse(f, open.pos, bytes) {
                Ok(Some(end)) => open.written_end = end,
                Ok(None) => {}
                Err(e) => {
                    open.file = None;
                    open.error = Some(format!("cannot write: {e}"));
                }
            }
        }
        open.pos += bytes.len() as u64;
        self.shared.progress.advance(bytes.len() as u64);
    }

    /// Ends the open file: sets its length and metadata, or with `damage` (or an
    /// earlier failure) removes it.
    fn finish(&mut self, damage: Option<String>) {
        let Some(open) = self.open.take() else {
            return;
        };
        let OpenFile {
            index,
            entry,
            dir,
            name,
            len,
            first,
            file,
            created,
            written_end,
            error,
            ..
        } = open;
        let failure = error.or(damage);
        let result = match (file, failure) {
            (Some(f), None) => self.complete(&f, entry, len, written_end, first.is_some()),
            (f, failure) => {
                drop(f);
                let reason = failure.unwrap_or_else(|| "cannot create".into());
                if created {
                    // Only what this restore created is removed: the file holds a
                    // verified prefix at most, and leaving it would pass it off as
                    // restored.
                    let _ = fsops::remove_entry(dir.as_fd(), name);
                    Err(format!("{reason} (not restored)"))
                } else {
                    Err(reason)
                }
            }
        };
        match result {
            Ok((warnings, id)) => {
                self.tally.files += 1;
                self.tally.bytes += len;
                if let (Some(first), Some((dev, ino))) = (first, id) {
                    let (parent, _) = split(&entry.path);
                    first.resolve(FirstOutcome::Restored {
                        dir: Arc::downgrade(&dir),
                        parent: parent.to_vec(),
                        name: name.to_vec(),
                        dev,
                        ino,
                    });
                }
                for m in warnings {
                    self.warn(index, entry, m);
                }
            }
            Err(message) => {
                drop(first);
                self.warn(index, entry, message);
            }
        }
        self.done();
    }

    /// Gives a file whose data is all written its length (the holes at its end) and
    /// metadata; returns what metadata failed, and (if `linked`: later names will be
    /// links to it) its device and inode.
    fn complete(
        &self,
        f: &File,
        entry: &TreeEntry,
        len: u64,
        written_end: u64,
        linked: bool,
    ) -> Result<(Vec<String>, Option<fsops::DevIno>), String> {
        if written_end != len {
            f.set_len(len).map_err(|e| format!("cannot write: {e}"))?;
        }
        let warnings = restore_metadata(Node::Fd(f.as_fd()), entry, &self.shared.owners);
        let id = if linked {
            let st = fsops::stat(f.as_fd()).map_err(|e| e.to_string())?;
            Some(fsops::dev_ino(&st))
        } else {
            None
        };
        Ok((warnings, id))
    }

    /// Links `name` in `dir` to the restored first name of `group`. If the first was
    /// not restored, or the link cannot be made, the entry is left for a pass that
    /// restores its data.
    fn link(
        &mut self,
        index: usize,
        dir: BorrowedFd<'_>,
        name: &[u8],
        group: usize,
    ) -> Result<(), String> {
        let FirstOutcome::Restored {
            dir: first_dir,
            parent,
            name: first_name,
            dev,
            ino,
        } = self.shared.links.wait(group)
        else {
            self.tally.unlinked.push(index);
            return Ok(());
        };
        // The first name's directory, still open if its entries are, else opened
        // again beneath the target.
        let first_dir = match first_dir.upgrade() {
            Some(fd) => fd,
            None if parent.is_empty() => Arc::clone(&self.shared.root),
            None => match fsops::open_beneath(self.shared.root.as_fd(), &parent) {
                Ok(fd) => Arc::new(fd),
                Err(_) => {
                    self.tally.unlinked.push(index);
                    return Ok(());
                }
            },
        };
        match self.make_at(dir, name, || {
            fsops::make_link(first_dir.as_fd(), &first_name, dir, name)
        }) {
            Ok(()) => {}
            Err(MakeError::Exists) => return Err(MakeError::Exists.to_string()),
            Err(MakeError::Failed(_)) => {
                self.tally.unlinked.push(index);
                return Ok(());
            }
        }
        // The first name may have been replaced in its directory since it was
        // restored: then this is not a link to it.
        match fsops::stat_at(dir, name) {
            Ok(st) if fsops::dev_ino(&st) == (dev, ino) => {
                self.tally.files += 1;
                self.tally.hard_links += 1;
                Ok(())
            }
            _ => {
                let _ = fsops::remove_entry(dir, name);
                self.tally.unlinked.push(index);
                Ok(())
            }
        }
    }

    /// Creates a symlink and sets its metadata through a descriptor of the link
    /// itself; returns what failed.
    fn symlink(&mut self, dir: BorrowedFd<'_>, name: &[u8], entry: &TreeEntry) -> Vec<String> {
        if let Err(e) = self.make_at(dir, name, || fsops::make_symlink(dir, name, &entry.target)) {
            return vec![e.to_string()];
        }
        self.tally.symlinks += 1;
        match fsops::open_node(dir, name, FileType::Symlink) {
            Ok(link) => {
                let node = Node::Symlink {
                    link: link.as_fd(),
                    dir,
                    name,
                };
                restore_metadata(node, entry, &self.shared.owners)
            }
            Err(e) => vec![e.to_string()],
        }
    }

    /// Creates a FIFO or device node (`mknodat`; devices need root) and sets its
    /// metadata through an `O_PATH` descriptor of it; returns what failed.
    fn special(&mut self, dir: BorrowedFd<'_>, name: &[u8], entry: &TreeEntry) -> Vec<String> {
        let (kind, what) = match entry.kind {
            EntryKind::Fifo => (FileType::Fifo, "FIFO"),
            EntryKind::CharDevice => (FileType::CharacterDevice, "character device"),
            _ => (FileType::BlockDevice, "block device"),
        };
        let made = self.make_at(dir, name, || fsops::make_node(dir, name, kind, entry.rdev));
        if let Err(e) = made {
            return vec![match e {
                MakeError::Failed(e) if entry.kind.is_device() => {
                    format!("{e} (a {what}; creating one needs root)")
                }
                e => e.to_string(),
            }];
        }
        self.tally.specials += 1;
        match fsops::open_node(dir, name, kind) {
            Ok(node) => restore_metadata(Node::Special(node.as_fd()), entry, &self.shared.owners),
            Err(e) => vec![e.to_string()],
        }
    }
}

/// Why an entry could not be created.
enum MakeError {
    /// Something is in its place and `--overwrite` was not given.
    Exists,
    Failed(String),
}

impl std::fmt::Display for MakeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Exists => f.write_str("already exists; not overwritten (use --overwrite)"),
            Self::Failed(reason) => f.write_str(reason),
        }
    }
}

/// Writes `data` at `offset` of `file`, leaving out each block (aligned to
/// [`HOLE_BLOCK`] in file offsets; the first and last may be partial) that holds only
/// zeros: the file was created empty, so what is not written reads as zeros, and a
/// run of such blocks stays a hole. Returns where the last byte written ends, `None`
/// if nothing was.
fn write_sparse(file: &File, offset: u64, data: &[u8]) -> io::Result<Option<u64>> {
    let mut written_end = None;
    let mut run: Option<usize> = None;
    let mut at = 0;
    while at < data.len() {
        let to_boundary = HOLE_BLOCK - (offset as usize + at) % HOLE_BLOCK;
        let end = (at + to_boundary).min(data.len());
        if is_zero(&data[at..end]) {
            if let Some(start) = run.take() {
                file.write_all_at(&data[start..at], offset + start as u64)?;
                written_end = Some(offset + at as u64);
            }
        } else if run.is_none() {
            run = Some(at);
        }
        at = end;
    }
    if let Some(start) = run {
        file.write_all_at(&data[start..], offset + start as u64)?;
        written_end = Some(offset + data.len() as u64);
    }
    Ok(written_end)
}

/// Whether `block` is all zeros. The inner fold over 64 bytes has no early exit, so
/// the compiler vectorizes it; the outer loop stops at the first 64 bytes that are not
/// zero, which for ordinary data is the first (docs/performance.md, "Restore of
/// many-file trees": the check costs no measurable time).
fn is_zero(block: &[u8]) -> bool {
    block
        .chunks(64)
        .all(|c| c.iter().fold(0u8, |acc, &b| acc | b) == 0)
}

/// The writer a new directory's entries go to: the least loaded, the lowest index
/// among equals.
pub(super) fn least_loaded(load: &[AtomicUsize]) -> usize {
    load.iter()
        .enumerate()
        .min_by_key(|(_, l)| l.load(Ordering::Relaxed))
        .map_or(0, |(i, _)| i)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    #[test]
    fn zero_check_over_lengths_around_its_step() {
        for len in [0, 1, 63, 64, 65, 4095, 4096, 4097] {
            let mut block = vec![0u8; len];
            assert!(is_zero(&block), "{len}");
            for i in [0, len / 2, len.saturating_sub(1)] {
                if len > 0 {
                    block[i] = 1;
                    assert!(!is_zero(&block), "{len} {i}");
                    block[i] = 0;
                }
            }
        }
    }

    /// Sparse writes at any offset and in any pieces give the same bytes as plain
    /// writes, and leave zero blocks unwritten.
    #[test]
    fn sparse_writes_read_back_exactly() {
        let dir = tempfile::tempdir().unwrap();
        let len = 5 * HOLE_BLOCK + 123;
        let mut data = vec![0u8; len];
        data[10] = 1;
        data[3 * HOLE_BLOCK + 7] = 2;
        data[len - 1] = 3;
        for step in [1, 100, HOLE_BLOCK - 1, HOLE_BLOCK, HOLE_BLOCK + 1, len] {
            let path = dir.path().join(format!("f{step}"));
            let f = File::create(&path).unwrap();
            let mut end = 0;
            for (i, piece) in data.chunks(step).enumerate() {
                if let Some(e) = write_sparse(&f, (i * step) as u64, piece).unwrap() {
                    end = e;
                }
            }
            assert_eq!(end, len as u64);
            let mut back = Vec::new();
            File::open(&path).unwrap().read_to_end(&mut back).unwrap();
            assert!(back == data, "step {step}");
        }
        // All zeros: nothing written at all.
        let f = File::create(dir.path().join("zeros")).unwrap();
        assert_eq!(write_sparse(&f, 0, &vec![0; len]).unwrap(), None);
        assert_eq!(f.metadata().unwrap().len(), 0);
    }
}
