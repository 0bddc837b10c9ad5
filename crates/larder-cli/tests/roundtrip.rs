//! Backup then restore gives back the same tree, byte for byte, with modes, mtimes and
//! symlink targets, for every chunker and every fingerprint; an unchanged tree stores
//! (almost) nothing new; snapshots are found by `latest` and by id prefix.

mod support;

use std::fs;
use std::path::Path;

use proptest::prelude::*;
use serde_json::Value;
use support::{assert_same_tree, compare_trees, pseudo_random, restored, Repo, TreeBuilder};

const RANDOM_LEN: usize = 3 << 20;
const REPEAT_BLOCK: usize = 4096;
const REPEAT_COUNT: usize = 256;

/// A tree with every kind of entry the README promises to restore. Returns the sum of
/// the file sizes.
fn build_everything_tree(root: &Path) -> u64 {
    let mut t = TreeBuilder::new(root);
    let random = pseudo_random(1, RANDOM_LEN);
    let repeated = pseudo_random(2, REPEAT_BLOCK).repeat(REPEAT_COUNT);
    let tiny_abs = root.join("tiny");
    t.file("empty", b"")
        .file("tiny", pseudo_random(3, 100))
        .file("plain", b"a small file that the second backup changes\n")
        .file("random.bin", &random)
        .file("repeated.bin", &repeated)
        .file("secret", b"0600\n")
        .mode("secret", 0o600)
        .file("script.sh", b"#!/bin/sh\necho hi\n")
        .mode("script.sh", 0o755)
        .file("odd-mode", b"setgid-less odd bits\n")
        .mode("odd-mode", 0o640)
        .dir("empty_dir")
        .dir("deep/er/est")
        .symlink("links/relative", "../tiny")
        .symlink("links/absolute", tiny_abs.as_os_str().as_encoded_bytes())
        .symlink("links/dangling", "no/such/file")
        .symlink(b"links/\xfe-link", b"\xff/target")
        .file(b"bin\xff\xfename", b"a non-UTF-8 file name\n")
        .file(b"dir\x80/f\xc3(", pseudo_random(4, 5000))
        .file("ro/inside", b"inside a read-only directory\n")
        .mode("ro/inside", 0o444)
        .mode("ro", 0o555)
        .file("old", b"before 1970\n")
        .mtime("old", -1_000_000, 5)
        .file("future", b"year 2100\n")
        .mtime("future", 4_102_444_800, 999_999_999)
        .mtime("deep/er/est", 1_234_567_890, 1);
    t.finish();
    support::list_tree(root)
        .iter()
        .filter_map(|rel| fs::symlink_metadata(root.join(rel)).ok())
        .filter(|m| m.is_file())
        .map(|m| m.len())
        .sum()
}

fn u(v: &Value, field: &str) -> u64 {
    v[field]
        .as_u64()
        .unwrap_or_else(|| panic!("{field} missing or not a number in {v}"))
}

fn tree_size(snapshots: &[Value], id: &str) -> u64 {
    let s = snapshots
        .iter()
        .find(|s| s["id"] == id)
        .unwrap_or_else(|| panic!("snapshot {id} not listed"));
    u(&s["snapshot"]["tree"], "size")
}

