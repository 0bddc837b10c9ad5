//! The one error type of larder-bench.

use std::path::PathBuf;

use larder_chunk::ConfigError;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BenchError {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "the inputs hold {total} bytes, more than the {cap} bytes that may be loaded into \
         memory: give fewer or smaller inputs, or raise the limit (--max-input)"
    )]
    TooLarge { total: u64, cap: u64 },
    #[error("the inputs hold no data: give at least one non-empty regular file")]
    NoData,
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("drawing the plot {plot}: {reason}")]
    Plot { plot: String, reason: String },
    #[error(
        "the keyed chunker's experiment key is already in use: give the secret before \
         any chunker is built"
    )]
    KeyInUse,
    #[error("cannot start the chunking threads: {0}")]
    Threads(String),
    #[error("a benchmark backup could not read its input: {0}")]
    Backup(String),
    #[error(transparent)]
    Engine(#[from] larder_engine::EngineError),
    #[error(transparent)]
    Store(#[from] larder_store::StoreError),
    #[error(transparent)]
    Gen(#[from] larder_gen::GenError),
    #[error(transparent)]
    Index(#[from] larder_index::IndexError),
    #[error(
        "{run} answered wrongly: {detail} (every run must find exactly the oracle's new \
         fingerprints; a benchmark of a wrong index means nothing)"
    )]
    Inexact { run: String, detail: String },
    #[error(
        "--drop-caches: cannot write 3 to /proc/sys/vm/drop_caches ({source}): it needs \
         root and a writable /proc/sys; use --direct on instead where the filesystem allows"
    )]
    DropCaches { source: std::io::Error },
    #[error(
        "--direct on: {} does not take O_DIRECT ({reason}); give --dir on another \
         filesystem, or --direct off (with --drop-caches as root)",
        dir.display()
    )]
    DirectUnsupported { dir: PathBuf, reason: String },
}

impl BenchError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self::Io {
            path: path.into(),
            source,
        }
    }

    /// Whether trying again may succeed: only I/O that was interrupted or timed out.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Io { source, .. } => matches!(
                source.kind(),
                std::io::ErrorKind::Interrupted
                    | std::io::ErrorKind::TimedOut
                    | std::io::ErrorKind::WouldBlock
            ),
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_transient_io_is_retryable() {
        let io = |kind| BenchError::io("f", std::io::Error::from(kind));
        assert!(io(std::io::ErrorKind::Interrupted).is_retryable());
        assert!(!io(std::io::ErrorKind::NotFound).is_retryable());
        assert!(!BenchError::NoData.is_retryable());
        assert!(!BenchError::TooLarge { total: 2, cap: 1 }.is_retryable());
    }
}
