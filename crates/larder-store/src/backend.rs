//! The narrow I/O interface below the repository, and its local-directory implementation.

use std::fs::{self, File};
use std::io::ErrorKind;
use std::ops::Range;
use std::os::unix::fs::{DirBuilderExt, FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{Result, StoreError};

mod cache;
#[cfg(feature = "object-store")]
mod object;
mod retry;
#[cfg(feature = "sftp")]
mod sftp;
mod split;

pub use cache::CachedBackend;
pub use retry::{RetryBackend, RetryPolicy};
pub use split::SplitBackend;

#[cfg(feature = "object-store")]
pub use object::{parse_s3_url, ObjectBackend};
#[cfg(feature = "sftp")]
pub use sftp::{parse_sftp_url, SftpBackend, SftpUrl, SshCommand};

/// The kinds of files a repository holds, each in its own directory (the config at
/// the top).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FileKind {
    /// The repository's `config`; its only name is [`CONFIG_NAME`].
    Config,
    /// A key slot of an encrypted repository (docs/design/crypto.md, "Key slots").
    Key,
    /// A lock object (docs/design/remote.md, "Lock objects").
    Lock,
    Container,
    IndexSegment,
    Snapshot,
    /// A garbage collection's plan (docs/design/gc.md).
    GcPlan,
}

/// The one name of a [`FileKind::Config`] file.
pub const CONFIG_NAME: &str = "config";

impl FileKind {
    pub const ALL: [FileKind; 7] = [
        Self::Config,
        Self::Key,
        Self::Lock,
        Self::Container,
        Self::IndexSegment,
        Self::Snapshot,
        Self::GcPlan,
    ];

    /// The directory of the kind's files; empty for the config, which is at the top.
    pub fn dir(self) -> &'static str {
        match self {
            Self::Config => "",
            Self::Key => "keys",
            Self::Lock => "locks",
            Self::Container => "containers",
            Self::IndexSegment => "index",
            Self::Snapshot => "snapshots",
            Self::GcPlan => "gc",
        }
    }

    /// The extension of the kind's files; empty for the config.
    pub fn extension(self) -> &'static str {
        match self {
            Self::Config => "",
            Self::Key => "key",
            Self::Lock => "lock",
            Self::Container => "ctr",
            Self::IndexSegment => "idx",
            Self::Snapshot => "snap",
            Self::GcPlan => "plan",
        }
    }

    /// File `name`'s path below the repository's top, `/`-separated:
    /// `<dir>/<name>.<extension>`, and `config` for the config.
    pub fn relative_path(self, name: &str) -> String {
        match self {
            Self::Config => CONFIG_NAME.to_string(),
            _ => format!("{}/{name}.{}", self.dir(), self.extension()),
        }
    }

    /// The name of the file at `file_name` in the kind's directory, if it is one.
    pub(crate) fn name_of(self, file_name: &str) -> Option<&str> {
        match self {
            Self::Config => (file_name == CONFIG_NAME).then_some(file_name),
            _ => file_name
                .strip_suffix(self.extension())
                .and_then(|n| n.strip_suffix('.')),
        }
    }
}

/// A file's version as storage lists it: its length and a tag that changes when the
/// file is written again (an object's ETag, a file's modification time). Two files of
/// one name with equal versions are taken to be the same file (docs/design/remote.md,
/// "Local state and cache").
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct FileVersion {
    pub len: u64,
    pub tag: String,
}

/// The names of a versioned listing, in its order: `list` where one listing gives
/// versions too.
pub(crate) fn names_of(listing: Vec<(String, FileVersion)>) -> Vec<String> {
    listing.into_iter().map(|(n, _)| n).collect()
}

/// The names and lengths of a versioned listing, in its order: `list_sizes` where one
/// listing gives versions too.
pub(crate) fn sizes_of(listing: Vec<(String, FileVersion)>) -> Vec<(String, u64)> {
    listing.into_iter().map(|(n, v)| (n, v.len)).collect()
}

