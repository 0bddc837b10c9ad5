//! The writers: threads that create the entries other than directories (files,
//! symlinks, FIFOs, device nodes, hard links), write files' data, and set their
//! metadata. The coordinator (`restore.rs`) hands each writer the entries of the
//! directories it owns, in tree order, through a bounded queue; a file's data follows
//! its creation as pieces of the shared slices (`stream.rs`).
//!
//! What a writer may do to the target (the rest of restore's safety rules rely on it):
//! - create an entry only at the path of a task, with `O_CREAT | O_EXCL | O_NOFOLLOW`,
//!   `symlink`, `mknod` or `link`, all of which fail on anything already there;
//! - with `--overwrite`, remove what is at that path if it is not a directory, and
//!   only then create. A writer never removes a directory: only the coordinator does,
//!   after every writer has finished what it was given, so no queued task ever names
//!   a path through a directory that has gone;
//! - write only through the descriptor of a file it created.

use std::ffi::{CString, OsStr};
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;

use larder_store::{EntryKind, TreeEntry};

use super::links::{FirstGuard, FirstOutcome, LinkBoard};
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

/// Create the entry `entry` (not a directory), number `index` of the restore, at
/// `dest`, whose parent the coordinator checked.
pub(super) struct Create<'e, 'b> {
    pub index: usize,
    pub entry: &'e TreeEntry,
    pub dest: PathBuf,
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
    dest: PathBuf,
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
    fn warn(&mut self, index: usize, dest: &Path, message: impl std::fmt::Display) {
        let w = Warning::error(dest, message);
        self.shared.progress.warn(&w);
        self.tally.warnings.push((index, w));
    }

    fn done(&self) {
        self.shared.load[self.me].fetch_sub(1, Ordering::Relaxed);
    }

    fn create(&mut self, c: Create<'e, 'b>) {
        let Create {
            index,
            entry,
            dest,
            how,
        } = c;
        let result = match how {
            How::File { len, first } => {
                let (file, error) = match self.create_file(&dest) {
                    Ok(f) => (Some(f), None),
                    Err(e) => (None, Some(e.to_string())),
                };
                self.open = Some(OpenFile {
                    index,
                    entry,
                    dest,
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
            How::Link { group } => self.link(index, &dest, group).map(|()| false),
            How::Symlink => self.symlink(&dest, entry).map(|()| true),
            How::Special => self.special(&dest, entry).map(|()| true),
        };
        match result {
            Ok(true) => {
                for m in restore_metadata(
                    Node::Path(&dest),
                    entry,
                    &self.shared.owners,
                    entry.kind != EntryKind::Symlink,
                ) {
                    self.warn(index, &dest, m);
                }
            }
            Ok(false) => {}
            Err(message) => self.warn(index, &dest, message),
        }
        self.done();
    }

    /// Runs `make` (which creates an entry at `dest`, failing if anything is there);
    /// with `--overwrite`, if something that is not a directory is in the way, removes
    /// it and runs `make` again.
    fn make_at(
        &self,
        dest: &Path,
        mut make: impl FnMut() -> io::Result<()>,
    ) -> Result<(), MakeError> {
        match make() {
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                if !self.shared.overwrite {
                    return Err(MakeError::Exists);
                }
                if fs::symlink_metadata(dest).is_ok_and(|m| m.is_dir()) {
                    return Err(MakeError::Failed(
                        "a directory took its place; not replaced".into(),
                    ));
                }
                match fs::remove_file(dest) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    Err(e) => return Err(MakeError::Failed(format!("cannot replace: {e}"))),
                }
                make().map_err(|e| MakeError::Failed(format!("cannot create: {e}")))
            }
            other => other.map_err(|e| MakeError::Failed(format!("cannot create: {e}"))),
        }
    }

    fn create_file(&self, dest: &Path) -> Result<File, MakeError> {
        let mut file = None;
        self.make_at(dest, || {
            file = Some(
                OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .custom_flags(libc::O_NOFOLLOW)
                    .mode(0o600)
                    .open(dest)?,
            );
            Ok(())
        })?;
        file.ok_or_else(|| MakeError::Failed("cannot create".into()))
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
            dest,
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
            (Some(f), None) => self.complete(&f, entry, len, written_end),
            (f, failure) => {
                drop(f);
                let reason = failure.unwrap_or_else(|| "cannot create".into());
                if created {
                    // Only what this restore created is removed: the file holds a
                    // verified prefix at most, and leaving it would pass it off as
                    // restored.
                    let _ = fs::remove_file(&dest);
                    Err(format!("{reason} (not restored)"))
                } else {
                    Err(reason)
                }
            }
        };
        match result {
            Ok((warnings, dev, ino)) => {
                self.tally.files += 1;
                self.tally.bytes += len;
                if let Some(first) = first {
                    first.resolve(FirstOutcome::Restored {
                        path: dest.clone(),
                        dev,
                        ino,
                    });
                }
                for m in warnings {
                    self.warn(index, &dest, m);
                }
            }
            Err(message) => {
                drop(first);
                self.warn(index, &dest, message);
            }
        }
        self.done();
    }

