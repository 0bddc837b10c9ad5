//! The one error type of the store.

use std::io;
use std::path::PathBuf;

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// Everything that can go wrong in the repository.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    #[error("{}", path.display())]
    Io { path: PathBuf, source: io::Error },
    #[error("{} is not a larder repository (no config file); create one with `larder init`", .0.display())]
    NotARepository(PathBuf),
    /// The object store answered that the bucket itself does not exist.
    #[error("{0}: the bucket does not exist; create it with the storage's own tools (larder creates no buckets), or check its name")]
    NoSuchBucket(String),
    #[error("{} already exists and is not empty; refusing to create a repository there", .0.display())]
    AlreadyExists(PathBuf),
    #[error("corrupt {what} {name}: {reason}")]
    Corrupt {
        what: &'static str,
        name: String,
        reason: String,
    },
    #[error(
        "{what} format version {version} is not supported by this larder (it reads {supported})"
    )]
    UnsupportedVersion {
        /// "repository", "container", "index segment" or "snapshot".
        what: &'static str,
        version: u64,
        /// The versions this larder reads, in words.
        supported: &'static str,
    },
    #[error("repository {} is {holder}{}", path.display(), waited_advice(*.waited))]
    Locked {
        path: PathBuf,
        /// Who holds the lock, in words.
        holder: String,
        /// How long this process waited for it.
        waited: std::time::Duration,
    },
    #[error("{what} {name} already exists in repository {location} with other contents: another writer is using the repository at the same time (a lock taken for stale, or no lock); nothing was overwritten, and this writer stops here without committing")]
    NameTaken {
        location: String,
        what: &'static str,
        name: String,
    },
    #[error("the lock of repository {} could not be refreshed for so long that others may take it as stale; stopped before committing", .0.display())]
    LockLost(PathBuf),
    #[error("the storage of repository {location} refuses deletes (append-only): cannot {action}; run it with credentials that may delete (docs/design/remote.md, \"Append-only storage\")")]
    DeletesRefused {
        location: String,
        /// What could not run, in words.
        action: &'static str,
    },
    #[error("no snapshot matches {0:?} (see `larder snapshots`)")]
    NoSuchSnapshot(String),
    #[error("snapshot prefix {0:?} matches more than one snapshot; give more digits")]
    AmbiguousSnapshot(String),
    #[error("snapshot {id} is unreadable ({reason}); `larder forget {short}` removes it", short = id.get(..8).unwrap_or(id))]
    UnreadableSnapshot { id: String, reason: String },
    #[error("chunk {0} is missing from the repository (`larder repair` writes the snapshots that use it again without it)")]
    MissingChunk(larder_hash::Fingerprint),
    #[error("invalid repository config: {0}")]
    Config(String),
    #[error("wrong password or no matching key")]
    WrongPassword,
    #[error("repository {} is encrypted: it needs its password or key", .0.display())]
    NeedsKey(PathBuf),
    #[error("refusing to open repository {location}: its config is not encrypted, but {reason}. An encrypted repository's config is always sealed: the storage may have replaced it to make larder write in the clear (docs/design/crypto.md, \"Threat model\")")]
    PlaintextConfig {
        location: String,
        /// Why the repository may be an encrypted one, in words.
        reason: String,
    },
    #[error("this key is write-only: it cannot {0}")]
    WriteOnly(&'static str),
    #[error("key {0}")]
    Key(String),
    #[error("compression: {0}")]
    Compression(String),
    /// Its message holds the index error's, so the error is not its source too (a
    /// cause chain would print it twice).
    #[error("disk index: {0}")]
    DiskIndex(larder_index::IndexError),
    #[error("the disk index is {0}; open the repository with a writer (`larder index rebuild`) to repair it")]
    DiskIndexUnusable(&'static str),
}

impl From<larder_index::IndexError> for StoreError {
    fn from(e: larder_index::IndexError) -> Self {
        Self::DiskIndex(e)
    }
}

fn waited_advice(waited: std::time::Duration) -> String {
    if waited.is_zero() {
        "; wait for it to finish, or wait for the lock with --retry-lock DURATION".into()
    } else {
        format!("; gave up after waiting {} s", waited.as_secs_f64())
    }
}

/// `e` and every error behind it, joined by `: ` (Display alone leaves the causes out).
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        out.push_str(": ");
        out.push_str(&c.to_string());
        cause = c.source();
    }
    out
}

impl StoreError {
    pub fn io(path: impl Into<PathBuf>, source: io::Error) -> Self {
        Self::Io {
            path: path.into(),
            source,
        }
    }

    pub(crate) fn corrupt(
        what: &'static str,
        name: impl Into<String>,
        reason: impl Into<String>,
    ) -> Self {
        Self::Corrupt {
            what,
            name: name.into(),
            reason: reason.into(),
        }
    }

    /// Whether the same call may succeed if made again (docs/design/remote.md,
    /// "Retries"): a dropped, refused or timed-out connection, or a throttled or
    /// failing server ([`io::ErrorKind::ResourceBusy`], as backends report them).
    pub fn is_transient(&self) -> bool {
        let Self::Io { source, .. } = self else {
            return false;
        };
        use io::ErrorKind as K;
        matches!(
            source.kind(),
            K::Interrupted
                | K::WouldBlock
                | K::TimedOut
                | K::ConnectionReset
                | K::ConnectionAborted
                | K::ConnectionRefused
                | K::NotConnected
                | K::BrokenPipe
                | K::UnexpectedEof
                | K::ResourceBusy
        )
    }

    /// Whether trying the same operation again may succeed: a transient error, or a
    /// lock another process holds.
    pub fn is_retryable(&self) -> bool {
        matches!(self, Self::Locked { .. }) || self.is_transient()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_disk_index_error_is_printed_once_in_its_chain() {
        let inner = larder_index::IndexError::NeedsRebuild;
        let text = error_chain(&StoreError::from(inner));
        let message = larder_index::IndexError::NeedsRebuild.to_string();
        assert_eq!(text.matches(&message).count(), 1, "{text}");
        assert!(text.starts_with("disk index: "), "{text}");
    }
}
