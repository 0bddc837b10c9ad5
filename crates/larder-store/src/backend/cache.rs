//! A local cache of a remote repository's metadata (docs/design/remote.md, "Local
//! state and cache"): index segments, snapshots and key slots, which every command
//! reads and which are written once under their names, kept in a local directory so
//! that opening a repository downloads only what is new.
//!
//! Invariants:
//! - the backend behind decides: a listing always asks it, and entries it no longer
//!   lists are dropped from the cache (another machine's `forget` or `gc`);
//! - an entry is served only when the version recorded in it equals the version this
//!   process's latest listing gives for its name: a name alone does not identify a
//!   file (a copied bucket written to on both sides, storage rolled back and written
//!   again, both under one repository id and so one cache);
//! - an entry is the file's bytes, its version and a BLAKE3 hash of both; an entry
//!   whose hash does not match is damaged, removed, and read again from the backend.
//!   The repository verifies what it reads as always, so the cache adds no trust;
//! - in verifying mode (`check`) every read goes to the backend, and an entry that
//!   differs from what the backend holds is replaced and named in
//!   [`CachedBackend::refreshed`].

use std::collections::HashMap;
use std::fs;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use super::{Backend, FileKind, FileVersion};
use crate::error::{Result, StoreError};

/// The kinds the cache keeps.
const CACHED: [FileKind; 3] = [FileKind::IndexSegment, FileKind::Snapshot, FileKind::Key];
/// Bytes after an entry's data and version: its BLAKE3 hash.
const HASH_LEN: usize = 32;
/// The magic that ends an entry's version fields (before the hash).
const MAGIC: &[u8; 4] = b"LDC2";
/// Version length (8), tag length (2), flag (1) and magic (4).
const FIELDS_LEN: usize = 15;
/// The longest tag kept; a longer one is kept as no version (never served).
const MAX_TAG: usize = 1024;

/// `inner` with its metadata cached in `dir`.
pub struct CachedBackend<B> {
    inner: B,
    dir: PathBuf,
    tmp_counter: AtomicU64,
    /// This process's latest listing of each cached kind: each name's version.
    listed: Mutex<HashMap<FileKind, HashMap<String, FileVersion>>>,
    /// Files this process wrote through the cache, with their lengths, until a
    /// listing gives them a version.
    written: Mutex<HashMap<(FileKind, String), u64>>,
    /// Every read of a cached kind goes to the backend (`check`).
    verify: bool,
    /// Entries found damaged or differing from the backend's file, and replaced:
    /// their paths in the repository.
    refreshed: Mutex<Vec<String>>,
}

/// An intact entry: the file's bytes and the version they were read as, if known.
struct Entry {
    data: Vec<u8>,
    version: Option<FileVersion>,
}

