//! Lock objects (docs/design/remote.md, "Lock objects"): the lock of a repository on
//! storage without `flock` (object stores, SFTP). Each holder writes a
//! [`FileKind::Lock`] object naming itself and whether it is exclusive (sealed with
//! the repository's keys in an encrypted repository), rewrites it every
//! [`LOCK_REFRESH`] while it holds the lock, and removes it when done.
//!
//! Invariants:
//! - an object that cannot be read (too large, damaged, or in an encrypted repository
//!   one that does not open with its key) is held: it conflicts with every mode, so
//!   neither damage nor the storage can make a lock look free or stale.
//! - a holder holds the lock only after it wrote its object and then found no live
//!   conflicting object; otherwise it removes its object and waits. Two racers may
//!   both back off, never both hold.
//! - an object whose holder larder can see (same host, boot and pid namespace) is
//!   stale exactly when that process is gone: clocks play no part. Any other object
//!   is stale once it was not refreshed for [`LOCK_STALE_AFTER`], or claims a refresh
//!   more than `LOCK_STALE_AFTER` ahead of this client's clock. A holder that
//!   cannot refresh for `LOCK_STALE_AFTER - LOCK_REFRESH` counts its lock as lost
//!   ([`ObjectLock::is_lost`]) before anyone may take it as stale; so does a holder
//!   whose object is gone or no longer its own when it reads it back to refresh it.
//! - objects are created create-only, under fresh names. Where the storage refuses to
//!   replace one, a refresh creates its successor before releasing it, so that the
//!   holder is never without a live object.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use larder_crypto::{ObjectKind, RepoKeys};
use serde::{Deserialize, Serialize};

use super::{unix_now, LockHolder, LockMode, Removal, RemovedLock, MAX_HOLDER_BYTES};
use crate::backend::{create_file, Backend, FileKind};
use crate::error::{Result, StoreError};

/// How often a holder rewrites its lock object (restic's interval).
pub const LOCK_REFRESH: Duration = Duration::from_secs(5 * 60);
/// How long after its last refresh a lock object is stale (restic's interval: it
/// allows for clocks that differ between machines by minutes).
pub const LOCK_STALE_AFTER: Duration = Duration::from_secs(30 * 60);
/// How often a waiting process lists the lock objects again.
const RETRY: Duration = Duration::from_millis(500);
/// How long a process tries at least, even with no `--retry-lock`: a racer that wrote
/// its object at the same moment backs off too, and is gone a moment later.
const RACE_GRACE: Duration = Duration::from_secs(2);
/// How soon a failed refresh is tried again.
const REFRESH_RETRY: Duration = Duration::from_secs(20);

/// The content of a lock object (JSON; sealed in an encrypted repository).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockObject {
    #[serde(flatten)]
    pub holder: LockHolder,
    pub exclusive: bool,
    /// When the holder last wrote the object, seconds since the Unix epoch.
    pub refreshed: u64,
}

/// The name a lock object's envelope binds: its 16 hex digits as a little-endian u64.
fn bound_name(name: &str) -> std::result::Result<[u8; 8], String> {
    u64::from_str_radix(name, 16)
        .map(u64::to_le_bytes)
        .map_err(|_| "its name is not a hex number".to_string())
}

impl LockObject {
    fn new(mode: LockMode) -> Self {
        Self {
            holder: LockHolder::current(),
            exclusive: mode == LockMode::Exclusive,
            refreshed: unix_now(),
        }
    }

    /// The bytes of lock object `name`: its JSON, in a metadata envelope (kind 10)
    /// when `keys` are given.
    pub fn encode(&self, name: &str, keys: Option<&RepoKeys>) -> Vec<u8> {
        let json = serde_json::to_vec(self).expect("a lock object serializes");
        match keys {
            None => json,
            Some(keys) => {
                let bound = bound_name(name).expect("lock objects are named by hex numbers");
                keys.seal_object(ObjectKind::LockObject, &bound, &json)
            }
        }
    }