    /// Gives a file whose data is all written its length (the holes at its end) and
    /// metadata; returns what metadata failed, and its device and inode.
    fn complete(
        &self,
        f: &File,
        entry: &TreeEntry,
        len: u64,
        written_end: u64,
    ) -> Result<(Vec<String>, u64, u64), String> {
        if written_end != len {
            f.set_len(len).map_err(|e| format!("cannot write: {e}"))?;
        }
        let warnings = restore_metadata(Node::File(f), entry, &self.shared.owners, true);
        let meta = f.metadata().map_err(|e| e.to_string())?;
        Ok((warnings, meta.dev(), meta.ino()))
    }

    /// Links `dest` to the restored first name of `group`. If the first was not
    /// restored, or the link cannot be made, `dest` is left for a pass that restores
    /// its data.
    fn link(&mut self, index: usize, dest: &Path, group: usize) -> Result<(), String> {
        let FirstOutcome::Restored { path, dev, ino } = self.shared.links.wait(group) else {
            self.tally.unlinked.push(index);
            return Ok(());
        };
        match self.make_at(dest, || fs::hard_link(&path, dest)) {
            Ok(()) => {}
            Err(MakeError::Exists) => return Err(MakeError::Exists.to_string()),
            Err(MakeError::Failed(_)) => {
                self.tally.unlinked.push(index);
                return Ok(());
            }
        }
        // `link` follows symlinks in the directories of its source: if the first
        // name's place changed since it was restored, this is not a link to it.
        match fs::symlink_metadata(dest) {
            Ok(m) if (m.dev(), m.ino()) == (dev, ino) => {
                self.tally.files += 1;
                self.tally.hard_links += 1;
                Ok(())
            }
            _ => {
                let _ = fs::remove_file(dest);
                self.tally.unlinked.push(index);
                Ok(())
            }
        }
    }

    fn symlink(&mut self, dest: &Path, entry: &TreeEntry) -> Result<(), String> {
        let target = OsStr::from_bytes(&entry.target);
        self.make_at(dest, || std::os::unix::fs::symlink(target, dest))
            .map_err(|e| e.to_string())?;
        self.tally.symlinks += 1;
        Ok(())
    }

    /// Creates a FIFO or device node (`mknod`; devices need root).
    fn special(&mut self, dest: &Path, entry: &TreeEntry) -> Result<(), String> {
        let (kind, what) = match entry.kind {
            EntryKind::Fifo => (libc::S_IFIFO, "FIFO"),
            EntryKind::CharDevice => (libc::S_IFCHR, "character device"),
            _ => (libc::S_IFBLK, "block device"),
        };
        let c = CString::new(dest.as_os_str().as_bytes()).map_err(|e| e.to_string())?;
        self.make_at(dest, || {
            // SAFETY: `c` is a valid NUL-terminated path; mknod retains nothing.
            let rc = unsafe { libc::mknod(c.as_ptr(), kind | (entry.mode & 0o7777), entry.rdev) };
            if rc == 0 {
                Ok(())
            } else {
                Err(io::Error::last_os_error())
            }
        })
        .map_err(|e| match e {
            MakeError::Failed(e) if entry.kind.is_device() => {
                format!("{e} (a {what}; creating one needs root)")
            }
            e => e.to_string(),
        })?;
        self.tally.specials += 1;
        Ok(())
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
