//! One suite of `Backend` behaviour run against every implementation: the local
//! directory, `ObjectBackend` over object_store's in-memory store, and `ObjectBackend`
//! over a real S3 server (s3s-fs, tests/support/s3s.rs).

use std::sync::Arc;

use larder_store::{Backend, FileKind, LocalBackend, ObjectBackend};
use object_store::memory::InMemory;

#[path = "support/conformance.rs"]
mod conformance;
#[path = "support/s3s.rs"]
mod s3s;

use conformance::{conformance, not_found};

fn local() -> (tempfile::TempDir, LocalBackend) {
    let dir = tempfile::tempdir().unwrap();
    for sub in ["tmp", "containers", "index", "snapshots", "gc"] {
        std::fs::create_dir(dir.path().join(sub)).unwrap();
    }
    let backend = LocalBackend::new(dir.path());
    (dir, backend)
}

#[test]
fn local_backend_conforms() {
    let (_dir, backend) = local();
    conformance(&backend);
}

#[test]
fn object_backend_in_memory_conforms() {
    let backend = ObjectBackend::new(Arc::new(InMemory::new()), "repo", "memory://").unwrap();
    conformance(&backend);
}

#[test]
fn object_backend_on_s3s_conforms() {
    let server = s3s::S3sServer::start(&["larder"]);
    let backend = ObjectBackend::new(server.store("larder"), "some/prefix", "s3://larder").unwrap();
    conformance(&backend);
    // The layout: the local paths as keys under the prefix.
    let file = server
        .bucket_dir("larder")
        .join("some/prefix/containers/000000000000000b.ctr");
    assert_eq!(std::fs::metadata(&file).unwrap().len(), 5 << 20);
}

/// Two prefixes of one bucket are two repositories: neither lists nor reads the
/// other's files, even where one prefix starts with the other's name.
#[test]
fn prefixes_are_disjoint() {
    let store: Arc<dyn object_store::ObjectStore> = Arc::new(InMemory::new());
    let a = ObjectBackend::new(store.clone(), "nodes/1", "memory://").unwrap();
    let b = ObjectBackend::new(store.clone(), "nodes/10", "memory://").unwrap();
    a.write(FileKind::Snapshot, "x", b"a").unwrap();
    b.write(FileKind::Snapshot, "y", b"b").unwrap();
    assert_eq!(a.list(FileKind::Snapshot).unwrap(), ["x"]);
    assert_eq!(b.list(FileKind::Snapshot).unwrap(), ["y"]);
    assert!(not_found(&a.read(FileKind::Snapshot, "y").unwrap_err()));
    let sub = ObjectBackend::new(store, "", "memory://")
        .unwrap()
        .sub("nodes/1");
    assert_eq!(sub.read(FileKind::Snapshot, "x").unwrap(), b"a");
}

/// A create-only put refuses to replace an object and leaves it as it was; on s3s-fs
/// too (it honours `If-None-Match: *`), which the cluster's partition objects rely on.
#[test]
fn create_only_put_never_replaces() {
    let server = s3s::S3sServer::start(&["larder"]);
    let stores: [Arc<dyn object_store::ObjectStore>; 2] =
        [Arc::new(InMemory::new()), server.store("larder")];
    for store in stores {
        let backend = ObjectBackend::new(store, "p", "test").unwrap();
        assert!(backend
            .put("partitions/00001/a.delta", b"first", true)
            .unwrap());
        assert!(!backend
            .put("partitions/00001/a.delta", b"second", true)
            .unwrap());
        assert_eq!(backend.get("partitions/00001/a.delta").unwrap(), b"first");
        assert_eq!(backend.list_keys("partitions").unwrap(), ["00001/a.delta"]);
    }
}

/// The backend is called from tasks of other tokio runtimes (the node's blocking
/// threads, and worse, async tasks): it must neither panic nor deadlock there, and
/// dropping it inside a runtime must not panic either.
#[test]
fn usable_and_droppable_inside_another_runtime() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    runtime.block_on(async {
        let backend = ObjectBackend::new(Arc::new(InMemory::new()), "", "memory://").unwrap();
        backend.write(FileKind::Snapshot, "s", b"inside").unwrap();
        assert_eq!(backend.read(FileKind::Snapshot, "s").unwrap(), b"inside");
        drop(backend);
    });
}

/// `from_url` takes the bucket and prefix from the URL and the rest from the standard
/// AWS environment variables (set here for this process only: no other test of this
/// binary reads them).
#[test]
fn from_url_reaches_the_server_through_the_environment() {
    let server = s3s::S3sServer::start(&["bucket"]);
    for (key, value) in server.env() {
        std::env::set_var(key, value);
    }
    let backend = ObjectBackend::from_url("s3://bucket/one/two/").unwrap();
    backend
        .write(FileKind::Snapshot, "s", b"through env")
        .unwrap();
    assert!(server
        .bucket_dir("bucket")
        .join("one/two/snapshots/s.snap")
        .is_file());
    for bad in ["bucket/x", "s3://", "s3:///x", "file:///tmp"] {
        assert!(ObjectBackend::from_url(bad).is_err(), "{bad}");
    }
}
