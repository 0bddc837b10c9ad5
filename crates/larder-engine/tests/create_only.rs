//! Containers, index segments and snapshots are created, never replaced: a writer that
//! finds one of its names taken (another writer beside it, whose lock it took for
//! stale or never saw) fails with `StoreError::NameTaken` before committing, leaves
//! the other file as it was, and every committed snapshot still restores
//! byte-identical (docs/design/remote.md, "Lock objects").

use std::fs;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use larder_chunk::ChunkerConfig;
use larder_engine::{backup, restore, EngineError};
use larder_hash::HashAlgo;
use larder_store::{
    error_chain, Backend, FileKind, LockMode, ObjectBackend, RepoConfig, Repository,
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

fn open(backend: &Arc<dyn Backend>, state: &Path) -> Repository {
    Repository::open_in(
        backend.clone(),
        state,
        LockMode::Exclusive,
        Duration::ZERO,
        None,
    )
    .unwrap()
}

/// The name after the highest of `kind` on the storage.
fn next_name(backend: &Arc<dyn Backend>, kind: FileKind) -> String {
    let highest = backend
        .list(kind)
        .unwrap()
        .iter()
        .filter_map(|n| u64::from_str_radix(n, 16).ok())
        .max()
        .unwrap_or(0);
    format!("{:016x}", highest + 1)
}

/// Restores `id` and compares it with `expected`, a copy of the source as it was.
fn assert_restores(repo: &Repository, id: &str, src: &Path, expected: &Path, into: &Path) {
    restore(repo, id, into, &restore_options(4)).unwrap();
    let restored = into.join(src.strip_prefix("/").unwrap());
    assert_eq!(files(&restored), files(expected));
}

#[test]
fn a_taken_container_or_segment_name_fails_the_backup_and_overwrites_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (state, src) = (dir.path().join("state"), dir.path().join("src"));
    let store = ObjectBackend::new(Arc::new(InMemory::new()), "repo", "memory://").unwrap();
    let backend: Arc<dyn Backend> = Arc::new(store);
    let config = RepoConfig::new(ChunkerConfig::default(), HashAlgo::Blake3);
    Repository::init_in(&*backend, &state, &config, None, None).unwrap();
    fs::create_dir_all(&src).unwrap();
    fs::write(src.join("first"), bytes(1, 300_000)).unwrap();
    let first = {
        let mut repo = open(&backend, &state);
        backup(&mut repo, std::slice::from_ref(&src), &backup_options(2))
            .unwrap()
            .snapshot_id
    };
    let kept = dir.path().join("kept");
    fs::create_dir_all(&kept).unwrap();
    fs::copy(src.join("first"), kept.join("first")).unwrap();

    let others = b"another writer's file".to_vec();
    for (round, kind) in [(2, FileKind::Container), (3, FileKind::IndexSegment)] {
        fs::write(src.join(format!("new{round}")), bytes(round, 300_000)).unwrap();
        let mut repo = open(&backend, &state);
        // Another writer creates the name this one is about to use.
        let taken = next_name(&backend, kind);
        backend.write(kind, &taken, &others).unwrap();
        let snapshots = backend.list(FileKind::Snapshot).unwrap();
        let failed = backup(&mut repo, std::slice::from_ref(&src), &backup_options(2));
        let e = match failed {
            Err(e) => e,
            Ok(s) => panic!(
                "{kind:?} {taken} taken, yet snapshot {} committed",
                s.snapshot_id
            ),
        };
        let message = error_chain(&e);
        assert!(
            matches!(
                &e,
                EngineError::Store(larder_store::StoreError::NameTaken { .. })
            ) || message.contains("already exists"),
            "{message}"
        );
        assert!(message.contains(&taken), "{message}");
        assert_eq!(backend.read(kind, &taken).unwrap(), others, "overwritten");
        assert_eq!(backend.list(FileKind::Snapshot).unwrap(), snapshots);
        drop(repo);
        // The committed snapshot restores as it was.
        let repo = open(&backend, &state);
        let into = dir.path().join(format!("restore{round}"));
        assert_restores(&repo, &first, &src, &kept, &into);
    }
}
