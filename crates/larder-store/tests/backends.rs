//! One suite of `Backend` behaviour run against every implementation: the local
//! directory, `ObjectBackend` over object_store's in-memory store, and `ObjectBackend`
//! over a real S3 server (s3s-fs, tests/support/s3s.rs).

use std::io::ErrorKind;
use std::sync::Arc;

use larder_store::{error_chain, Backend, FileKind, LocalBackend, ObjectBackend, StoreError};
use object_store::memory::InMemory;

#[path = "support/s3s.rs"]
mod s3s;

/// Deterministic bytes (xorshift), different per seed.
fn bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn not_found(e: &StoreError) -> bool {
    matches!(e, StoreError::Io { source, .. } if source.kind() == ErrorKind::NotFound)
}

/// Every behaviour the repository relies on (the `Backend` trait's contract).
fn conformance(backend: &dyn Backend) {
    for kind in FileKind::ALL {
        assert_eq!(
            backend.list(kind).unwrap(),
            Vec::<String>::new(),
            "{kind:?}"
        );
    }

    // Written bytes read back byte for byte, a container's size included.
    let big = bytes(1, 5 << 20);
    let small = bytes(2, 1000);
    backend
        .write(FileKind::Container, "000000000000000b", &big)
        .unwrap();
    backend
        .write(FileKind::Container, "000000000000000a", &small)
        .unwrap();
    backend
        .write(FileKind::Container, "0000000000000010", &[])
        .unwrap();
    backend
        .write(FileKind::Snapshot, "snap-1", b"snapshot")
        .unwrap();
    for kind in FileKind::ALL {
        backend.sync(kind).unwrap();
    }
    assert!(
        backend
            .read(FileKind::Container, "000000000000000b")
            .unwrap()
            == big
    );
    assert_eq!(
        backend
            .read(FileKind::Container, "000000000000000a")
            .unwrap(),
        small
    );
    assert_eq!(
        backend
            .read(FileKind::Container, "0000000000000010")
            .unwrap(),
        b""
    );
    assert_eq!(
        backend.read(FileKind::Snapshot, "snap-1").unwrap(),
        b"snapshot"
    );

    // Ranges, in the order given, overlapping and empty ones included.
    let ranges = [
        0..10,
        4 << 20..(4 << 20) + 7000,
        5..6,
        100..100,
        (5 << 20) - 3..5 << 20,
    ];
    let got = backend
        .read_ranges(FileKind::Container, "000000000000000b", &ranges)
        .unwrap();
    assert_eq!(got.len(), ranges.len());
    for (range, bytes) in ranges.iter().zip(&got) {
        assert!(
            bytes[..] == big[range.start as usize..range.end as usize],
            "range {range:?}"
        );
    }
    let past_end = backend.read_ranges(
        FileKind::Container,
        "000000000000000a",
        std::slice::from_ref(&(990..1010)),
    );
    assert!(
        past_end.is_err(),
        "a range past the end must fail: {past_end:?}"
    );

    assert_eq!(
        backend
            .file_len(FileKind::Container, "000000000000000b")
            .unwrap(),
        5 << 20
    );
    assert_eq!(
        backend
            .file_len(FileKind::Container, "0000000000000010")
            .unwrap(),
        0
    );

    // Sorted names without extension, per kind.
    assert_eq!(
        backend.list(FileKind::Container).unwrap(),
        ["000000000000000a", "000000000000000b", "0000000000000010"]
    );
    assert_eq!(backend.list(FileKind::Snapshot).unwrap(), ["snap-1"]);
    assert!(backend.list(FileKind::IndexSegment).unwrap().is_empty());
    assert!(backend.list(FileKind::GcPlan).unwrap().is_empty());

    // A second write of a name replaces the file whole, as the local rename does.
    backend
        .write(FileKind::Snapshot, "snap-1", b"replaced, longer")
        .unwrap();
    assert_eq!(
        backend.read(FileKind::Snapshot, "snap-1").unwrap(),
        b"replaced, longer"
    );
    assert_eq!(backend.list(FileKind::Snapshot).unwrap(), ["snap-1"]);

    // Remove, twice (the second is no error); a missing file is a clear NotFound
    // naming the file, for every read.
    backend
        .remove(FileKind::Container, "000000000000000a")
        .unwrap();
    backend
        .remove(FileKind::Container, "000000000000000a")
        .unwrap();
    backend.sync(FileKind::Container).unwrap();
    assert_eq!(
        backend.list(FileKind::Container).unwrap(),
        ["000000000000000b", "0000000000000010"]
    );
    let errors = [
        backend
            .read(FileKind::Container, "000000000000000a")
            .unwrap_err(),
        backend
            .file_len(FileKind::Container, "000000000000000a")
            .unwrap_err(),
        backend
            .read_ranges(
                FileKind::Container,
                "000000000000000a",
                std::slice::from_ref(&(0..1)),
            )
            .unwrap_err(),
        backend
            .read(FileKind::IndexSegment, "never-written")
            .unwrap_err(),
    ];
    for e in &errors {
        assert!(not_found(e), "{e:?}");
    }
    let message = error_chain(&errors[0]);
    assert!(
        message.contains("containers/000000000000000a.ctr"),
        "the error names the file: {message}"
    );

    // Create-only writes: the first wins, a second leaves the first's bytes.
    assert!(backend.write_new(FileKind::Key, "k1", b"first").unwrap());
    assert!(!backend.write_new(FileKind::Key, "k1", b"second").unwrap());
    assert_eq!(backend.read(FileKind::Key, "k1").unwrap(), b"first");
    assert_eq!(backend.list(FileKind::Key).unwrap(), ["k1"]);

    // The config is one file at the top, listed by its name only.
    assert!(backend.list(FileKind::Config).unwrap().is_empty());
    assert!(backend
        .write_new(FileKind::Config, larder_store::CONFIG_NAME, b"{}")
        .unwrap());
    backend.sync(FileKind::Config).unwrap();
    assert_eq!(backend.list(FileKind::Config).unwrap(), ["config"]);
    backend
        .write(FileKind::Config, larder_store::CONFIG_NAME, b"{\"v\":2}")
        .unwrap();
    assert_eq!(
        backend
            .read(FileKind::Config, larder_store::CONFIG_NAME)
            .unwrap(),
        b"{\"v\":2}"
    );
    assert_eq!(
        backend.list_sizes(FileKind::Container).unwrap(),
        [
            ("000000000000000b".to_string(), 5 << 20),
            ("0000000000000010".to_string(), 0)
        ]
    );
}

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
