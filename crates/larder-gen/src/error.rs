//! The one error type of larder-gen.

/// Why a workload cannot be configured or written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GenError {
    /// Run-length statistics no truncated lognormal reproduces.
    #[error("{what} run lengths: {reason}")]
    RunLengths { what: &'static str, reason: String },
    /// A transition probability outside 0..=1, or a chain that never produces new data.
    #[error("transition probabilities: {0}")]
    Transitions(String),
    /// A target dedup ratio the model cannot reach with these run lengths and edits.
    #[error("dedup ratio {ratio}: {reason}")]
    DedupRatio { ratio: f64, reason: String },
    /// Any other setting out of range (sizes, counts, edit parameters).
    #[error("{0}")]
    Config(String),
    /// The sink refused the bytes.
    #[error("writing the generated data: {0}")]
    Io(#[from] std::io::Error),
}

impl GenError {
    /// Whether trying again may succeed: only sink I/O that was interrupted or timed
    /// out. Configuration errors are permanent.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Io(e) => matches!(
                e.kind(),
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
        let io = |kind| GenError::Io(std::io::Error::from(kind));
        assert!(io(std::io::ErrorKind::Interrupted).is_retryable());
        assert!(!io(std::io::ErrorKind::BrokenPipe).is_retryable());
        assert!(!GenError::Config("x".into()).is_retryable());
    }
}
