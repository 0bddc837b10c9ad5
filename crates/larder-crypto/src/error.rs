//! The crate's one error type.

/// What can go wrong opening, unlocking or parsing protected bytes.
///
/// Every error is permanent: the same bytes and the same key give the same answer on
/// every retry, so callers never retry a `CryptoError` (I/O, which may be retried, is
/// the store's, not this crate's).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CryptoError {
    /// An envelope, a container part or a key slot failed authentication: wrong key,
    /// or damaged or tampered bytes, which an AEAD cannot tell apart. The message is a
    /// whole sentence, e.g. "wrong password or no matching key".
    #[error("{0}")]
    Authentication(String),
    /// Bytes that do not parse as the format they claim.
    #[error("malformed {what}: {detail}")]
    Malformed { what: &'static str, detail: String },
    /// A write-only key was asked to open what only a full key can open.
    #[error(
        "this key is write-only: it cannot read {what}; unlock the repository with a full key"
    )]
    WriteOnly {
        /// What was refused, in words: "snapshots", "chunks", ...
        what: &'static str,
    },
}

impl CryptoError {
    /// Always false: see the type's documentation.
    pub fn is_retryable(&self) -> bool {
        false
    }

    pub(crate) fn malformed(what: &'static str, detail: impl Into<String>) -> Self {
        Self::Malformed {
            what,
            detail: detail.into(),
        }
    }
}

pub type Result<T> = std::result::Result<T, CryptoError>;