fn roundtrip(chunker: &str, hash: &str) {
    // Plaintext: the test reads the config, and SHA-1 cannot be encrypted.
    let (repo, init) = Repo::init_plain_with(&["--chunker", chunker, "--hash", hash]);
    init.expect_ok();
    if hash == "sha1" {
        init.expect_stderr(&["warning", "SHA-1"]);
    } else {
        assert!(
            !init.stderr.contains("warning"),
            "unexpected warning\n{init}"
        );
    }
    let config: Value =
        serde_json::from_slice(&fs::read(repo.path.join("config")).expect("read config"))
            .expect("config is JSON");
    let kind = if chunker == "fastcdc" {
        "fastcdc2020"
    } else {
        chunker
    };
    assert_eq!(config["chunker"]["kind"], kind, "config: {config}");
    assert_eq!(config["hash"], hash, "config: {config}");

    let src = repo.dir("src");
    let file_bytes = build_everything_tree(&src);

    // First backup: everything is new, but the repeated file deduplicates.
    let first = repo.backup(&[&src]);
    assert_eq!(first["warnings"], Value::Array(vec![]), "{first}");
    assert_eq!(u(&first, "files"), 13, "{first}");
    assert_eq!(u(&first, "symlinks"), 4, "{first}");
    assert_eq!(u(&first, "bytes_in"), file_bytes, "{first}");
    assert!(
        u(&first, "bytes_stored") < u(&first, "bytes_in"),
        "repeated data did not deduplicate: {first}"
    );
    assert!(
        u(&first, "bytes_new") < file_bytes - (REPEAT_BLOCK * (REPEAT_COUNT - 16)) as u64,
        "{first}"
    );
    assert!(u(&first, "chunks_new") < u(&first, "chunks"), "{first}");
    let stats = repo.run(["--json", "stats"]);
    stats.expect_ok();
    let stats = stats.json();
    assert!(
        u(&stats, "stored_bytes") < u(&stats, "logical_bytes"),
        "{stats}"
    );

    let target = repo.dir("restore-latest-1");
    let out = repo.restore("latest", &target, &[]);
    out.expect_ok();
    assert_eq!(u(&out.json(), "files"), 13, "{out}");
    assert_same_tree(&src, &restored(&target, &src));

    // Second backup, nothing changed: at most part of the tree stream is new (its
    // first entries are the parents of the source, e.g. /tmp, whose mtime others move).
    let second = repo.backup(&[&src]);
    let snaps = repo.snapshots();
    let second_id = second["snapshot"].as_str().expect("snapshot id");
    assert_eq!(u(&second, "bytes_in"), file_bytes, "{second}");
    assert!(
        u(&second, "bytes_new") <= tree_size(&snaps, second_id),
        "an unchanged tree stored file data again: {second}"
    );
    assert!(u(&second, "chunks_new") <= 3, "{second}");

    // Third backup after changing one small file: its new content and part of the tree.
    let changed = b"a changed small file, with new content nobody stored before\n";
    fs::write(src.join("plain"), changed).expect("change plain");
    support::set_mtime(&src.join("plain"), (1_700_000_000, 42), false);
    let third = repo.backup(&[&src]);
    let snaps = repo.snapshots();
    let third_id = third["snapshot"].as_str().expect("snapshot id");
    let new = u(&third, "bytes_new");
    assert!(
        new >= changed.len() as u64,
        "the change was not stored: {third}"
    );
    assert!(
        new <= changed.len() as u64 + tree_size(&snaps, third_id),
        "a one-file change stored too much: {third}"
    );

    // `snapshots --json` lists all three, oldest first.
    let ids: Vec<&str> = snaps.iter().map(|s| s["id"].as_str().unwrap()).collect();
    let first_id = first["snapshot"].as_str().unwrap();
    assert_eq!(ids, [first_id, second_id, third_id]);
    for s in &snaps {
        assert_eq!(
            s["snapshot"]["paths"],
            Value::Array(vec![src.to_str().unwrap().into()])
        );
    }

    // The first snapshot by id prefix: the old `plain`, everything else as now.
    let target = repo.dir("restore-first");
    repo.restore(&first_id[..8], &target, &[]).expect_ok();
    let diffs = compare_trees(&src, &restored(&target, &src));
    assert!(!diffs.is_empty(), "the old snapshot restored the new file");
    assert!(
        diffs.iter().all(|d| d.starts_with("plain:")),
        "unexpected differences: {diffs:#?}"
    );
    assert_eq!(
        fs::read(restored(&target, &src).join("plain")).unwrap(),
        b"a small file that the second backup changes\n"
    );

    let target = repo.dir("restore-latest-3");
    let out = repo.restore("latest", &target, &[]);
    out.expect_ok();
    assert_eq!(out.json()["snapshot"], third_id);
    assert_same_tree(&src, &restored(&target, &src));
}