    /// The lock object `name` in `bytes`, opened with `keys` when given; why not, if
    /// it is unreadable.
    pub fn decode(
        name: &str,
        bytes: &[u8],
        keys: Option<&RepoKeys>,
    ) -> std::result::Result<Self, String> {
        let opened;
        let json = match keys {
            None => bytes,
            Some(keys) => {
                opened = keys
                    .open_object(ObjectKind::LockObject, &bound_name(name)?, bytes)
                    .map_err(|e| {
                        format!(
                            "it does not open with this repository's key ({e}): damaged, \
                             not written by a holder of the key, or by a larder from before \
                             lock objects were sealed"
                        )
                    })?;
                &opened[..]
            }
        };
        serde_json::from_slice(json).map_err(|e| format!("it is not a lock object ({e})"))
    }

    /// Whether the holder is gone at `now` (seconds since the epoch, this client's
    /// clock). A holder that larder can see (this host, boot and pid namespace) is
    /// gone exactly when its process is, whatever the clocks say. Another one is gone
    /// when its object was not refreshed for [`LOCK_STALE_AFTER`], or claims a
    /// refresh more than `LOCK_STALE_AFTER` ahead of `now`: no clock that far ahead
    /// is trusted, so no time an object claims holds the lock for more than twice the
    /// bound past `now` (docs/design/remote.md, "Lock objects").
    pub fn is_stale(&self, now: u64) -> bool {
        match self.holder.is_alive() {
            Some(alive) => !alive,
            None => {
                let bound = LOCK_STALE_AFTER.as_secs();
                now.saturating_sub(self.refreshed) > bound
                    || self.refreshed.saturating_sub(now) > bound
            }
        }
    }

    /// Whether it excludes a process that wants the lock in `mode`.
    fn conflicts_with(&self, mode: LockMode) -> bool {
        self.exclusive || mode == LockMode::Exclusive
    }

    fn describe(&self, now: u64) -> String {
        let on_this_host = self.holder.is_alive().is_some();
        let expiry = (LOCK_STALE_AFTER.as_secs() + self.refreshed).saturating_sub(now);
        format!(
            "locked by {}{}",
            self.holder.describe(),
            if on_this_host {
                String::new()
            } else {
                format!("; it lapses in {expiry} s unless its holder refreshes it")
            }
        )
    }
}

/// The suffix of the marker a holder writes when the storage refused to remove its
/// lock object (append-only storage): `<lock name>-released`, a new object, which such
/// storage accepts. A lock object with its marker is released.
const RELEASED: &str = "-released";

