//! A repository whose immutable files are in S3-compatible object storage (a real
//! s3s-fs server): its config, lock and tmp stay in a local directory
//! (`Repository::open_with_backend`; docs/design/format.md, "Object storage"). Backups
//! into it restore byte for byte, a second backup of the same data stores nothing new,
//! and `check --read-data` finds every chunk through the backend.

use std::fs;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use larder_chunk::ChunkerConfig;
use larder_engine::{backup, check, restore, BackupOptions, Parents, DEFAULT_RESTORE_CACHE};
use larder_hash::HashAlgo;
use larder_store::{Backend, FileKind, LockMode, ObjectBackend, RepoConfig, Repository};

#[path = "support/bytes.rs"]
mod seeded;
use seeded::bytes;

#[path = "support/files.rs"]
mod tree_files;
use tree_files::files;

#[path = "support/options.rs"]
mod options;
use options::{backup_options, check_options, restore_options};

#[path = "../../larder-store/tests/support/s3s.rs"]
mod s3s;

fn open(root: &Path, backend: &Arc<ObjectBackend>, mode: LockMode) -> Repository {
    let backend: Arc<dyn Backend> = backend.clone();
    Repository::open_with_backend(root, mode, Duration::from_secs(10), backend).unwrap()
}

#[test]
fn backup_to_object_storage_restores_byte_identical() {
    let server = s3s::S3sServer::start(&["larder"]);
    let dir = tempfile::tempdir().unwrap();
    let (root, src) = (dir.path().join("repo"), dir.path().join("src"));
    Repository::init(
        &root,
        &RepoConfig::new(ChunkerConfig::default(), HashAlgo::Blake3),
    )
    .unwrap();
    let backend =
        Arc::new(ObjectBackend::new(server.store("larder"), "repo-1", "s3://larder").unwrap());

    fs::create_dir_all(src.join("sub")).unwrap();
    let big = bytes(7, 6 << 20);
    fs::write(src.join("big.bin"), &big).unwrap();
    fs::write(src.join("sub/copy.bin"), &big).unwrap();
    fs::write(src.join("sub/empty"), b"").unwrap();
    for i in 0..30u64 {
        fs::write(
            src.join(format!("small-{i}")),
            bytes(100 + i, 100 + 997 * i as usize),
        )
        .unwrap();
    }

    let first = {
        let mut repo = open(&root, &backend, LockMode::Exclusive);
        backup(&mut repo, std::slice::from_ref(&src), &backup_options(2)).unwrap()
    };
    assert!(first.warnings.is_empty(), "{:?}", first.warnings);
    assert!(first.containers_written >= 2, "{first:?}");
    // Nothing of the repository's immutable files is local; all are objects.
    assert!(fs::read_dir(root.join("containers"))
        .unwrap()
        .next()
        .is_none());
    assert!(fs::read_dir(root.join("snapshots"))
        .unwrap()
        .next()
        .is_none());
    let bucket = server.bucket_dir("larder").join("repo-1");
    assert_eq!(
        fs::read_dir(bucket.join("containers")).unwrap().count() as u64,
        first.containers_written
    );
    assert_eq!(
        backend.list(FileKind::Snapshot).unwrap(),
        std::slice::from_ref(&first.snapshot_id)
    );

    // The same data again, every file read: every data chunk is found through the
    // segments on the server (the tree may have a new chunk: it records the times of
    // the source's parent directories, which other tests change).
    let second = {
        let mut repo = open(&root, &backend, LockMode::Exclusive);
        let read_all = BackupOptions {
            parents: Parents::None,
            ..backup_options(2)
        };
        backup(&mut repo, std::slice::from_ref(&src), &read_all).unwrap()
    };
    assert_eq!(second.bytes_read, second.bytes_in);
    assert_eq!(second.chunks_new, second.tree_chunks_new, "{second:?}");

    let repo = open(&root, &backend, LockMode::Shared);
    let report = check(&repo, &check_options(true)).unwrap();
    assert!(report.is_ok(), "{:?}", report.damage);
    assert_eq!(report.snapshots, 2);
    for (n, id) in [&first.snapshot_id, &second.snapshot_id]
        .into_iter()
        .enumerate()
    {
        let target = dir.path().join(format!("restored-{n}"));
        let summary = restore(&repo, id, &target, &restore_options(DEFAULT_RESTORE_CACHE)).unwrap();
        assert!(summary.warnings.is_empty(), "{:?}", summary.warnings);
        let restored = target.join(src.strip_prefix("/").unwrap());
        assert!(
            files(&restored) == files(&src),
            "snapshot {id} restores byte for byte"
        );
    }
}