/// Storage of named files.
///
/// Invariants every implementation keeps:
/// - after `write` or `write_new` returns, the file's contents are durable and the file
///   is visible under its name complete or not at all;
/// - after `sync` returns, every earlier write of that kind survives a crash;
/// - errors that may pass if the same call is made again (a dropped connection, a
///   throttled or failing server) are [`StoreError::is_transient`], and no others.
pub trait Backend: Send + Sync {
    fn read(&self, kind: FileKind, name: &str) -> Result<Vec<u8>>;
    /// The bytes of each range of the file, one read per range, in the order given; an
    /// error if the file ends before a range does.
    fn read_ranges(
        &self,
        kind: FileKind,
        name: &str,
        ranges: &[Range<u64>],
    ) -> Result<Vec<Vec<u8>>>;
    /// The file's length in bytes.
    fn file_len(&self, kind: FileKind, name: &str) -> Result<u64>;
    /// Writes the file, replacing any file of that name.
    fn write(&self, kind: FileKind, name: &str, data: &[u8]) -> Result<()>;
    /// Writes the file unless one of that name exists: `Ok(false)`, and nothing
    /// written, if one does. Atomic: of two processes creating one name, one wins.
    fn write_new(&self, kind: FileKind, name: &str, data: &[u8]) -> Result<bool>;
    fn sync(&self, kind: FileKind) -> Result<()>;
    /// Names (without extension) of every file of `kind`, sorted.
    fn list(&self, kind: FileKind) -> Result<Vec<String>>;
    /// Names of every file of `kind` with their lengths, sorted by name.
    fn list_sizes(&self, kind: FileKind) -> Result<Vec<(String, u64)>> {
        self.list(kind)?
            .into_iter()
            .map(|name| {
                let len = self.file_len(kind, &name)?;
                Ok((name, len))
            })
            .collect()
    }
    /// Names of every file of `kind` with their versions, sorted by name. The default
    /// tags nothing (a length alone): a backend whose listing says more overrides it.
    fn list_versions(&self, kind: FileKind) -> Result<Vec<(String, FileVersion)>> {
        Ok(self
            .list_sizes(kind)?
            .into_iter()
            .map(|(name, len)| {
                let version = FileVersion {
                    len,
                    tag: String::new(),
                };
                (name, version)
            })
            .collect())
    }
    /// Removes the file; a missing file is no error.
    fn remove(&self, kind: FileKind, name: &str) -> Result<()>;
    /// Removes what killed writers left half-written; returns how many files. Nothing
    /// for storage whose writes are atomic by themselves (object stores).
    fn clean_tmp(&self) -> Result<usize> {
        Ok(0)
    }
    /// A local directory in which the repository lock is a kernel `flock`, if the
    /// repository is on a local file system; else locks are lock objects
    /// ([`FileKind::Lock`], docs/design/remote.md).
    fn flock_dir(&self) -> Option<&Path> {
        None
    }
    /// The repository's location, for messages: a path or a URL.
    fn location(&self) -> String;
    /// The name file `name` has in the repository that wrote it, which an encrypted
    /// repository's envelopes bind (docs/design/crypto.md, "Envelopes"): `name` itself,
    /// but for a backend that shows the files of several repositories under names of
    /// its own (a cluster's view, docs/design/crypto.md "Cluster").
    fn written_name<'a>(&self, _kind: FileKind, name: &'a str) -> &'a str {
        name
    }
}

/// Creates file `name` of `kind` (a container or an index segment, `what` in words)
/// with `data`, never replacing one: where one of that name exists with other bytes,
/// [`StoreError::NameTaken`], and that file stays as it was. One with the same bytes is
/// this write's own (a retried create whose first attempt succeeded unseen), or as
/// good as its own.
pub fn create_file(
    backend: &dyn Backend,
    kind: FileKind,
    name: &str,
    data: &[u8],
    what: &'static str,
) -> Result<()> {
    if backend.write_new(kind, name, data)? {
        return Ok(());
    }
    let same =
        backend.file_len(kind, name)? == data.len() as u64 && backend.read(kind, name)? == data;
    if same {
        return Ok(());
    }
    Err(StoreError::NameTaken {
        location: backend.location(),
        what,
        name: name.to_string(),
    })
}

/// A backend shows as its location (what holders of one, such as a lock, print).
impl std::fmt::Debug for dyn Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Backend({})", self.location())
    }
}

