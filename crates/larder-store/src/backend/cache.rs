//! A local cache of a remote repository's metadata (docs/design/remote.md, "Local
//! cache"): index segments, snapshots and key slots, which every command reads and
//! which never change once written, kept in a local directory so that opening a
//! repository downloads only what is new.
//!
//! Invariants:
//! - the backend behind decides: a listing always asks it, and entries it no longer
//!   lists are dropped from the cache (another machine's `forget` or `gc`);
//! - a cache entry is the file's bytes followed by their BLAKE3 hash; an entry whose
//!   hash does not match is damaged, removed, and read again from the backend. The
//!   repository verifies what it reads as always, so the cache adds no trust.

use std::fs;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use super::{Backend, FileKind};
use crate::error::{Result, StoreError};

/// The kinds the cache keeps.
const CACHED: [FileKind; 3] = [FileKind::IndexSegment, FileKind::Snapshot, FileKind::Key];
/// Bytes after an entry's data: its BLAKE3 hash.
const HASH_LEN: usize = 32;

/// `inner` with its metadata cached in `dir`.
pub struct CachedBackend<B> {
    inner: B,
    dir: PathBuf,
    tmp_counter: AtomicU64,
}

impl<B: Backend> CachedBackend<B> {
    /// Caches `inner`'s metadata in `dir` (made if missing).
    pub fn new(inner: B, dir: impl Into<PathBuf>) -> Result<Self> {
        let dir = dir.into();
        for sub in CACHED.iter().map(|k| k.dir()).chain(["tmp"]) {
            let path = dir.join(sub);
            super::create_private_dir(&path).map_err(|e| StoreError::io(&path, e))?;
        }
        Ok(Self {
            inner,
            dir,
            tmp_counter: AtomicU64::new(0),
        })
    }

    fn entry(&self, kind: FileKind, name: &str) -> Option<PathBuf> {
        CACHED
            .contains(&kind)
            .then(|| self.dir.join(kind.relative_path(name)))
    }

    /// The cached bytes at `path`, if it holds an intact entry; a damaged one is
    /// removed.
    fn load(path: &Path) -> Option<Vec<u8>> {
        let mut bytes = fs::read(path).ok()?;
        let data_len = bytes.len().checked_sub(HASH_LEN);
        match data_len {
            Some(n) if blake3::hash(&bytes[..n]).as_bytes() == &bytes[n..] => {
                bytes.truncate(n);
                Some(bytes)
            }
            _ => {
                tracing::warn!(
                    "cache entry {} is damaged; reading it again",
                    path.display()
                );
                let _ = fs::remove_file(path);
                None
            }
        }
    }

    /// Keeps `data` at `path`. Best effort: a cache that cannot be written only costs
    /// downloads.
    fn store(&self, path: &Path, data: &[u8]) {
        let n = self.tmp_counter.fetch_add(1, Ordering::Relaxed);
        let tmp = self
            .dir
            .join("tmp")
            .join(format!("{}-{n}.tmp", std::process::id()));
        let mut bytes = Vec::with_capacity(data.len() + HASH_LEN);
        bytes.extend_from_slice(data);
        bytes.extend_from_slice(blake3::hash(data).as_bytes());
        let stored = super::private_file_options()
            .create_new(true)
            .open(&tmp)
            .and_then(|mut f| std::io::Write::write_all(&mut f, &bytes))
            .and_then(|()| fs::rename(&tmp, path));
        if let Err(e) = stored {
            let _ = fs::remove_file(&tmp);
            tracing::warn!("caching {}: {e}", path.display());
        }
    }

    /// Drops the entries of `kind` whose files `names` (the backend's listing, sorted)
    /// no longer holds.
    fn prune(&self, kind: FileKind, names: &[String]) {
        let Ok(entries) = fs::read_dir(self.dir.join(kind.dir())) else {
            return;
        };
        for entry in entries.flatten() {
            let file = entry.file_name();
            let Some(name) = file.to_str().and_then(|f| kind.name_of(f)) else {
                continue;
            };
            if names.binary_search_by(|n| n.as_str().cmp(name)).is_err() {
                let _ = fs::remove_file(entry.path());
            }
        }
    }
}

impl<B: Backend> Backend for CachedBackend<B> {
    fn read(&self, kind: FileKind, name: &str) -> Result<Vec<u8>> {
        let Some(path) = self.entry(kind, name) else {
            return self.inner.read(kind, name);
        };
        if let Some(data) = Self::load(&path) {
            return Ok(data);
        }
        let data = self.inner.read(kind, name)?;
        self.store(&path, &data);
        Ok(data)
    }

    fn read_ranges(
        &self,
        kind: FileKind,
        name: &str,
        ranges: &[Range<u64>],
    ) -> Result<Vec<Vec<u8>>> {
        self.inner.read_ranges(kind, name, ranges)
    }

    fn file_len(&self, kind: FileKind, name: &str) -> Result<u64> {
        match self.entry(kind, name).and_then(|p| Self::load(&p)) {
            Some(data) => Ok(data.len() as u64),
            None => self.inner.file_len(kind, name),
        }
    }

    fn write(&self, kind: FileKind, name: &str, data: &[u8]) -> Result<()> {
        self.inner.write(kind, name, data)?;
        if let Some(path) = self.entry(kind, name) {
            self.store(&path, data);
        }
        Ok(())
    }

    fn write_new(&self, kind: FileKind, name: &str, data: &[u8]) -> Result<bool> {
        let written = self.inner.write_new(kind, name, data)?;
        if let Some(path) = self.entry(kind, name).filter(|_| written) {
            self.store(&path, data);
        }
        Ok(written)
    }

    fn sync(&self, kind: FileKind) -> Result<()> {
        self.inner.sync(kind)
    }

    fn list(&self, kind: FileKind) -> Result<Vec<String>> {
        let names = self.inner.list(kind)?;
        if CACHED.contains(&kind) {
            self.prune(kind, &names);
        }
        Ok(names)
    }

    fn list_sizes(&self, kind: FileKind) -> Result<Vec<(String, u64)>> {
        let sizes = self.inner.list_sizes(kind)?;
        if CACHED.contains(&kind) {
            let names: Vec<String> = sizes.iter().map(|(n, _)| n.clone()).collect();
            self.prune(kind, &names);
        }
        Ok(sizes)
    }

    fn remove(&self, kind: FileKind, name: &str) -> Result<()> {
        self.inner.remove(kind, name)?;
        if let Some(path) = self.entry(kind, name) {
            let _ = fs::remove_file(path);
        }
        Ok(())
    }

    fn clean_tmp(&self) -> Result<usize> {
        self.inner.clean_tmp()
    }

    fn flock_dir(&self) -> Option<&Path> {
        self.inner.flock_dir()
    }

    fn location(&self) -> String {
        self.inner.location()
    }

    fn written_name<'a>(&self, kind: FileKind, name: &'a str) -> &'a str {
        self.inner.written_name(kind, name)
    }
}