/// What an entry's path holds.
enum Loaded {
    Intact(Entry),
    Missing,
    /// Damaged, and removed.
    Damaged,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
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
            listed: Mutex::default(),
            written: Mutex::default(),
            verify: false,
            refreshed: Mutex::default(),
        })
    }

    /// Like [`CachedBackend::new`], in verifying mode: every read of a cached kind
    /// goes to `inner`, and each entry that differs from what `inner` holds is
    /// replaced and named in [`CachedBackend::refreshed`] (`check`).
    pub fn verifying(inner: B, dir: impl Into<PathBuf>) -> Result<Self> {
        Ok(Self {
            verify: true,
            ..Self::new(inner, dir)?
        })
    }

    /// The repository paths (`index/<name>.idx`, ...) of the entries found damaged or
    /// differing from the backend's files so far, each replaced with the backend's
    /// bytes; in the order found.
    pub fn refreshed(&self) -> Vec<String> {
        lock(&self.refreshed).clone()
    }

    fn entry(&self, kind: FileKind, name: &str) -> Option<PathBuf> {
        CACHED
            .contains(&kind)
            .then(|| self.dir.join(kind.relative_path(name)))
    }

    /// The entry at `path`; a damaged one is removed.
    fn load(path: &Path) -> Loaded {
        let Ok(bytes) = fs::read(path) else {
            return Loaded::Missing;
        };
        match decode(bytes) {
            Some(entry) => Loaded::Intact(entry),
            None => {
                tracing::warn!(
                    "cache entry {} is damaged; reading it again",
                    path.display()
                );
                let _ = fs::remove_file(path);
                Loaded::Damaged
            }
        }
    }

    /// Keeps `data` at `path` as `version` of the file. Best effort: a cache that
    /// cannot be written only costs downloads.
    fn store(&self, path: &Path, data: &[u8], version: Option<&FileVersion>) {
        let n = self.tmp_counter.fetch_add(1, Ordering::Relaxed);
        let tmp = self
            .dir
            .join("tmp")
            .join(format!("{}-{n}.tmp", std::process::id()));
        let bytes = encode(data, version);
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

    /// The version of `name` in this process's latest listing of `kind`, listing the
    /// kind first if this process has not.
    fn listed_version(&self, kind: FileKind, name: &str) -> Result<Option<FileVersion>> {
        if !lock(&self.listed).contains_key(&kind) {
            self.list_versions(kind)?;
        }
        Ok(lock(&self.listed)
            .get(&kind)
            .and_then(|names| names.get(name).cloned()))
    }

    /// Forgets what this process knew of `name`'s version: it was written or removed.
    fn forget(&self, kind: FileKind, name: &str) {
        if let Some(names) = lock(&self.listed).get_mut(&kind) {
            names.remove(name);
        }
        lock(&self.written).remove(&(kind, name.to_string()));
    }

    /// Records `listing` (the backend's, of cached `kind`): drops the entries it no
    /// longer holds, and gives the files this process wrote their versions where the
    /// listing shows them with the length written.
    fn note_listing(&self, kind: FileKind, listing: &[(String, FileVersion)]) {
        self.prune(kind, listing);
        let names: HashMap<String, FileVersion> = listing.iter().cloned().collect();
        let adopted: Vec<(String, FileVersion)> = {
            let mut written = lock(&self.written);
            let mine: Vec<String> = written
                .keys()
                .filter(|(k, _)| *k == kind)
                .map(|(_, n)| n.clone())
                .collect();
            mine.into_iter()
                .filter_map(|name| {
                    let len = written.remove(&(kind, name.clone()))?;
                    let version = names.get(&name).filter(|v| v.len == len)?;
                    Some((name, version.clone()))
                })
                .collect()
        };
        for (name, version) in adopted {
            let Some(path) = self.entry(kind, &name) else {
                continue;
            };
            if let Loaded::Intact(e) = Self::load(&path) {
                if e.data.len() as u64 == version.len {
                    self.store(&path, &e.data, Some(&version));
                }
            }
        }
        lock(&self.listed).insert(kind, names);
    }

    /// Drops the entries of `kind` whose files `listing` (the backend's, sorted) no
    /// longer holds.
    fn prune(&self, kind: FileKind, listing: &[(String, FileVersion)]) {
        let Ok(entries) = fs::read_dir(self.dir.join(kind.dir())) else {
            return;
        };
        for entry in entries.flatten() {
            let file = entry.file_name();
            let Some(name) = file.to_str().and_then(|f| kind.name_of(f)) else {
                continue;
            };
            if listing
                .binary_search_by(|(n, _)| n.as_str().cmp(name))
                .is_err()
            {
                let _ = fs::remove_file(entry.path());
            }
        }
    }

    /// A read of cached `kind` in normal mode: the entry if it is the listed version.
    fn read_cached(&self, kind: FileKind, name: &str, path: &Path) -> Result<Vec<u8>> {
        let Some(version) = self.listed_version(kind, name)? else {
            // Not listed (written since the listing, or missing): nothing to bind an
            // entry to.
            return self.inner.read(kind, name);
        };
        if let Loaded::Intact(e) = Self::load(path) {
            if e.version.as_ref() == Some(&version) && e.data.len() as u64 == version.len {
                return Ok(e.data);
            }
        }
        let data = self.inner.read(kind, name)?;
        let version = Some(&version).filter(|v| v.len == data.len() as u64);
        self.store(path, &data, version);
        Ok(data)
    }

    /// A read of cached `kind` in verifying mode: the backend's bytes, which replace
    /// an entry that differs from them.
    fn read_verified(&self, kind: FileKind, name: &str, path: &Path) -> Result<Vec<u8>> {
        let data = self.inner.read(kind, name)?;
        let differs = match Self::load(path) {
            Loaded::Intact(e) => e.data != data,
            Loaded::Damaged => true,
            Loaded::Missing => false,
        };
        if differs {
            lock(&self.refreshed).push(kind.relative_path(name));
        }
        let version = lock(&self.listed)
            .get(&kind)
            .and_then(|names| names.get(name).cloned())
            .filter(|v| v.len == data.len() as u64);
        self.store(path, &data, version.as_ref());
        Ok(data)
    }
}

/// An entry's bytes: `data`, the version fields, the magic and the hash of all before
/// (docs/design/remote.md, "Local state and cache").
fn encode(data: &[u8], version: Option<&FileVersion>) -> Vec<u8> {
    let version = version.filter(|v| v.tag.len() <= MAX_TAG);
    let tag = version.map_or("", |v| v.tag.as_str());
    let mut bytes = Vec::with_capacity(data.len() + tag.len() + FIELDS_LEN + HASH_LEN);
    bytes.extend_from_slice(data);
    bytes.extend_from_slice(tag.as_bytes());
    bytes.extend_from_slice(&version.map_or(0, |v| v.len).to_le_bytes());
    bytes.extend_from_slice(&(tag.len() as u16).to_le_bytes());
    bytes.push(u8::from(version.is_some()));
    bytes.extend_from_slice(MAGIC);
    let hash = blake3::hash(&bytes);
    bytes.extend_from_slice(hash.as_bytes());
    bytes
}

