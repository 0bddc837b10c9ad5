//! Retries with backoff around any backend (docs/design/remote.md, "Retries"): a call
//! that fails with a transient error ([`StoreError::is_transient`]) is made again, up
//! to [`RetryPolicy::attempts`] times in all, after a growing, jittered pause.
//!
//! Invariant: only calls whose repetition is harmless are repeated, and every
//! [`Backend`] call is: reads, listings and removals are idempotent, and a write puts
//! the same bytes under the same name. A `write_new` whose first attempt succeeded
//! unseen reads as "already there" on the next: callers treat that as a refusal, which
//! is safe.

use std::ops::Range;
use std::path::Path;
use std::time::Duration;

use super::{Backend, FileKind, FileVersion};
use crate::error::{error_chain, Result};

/// How often and how patiently a call is tried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in all, the first included.
    pub attempts: u32,
    /// The pause after the first failure; each later pause doubles, up to `max_delay`.
    pub first_delay: Duration,
    pub max_delay: Duration,
}

impl RetryPolicy {
    /// Eight attempts over about a minute and a half.
    pub const DEFAULT: Self = Self {
        attempts: 8,
        first_delay: Duration::from_millis(500),
        max_delay: Duration::from_secs(30),
    };

    /// The pause before attempt `attempt + 1` (`attempt` from 1): doubled each time,
    /// capped, plus up to a quarter more at random.
    fn delay(&self, attempt: u32) -> Duration {
        let base = self
            .first_delay
            .saturating_mul(1 << (attempt - 1).min(16))
            .min(self.max_delay);
        let byte = u8::from_str_radix(&larder_crypto::random_id_hex(1), 16).unwrap_or(0);
        base + base.mul_f64(f64::from(byte) / 1024.0)
    }
}

/// `inner`, its transient failures retried under `policy`.
pub struct RetryBackend<B> {
    inner: B,
    policy: RetryPolicy,
}

impl<B: Backend> RetryBackend<B> {
    pub fn new(inner: B, policy: RetryPolicy) -> Self {
        Self { inner, policy }
    }

    /// `call`, made again while it fails transiently and attempts are left.
    fn retry<T>(&self, what: &str, mut call: impl FnMut(&B) -> Result<T>) -> Result<T> {
        let mut attempt = 1;
        loop {
            match call(&self.inner) {
                Err(e) if e.is_transient() && attempt < self.policy.attempts => {
                    let pause = self.policy.delay(attempt);
                    tracing::warn!(
                        "{what} failed ({}); trying again in {:.1} s",
                        error_chain(&e),
                        pause.as_secs_f64()
                    );
                    std::thread::sleep(pause);
                    attempt += 1;
                }
                outcome => return outcome,
            }
        }
    }
}

impl<B: Backend> Backend for RetryBackend<B> {
    fn read(&self, kind: FileKind, name: &str) -> Result<Vec<u8>> {
        self.retry("reading", |b| b.read(kind, name))
    }

    fn read_ranges(
        &self,
        kind: FileKind,
        name: &str,
        ranges: &[Range<u64>],
    ) -> Result<Vec<Vec<u8>>> {
        self.retry("reading", |b| b.read_ranges(kind, name, ranges))
    }

    fn file_len(&self, kind: FileKind, name: &str) -> Result<u64> {
        self.retry("reading the length of a file", |b| b.file_len(kind, name))
    }

    fn write(&self, kind: FileKind, name: &str, data: &[u8]) -> Result<()> {
        self.retry("writing", |b| b.write(kind, name, data))
    }

    fn write_new(&self, kind: FileKind, name: &str, data: &[u8]) -> Result<bool> {
        self.retry("writing", |b| b.write_new(kind, name, data))
    }

    fn sync(&self, kind: FileKind) -> Result<()> {
        self.retry("syncing", |b| b.sync(kind))
    }

    fn list(&self, kind: FileKind) -> Result<Vec<String>> {
        self.retry("listing", |b| b.list(kind))
    }

    fn list_sizes(&self, kind: FileKind) -> Result<Vec<(String, u64)>> {
        self.retry("listing", |b| b.list_sizes(kind))
    }

    fn list_versions(&self, kind: FileKind) -> Result<Vec<(String, FileVersion)>> {
        self.retry("listing", |b| b.list_versions(kind))
    }

    fn remove(&self, kind: FileKind, name: &str) -> Result<()> {
        self.retry("removing", |b| b.remove(kind, name))
    }

    fn clean_tmp(&self) -> Result<usize> {
        self.retry("cleaning tmp/", |b| b.clean_tmp())
    }

    fn flock_dir(&self) -> Option<&Path> {
        self.inner.flock_dir()
    }

    fn location(&self) -> String {
        self.inner.location()
    }

    fn written_name<'a>(&self, kind: FileKind, name: &'a str) -> &'a str {
        self.inner.written_name(kind, name)
    }
}
