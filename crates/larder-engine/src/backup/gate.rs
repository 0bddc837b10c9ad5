//! Serial mode ([`super::BackupOptions::serial`]): the stages take turns instead of
//! overlapping. Each stage passes the gate before it works and leaves it before it
//! waits on a queue, so no stage ever waits on a queue while holding it. Without
//! serial mode the gate is open and passing it only reads the clock.

use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::lock;

pub(crate) struct SerialGate(Option<Mutex<()>>);

/// A stage's span of work: the gate it holds (serial mode) and when it began, after
/// the gate was passed.
pub(crate) struct BusySpan<'g> {
    _held: Option<MutexGuard<'g, ()>>,
    started: Instant,
}

impl SerialGate {
    pub fn new(serial: bool) -> Self {
        Self(serial.then(|| Mutex::new(())))
    }

    pub fn begin(&self) -> BusySpan<'_> {
        // Fields are evaluated in order: the clock starts once the gate is held.
        BusySpan {
            _held: self.0.as_ref().map(lock),
            started: Instant::now(),
        }
    }

    pub fn is_serial(&self) -> bool {
        self.0.is_some()
    }
}

impl BusySpan<'_> {
    /// Ends the span, leaving the gate; returns how long it worked.
    pub fn end(self) -> Duration {
        self.started.elapsed()
    }
}
