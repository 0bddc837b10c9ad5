//! The `Backend` conformance suite: every behaviour the repository relies on, run
//! against each implementation (included with `#[path]` by backends.rs and sftp.rs).

#![allow(dead_code)]

use std::io::ErrorKind;

use larder_store::{create_file, error_chain, Backend, FileKind, StoreError};

/// Deterministic pseudo-random bytes, different per seed.
pub fn bytes(seed: u64, len: usize) -> Vec<u8> {
    larder_gen::seeded_bytes(seed, len)
}

pub fn not_found(e: &StoreError) -> bool {
    matches!(e, StoreError::Io { source, .. } if source.kind() == ErrorKind::NotFound)
}

/// Every behaviour the repository relies on (the `Backend` trait's contract).
pub fn conformance(backend: &dyn Backend) {
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

    // Containers, segments and snapshots are created, never replaced: another file
    // of the name is `NameTaken` and stays; the same bytes are this write's own.
    let (name, ctr) = ("00000000000000c1", bytes(9, 70_000));
    let create = |data: &[u8]| create_file(backend, FileKind::Container, name, data, "container");
    create(&ctr).unwrap();
    create(&ctr).unwrap();
    let taken = create(b"x");
    assert!(
        matches!(&taken, Err(StoreError::NameTaken { name: n, .. }) if n == name),
        "{taken:?}"
    );
    assert_eq!(backend.read(FileKind::Container, name).unwrap(), ctr);
    backend.remove(FileKind::Container, name).unwrap();

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
