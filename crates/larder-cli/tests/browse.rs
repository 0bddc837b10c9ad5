//! `larder ls` and `larder cat` (alias `dump`): listings as text, `ls -l` lines and
//! JSON; a path with or without its leading `/`; file content byte for byte, verified
//! chunk by chunk; clear errors with the README's exit codes; hostile trees listed and
//! refused without a panic.

mod support;

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::Stdio;

use larder_store::{
    encode_tree_header, ContainerBuilder, EntryKind, FileKind, LockMode, SegmentContainer,
    Snapshot, SnapshotSummary, TreeEntry, TreeRef,
};
use serde_json::Value;
use support::{pseudo_random, run_command, snapshot_path, Repo, TreeBuilder, RUN_TIMEOUT};

/// A source tree with every kind of entry; returns its root.
fn build_source(repo: &Repo) -> PathBuf {
    let src = repo.dir("src");
    TreeBuilder::new(&src)
        .file("a.txt", b"alpha\n")
        .mtime("a.txt", 1_700_000_000, 123_456_789)
        .file("sub/b.bin", pseudo_random(7, 3 << 20))
        .file("sub/script.sh", b"#!/bin/sh\n")
        .mode("sub/script.sh", 0o750)
        .dir("sub/empty")
        .symlink("sub/link", "../a.txt")
        .file(b"odd\x1b[31m\xffname", b"escape me\n")
        .finish();
    src
}

/// The paths `ls` prints for `src` and below, in tree order.
fn expected_listing(src: &Path) -> Vec<String> {
    let root = format!("/{}", snapshot_path(src));
    [
        "",
        "/a.txt",
        "/odd\\x1b[31m\\xffname",
        "/sub",
        "/sub/b.bin",
        "/sub/empty",
        "/sub/link",
        "/sub/script.sh",
    ]
    .iter()
    .map(|rel| format!("{root}{rel}"))
    .collect()
}

fn entries(v: &Value) -> &Vec<Value> {
    v["entries"]
        .as_array()
        .unwrap_or_else(|| panic!("no entries array in {v}"))
}

fn lines(s: &str) -> Vec<String> {
    s.lines().map(str::to_string).collect()
}

#[test]
fn ls_lists_paths_as_text_and_every_field_as_json() {
    let repo = Repo::init(&[]);
    let src = build_source(&repo);
    repo.backup(&[&src]);
    let src_arg = src.to_str().unwrap();

    let all = repo.run(["ls", "latest"]);
    all.expect_ok();
    let all = lines(&all.stdout);
    let parents = src.ancestors().count() - 2;
    assert_eq!(&all[parents..], expected_listing(&src).as_slice());
    assert_eq!(
        all[0],
        format!("/{}", snapshot_path(&src).split('/').next().unwrap())
    );

    // Under a path, given with or without the leading `/`.
    let under = repo.run(["ls", "latest", src_arg]);
    under.expect_ok();
    assert_eq!(lines(&under.stdout), expected_listing(&src));
    let relative = repo.run(["ls", "latest", src_arg.trim_start_matches('/')]);
    assert_eq!(relative.stdout, under.stdout);
    assert!(
        !under.stdout.contains('\x1b'),
        "a name reached the terminal unescaped"
    );

    let json = repo.run(["--json", "ls", "latest", src_arg]);
    json.expect_ok();
    let v = json.json();
    assert_eq!(v["count"], 8);
    assert_eq!(v["path"], format!("/{}", snapshot_path(&src)));
    let listed = entries(&v);
    let find = |rel: &str| -> &Value {
        let path = format!("{}/{rel}", src.display());
        listed
            .iter()
            .find(|e| e["path"] == path.as_str())
            .unwrap_or_else(|| panic!("{path} not listed in {v}"))
    };
    let a = find("a.txt");
    assert_eq!(a["type"], "file");
    assert_eq!(a["size"], 6);
    assert_eq!(a["permissions"], "-rw-r--r--");
    assert_eq!(a["mtime"], "2023-11-14T22:13:20.123456789Z");
    assert_eq!(a["chunks"], 1);
    let link = find("sub/link");
    assert_eq!(link["type"], "symlink");
    assert_eq!(link["target"], "../a.txt");
    assert_eq!(find("sub/script.sh")["permissions"], "-rwxr-x---");
    assert_eq!(find("sub/empty")["type"], "dir");
    assert_eq!(find("sub/b.bin")["size"], 3 << 20);
    let odd = listed
        .iter()
        .find(|e| e.get("path_hex").is_some())
        .unwrap_or_else(|| panic!("the non-UTF-8 name has no path_hex in {v}"));
    let hex = odd["path_hex"].as_str().unwrap();
    assert!(hex.ends_with("6f64641b5b33316dff6e616d65"), "{hex}");
}