/// A shared backend is a backend (wrappers such as [`CachedBackend`] take either).
impl<T: Backend + ?Sized> Backend for std::sync::Arc<T> {
    fn read(&self, kind: FileKind, name: &str) -> Result<Vec<u8>> {
        (**self).read(kind, name)
    }

    fn read_ranges(
        &self,
        kind: FileKind,
        name: &str,
        ranges: &[Range<u64>],
    ) -> Result<Vec<Vec<u8>>> {
        (**self).read_ranges(kind, name, ranges)
    }

    fn file_len(&self, kind: FileKind, name: &str) -> Result<u64> {
        (**self).file_len(kind, name)
    }

    fn write(&self, kind: FileKind, name: &str, data: &[u8]) -> Result<()> {
        (**self).write(kind, name, data)
    }

    fn write_new(&self, kind: FileKind, name: &str, data: &[u8]) -> Result<bool> {
        (**self).write_new(kind, name, data)
    }

    fn sync(&self, kind: FileKind) -> Result<()> {
        (**self).sync(kind)
    }

    fn list(&self, kind: FileKind) -> Result<Vec<String>> {
        (**self).list(kind)
    }

    fn list_sizes(&self, kind: FileKind) -> Result<Vec<(String, u64)>> {
        (**self).list_sizes(kind)
    }

    fn list_versions(&self, kind: FileKind) -> Result<Vec<(String, FileVersion)>> {
        (**self).list_versions(kind)
    }

    fn remove(&self, kind: FileKind, name: &str) -> Result<()> {
        (**self).remove(kind, name)
    }

    fn clean_tmp(&self) -> Result<usize> {
        (**self).clean_tmp()
    }

    fn flock_dir(&self) -> Option<&Path> {
        (**self).flock_dir()
    }

    fn location(&self) -> String {
        (**self).location()
    }

    fn written_name<'a>(&self, kind: FileKind, name: &'a str) -> &'a str {
        (**self).written_name(kind, name)
    }
}

/// A repository in a local directory (see docs/design/format.md, "Layout").
#[derive(Debug)]
pub struct LocalBackend {
    root: PathBuf,
    tmp_counter: AtomicU64,
}

impl LocalBackend {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self {
            root: root.into(),
            tmp_counter: AtomicU64::new(0),
        }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn path_of(&self, kind: FileKind, name: &str) -> PathBuf {
        self.root.join(kind.relative_path(name))
    }

    fn tmp_path(&self) -> PathBuf {
        let n = self.tmp_counter.fetch_add(1, Ordering::Relaxed);
        self.root
            .join("tmp")
            .join(format!("{}-{n}.tmp", std::process::id()))
    }

    /// Writes `data` durably into a new file in `tmp/` and hands its path to `place`,
    /// which moves it into place; the file is removed if anything fails.
    fn write_via_tmp<T>(
        &self,
        kind: FileKind,
        name: &str,
        data: &[u8],
        place: impl Fn(&Path, &Path) -> std::io::Result<T>,
    ) -> Result<T> {
        let tmp = self.tmp_path();
        if let Err(e) = crate::direct::write_durable(&tmp, data) {
            let _ = fs::remove_file(&tmp);
            return Err(StoreError::io(&tmp, e));
        }
        let dest = self.path_of(kind, name);
        let mut placed = place(&tmp, &dest);
        if matches!(&placed, Err(e) if e.kind() == ErrorKind::NotFound) {
            // The kind's directory is made on its first file (keys/ in an encrypted
            // repository).
            if let Some(dir) = dest.parent() {
                create_private_dir(dir).map_err(|e| StoreError::io(dir, e))?;
                placed = place(&tmp, &dest);
            }
        }
        let _ = fs::remove_file(&tmp);
        placed.map_err(|e| StoreError::io(dest, e))
    }
}

/// The mode of every file larder makes in a repository, its cache and its local state:
/// private to its owner whatever the umask (restic's choice; the umask can only take
/// bits away).
pub const FILE_MODE: u32 = 0o600;
/// The mode of every directory larder makes there.
pub const DIR_MODE: u32 = 0o700;

/// Creates `dir` and its missing parents, each [`DIR_MODE`]; an existing directory
/// keeps its mode (its owner chose it).
pub fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(DIR_MODE)
        .create(dir)
}

