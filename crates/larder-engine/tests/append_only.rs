//! A repository on storage that refuses deletes (append-only: an SFTP account without
//! remove, a bucket policy without DeleteObject), here an in-memory object store whose
//! removals fail with PermissionDenied: backups still run one after another (lock
//! objects are released by marker, segments are not merged), every snapshot restores,
//! and forget and gc refuse before deleting anything (docs/design/remote.md,
//! "Append-only storage").

use std::fs;
use std::ops::Range;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use larder_chunk::ChunkerConfig;
use larder_engine::{backup, restore};
use larder_hash::HashAlgo;
use larder_store::{
    Backend, FileKind, GcOptions, LockMode, ObjectBackend, RepoConfig, Repository, Result,
    StoreError,
};
use object_store::memory::InMemory;

#[path = "support/bytes.rs"]
mod seeded;
use seeded::bytes;

#[path = "support/files.rs"]
mod tree_files;
use tree_files::files;

#[path = "support/options.rs"]
mod options;
use options::{backup_options, restore_options};

/// `inner`, refusing every removal.
struct AppendOnly(ObjectBackend);

impl Backend for AppendOnly {
    fn read(&self, kind: FileKind, name: &str) -> Result<Vec<u8>> {
        self.0.read(kind, name)
    }
    fn read_ranges(
        &self,
        kind: FileKind,
        name: &str,
        ranges: &[Range<u64>],
    ) -> Result<Vec<Vec<u8>>> {
        self.0.read_ranges(kind, name, ranges)
    }
    fn file_len(&self, kind: FileKind, name: &str) -> Result<u64> {
        self.0.file_len(kind, name)
    }
    fn write(&self, kind: FileKind, name: &str, data: &[u8]) -> Result<()> {
        self.0.write(kind, name, data)
    }
    fn write_new(&self, kind: FileKind, name: &str, data: &[u8]) -> Result<bool> {
        self.0.write_new(kind, name, data)
    }
    fn sync(&self, kind: FileKind) -> Result<()> {
        self.0.sync(kind)
    }
    fn list(&self, kind: FileKind) -> Result<Vec<String>> {
        self.0.list(kind)
    }
    fn remove(&self, kind: FileKind, name: &str) -> Result<()> {
        Err(StoreError::io(
            kind.relative_path(name),
            std::io::Error::new(std::io::ErrorKind::PermissionDenied, "append-only"),
        ))
    }
    fn location(&self) -> String {
        "memory://append-only".into()
    }
}

fn open(backend: &Arc<dyn Backend>, state: &Path, mode: LockMode) -> Repository {
    Repository::open_in(backend.clone(), state, mode, Duration::ZERO, None).unwrap()
}

#[test]
fn backups_run_on_append_only_storage_and_forget_and_gc_refuse() {
    let dir = tempfile::tempdir().unwrap();
    let (state, src) = (dir.path().join("state"), dir.path().join("src"));
    let store = ObjectBackend::new(Arc::new(InMemory::new()), "repo", "memory://").unwrap();
    let backend: Arc<dyn Backend> = Arc::new(AppendOnly(store));
    let config = RepoConfig::new(ChunkerConfig::default(), HashAlgo::Blake3);
    Repository::init_in(&*backend, &state, &config, None, None).unwrap();

    fs::create_dir_all(&src).unwrap();
    // More backups than segments are merged at: on append-only storage none are.
    let rounds = 36u64;
    let mut last = String::new();
    for round in 0..rounds {
        fs::write(src.join(format!("f{round}")), bytes(round, 20_000)).unwrap();
        // Each open takes the exclusive lock at once: the last one's was released.
        let mut repo = open(&backend, &state, LockMode::Exclusive);
        let summary = backup(&mut repo, std::slice::from_ref(&src), &backup_options(2)).unwrap();
        last = summary.snapshot_id;
    }
    assert_eq!(
        backend.list(FileKind::IndexSegment).unwrap().len() as u64,
        rounds
    );
    let locks = backend.list(FileKind::Lock).unwrap();
    assert!(
        locks.iter().filter(|n| n.ends_with("-released")).count() as u64 >= rounds,
        "{locks:?}"
    );

    let mut repo = open(&backend, &state, LockMode::Exclusive);
    let target = dir.path().join("restore");
    restore(&repo, &last, &target, &restore_options(4)).unwrap();
    let restored = target.join(src.strip_prefix("/").unwrap());
    assert_eq!(files(&restored), files(&src));

    let snapshots = backend.list(FileKind::Snapshot).unwrap();
    let refused = larder_engine::forget(&repo, &snapshots[..1]).unwrap_err();
    let message = larder_store::error_chain(&refused);
    assert!(message.contains("refuses deletes"), "{message}");
    let refused = larder_engine::gc(&mut repo, &GcOptions::default()).unwrap_err();
    assert!(
        larder_store::error_chain(&refused).contains("refuses deletes"),
        "{refused}"
    );
    assert_eq!(backend.list(FileKind::Snapshot).unwrap(), snapshots);
    let dry_run = GcOptions {
        dry_run: true,
        ..GcOptions::default()
    };
    larder_engine::gc(&mut repo, &dry_run).unwrap();
}
