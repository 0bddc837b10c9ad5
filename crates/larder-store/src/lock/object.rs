//! Lock objects (docs/design/remote.md, "Lock objects"): the lock of a repository on
//! storage without `flock` (object stores, SFTP). Each holder writes a
//! [`FileKind::Lock`] object naming itself and whether it is exclusive, rewrites it
//! every [`LOCK_REFRESH`] while it holds the lock, and removes it when done.
//!
//! Invariants:
//! - a holder holds the lock only after it wrote its object and then found no live
//!   conflicting object; otherwise it removes its object and waits. Two racers may
//!   both back off, never both hold.
//! - an object is stale, and excludes nothing, once its holder is known gone (same
//!   host, pid gone) or it was not refreshed for [`LOCK_STALE_AFTER`]. A holder that
//!   cannot refresh for `LOCK_STALE_AFTER - LOCK_REFRESH` counts its lock as lost
//!   ([`ObjectLock::is_lost`]) before anyone may take it as stale.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::{unix_now, LockHolder, LockMode};
use crate::backend::{Backend, FileKind};
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

/// The content of a lock object (JSON).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockObject {
    #[serde(flatten)]
    pub holder: LockHolder,
    pub exclusive: bool,
    /// When the holder last wrote the object, seconds since the Unix epoch.
    pub refreshed: u64,
}

impl LockObject {
    fn new(mode: LockMode) -> Self {
        Self {
            holder: LockHolder::current(),
            exclusive: mode == LockMode::Exclusive,
            refreshed: unix_now(),
        }
    }

    fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a lock object serializes")
    }

    /// Whether the holder is gone at `now` (seconds since the epoch): on this host
    /// with its pid gone, or not refreshed for [`LOCK_STALE_AFTER`].
    pub fn is_stale(&self, now: u64) -> bool {
        self.holder.is_alive() == Some(false)
            || now.saturating_sub(self.refreshed) > LOCK_STALE_AFTER.as_secs()
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

/// Every lock object but `own`, with its content or `None` if it does not parse.
/// Objects removed while listing, released ones, and names that are not lock objects'
/// (markers, probes: they hold a `-`) are left out.
fn read_all(backend: &dyn Backend, own: Option<&str>) -> Result<Vec<(String, Option<LockObject>)>> {
    let names = backend.list(FileKind::Lock)?;
    let released: std::collections::HashSet<&str> = names
        .iter()
        .filter_map(|n| n.strip_suffix(RELEASED))
        .collect();
    let mut out = Vec::new();
    for name in &names {
        if Some(name.as_str()) == own || name.contains('-') || released.contains(name.as_str()) {
            continue;
        }
        match backend.read(FileKind::Lock, name) {
            Ok(bytes) => out.push((name.clone(), serde_json::from_slice(&bytes).ok())),
            Err(StoreError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
            }
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

/// Why the lock cannot be taken in `mode` now, or `None` if it can: the first live
/// conflicting object. An object that does not parse conflicts (`larder unlock`
/// removes it).
fn blocker(backend: &dyn Backend, own: Option<&str>, mode: LockMode) -> Result<Option<String>> {
    let now = unix_now();
    for (name, object) in read_all(backend, own)? {
        match object {
            None => {
                return Ok(Some(format!(
                    "locked by lock object {name}, which is damaged"
                )))
            }
            Some(o) if o.conflicts_with(mode) && !o.is_stale(now) => {
                return Ok(Some(o.describe(now)))
            }
            Some(_) => {}
        }
    }
    Ok(None)
}

/// A held lock object, refreshed by a thread of its own until dropped.
#[derive(Debug)]
pub struct ObjectLock {
    backend: Arc<dyn Backend>,
    name: String,
    lost: Arc<AtomicBool>,
    stop: Option<mpsc::Sender<()>>,
    refresher: Option<JoinHandle<()>>,
}

impl ObjectLock {
    /// Takes the lock in `mode`, trying again for up to `wait` (at least
    /// `RACE_GRACE`).
    pub fn acquire(backend: Arc<dyn Backend>, mode: LockMode, wait: Duration) -> Result<Self> {
        let start = Instant::now();
        let deadline = start + wait.max(RACE_GRACE);
        let name = larder_crypto::random_id_hex(8);
        loop {
            let mut blocked = blocker(&*backend, None, mode)?;
            if blocked.is_none() {
                let object = LockObject::new(mode);
                backend.write(FileKind::Lock, &name, &object.encode())?;
                blocked = blocker(&*backend, Some(&name), mode)?;
                if blocked.is_none() {
                    return Ok(Self::start(backend, name, object));
                }
                backend.remove(FileKind::Lock, &name)?;
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

    fn start(backend: Arc<dyn Backend>, name: String, object: LockObject) -> Self {
        let lost = Arc::new(AtomicBool::new(false));
        let (stop, stopped) = mpsc::channel();
        let refresher = {
            let (backend, name, lost) = (backend.clone(), name.clone(), lost.clone());
            std::thread::Builder::new()
                .name("larder-lock-refresh".into())
                .spawn(move || refresh(&*backend, &name, object, &stopped, &lost))
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

/// Rewrites the lock object every [`LOCK_REFRESH`] until `stopped` says so.
fn refresh(
    backend: &dyn Backend,
    name: &str,
    mut object: LockObject,
    stopped: &mpsc::Receiver<()>,
    lost: &AtomicBool,
) {
    let mut last_written = Instant::now();
    let mut interval = LOCK_REFRESH;
    while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(interval) {
        object.refreshed = unix_now();
        match backend.write(FileKind::Lock, name, &object.encode()) {
            Ok(()) => {
                last_written = Instant::now();
                interval = LOCK_REFRESH;
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
        if let Some(thread) = self.refresher.take() {
            let _ = thread.join();
        }
        // Best effort: an object left behind goes stale (see the module's invariants).
        // Storage that refuses removals gets a release marker instead.
        if let Err(StoreError::Io { source, .. }) = self.backend.remove(FileKind::Lock, &self.name)
        {
            if source.kind() == std::io::ErrorKind::PermissionDenied {
                let marker = format!("{}{RELEASED}", self.name);
                let _ = self.backend.write_new(FileKind::Lock, &marker, b"");
            }
        }
    }
}

/// `d` plus up to half of it again, at random: racers that back off together do
/// not try again together.
fn jittered(d: Duration) -> Duration {
    let byte = u8::from_str_radix(&larder_crypto::random_id_hex(1), 16).unwrap_or(0);
    d + d.mul_f64(f64::from(byte) / 512.0)
}

/// Removes the stale lock objects and those that do not parse; returns the holders
/// of the stale ones.
pub(super) fn remove_stale(backend: &dyn Backend) -> Result<Vec<LockHolder>> {
    let now = unix_now();
    let mut removed = Vec::new();
    for (name, object) in read_all(backend, None)? {
        match object {
            Some(o) if !o.is_stale(now) => continue,
            Some(o) => removed.push(o.holder),
            None => {}
        }
        backend.remove(FileKind::Lock, &name)?;
    }
    Ok(removed)
}
