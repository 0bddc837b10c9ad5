//! The narrow I/O interface below the repository, and its local-directory implementation.

use std::fs::{self, File};
use std::io::ErrorKind;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{Result, StoreError};

#[cfg(feature = "object-store")]
mod object;

#[cfg(feature = "object-store")]
pub use object::{parse_s3_url, ObjectBackend};

/// The kinds of immutable files a repository holds, each in its own directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FileKind {
    Container,
    IndexSegment,
    Snapshot,
    /// A garbage collection's plan (docs/design/gc.md).
    GcPlan,
}

impl FileKind {
    pub const ALL: [FileKind; 4] = [
        Self::Container,
        Self::IndexSegment,
        Self::Snapshot,
        Self::GcPlan,
    ];

    pub fn dir(self) -> &'static str {
        match self {
            Self::Container => "containers",
            Self::IndexSegment => "index",
            Self::Snapshot => "snapshots",
            Self::GcPlan => "gc",
        }
    }

    pub fn extension(self) -> &'static str {
        match self {
            Self::Container => "ctr",
            Self::IndexSegment => "idx",
            Self::Snapshot => "snap",
            Self::GcPlan => "plan",
        }
    }
}

/// Storage of named, immutable files.
///
/// Invariant every implementation keeps: after `write` returns, the file's contents are
/// durable and the file is visible under its name complete or not at all; after `sync`
/// returns, every earlier `write` of that kind survives a crash.
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
    fn write(&self, kind: FileKind, name: &str, data: &[u8]) -> Result<()>;
    fn sync(&self, kind: FileKind) -> Result<()>;
    /// Names (without extension) of every file of `kind`, sorted.
    fn list(&self, kind: FileKind) -> Result<Vec<String>>;
    fn remove(&self, kind: FileKind, name: &str) -> Result<()>;
    /// The name file `name` has in the repository that wrote it, which an encrypted
    /// repository's envelopes bind (docs/design/crypto.md, "Envelopes"): `name` itself,
    /// but for a backend that shows the files of several repositories under names of
    /// its own (a cluster's view, docs/design/crypto.md "Cluster").
    fn written_name<'a>(&self, _kind: FileKind, name: &'a str) -> &'a str {
        name
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
        self.root
            .join(kind.dir())
            .join(format!("{name}.{}", kind.extension()))
    }

    fn tmp_path(&self) -> PathBuf {
        let n = self.tmp_counter.fetch_add(1, Ordering::Relaxed);
        self.root
            .join("tmp")
            .join(format!("{}-{n}.tmp", std::process::id()))
    }
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
        let tmp = self.tmp_path();
        if let Err(e) = crate::direct::write_durable(&tmp, data) {
            let _ = fs::remove_file(&tmp);
            return Err(StoreError::io(&tmp, e));
        }
        let dest = self.path_of(kind, name);
        fs::rename(&tmp, &dest).map_err(|e| StoreError::io(dest, e))
    }

    fn sync(&self, kind: FileKind) -> Result<()> {
        sync_dir(&self.root.join(kind.dir()))
    }

    fn list(&self, kind: FileKind) -> Result<Vec<String>> {
        let dir = self.root.join(kind.dir());
        let suffix = format!(".{}", kind.extension());
        let mut names = Vec::new();
        for entry in fs::read_dir(&dir).map_err(|e| StoreError::io(&dir, e))? {
            let entry = entry.map_err(|e| StoreError::io(&dir, e))?;
            if let Some(name) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.strip_suffix(&suffix))
            {
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
}
