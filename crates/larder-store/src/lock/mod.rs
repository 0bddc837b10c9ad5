//! The repository lock (docs/design/format.md, "Locking"): a kernel `flock` for a
//! repository in a local directory ([`flock`]), lock objects with an expiry for any
//! other storage ([`object`], docs/design/remote.md "Lock objects"). Both exclude the
//! same way: any number of shared holders, or one exclusive holder.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use larder_crypto::RepoKeys;
use serde::{Deserialize, Serialize};

use crate::backend::Backend;
use crate::error::Result;
use crate::names::escape_name;

mod flock;
mod object;

pub use flock::FlockLock;
pub use object::{LockObject, ObjectLock, LOCK_REFRESH, LOCK_STALE_AFTER};

/// How often a waiting process tries the lock again.
pub(crate) const RETRY_INTERVAL: Duration = Duration::from_millis(100);
/// The most bytes of a lock note or lock object read: a hostile file cannot make
/// larder read more.
pub(crate) const MAX_HOLDER_BYTES: u64 = 64 << 10;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockMode {
    /// Readers: restore, check, snapshots, stats, ls, diff, cat.
    Shared,
    /// Writers: init, backup, forget, gc, rebuild-index.
    Exclusive,
    /// Readers that take no lock at all (`--no-lock`), for storage where none can be
    /// taken: nothing keeps a writer from deleting what they read meanwhile.
    Unlocked,
}

/// Who holds a lock (docs/design/format.md, "Locking"; remote.md, "Lock objects"):
/// what judging staleness needs and nothing more. Never the command line, which may
/// hold a `--password-command` and its secrets.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockHolder {
    pub pid: u32,
    pub hostname: String,
    /// Its user's name, else its uid in decimal; empty in a note from before.
    #[serde(default)]
    pub username: String,
    /// When it took the lock, in seconds since the Unix epoch.
    pub started: u64,
    /// 32 hex digits drawn when it took the lock: tells two holders apart that show
    /// the same host and pid, so a holder knows its own lock object when it reads it
    /// back. Empty in a note from before.
    #[serde(default)]
    pub nonce: String,
    /// Which pids its pid is one of: the host's boot id and the holder's pid
    /// namespace ([`boot`]). Empty in a note from before, or where /proc is missing.
    #[serde(default)]
    pub boot: String,
    /// When its process started, in clock ticks since boot (`/proc/<pid>/stat`): a
    /// live pid that started at another time is another process that reused the pid.
    /// 0 where unknown.
    #[serde(default)]
    pub pid_start: u64,
}

impl LockHolder {
    /// This process, taking a lock now.
    pub fn current() -> Self {
        let pid = std::process::id();
        Self {
            pid,
            hostname: hostname(),
            username: username(),
            started: unix_now(),
            nonce: larder_crypto::random_id_hex(16),
            boot: boot(),
            pid_start: process_start(pid).unwrap_or(0),
        }
    }