#[test]
fn ls_long_reads_like_ls_l() {
    let repo = Repo::init(&[]);
    let src = build_source(&repo);
    repo.backup(&[&src]);
    let out = repo.run(["ls", "--long", "latest", src.to_str().unwrap()]);
    out.expect_ok();
    let long = lines(&out.stdout);
    assert_eq!(long.len(), 8);
    let line_of = |suffix: &str| -> &String {
        long.iter()
            .find(|l| l.ends_with(suffix))
            .unwrap_or_else(|| panic!("no line ends with {suffix:?}\n{out}"))
    };
    let a = line_of("/a.txt");
    assert!(a.starts_with("-rw-r--r-- "), "{a}");
    assert!(a.contains(" 6 2023-11-14 22:13:20 "), "{a}");
    let link = line_of("/sub/link -> ../a.txt");
    assert!(link.starts_with("lrwxrwxrwx "), "{link}");
    assert!(line_of("/sub/empty").starts_with("drwxr-xr-x "));
    assert!(line_of("/sub/b.bin").contains(&format!(" {} ", 3 << 20)));
    // -l is the short form.
    assert_eq!(
        repo.run(["ls", "-l", "latest", src.to_str().unwrap()])
            .stdout,
        out.stdout
    );
}

#[test]
fn ls_of_a_file_lists_that_file_only() {
    let repo = Repo::init(&[]);
    let src = build_source(&repo);
    repo.backup(&[&src]);
    let file = src.join("sub/script.sh");
    let out = repo.run(["ls", "latest", file.to_str().unwrap()]);
    out.expect_ok();
    assert_eq!(lines(&out.stdout), [file.to_str().unwrap()]);
}

#[test]
fn ls_errors_say_what_is_wrong_with_the_readme_exit_codes() {
    let repo = Repo::init(&[]);
    repo.run(["ls", "latest"])
        .expect_code(1)
        .expect_stderr(&["no snapshot matches"]);
    let src = build_source(&repo);
    repo.backup(&[&src]);
    repo.run(["ls", "0000000000"])
        .expect_code(1)
        .expect_stderr(&["no snapshot matches"]);
    let missing = src.join("no-such-file");
    let out = repo.run(["--json", "ls", "latest", missing.to_str().unwrap()]);
    out.expect_code(1)
        .expect_stderr(&[missing.to_str().unwrap(), "is not in snapshot"]);
    assert!(out.json()["error"]
        .as_str()
        .is_some_and(|e| e.contains("is not in snapshot")));
    // A sibling whose name extends a listed one is not below it.
    let prefix = format!("{}/sub/scr", src.display());
    repo.run(["ls", "latest", &prefix]).expect_code(1);
    repo.run(["ls", "latest", "/a/../b"])
        .expect_code(2)
        .expect_stderr(&["`..` is not allowed"]);
}

/// Runs `larder --repo REPO ARGS` with stdout in a file; returns the run and the bytes
/// it wrote (the support runner decodes stdout as text, which binary content is not).
fn run_to_file(repo: &Repo, args: &[&str]) -> (support::Output, Vec<u8>) {
    let path = repo.scratch.path().join("stdout.bin");
    let file = File::create(&path).expect("create stdout file");
    let mut cmd = repo.command(args);
    cmd.stdout(Stdio::from(file));
    let out = run_command(cmd, RUN_TIMEOUT);
    let bytes = fs::read(&path).expect("read stdout file");
    (out, bytes)
}

#[test]
fn cat_writes_a_multi_chunk_file_byte_for_byte() {
    let repo = Repo::init(&[]);
    let src = build_source(&repo);
    let summary = repo.backup(&[&src]);
    assert!(summary["chunks"].as_u64().unwrap() > 100, "{summary}");
    let big = src.join("sub/b.bin");
    let original = fs::read(&big).unwrap();
    for (command, path) in [
        ("cat", big.to_str().unwrap()),
        ("dump", big.to_str().unwrap().trim_start_matches('/')),
    ] {
        let (out, bytes) = run_to_file(&repo, &[command, "latest", path]);
        out.expect_ok();
        assert!(bytes == original, "{command} wrote different bytes\n{out}");
        assert!(out.stderr.is_empty(), "{out}");
    }
    let (out, bytes) = run_to_file(&repo, &["-q", "cat", "latest", big.to_str().unwrap()]);
    out.expect_ok();
    assert!(bytes == original, "-q must not silence the content");
    let empty = src.join("sub/empty");
    let (out, bytes) = run_to_file(&repo, &["cat", "latest", empty.to_str().unwrap()]);
    out.expect_code(1)
        .expect_stderr(&[empty.to_str().unwrap(), "is a directory", "larder ls"]);
    assert!(bytes.is_empty());
}

