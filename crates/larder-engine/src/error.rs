//! The one error type of the engine, and the warnings that do not stop a run.

use std::fmt;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

use larder_store::StoreError;
use serde::{Serialize, Serializer};

use crate::names::{escape_name, BytesField};

pub type Result<T, E = EngineError> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EngineError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("{}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: {reason}", path.display())]
    Source { path: PathBuf, reason: String },
    #[error("a pipeline stage failed: {0}")]
    Pipeline(String),
    /// A remote index (a cluster's owners) failed a lookup or an acknowledgement.
    #[error("the cluster's index: {message}")]
    Remote { message: String, retryable: bool },
    /// The device asked to chunk and fingerprint (the GPU) cannot be used.
    #[error("{0}")]
    Device(String),
    #[error("invalid pattern \"{pattern}\": {reason}")]
    InvalidPattern { pattern: String, reason: String },
    #[error("invalid snapshot path \"{path}\": {reason}")]
    InvalidSnapshotPath { path: String, reason: String },
    #[error("{path} is not in snapshot {snapshot} (see `larder ls {snapshot}`)")]
    PathNotInSnapshot { path: String, snapshot: String },
    #[error("{path} is {what} in snapshot {snapshot}; {advice}")]
    NotAFile {
        path: String,
        snapshot: String,
        what: String,
        advice: &'static str,
    },
    #[error("{path} occurs {count} times in snapshot {snapshot}; larder writes each path once, so this tree is damaged or was crafted")]
    AmbiguousPath {
        path: String,
        snapshot: String,
        count: usize,
    },
    #[error("{path} in snapshot {snapshot}: {reason}")]
    DamagedEntry {
        path: String,
        snapshot: String,
        reason: String,
    },
    #[error("snapshot {snapshot} cannot be copied: {reason}")]
    CopyFailed { snapshot: String, reason: String },
    #[error("gc refused: {0}")]
    GcRefused(String),
    #[error("repair stopped before writing anything: {0}")]
    RepairStopped(String),
    #[error("cannot write the content of {path}")]
    Write {
        path: String,
        source: std::io::Error,
    },
}

impl EngineError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self::Io {
            path: path.into(),
            source,
        }
    }

    /// Whether trying again may succeed.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Store(e) => e.is_retryable(),
            Self::Remote { retryable, .. } => *retryable,
            _ => false,
        }
    }
}

/// A problem with one path that the run stepped over: an unreadable file, a file that
/// changed while it was read, a special file that was skipped.
///
/// Shown (`Display`) with its path escaped by [`escape_name`]; in JSON, `path` is a
/// string, with `path_hex` beside it where the path is not UTF-8, then `message` and
/// `is_error`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Warning {
    pub path: PathBuf,
    pub message: String,
    /// False for notices that leave the result complete (a skipped socket).
    pub is_error: bool,
}

impl Warning {
    pub(crate) fn error(path: impl Into<PathBuf>, message: impl fmt::Display) -> Self {
        Self {
            path: path.into(),
            message: message.to_string(),
            is_error: true,
        }
    }

    pub(crate) fn notice(path: impl Into<PathBuf>, message: impl fmt::Display) -> Self {
        Self {
            path: path.into(),
            message: message.to_string(),
            is_error: false,
        }
    }
}

impl fmt::Display for Warning {
    /// `PATH: MESSAGE`, the path escaped; the message as it is (a line is made safe
    /// for the terminal where it is written: `escape_controls`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let path = escape_name(self.path.as_os_str().as_bytes());
        write!(f, "{path}: {}", self.message)
    }
}

impl Serialize for Warning {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct Fields<'a> {
            #[serde(flatten)]
            path: BytesField<'a>,
            message: &'a str,
            is_error: bool,
        }
        Fields {
            path: BytesField::new("path", self.path.as_os_str().as_bytes()),
            message: &self.message,
            is_error: self.is_error,
        }
        .serialize(s)
    }
}