    /// Whether the holder's process still runs, whatever any clock says: `None` when
    /// it ran on another host, in another boot or another pid namespace (larder cannot
    /// see its pid from here); else whether its pid exists and, where the holder
    /// recorded its start time, still belongs to the process that started then.
    pub fn is_alive(&self) -> Option<bool> {
        if self.hostname != hostname() || (!self.boot.is_empty() && self.boot != boot()) {
            return None;
        }
        let Ok(pid) = libc::pid_t::try_from(self.pid) else {
            return Some(false);
        };
        // SAFETY: signal 0 only checks that `pid` exists and may be signalled.
        let r = unsafe { libc::kill(pid, 0) };
        let exists = r == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM);
        let reused = self.pid_start != 0
            && !self.boot.is_empty()
            && process_start(self.pid).is_some_and(|start| start != self.pid_start);
        Some(exists && !reused)
    }

    /// "pid 12 of root on host h (for 3 s)", names with control characters escaped
    /// (a plaintext repository's lock object is the storage's to write).
    pub fn describe(&self) -> String {
        let user = match self.username.as_str() {
            "" => String::new(),
            name => format!(" of {}", escape_name(name.as_bytes())),
        };
        format!(
            "pid {}{user} on host {} (for {} s)",
            self.pid,
            escape_name(self.hostname.as_bytes()),
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

/// Which pids this process sees: the boot id (`/proc/sys/kernel/random/boot_id`, new
/// at each boot) and its pid namespace (the link `/proc/self/ns/pid`), joined by a
/// space; empty if either is unknown. Two processes that show one host name and one
/// `boot` see the same pid as the same process.
pub(crate) fn boot() -> String {
    let id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id");
    let ns = std::fs::read_link("/proc/self/ns/pid");
    match (id, ns) {
        (Ok(id), Ok(ns)) => format!("{} {}", id.trim(), ns.display()),
        _ => String::new(),
    }
}

/// When process `pid` started, in clock ticks since boot: field 22 of
/// `/proc/<pid>/stat`; `None` if it is gone or the field cannot be read.
fn process_start(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // "PID (COMM) STATE ...": COMM may hold spaces and parentheses, so count from
    // the last ')'; the state is field 3, the start time field 22.
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// This process's user's name in the password database, else its uid in decimal.
fn username() -> String {
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    match crate::accounts::user_name(uid) {
        name if name.is_empty() => uid.to_string(),
        name => String::from_utf8_lossy(&name).into_owned(),
    }
}

/// What `larder unlock` removed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum RemovedLock {
    /// A lock whose holder is gone (or stopped refreshing it).
    Stale(LockHolder),
    /// A lock object that could not be read: too large, damaged, not a lock object,
    /// or in an encrypted repository one that does not open with its key.
    Unreadable { name: String, why: String },
    /// A lock object whose holder may still run (removed only when asked to remove
    /// every lock: `larder unlock --remove-all`).
    Live(LockHolder),
}

/// What removing locks did: what it removed, and the holders it left, whose locks
/// still exclude others.
#[derive(Debug, Default, Serialize)]
pub struct Removal {
    pub removed: Vec<RemovedLock>,
    pub kept: Vec<LockHolder>,
}

/// A held repository lock; dropping it releases the lock.
#[derive(Debug)]
pub enum RepoLock {
    Flock(FlockLock),
    Object(ObjectLock),
    /// No lock was taken ([`LockMode::Unlocked`]).
    Unlocked,
}

impl RepoLock {
    /// Takes the lock of the repository in `backend` in `mode`, trying again for up
    /// to `wait`: a `flock` where the backend has a local directory for one, else a
    /// lock object, sealed with `keys` in an encrypted repository.
    pub fn acquire(
        backend: &Arc<dyn Backend>,
        mode: LockMode,
        wait: Duration,
        keys: Option<&Arc<RepoKeys>>,
    ) -> Result<Self> {
        if mode == LockMode::Unlocked {
            return Ok(Self::Unlocked);
        }
        match backend.flock_dir() {
            Some(dir) => FlockLock::acquire(dir, mode, wait).map(Self::Flock),
            None => {
                ObjectLock::acquire(backend.clone(), mode, wait, keys.cloned()).map(Self::Object)
            }
        }
    }

    /// Removes what killed processes left: the stale note of a `flock` lock, or the
    /// stale and unreadable lock objects (whose holders are gone or stopped
    /// refreshing them; `keys` open an encrypted repository's), and with `all` every
    /// lock object, live holders' included (for a holder known gone that the storage
    /// cannot show gone: another host's, or one whose clock claims a time to come).
    /// A lock held by a running process is never removed from a local repository: a
    /// `flock` ends with its process, and the error names the holder.
    pub fn remove_stale(
        backend: &Arc<dyn Backend>,
        keys: Option<&RepoKeys>,
        all: bool,
    ) -> Result<Removal> {
        match backend.flock_dir() {
            Some(dir) => Ok(Removal {
                removed: FlockLock::remove_stale(dir)?
                    .into_iter()
                    .map(RemovedLock::Stale)
                    .collect(),
                kept: Vec::new(),
            }),
            None => object::remove(&**backend, keys, all),
        }
    }

    /// Whether the lock may no longer exclude others: a lock object that could not be
    /// refreshed in time, or that another process removed. A writer stops before
    /// committing when it is lost.
    pub fn is_lost(&self) -> bool {
        match self {
            Self::Flock(_) | Self::Unlocked => false,
            Self::Object(lock) => lock.is_lost(),
        }
    }

    /// Why the holder's note could not be written, if it could not (a full disk):
    /// the lock is held all the same.
    pub fn note_failure(&self) -> Option<&str> {
        match self {
            Self::Flock(lock) => lock.note_failure(),
            _ => None,
        }
    }
}
