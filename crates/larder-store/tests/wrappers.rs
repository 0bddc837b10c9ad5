//! The wrappers every remote backend is opened through: `RetryBackend` retries
//! transient failures only, and `CachedBackend` serves metadata from its cache,
//! verified, and follows what the backend lists.

use std::io::ErrorKind;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use larder_store::{
    Backend, CachedBackend, FileKind, ObjectBackend, Result, RetryBackend, RetryPolicy, StoreError,
};
use object_store::memory::InMemory;

/// An in-memory store whose next `failures` reads fail with `kind`, and which counts
/// the reads that reach it.
struct Flaky {
    inner: ObjectBackend,
    failures: AtomicU32,
    kind: ErrorKind,
    reads: AtomicU32,
}

impl Flaky {
    fn new(failures: u32, kind: ErrorKind) -> Self {
        Self {
            inner: ObjectBackend::new(Arc::new(InMemory::new()), "r", "memory://").unwrap(),
            failures: AtomicU32::new(failures),
            kind,
            reads: AtomicU32::new(0),
        }
    }
}

impl Backend for Flaky {
    fn read(&self, kind: FileKind, name: &str) -> Result<Vec<u8>> {
        self.reads.fetch_add(1, Ordering::SeqCst);
        let left = self.failures.load(Ordering::SeqCst);
        if left > 0 {
            self.failures.store(left - 1, Ordering::SeqCst);
            return Err(StoreError::io(
                name,
                std::io::Error::new(self.kind, "injected"),
            ));
        }
        self.inner.read(kind, name)
    }
    fn read_ranges(
        &self,
        kind: FileKind,
        name: &str,
        ranges: &[std::ops::Range<u64>],
    ) -> Result<Vec<Vec<u8>>> {
        self.inner.read_ranges(kind, name, ranges)
    }
    fn file_len(&self, kind: FileKind, name: &str) -> Result<u64> {
        self.inner.file_len(kind, name)
    }
    fn write(&self, kind: FileKind, name: &str, data: &[u8]) -> Result<()> {
        self.inner.write(kind, name, data)
    }
    fn write_new(&self, kind: FileKind, name: &str, data: &[u8]) -> Result<bool> {
        self.inner.write_new(kind, name, data)
    }
    fn sync(&self, kind: FileKind) -> Result<()> {
        self.inner.sync(kind)
    }
    fn list(&self, kind: FileKind) -> Result<Vec<String>> {
        self.inner.list(kind)
    }
    fn remove(&self, kind: FileKind, name: &str) -> Result<()> {
        self.inner.remove(kind, name)
    }
    fn location(&self) -> String {
        self.inner.location()
    }
}

const QUICK: RetryPolicy = RetryPolicy {
    attempts: 4,
    first_delay: Duration::from_millis(1),
    max_delay: Duration::from_millis(5),
};

#[test]
fn transient_failures_are_retried_until_attempts_run_out() {
    for (failures, ok) in [(0, true), (3, true), (4, false)] {
        let flaky = Arc::new(Flaky::new(failures, ErrorKind::ConnectionReset));
        flaky.write(FileKind::Snapshot, "s", b"bytes").unwrap();
        let retry = RetryBackend::new(flaky.clone(), QUICK);
        let got = retry.read(FileKind::Snapshot, "s");
        assert_eq!(got.is_ok(), ok, "{failures} failures: {got:?}");
        assert_eq!(flaky.reads.load(Ordering::SeqCst), (failures + 1).min(4));
    }
}

#[test]
fn permanent_failures_are_not_retried() {
    for kind in [
        ErrorKind::NotFound,
        ErrorKind::PermissionDenied,
        ErrorKind::Other,
    ] {
        let flaky = Arc::new(Flaky::new(1, kind));
        let retry = RetryBackend::new(flaky.clone(), QUICK);
        let e = retry.read(FileKind::Snapshot, "s").unwrap_err();
        assert!(!e.is_transient(), "{kind:?}");
        assert_eq!(flaky.reads.load(Ordering::SeqCst), 1, "{kind:?}");
    }
}

#[test]
fn the_cache_serves_metadata_once_fetched_and_never_containers() {
    let flaky = Arc::new(Flaky::new(0, ErrorKind::Other));
    flaky
        .write(FileKind::IndexSegment, "01", b"segment")
        .unwrap();
    flaky
        .write(FileKind::Container, "02", b"container")
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cached = CachedBackend::new(flaky.clone(), dir.path()).unwrap();
    for _ in 0..3 {
        assert_eq!(
            cached.read(FileKind::IndexSegment, "01").unwrap(),
            b"segment"
        );
        assert_eq!(
            cached.read(FileKind::Container, "02").unwrap(),
            b"container"
        );
    }
    assert_eq!(
        flaky.reads.load(Ordering::SeqCst),
        1 + 3,
        "one segment read, three container reads"
    );

    // What is written through it is cached as written.
    cached.write(FileKind::Snapshot, "s1", b"snap").unwrap();
    assert_eq!(cached.read(FileKind::Snapshot, "s1").unwrap(), b"snap");
    assert_eq!(flaky.reads.load(Ordering::SeqCst), 4);

    // A damaged entry is read again; an entry the backend no longer lists is dropped.
    let entry = dir.path().join("index/01.idx");
    let mut bytes = std::fs::read(&entry).unwrap();
    bytes[0] ^= 1;
    std::fs::write(&entry, bytes).unwrap();
    assert_eq!(
        cached.read(FileKind::IndexSegment, "01").unwrap(),
        b"segment"
    );
    assert_eq!(flaky.reads.load(Ordering::SeqCst), 5);
    flaky.remove(FileKind::IndexSegment, "01").unwrap();
    assert!(cached.list(FileKind::IndexSegment).unwrap().is_empty());
    assert!(!entry.exists());
}
