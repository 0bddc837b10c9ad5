//! The lock of a repository in a local directory (docs/design/format.md, "Locking"):
//! `flock` on the `lock` file, plus a note of who holds it exclusively, so that a
//! refused process can say who is in the way.
//!
//! Invariants:
//! - the note never decides anything. Only the `flock` excludes; the kernel drops it
//!   when its process dies, so a killed larder never leaves a lock that blocks. A note
//!   left by a killed process is stale, recognised as such (its pid is gone) and
//!   overwritten by the next exclusive holder.
//! - so a note that cannot be written (a full disk) fails nothing: the holder goes on
//!   with the lock, and says so ([`FlockLock::note_failure`]).
//! - a shared holder needs no write access: where `lock` cannot be opened for writing
//!   (a read-only mount, a repository the user may only read) it is opened read-only.

use std::fs::{File, TryLockError};
use std::io::{ErrorKind, Read, Seek, SeekFrom, Write};
use std::path::Path;
use std::time::{Duration, Instant};

use crate::error::{Result, StoreError};

use super::{LockHolder, LockMode, MAX_HOLDER_BYTES, RETRY_INTERVAL};

/// The note in a lock file; `None` if there is none or it does not parse. Reads at
/// most [`MAX_HOLDER_BYTES`].
fn read_holder(file: &mut File) -> Option<LockHolder> {
    let mut text = Vec::new();
    file.seek(SeekFrom::Start(0)).ok()?;
    file.take(MAX_HOLDER_BYTES).read_to_end(&mut text).ok()?;
    serde_json::from_slice(&text).ok()
}

/// Why the lock is busy, in words.
fn who_holds(file: &mut File, wanted: LockMode) -> String {
    let holder = read_holder(file);
    match holder.as_ref().map(|h| (h, h.is_alive())) {
        Some((h, Some(true))) => format!("locked by {}", h.describe()),
        Some((h, None)) => format!(
            "locked, perhaps by {} (another host, boot or pid namespace: larder cannot tell whether it still runs)",
            h.describe()
        ),
        Some((h, Some(false))) if wanted == LockMode::Exclusive => format!(
            "locked by one or more readers (restore, check, ls, ...); the note of {} is stale: that process is gone",
            h.describe()
        ),
        _ if wanted == LockMode::Exclusive => {
            "locked by one or more readers (restore, check, ls, ...)".to_string()
        }
        _ => "locked by a writer that has not recorded itself yet".to_string(),
    }
}

/// Opens `path` to lock it in `mode`: for reading and writing (created, 0600, if
/// missing), or for a shared lock read-only where writing is refused.
fn open_lock_file(path: &Path, mode: LockMode) -> Result<File> {
    let writable = crate::backend::private_file_options()
        .read(true)
        .create(true)
        .truncate(false)
        .open(path);
    match writable {
        Err(e) if mode == LockMode::Shared && is_write_refusal(&e) => {
            File::open(path).map_err(|e| match e.kind() {
                ErrorKind::NotFound => StoreError::io(
                    path,
                    std::io::Error::new(
                        e.kind(),
                        "the lock file is missing and cannot be made here (read-only storage): \
                         reading commands can run with --no-lock",
                    ),
                ),
                _ => StoreError::io(path, e),
            })
        }
        opened => opened.map_err(|e| StoreError::io(path, e)),
    }
}

/// Whether `e` refuses a write that a read may still be allowed: no permission, or a
/// read-only file system.
fn is_write_refusal(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        ErrorKind::PermissionDenied | ErrorKind::ReadOnlyFilesystem
    )
}

/// A held repository lock; dropping it releases the lock (an exclusive holder first
/// clears its note).
#[derive(Debug)]
pub struct FlockLock {
    file: File,
    mode: LockMode,
    /// Why the exclusive holder's note could not be written, if it could not.
    note_failure: Option<String>,
}

impl FlockLock {
    /// Takes the lock on `root/lock` in `mode`, trying again for up to `wait`.
    pub fn acquire(root: &Path, mode: LockMode, wait: Duration) -> Result<Self> {
        let path = root.join("lock");
        let mut file = open_lock_file(&path, mode)?;
        let deadline = Instant::now() + wait;
        loop {
            let locked = match mode {
                LockMode::Shared => file.try_lock_shared(),
                LockMode::Exclusive => file.try_lock(),
                LockMode::Unlocked => {
                    return Err(StoreError::Config(
                        "LockMode::Unlocked takes no lock (see RepoLock::acquire)".into(),
                    ))
                }
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
        let note_failure = match mode {
            LockMode::Exclusive => write_note(&mut file)
                .err()
                .map(|e| format!("{}: {e}", path.display())),
            _ => None,
        };
        Ok(Self {
            file,
            mode,
            note_failure,
        })
    }

    /// Why the note could not be written, if it could not: the lock is held all the
    /// same (only the `flock` excludes).
    pub fn note_failure(&self) -> Option<&str> {
        self.note_failure.as_deref()
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

/// Replaces the note in `file` with this process's.
fn write_note(file: &mut File) -> std::io::Result<()> {
    let note = serde_json::to_vec(&LockHolder::current()).expect("a note serializes");
    file.set_len(0)?;
    file.seek(SeekFrom::Start(0))?;
    file.write_all(&note)
}

impl Drop for FlockLock {
    fn drop(&mut self) {
        if self.mode == LockMode::Exclusive {
            // Best effort: a note left behind is harmless (see the module's invariant).
            let _ = self.file.set_len(0);
        }
    }
}