/// Options that create a file of [`FILE_MODE`] (writing, not yet creating).
pub fn private_file_options() -> fs::OpenOptions {
    let mut options = fs::OpenOptions::new();
    options.write(true).mode(FILE_MODE);
    options
}

/// fsyncs a directory so that renames into it are durable.
pub(crate) fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| StoreError::io(dir, e))
}

impl Backend for LocalBackend {
    fn read(&self, kind: FileKind, name: &str) -> Result<Vec<u8>> {
        let path = self.path_of(kind, name);
        fs::read(&path).map_err(|e| StoreError::io(path, e))
    }

    fn read_ranges(
        &self,
        kind: FileKind,
        name: &str,
        ranges: &[Range<u64>],
    ) -> Result<Vec<Vec<u8>>> {
        let path = self.path_of(kind, name);
        let read = |f: &File| {
            ranges
                .iter()
                .map(|r| {
                    let mut buf = vec![0u8; (r.end - r.start) as usize];
                    f.read_exact_at(&mut buf, r.start)?;
                    Ok(buf)
                })
                .collect()
        };
        File::open(&path)
            .and_then(|f| read(&f))
            .map_err(|e| StoreError::io(path, e))
    }

    fn file_len(&self, kind: FileKind, name: &str) -> Result<u64> {
        let path = self.path_of(kind, name);
        fs::metadata(&path)
            .map(|m| m.len())
            .map_err(|e| StoreError::io(path, e))
    }

    fn write(&self, kind: FileKind, name: &str, data: &[u8]) -> Result<()> {
        self.write_via_tmp(kind, name, data, |tmp, dest| fs::rename(tmp, dest))
    }

    /// A hard link from `tmp/` to the name fails if the name exists: of two
    /// processes, one wins.
    fn write_new(&self, kind: FileKind, name: &str, data: &[u8]) -> Result<bool> {
        self.write_via_tmp(kind, name, data, |tmp, dest| {
            match fs::hard_link(tmp, dest) {
                Ok(()) => Ok(true),
                Err(e) if e.kind() == ErrorKind::AlreadyExists => Ok(false),
                Err(e) => Err(e),
            }
        })
    }

    /// A kind whose directory is missing has had nothing written to sync.
    fn sync(&self, kind: FileKind) -> Result<()> {
        let dir = self.root.join(kind.dir());
        match sync_dir(&dir) {
            Err(StoreError::Io { source, .. }) if source.kind() == ErrorKind::NotFound => Ok(()),
            synced => synced,
        }
    }

    /// A kind whose directory is missing has no files (keys/ of a plaintext
    /// repository, gc/ of one made before gc existed).
    fn list(&self, kind: FileKind) -> Result<Vec<String>> {
        let dir = self.root.join(kind.dir());
        let entries = match fs::read_dir(&dir) {
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Vec::new()),
            entries => entries.map_err(|e| StoreError::io(&dir, e))?,
        };
        let mut names = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|e| StoreError::io(&dir, e))?;
            if let Some(name) = entry.file_name().to_str().and_then(|n| kind.name_of(n)) {
                names.push(name.to_owned());
            }
        }
        names.sort();
        Ok(names)
    }

    fn remove(&self, kind: FileKind, name: &str) -> Result<()> {
        let path = self.path_of(kind, name);
        match fs::remove_file(&path) {
            Err(e) if e.kind() != ErrorKind::NotFound => Err(StoreError::io(path, e)),
            _ => Ok(()),
        }
    }

    fn clean_tmp(&self) -> Result<usize> {
        let tmp = self.root.join("tmp");
        create_private_dir(&tmp).map_err(|e| StoreError::io(&tmp, e))?;
        let mut removed = 0;
        for entry in fs::read_dir(&tmp).map_err(|e| StoreError::io(&tmp, e))? {
            let path = entry.map_err(|e| StoreError::io(&tmp, e))?.path();
            fs::remove_file(&path).map_err(|e| StoreError::io(&path, e))?;
            removed += 1;
        }
        Ok(removed)
    }

    fn flock_dir(&self) -> Option<&Path> {
        Some(&self.root)
    }

    fn location(&self) -> String {
        self.root.display().to_string()
    }
}
