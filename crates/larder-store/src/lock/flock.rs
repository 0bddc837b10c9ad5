//! The lock of a repository in a local directory (docs/design/format.md, "Locking"):
//! `flock` on the `lock` file, plus a note of who holds it exclusively, so that a
//! refused process can say who is in the way.
//!
//! Invariant: the note never decides anything. Only the `flock` excludes; the kernel
//! drops it when its process dies, so a killed larder never leaves a lock that blocks.
//! A note left by a killed process is stale, recognised as such (its pid is gone) and
//! overwritten by the next exclusive holder.

use std::fs::{File, TryLockError};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;
use std::time::{Duration, Instant};

use crate::error::{Result, StoreError};

use super::{LockHolder, LockMode, RETRY_INTERVAL};

/// The note in a lock file; `None` if there is none or it does not parse.
fn read_holder(file: &mut File) -> Option<LockHolder> {
    let mut text = String::new();
    file.seek(SeekFrom::Start(0)).ok()?;
    file.read_to_string(&mut text).ok()?;
    serde_json::from_str(&text).ok()
}

/// Why the lock is busy, in words.
fn who_holds(file: &mut File, wanted: LockMode) -> String {
    let holder = read_holder(file);
    match holder.as_ref().map(|h| (h, h.is_alive())) {
        Some((h, Some(true))) => format!("locked by {}", h.describe()),
        Some((h, None)) => format!(
            "locked, perhaps by {} (another host: larder cannot tell whether it still runs)",
            h.describe()
        ),
        Some((h, Some(false))) if wanted == LockMode::Exclusive => format!(
            "locked by one or more readers (restore, check, ls, ...); the note of pid {} (`{}`) is stale: that process is gone",
            h.pid, h.command
        ),
        _ if wanted == LockMode::Exclusive => {
            "locked by one or more readers (restore, check, ls, ...)".to_string()
        }
        _ => "locked by a writer that has not recorded itself yet".to_string(),
    }
}

/// A held repository lock; dropping it releases the lock (an exclusive holder first
/// clears its note).
#[derive(Debug)]
pub struct FlockLock {
    file: File,
    mode: LockMode,
}

impl FlockLock {
    /// Takes the lock on `root/lock` in `mode`, trying again for up to `wait`.
    pub fn acquire(root: &Path, mode: LockMode, wait: Duration) -> Result<Self> {
        let path = root.join("lock");
        let mut file = crate::backend::private_file_options()
            .read(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| StoreError::io(&path, e))?;
        let deadline = Instant::now() + wait;
        loop {
            let locked = match mode {
                LockMode::Shared => file.try_lock_shared(),
                LockMode::Exclusive => file.try_lock(),
            };
            match locked {
                Ok(()) => break,
                Err(TryLockError::WouldBlock) => {
                    let now = Instant::now();
                    if now >= deadline {
                        return Err(StoreError::Locked {
                            path: root.to_path_buf(),
                            holder: who_holds(&mut file, mode),
                            waited: wait,
                        });
                    }
                    std::thread::sleep(RETRY_INTERVAL.min(deadline - now));
                }
                Err(TryLockError::Error(e)) => return Err(StoreError::io(path, e)),
            }
        }
        if mode == LockMode::Exclusive {
            let note = serde_json::to_vec(&LockHolder::current()).expect("a note serializes");
            file.set_len(0)
                .and_then(|()| file.seek(SeekFrom::Start(0)))
                .and_then(|_| file.write_all(&note))
                .map_err(|e| StoreError::io(&path, e))?;
        }
        Ok(Self { file, mode })
    }

    /// Clears a stale note (one whose process is gone) from `root/lock`, if the lock is
    /// free. Returns the note removed, or `None` if there was none. A lock held by a
    /// running process cannot be removed: the error names the holder.
    pub fn remove_stale(root: &Path) -> Result<Option<LockHolder>> {
        let mut lock = Self::acquire(root, LockMode::Shared, Duration::ZERO)?;
        let stale = read_holder(&mut lock.file);
        drop(lock);
        if stale.is_none() {
            return Ok(None);
        }
        // Exclusive briefly: the note is rewritten, and cleared on drop.
        drop(Self::acquire(root, LockMode::Exclusive, Duration::ZERO)?);
        Ok(stale)
    }
}

impl Drop for FlockLock {
    fn drop(&mut self) {
        if self.mode == LockMode::Exclusive {
            // Best effort: a note left behind is harmless (see the module's invariant).
            let _ = self.file.set_len(0);
        }
    }
}