#[test]
fn cat_refuses_directories_symlinks_json_and_missing_paths() {
    let repo = Repo::init(&[]);
    let src = build_source(&repo);
    repo.backup(&[&src]);
    let link = src.join("sub/link");
    let out = repo.run(["cat", "latest", link.to_str().unwrap()]);
    out.expect_code(1)
        .expect_stderr(&["is a symlink to ../a.txt", "not followed"]);
    assert!(out.stdout.is_empty(), "a symlink was followed\n{out}");
    repo.run(["cat", "latest", "/"])
        .expect_code(1)
        .expect_stderr(&["root directory"]);
    repo.run(["cat", "latest", src.join("nope").to_str().unwrap()])
        .expect_code(1)
        .expect_stderr(&["is not in snapshot"]);
    let out = repo.run([
        "--json",
        "cat",
        "latest",
        src.join("a.txt").to_str().unwrap(),
    ]);
    out.expect_code(2).expect_stderr(&["--json does not apply"]);
    assert!(out.json()["error"].is_string());
    repo.run(["cat", "nope", "/x"])
        .expect_code(1)
        .expect_stderr(&["no snapshot matches"]);
}

/// Flips one byte in the middle of the file's data: `cat` stops before the damaged
/// chunk with exit code 1 and a message naming the file; what it wrote is a prefix of
/// the original, never a wrong byte.
#[test]
fn cat_of_a_damaged_chunk_fails_and_writes_no_wrong_byte() {
    let repo = Repo::init(&[]);
    let src = repo.dir("src");
    let original = pseudo_random(11, 3 << 20);
    TreeBuilder::new(&src).file("big", &original).finish();
    repo.backup(&[&src]);
    let containers: Vec<PathBuf> = fs::read_dir(repo.path.join("containers"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(containers.len(), 1, "3 MiB fits one 4 MiB container");
    // The file's chunks come first in the container, from byte 32 (format.md).
    let damaged_at = 32 + (original.len() / 2);
    let mut bytes = fs::read(&containers[0]).unwrap();
    bytes[damaged_at] ^= 0x40;
    fs::write(&containers[0], &bytes).unwrap();

    let big = src.join("big");
    let (out, written) = run_to_file(&repo, &["cat", "latest", big.to_str().unwrap()]);
    out.expect_code(1)
        .expect_stderr(&[big.to_str().unwrap(), "cannot be read", "damaged"]);
    assert!(
        written.len() < original.len() / 2,
        "{} bytes written",
        written.len()
    );
    assert!(
        original.starts_with(&written),
        "cat wrote bytes that are not the original's"
    );
}

/// Writes a snapshot whose tree stream is exactly `entries` (in this order), with each
/// file's data as one chunk; returns the snapshot id. larder-store's public API, as in
/// restore_safety.rs.
fn craft_snapshot(repo_path: &Path, entries: &[(TreeEntry, &[u8])]) -> String {
    let mut repo = support::open_store(repo_path, LockMode::Exclusive);
    let codec = repo.codec();
    let id = repo.allocate_container_id();
    let mut container =
        ContainerBuilder::for_codec(id, &codec, 1 << 20, repo.config().container_size);
    let mut stream = Vec::new();
    encode_tree_header(&mut stream);
    for (entry, data) in entries {
        let mut entry = entry.clone();
        if entry.kind == EntryKind::File {
            let fp = codec.fingerprint(data);
            if !container.entries().iter().any(|c| c.fingerprint == fp) {
                container.push(fp, data);
            }
            entry.chunks = vec![fp];
        }
        entry.encode(&mut stream);
    }
    stream.push(0);
    let tree_fp = codec.fingerprint(&stream);
    container.push(tree_fp, &stream);
    let (bytes, table) = container.seal();
    repo.backend()
        .write(FileKind::Container, &format!("{id:016x}"), &bytes)
        .expect("write container");
    repo.commit(vec![SegmentContainer { id, entries: table }])
        .expect("commit");
    let snapshot = Snapshot {
        version: 1,
        time: format!("2030-01-01T00:00:{:02}.000000000Z", id % 60),
        hostname: "hostile".into(),
        username: "mallory".into(),
        paths: vec!["/hostile".into()],
        tree: TreeRef {
            size: stream.len() as u64,
            chunks: vec![tree_fp.to_hex()],
        },
        summary: SnapshotSummary::default(),
        partial: false,
        parents: Vec::new(),
        original: None,
        repaired_from: None,
    };
    repo.save_snapshot(&snapshot).expect("save snapshot")
}

fn hostile(kind: EntryKind, path: &[u8], size: u64) -> TreeEntry {
    TreeEntry {
        mode: u32::MAX,
        mtime_sec: i64::MIN,
        // The largest a version 2 tree takes (version 1 took any).
        mtime_nsec: 999_999_999,
        uid: u32::MAX,
        size,
        target: if kind == EntryKind::Symlink {
            b"\x1b]0;pwned\x07".to_vec()
        } else {
            Vec::new()
        },
        ..TreeEntry::new(kind, path.to_vec())
    }
}

/// A tree no backup writes: a repeated path, a file below a file and below a symlink,
/// entries out of order and without parents, a size its chunk does not hold, names
/// and a target with terminal escapes. Listing shows it, escaped; naming a repeated
/// or inconsistent file fails with exit code 1; nothing panics.
#[test]
fn hostile_trees_are_listed_and_refused_without_a_panic() {
    let repo = Repo::init(&[]);
    let src = build_source(&repo);
    let honest = repo.backup(&[&src])["snapshot"]
        .as_str()
        .unwrap()
        .to_string();
    let id = craft_snapshot(
        &repo.path,
        &[
            (hostile(EntryKind::File, b"z/twice", 3), b"one"),
            (hostile(EntryKind::File, b"z/twice", 3), b"two"),
            (hostile(EntryKind::File, b"z/twice/below-a-file", 1), b"x"),
            (hostile(EntryKind::Symlink, b"a/link", 0), b""),
            (hostile(EntryKind::File, b"a/link/through", 1), b"y"),
            (
                hostile(EntryKind::File, b"a/wrong-size", u64::MAX),
                b"short",
            ),
            (hostile(EntryKind::Dir, b"esc\x1b[2J", 0), b""),
        ],
    );
    let never_panics = |out: &support::Output| {
        assert!(
            !out.stderr.contains("panicked") && out.code.is_some_and(|c| c < 100),
            "{out}"
        );
    };

    let out = repo.run(["ls", "-l", &id]);
    never_panics(&out);
    out.expect_ok();
    assert_eq!(out.stdout.lines().count(), 7, "{out}");
    assert!(
        !out.stdout.contains('\x1b'),
        "an escape reached the terminal\n{out}"
    );
    assert!(out.stdout.contains("/esc\\x1b[2J"), "{out}");
    let json = repo.run(["--json", "ls", &id, "z/twice"]);
    never_panics(&json);
    assert_eq!(json.json()["count"], 3);

    let out = repo.run(["cat", &id, "z/twice"]);
    never_panics(&out);
    out.expect_code(1).expect_stderr(&["occurs 2 times"]);
    let out = repo.run(["cat", &id, "a/wrong-size"]);
    never_panics(&out);
    out.expect_code(1)
        .expect_stderr(&["hold 5 bytes", &u64::MAX.to_string()]);
    let out = repo.run(["cat", &id, "a/link/through"]);
    never_panics(&out);
    out.expect_ok();
    assert_eq!(out.stdout, "y");
    let out = repo.run(["cat", &id, "a/link"]);
    never_panics(&out);
    out.expect_code(1)
        .expect_stderr(&["is a symlink to \\x1b]0;pwned\\x07"]);

    for (a, b) in [
        (honest.as_str(), id.as_str()),
        (id.as_str(), honest.as_str()),
    ] {
        for json in [false, true] {
            let mut args = vec!["diff", a, b];
            if json {
                args.insert(0, "--json");
            }
            let out = repo.run(&args);
            never_panics(&out);
            out.expect_ok().expect_stderr(&["repeat a path"]);
            if json {
                assert_eq!(out.json()["duplicate_paths"], 1, "{out}");
            } else {
                assert!(!out.stdout.contains('\x1b'), "{out}");
            }
        }
    }
}
