//! The one error type of the index crate.

use std::path::PathBuf;

use larder_hash::Fingerprint;

/// What went wrong in an index operation. The in-memory index never fails; these come
/// from the disk index (docs/design/disk-index.md).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum IndexError {
    /// An I/O call failed; retrying may succeed (nothing buffered was lost).
    #[error("disk index I/O on {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A page or header does not decode; permanent: rebuild the index from the
    /// containers (`larder rebuild-index`).
    #[error("corrupt disk index file {file} at byte {offset}: {reason}; rebuild the index from the containers")]
    Corrupt {
        file: &'static str,
        offset: u64,
        reason: String,
    },
    /// The index was being written when its process stopped; permanent until rebuilt.
    #[error("the disk index was not closed cleanly (a crash while it was written); rebuild it from the containers")]
    NeedsRebuild,
    /// `insert` of a fingerprint that was not answered `New`, or was inserted already: a
    /// bug in the caller.
    #[error("insert of fingerprint {} that is not awaiting its insert", .0.to_hex())]
    NotPending(Fingerprint),
    /// `sync` while fingerprints answered `New` still wait for their `insert`.
    #[error("{0} fingerprints answered New still wait for their insert")]
    InsertsOutstanding(usize),
    /// A file does not exist (opening an index that was never created).
    #[error("disk index file {0} does not exist")]
    Missing(&'static str),
}

impl IndexError {
    /// Whether trying the same call again may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(self, IndexError::Io { .. })
    }
}

pub type Result<T, E = IndexError> = std::result::Result<T, E>;
