//! The repository lock (docs/design/format.md, "Locking"): a kernel `flock` for a
//! repository in a local directory ([`flock`]), lock objects with an expiry for any
//! other storage ([`object`], docs/design/remote.md "Lock objects"). Both exclude the
//! same way: any number of shared holders, or one exclusive holder.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use crate::backend::Backend;
use crate::error::Result;

mod flock;
mod object;

pub use flock::FlockLock;
pub use object::{LockObject, ObjectLock, LOCK_REFRESH, LOCK_STALE_AFTER};

/// How often a waiting process tries the lock again.
pub(crate) const RETRY_INTERVAL: Duration = Duration::from_millis(100);
/// The longest command line a note keeps.
const MAX_COMMAND_LEN: usize = 400;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockMode {
    /// Readers: restore, check, snapshots, stats, ls, diff, cat.
    Shared,
    /// Writers: init, backup, forget, gc, rebuild-index.
    Exclusive,
}

/// The note an exclusive holder writes into the lock file (JSON).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockHolder {
    pub pid: u32,
    pub hostname: String,
    /// The holder's command line.
    pub command: String,
    /// When it took the lock, in seconds since the Unix epoch.
    pub started: u64,
}

impl LockHolder {
    /// This process.
    pub fn current() -> Self {
        // Lossily: an argument that is not UTF-8 (a path to back up) must not panic.
        let args: Vec<String> = std::env::args_os()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        let mut command = args.join(" ");
        if command.len() > MAX_COMMAND_LEN {
            let mut end = MAX_COMMAND_LEN;
            while !command.is_char_boundary(end) {
                end -= 1;
            }
            command.truncate(end);
            command.push_str("...");
        }
        Self {
            pid: std::process::id(),
            hostname: hostname(),
            command,
            started: unix_now(),
        }
    }

    /// Whether the holder's process still runs: `Some(false)` only when it ran on this
    /// host and its pid is gone; `None` when it ran on another host.
    pub fn is_alive(&self) -> Option<bool> {
        if self.hostname != hostname() {
            return None;
        }
        let Ok(pid) = libc::pid_t::try_from(self.pid) else {
            return Some(false);
        };
        // SAFETY: signal 0 only checks that `pid` exists and may be signalled.
        let r = unsafe { libc::kill(pid, 0) };
        Some(r == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM))
    }

    /// "pid 12 on host h (`larder gc`, for 3 s)".
    pub fn describe(&self) -> String {
        format!(
            "pid {} on host {} (`{}`, for {} s)",
            self.pid,
            self.hostname,
            self.command,
            unix_now().saturating_sub(self.started)
        )
    }
}

pub(crate) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

pub(crate) fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::fs::read_to_string("/etc/hostname"))
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// A held repository lock; dropping it releases the lock.
#[derive(Debug)]
pub enum RepoLock {
    Flock(FlockLock),
    Object(ObjectLock),
}

impl RepoLock {
    /// Takes the lock of the repository in `backend` in `mode`, trying again for up
    /// to `wait`: a `flock` where the backend has a local directory for one, else a
    /// lock object.
    pub fn acquire(backend: &Arc<dyn Backend>, mode: LockMode, wait: Duration) -> Result<Self> {
        match backend.flock_dir() {
            Some(dir) => FlockLock::acquire(dir, mode, wait).map(Self::Flock),
            None => ObjectLock::acquire(backend.clone(), mode, wait).map(Self::Object),
        }
    }

    /// Removes what killed processes left: the stale note of a `flock` lock, or the
    /// stale lock objects (whose holders are gone or stopped refreshing them).
    /// Returns their holders. A lock held by a running process is not removed: with a
    /// `flock`, the error names the holder.
    pub fn remove_stale(backend: &Arc<dyn Backend>) -> Result<Vec<LockHolder>> {
        match backend.flock_dir() {
            Some(dir) => Ok(FlockLock::remove_stale(dir)?.into_iter().collect()),
            None => object::remove_stale(&**backend),
        }
    }

    /// Whether the lock may no longer exclude others: a lock object that could not be
    /// refreshed in time. A writer stops before committing when it is lost.
    pub fn is_lost(&self) -> bool {
        match self {
            Self::Flock(_) => false,
            Self::Object(lock) => lock.is_lost(),
        }
    }
}