/// Every lock object but `own`, with its content or why it is unreadable. Objects
/// removed while listing, released ones, and names that are not lock objects'
/// (markers, probes: they hold a `-`) are left out. No object larger than
/// [`MAX_HOLDER_BYTES`] is read.
#[allow(clippy::type_complexity)]
fn read_all(
    backend: &dyn Backend,
    own: Option<&str>,
    keys: Option<&RepoKeys>,
) -> Result<Vec<(String, std::result::Result<LockObject, String>)>> {
    let listed = backend.list_sizes(FileKind::Lock)?;
    let released: std::collections::HashSet<&str> = listed
        .iter()
        .filter_map(|(n, _)| n.strip_suffix(RELEASED))
        .collect();
    let mut out = Vec::new();
    for (name, len) in &listed {
        if Some(name.as_str()) == own || name.contains('-') || released.contains(name.as_str()) {
            continue;
        }
        if *len > MAX_HOLDER_BYTES {
            out.push((name.clone(), Err(format!("it is {len} bytes long"))));
            continue;
        }
        match backend.read(FileKind::Lock, name) {
            Ok(bytes) => out.push((name.clone(), LockObject::decode(name, &bytes, keys))),
            Err(StoreError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
            }
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

/// Why the lock cannot be taken in `mode` now, or `None` if it can: the first live
/// conflicting object. An unreadable object conflicts (`larder unlock` removes it).
fn blocker(
    backend: &dyn Backend,
    own: Option<&str>,
    mode: LockMode,
    keys: Option<&RepoKeys>,
) -> Result<Option<String>> {
    let now = unix_now();
    for (name, object) in read_all(backend, own, keys)? {
        match object {
            Err(why) => {
                return Ok(Some(format!(
                    "locked by lock object {name}, which cannot be read: {why} (`larder unlock` removes it)"
                )))
            }
            Ok(o) if o.conflicts_with(mode) && !o.is_stale(now) => {
                return Ok(Some(o.describe(now)))
            }
            Ok(_) => {}
        }
    }
    Ok(None)
}

/// A held lock object, refreshed by a thread of its own until dropped.
#[derive(Debug)]
pub struct ObjectLock {
    backend: Arc<dyn Backend>,
    /// The name its object was created under (the refresher may move it: see
    /// `Held::rewrite`).
    name: String,
    lost: Arc<AtomicBool>,
    stop: Option<mpsc::Sender<()>>,
    /// The refresher, which returns the name its object has when it stops.
    refresher: Option<JoinHandle<String>>,
}

impl ObjectLock {
    /// Takes the lock in `mode`, trying again for up to `wait` (at least
    /// `RACE_GRACE`); its object is sealed with `keys` in an encrypted repository.
    pub fn acquire(
        backend: Arc<dyn Backend>,
        mode: LockMode,
        wait: Duration,
        keys: Option<Arc<RepoKeys>>,
    ) -> Result<Self> {
        let start = Instant::now();
        let deadline = start + wait.max(RACE_GRACE);
        let k = keys.as_deref();
        loop {
            let mut blocked = blocker(&*backend, None, mode, k)?;
            if blocked.is_none() {
                let name = larder_crypto::random_id_hex(8);
                let object = LockObject::new(mode);
                create_file(
                    &*backend,
                    FileKind::Lock,
                    &name,
                    &object.encode(&name, k),
                    "lock object",
                )?;
                blocked = blocker(&*backend, Some(&name), mode, k)?;
                if blocked.is_none() {
                    return Ok(Self::start(backend, keys, name, object));
                }
                release(&*backend, &name)?;
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(StoreError::Locked {
                    path: backend.location().into(),
                    holder: blocked.unwrap_or_default(),
                    waited: wait,
                });
            }
            std::thread::sleep(jittered(RETRY).min(deadline - now));
        }
    }

    fn start(
        backend: Arc<dyn Backend>,
        keys: Option<Arc<RepoKeys>>,
        name: String,
        object: LockObject,
    ) -> Self {
        let lost = Arc::new(AtomicBool::new(false));
        let (stop, stopped) = mpsc::channel();
        let refresher = {
            let (backend, keys, name, lost) =
                (backend.clone(), keys.clone(), name.clone(), lost.clone());
            std::thread::Builder::new()
                .name("larder-lock-refresh".into())
                .spawn(move || {
                    let mut held = Held {
                        backend: &*backend,
                        keys: keys.as_deref(),
                        name,
                    };
                    refresh(&mut held, object, &stopped, &lost);
                    held.name
                })
                .ok()
        };
        // Without its thread the lock cannot be kept: count it lost from the start.
        lost.store(refresher.is_none(), Ordering::Relaxed);
        Self {
            backend,
            name,
            lost,
            stop: Some(stop),
            refresher,
        }
    }

    /// Whether refreshing failed for so long that others may take the lock as stale.
    pub fn is_lost(&self) -> bool {
        self.lost.load(Ordering::Relaxed)
    }
}

/// A held lock object as its refresher sees it.
struct Held<'a> {
    backend: &'a dyn Backend,
    keys: Option<&'a RepoKeys>,
    /// Its name now: a new one after each refresh on storage that refuses to replace
    /// a file.
    name: String,
}

impl Held<'_> {
    /// Whether the object under the holder's name is still its own (carries its
    /// nonce); an error if it could not be read for now.
    fn still_own(&self, nonce: &str) -> Result<bool> {
        match self.backend.read(FileKind::Lock, &self.name) {
            Ok(bytes) => Ok(LockObject::decode(&self.name, &bytes, self.keys)
                .is_ok_and(|o| o.holder.nonce == nonce)),
            Err(StoreError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }

    /// Writes `object` over the holder's object. Where the storage refuses to replace
    /// a file (an account that refuses overwrites, docs/design/sftp.md), writes it
    /// under a new name instead and releases the old one: the holder's lock never
    /// lapses in between.
    fn rewrite(&mut self, object: &LockObject) -> Result<()> {
        let bytes = object.encode(&self.name, self.keys);
        match self.backend.write(FileKind::Lock, &self.name, &bytes) {
            Err(StoreError::Io { source, .. })
                if source.kind() == std::io::ErrorKind::PermissionDenied =>
            {
                let next = larder_crypto::random_id_hex(8);
                let bytes = object.encode(&next, self.keys);
                create_file(self.backend, FileKind::Lock, &next, &bytes, "lock object")?;
                let old = std::mem::replace(&mut self.name, next);
                release(self.backend, &old)
            }
            written => written,
        }
    }
}

/// Removes lock object `name`; where the storage refuses removals (append-only
/// storage), writes its release marker instead.
fn release(backend: &dyn Backend, name: &str) -> Result<()> {
    match backend.remove(FileKind::Lock, name) {
        Err(StoreError::Io { source, .. })
            if source.kind() == std::io::ErrorKind::PermissionDenied =>
        {
            let marker = format!("{name}{RELEASED}");
            backend.write_new(FileKind::Lock, &marker, b"").map(drop)
        }
        removed => removed,
    }
}

/// Rewrites the lock object every [`LOCK_REFRESH`] until `stopped` says so, after
/// reading it back: an object gone or replaced means others may hold the lock, which
/// is then lost for good.
fn refresh(
    held: &mut Held,
    mut object: LockObject,
    stopped: &mpsc::Receiver<()>,
    lost: &AtomicBool,
) {
    let mut last_written = Instant::now();
    let mut interval = LOCK_REFRESH;
    while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(interval) {
        object.refreshed = unix_now();
        let refreshed = held.still_own(&object.holder.nonce).and_then(|own| {
            if own {
                held.rewrite(&object)?;
            }
            Ok(own)
        });
        let name = &held.name;
        match refreshed {
            Ok(true) => {
                last_written = Instant::now();
                interval = LOCK_REFRESH;
            }
            Ok(false) => {
                tracing::warn!(
                    "lock object {name} was removed or replaced by another process: the lock is lost"
                );
                lost.store(true, Ordering::Relaxed);
                return;
            }
            Err(e) => {
                tracing::warn!("refreshing lock object {name}: {}", crate::error_chain(&e));
                interval = REFRESH_RETRY;
                if last_written.elapsed() > LOCK_STALE_AFTER - LOCK_REFRESH {
                    lost.store(true, Ordering::Relaxed);
                }
            }
        }
    }
}

impl Drop for ObjectLock {
    fn drop(&mut self) {
        drop(self.stop.take());
        let name = match self.refresher.take().map(JoinHandle::join) {
            Some(Ok(name)) => name,
            _ => self.name.clone(),
        };
        // Best effort: an object left behind goes stale (see the module's invariants).
        let _ = release(&*self.backend, &name);
    }
}

/// `d` plus up to half of it again, at random: racers that back off together do
/// not try again together.
fn jittered(d: Duration) -> Duration {
    let byte = u8::from_str_radix(&larder_crypto::random_id_hex(1), 16).unwrap_or(0);
    d + d.mul_f64(f64::from(byte) / 512.0)
}

/// Removes the stale lock objects and the unreadable ones (opened with `keys` in an
/// encrypted repository), and with `all` every other one too, live holders' included.
/// Returns what it removed and the holders whose objects it left.
pub(super) fn remove(backend: &dyn Backend, keys: Option<&RepoKeys>, all: bool) -> Result<Removal> {
    let now = unix_now();
    let mut out = Removal::default();
    for (name, object) in read_all(backend, None, keys)? {
        out.removed.push(match object {
            Ok(o) if !o.is_stale(now) && !all => {
                out.kept.push(o.holder);
                continue;
            }
            Ok(o) if !o.is_stale(now) => RemovedLock::Live(o.holder),
            Ok(o) => RemovedLock::Stale(o.holder),
            Err(why) => RemovedLock::Unreadable {
                name: name.clone(),
                why,
            },
        });
        backend.remove(FileKind::Lock, &name)?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::LocalBackend;

    /// What the refresher checks before it rewrites its object: that the object under
    /// its name is still there and still its own.
    #[test]
    fn a_holder_knows_its_object_gone_or_replaced() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("tmp")).unwrap();
        let backend = LocalBackend::new(dir.path());
        let keys = RepoKeys::generate(
            [9; 16],
            larder_crypto::AeadKind::Aes256Gcm,
            larder_crypto::FingerprintKind::KeyedBlake3,
        );
        for keys in [None, Some(&keys)] {
            let held = Held {
                backend: &backend,
                keys,
                name: "00000000000000f1".into(),
            };
            let own = LockObject::new(LockMode::Exclusive);
            let nonce = own.holder.nonce.clone();
            backend
                .write(FileKind::Lock, &held.name, &own.encode(&held.name, keys))
                .unwrap();
            assert!(held.still_own(&nonce).unwrap());
            let other = LockObject::new(LockMode::Exclusive);
            backend
                .write(FileKind::Lock, &held.name, &other.encode(&held.name, keys))
                .unwrap();
            assert!(!held.still_own(&nonce).unwrap(), "replaced");
            backend.remove(FileKind::Lock, &held.name).unwrap();
            assert!(!held.still_own(&nonce).unwrap(), "removed");
        }
    }
    /// Storage that refuses to replace or remove a file (the SFTP account that refuses
    /// overwrites), over a local directory.
    struct NoOverwrites(LocalBackend);

    fn refused() -> StoreError {
        StoreError::io(
            "refused",
            std::io::Error::from(std::io::ErrorKind::PermissionDenied),
        )
    }

    impl Backend for NoOverwrites {
        fn read(&self, kind: FileKind, name: &str) -> Result<Vec<u8>> {
            self.0.read(kind, name)
        }
        fn read_ranges(
            &self,
            kind: FileKind,
            name: &str,
            ranges: &[std::ops::Range<u64>],
        ) -> Result<Vec<Vec<u8>>> {
            self.0.read_ranges(kind, name, ranges)
        }
        fn file_len(&self, kind: FileKind, name: &str) -> Result<u64> {
            self.0.file_len(kind, name)
        }
        fn write(&self, _: FileKind, _: &str, _: &[u8]) -> Result<()> {
            Err(refused())
        }
        fn write_new(&self, kind: FileKind, name: &str, data: &[u8]) -> Result<bool> {
            self.0.write_new(kind, name, data)
        }
        fn sync(&self, kind: FileKind) -> Result<()> {
            self.0.sync(kind)
        }
        fn list(&self, kind: FileKind) -> Result<Vec<String>> {
            self.0.list(kind)
        }
        fn remove(&self, _: FileKind, _: &str) -> Result<()> {
            Err(refused())
        }
        fn location(&self) -> String {
            "no-overwrites".into()
        }
    }

    /// Where the storage refuses to replace a file, a refresh writes the object under
    /// a new name and releases the old one: the holder holds the lock all along, and
    /// others see one live object.
    #[test]
    fn a_refresh_that_may_not_replace_moves_the_object_to_a_new_name() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("tmp")).unwrap();
        let backend = NoOverwrites(LocalBackend::new(dir.path()));
        let object = LockObject::new(LockMode::Exclusive);
        let first = "00000000000000f2";
        create_file(
            &backend,
            FileKind::Lock,
            first,
            &object.encode(first, None),
            "lock",
        )
        .unwrap();
        let mut held = Held {
            backend: &backend,
            keys: None,
            name: first.into(),
        };
        held.rewrite(&object).unwrap();
        assert_ne!(held.name, first);
        assert!(held.still_own(&object.holder.nonce).unwrap());
        let live: Vec<String> = read_all(&backend, None, None)
            .unwrap()
            .into_iter()
            .map(|(name, _)| name)
            .collect();
        assert_eq!(live, [held.name.clone()]);
        assert!(
            blocker(&backend, Some(&held.name), LockMode::Exclusive, None)
                .unwrap()
                .is_none()
        );
        assert!(blocker(&backend, None, LockMode::Shared, None)
            .unwrap()
            .is_some());
    }
}