macro_rules! roundtrip_tests {
    ($($name:ident: $chunker:literal, $hash:literal;)*) => {
        $(
            #[test]
            fn $name() {
                roundtrip($chunker, $hash);
            }
        )*
    };
}

roundtrip_tests! {
    fastcdc_blake3: "fastcdc", "blake3";
    fastcdc_sha256: "fastcdc", "sha256";
    fastcdc_sha1: "fastcdc", "sha1";
    fastcdc2016_blake3: "fastcdc2016", "blake3";
    fastcdc2016_sha256: "fastcdc2016", "sha256";
    fastcdc2016_sha1: "fastcdc2016", "sha1";
    fixed_blake3: "fixed", "blake3";
    fixed_sha256: "fixed", "sha256";
    fixed_sha1: "fixed", "sha1";
}

/// A random tree node for the property test.
#[derive(Debug, Clone)]
enum Node {
    File {
        data: Vec<u8>,
        mode: u32,
        mtime: (i64, u32),
    },
    Symlink(Vec<u8>),
    Dir {
        children: Vec<(Vec<u8>, Node)>,
        mode: u32,
        mtime: (i64, u32),
    },
}

fn name() -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(
        any::<u8>().prop_filter("no / or NUL", |b| *b != b'/' && *b != 0),
        1..10,
    )
    .prop_filter("not . or ..", |n| n != b"." && n != b"..")
}

fn mtime() -> impl Strategy<Value = (i64, u32)> {
    (0i64..4_000_000_000, 0u32..1_000_000_000)
}

fn node() -> impl Strategy<Value = Node> {
    let leaf = prop_oneof![
        3 => (
            prop_oneof![
                proptest::collection::vec(any::<u8>(), 0..300),
                (any::<u64>(), 0usize..150_000).prop_map(|(seed, len)| pseudo_random(seed, len)),
            ],
            prop::sample::select(vec![0o644u32, 0o600, 0o755, 0o444, 0o700]),
            mtime(),
        )
            .prop_map(|(data, mode, mtime)| Node::File { data, mode, mtime }),
        1 => proptest::collection::vec(any::<u8>().prop_filter("no NUL", |b| *b != 0), 1..20)
            .prop_map(Node::Symlink),
    ];
    leaf.prop_recursive(3, 24, 5, |inner| {
        (
            proptest::collection::vec((name(), inner), 0..5),
            prop::sample::select(vec![0o755u32, 0o700, 0o555, 0o750]),
            mtime(),
        )
            .prop_map(|(children, mode, mtime)| Node::Dir {
                children,
                mode,
                mtime,
            })
    })
}

fn materialize(t: &mut TreeBuilder, rel: &[u8], node: &Node) {
    match node {
        Node::File { data, mode, mtime } => {
            t.file(rel, data)
                .mode(rel, *mode)
                .mtime(rel, mtime.0, mtime.1);
        }
        Node::Symlink(target) => {
            t.symlink(rel, target);
        }
        Node::Dir {
            children,
            mode,
            mtime,
        } => {
            t.dir(rel).mode(rel, *mode).mtime(rel, mtime.0, mtime.1);
            let mut seen = std::collections::HashSet::new();
            for (name, child) in children {
                if seen.insert(name.clone()) {
                    let mut path = rel.to_vec();
                    path.push(b'/');
                    path.extend_from_slice(name);
                    materialize(t, &path, child);
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 8,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn random_small_trees_round_trip(top in proptest::collection::vec((name(), node()), 1..6)) {
        let repo = Repo::init(&[]);
        let src = repo.dir("src");
        let mut t = TreeBuilder::new(&src);
        let mut seen = std::collections::HashSet::new();
        for (name, node) in &top {
            if seen.insert(name.clone()) {
                materialize(&mut t, name, node);
            }
        }
        t.finish();
        repo.backup(&[&src]);
        let target = repo.dir("restore");
        repo.restore("latest", &target, &[]).expect_ok();
        let diffs = compare_trees(&src, &restored(&target, &src));
        prop_assert!(diffs.is_empty(), "differences: {:#?}", diffs);
    }
}
