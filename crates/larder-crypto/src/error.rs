//! The crate's one error type.

/// What can go wrong opening, unlocking or parsing protected bytes.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CryptoError {
    /// An envelope or key slot failed authentication: wrong key, or damaged or
    /// tampered bytes, which an AEAD cannot tell apart.
    #[error("authentication failed: {0}")]
    Authentication(String),
    /// Bytes that do not parse as the format they claim.
    #[error("malformed {what}: {detail}")]
    Malformed { what: &'static str, detail: String },
}

pub type Result<T> = std::result::Result<T, CryptoError>;