/// The entry `bytes` hold, `None` if damaged. An older larder's entry (the file's
/// bytes and their hash) is intact without a version.
fn decode(mut bytes: Vec<u8>) -> Option<Entry> {
    let body_len = bytes.len().checked_sub(HASH_LEN)?;
    if blake3::hash(&bytes[..body_len]).as_bytes() != &bytes[body_len..] {
        return None;
    }
    bytes.truncate(body_len);
    let version = fields(&bytes);
    let data_len = match &version {
        Some((data_len, _)) => *data_len,
        None => body_len,
    };
    bytes.truncate(data_len);
    Some(Entry {
        data: bytes,
        version: version.and_then(|(_, v)| v),
    })
}

/// The data length and version of an entry's `body` (its bytes before the hash), if
/// it ends with the version fields.
fn fields(body: &[u8]) -> Option<(usize, Option<FileVersion>)> {
    let end = body.len().checked_sub(FIELDS_LEN)?;
    let f = &body[end..];
    if &f[11..] != MAGIC {
        return None;
    }
    let len = u64::from_le_bytes(f[..8].try_into().expect("8 bytes"));
    let tag_len = usize::from(u16::from_le_bytes(f[8..10].try_into().expect("2 bytes")));
    let data_len = end.checked_sub(tag_len)?;
    let version = match f[10] {
        0 => None,
        1 => {
            let tag = std::str::from_utf8(&body[data_len..end]).ok()?.to_string();
            Some(FileVersion { len, tag })
        }
        _ => return None,
    };
    Some((data_len, version))
}

impl<B: Backend> Backend for CachedBackend<B> {
    fn read(&self, kind: FileKind, name: &str) -> Result<Vec<u8>> {
        match self.entry(kind, name) {
            None => self.inner.read(kind, name),
            Some(path) if self.verify => self.read_verified(kind, name, &path),
            Some(path) => self.read_cached(kind, name, &path),
        }
    }

    fn read_ranges(
        &self,
        kind: FileKind,
        name: &str,
        ranges: &[Range<u64>],
    ) -> Result<Vec<Vec<u8>>> {
        self.inner.read_ranges(kind, name, ranges)
    }

    /// The listed length where this process listed the file (never the entry's).
    fn file_len(&self, kind: FileKind, name: &str) -> Result<u64> {
        let listed = lock(&self.listed)
            .get(&kind)
            .and_then(|names| names.get(name).map(|v| v.len));
        match listed {
            Some(len) if !self.verify => Ok(len),
            _ => self.inner.file_len(kind, name),
        }
    }

    fn write(&self, kind: FileKind, name: &str, data: &[u8]) -> Result<()> {
        self.inner.write(kind, name, data)?;
        self.kept_written(kind, name, data);
        Ok(())
    }

    fn write_new(&self, kind: FileKind, name: &str, data: &[u8]) -> Result<bool> {
        let written = self.inner.write_new(kind, name, data)?;
        if written {
            self.kept_written(kind, name, data);
        }
        Ok(written)
    }

    fn sync(&self, kind: FileKind) -> Result<()> {
        self.inner.sync(kind)
    }

    fn list(&self, kind: FileKind) -> Result<Vec<String>> {
        if !CACHED.contains(&kind) {
            return self.inner.list(kind);
        }
        Ok(super::names_of(self.list_versions(kind)?))
    }

    fn list_sizes(&self, kind: FileKind) -> Result<Vec<(String, u64)>> {
        if !CACHED.contains(&kind) {
            return self.inner.list_sizes(kind);
        }
        Ok(super::sizes_of(self.list_versions(kind)?))
    }

    fn list_versions(&self, kind: FileKind) -> Result<Vec<(String, FileVersion)>> {
        let listing = self.inner.list_versions(kind)?;
        if CACHED.contains(&kind) {
            self.note_listing(kind, &listing);
        }
        Ok(listing)
    }

    fn remove(&self, kind: FileKind, name: &str) -> Result<()> {
        self.inner.remove(kind, name)?;
        self.forget(kind, name);
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

impl<B: Backend> CachedBackend<B> {
    /// Keeps what this process wrote as `name`, without a version until a listing
    /// shows it (docs/design/remote.md, "Local state and cache").
    fn kept_written(&self, kind: FileKind, name: &str, data: &[u8]) {
        let Some(path) = self.entry(kind, name) else {
            return;
        };
        self.forget(kind, name);
        self.store(&path, data, None);
        lock(&self.written).insert((kind, name.to_string()), data.len() as u64);
    }
}

#[cfg(test)]
mod tests;
