//! Patterns (docs/design/patterns.md) on the command line: `backup --exclude`,
//! `--exclude-file` and `.larderignore` files in nested directories leave entries out
//! without reading them; `restore --include/--exclude` restores a subset with the
//! parent directories of what it includes; invalid patterns are usage errors (exit 2).

mod support;

use std::collections::BTreeSet;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use serde_json::Value;
use support::{is_root, list_tree, restored, Repo, TreeBuilder, NOBODY};

/// Every path of the snapshot below `src`, relative to it.
fn snapshot_listing(repo: &Repo, src: &Path) -> BTreeSet<String> {
    let out = repo.run(["--json", "ls", "latest", src.to_str().unwrap()]);
    out.expect_ok();
    let prefix = format!("{}/", src.display());
    out.json()["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| {
            e["path"]
                .as_str()?
                .strip_prefix(&prefix)
                .map(str::to_string)
        })
        .collect()
}

fn set(paths: &[&str]) -> BTreeSet<String> {
    paths.iter().map(|p| p.to_string()).collect()
}

/// Every path under `root`, relative, as strings.
fn tree_listing(root: &Path) -> BTreeSet<String> {
    list_tree(root)
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect()
}

fn backup_with(repo: &Repo, src: &Path, extra: &[&str]) -> support::Output {
    let mut args = vec!["--json", "backup", src.to_str().unwrap()];
    args.extend_from_slice(extra);
    repo.run(args)
}

#[test]
fn excluded_entries_are_left_out_and_never_read() {
    let mut repo = Repo::init(&[]);
    let src = repo.dir("src");
    TreeBuilder::new(&src)
        .file("keep.txt", b"kept\n")
        .file("debug.log", b"excluded by name\n")
        .file("sub/trace.log", b"excluded at any depth\n")
        .file("sub/keep.rs", b"kept\n")
        .file("build/out.o", b"inside an excluded directory\n")
        .fifo("build/pipe")
        .file("build/locked/secret", b"unreadable, and never read\n")
        .mode("build/locked", 0o000)
        .file("sub/build/deep.o", b"a nested excluded directory\n")
        .file(
            "other/build",
            b"a file named build: build/ matches directories only\n",
        )
        .file(
            "logs.log.d/file",
            b"kept: *.log does not match logs.log.d\n",
        )
        .finish();
    if is_root() {
        // Root reads anything: run larder as an ordinary user, so that reading the
        // locked directory would fail.
        repo.run_as(NOBODY);
    }
    let out = backup_with(&repo, &src, &["--exclude", "*.log", "--exclude", "build/"]);
    out.expect_ok();
    let summary = out.json();
    assert_eq!(summary["excluded"], 4, "{summary}");
    assert_eq!(
        summary["warnings"].as_array().map(Vec::len),
        Some(0),
        "an excluded entry was read: {summary}"
    );
    assert_eq!(
        snapshot_listing(&repo, &src),
        set(&[
            "keep.txt",
            "logs.log.d",
            "logs.log.d/file",
            "other",
            "other/build",
            "sub",
            "sub/keep.rs",
        ])
    );
    let text = repo.run(["backup", src.to_str().unwrap(), "--exclude", "build/"]);
    text.expect_ok();
    assert!(
        text.stdout.contains("excluded    2 entries"),
        "the text summary reports exclusions\n{text}"
    );
}

#[test]
fn an_exclude_file_skips_comments_and_blank_lines_and_anchors_at_the_root() {
    let repo = Repo::init(&[]);
    let src = repo.dir("src");
    TreeBuilder::new(&src)
        .file("a.tmp", b"1\n")
        .file("keep.tmp", b"2\n")
        .file("sub/b.tmp", b"3\n")
        .file("cache/x", b"4\n")
        .file("sub/cache/y", b"5\n")
        .file("data.txt", b"6\n")
        .file("notes.txt", b"7\n")
        .finish();
    let file = repo.scratch.path().join("excludes");
    fs::write(
        &file,
        format!(
            "# what not to back up\n\n*.tmp   \n{}/cache/\r\n!keep.tmp\n  \n",
            src.display()
        ),
    )
    .unwrap();
    let out = backup_with(
        &repo,
        &src,
        &[
            "--exclude-file",
            file.to_str().unwrap(),
            "--exclude",
            "data.txt",
        ],
    );
    out.expect_ok();
    assert_eq!(out.json()["excluded"], 4);
    assert_eq!(
        snapshot_listing(&repo, &src),
        set(&["keep.tmp", "notes.txt", "sub", "sub/cache", "sub/cache/y"])
    );
    // --exclude comes after the file's patterns, so it has the last word.
    let out = backup_with(
        &repo,
        &src,
        &[
            "--exclude-file",
            file.to_str().unwrap(),
            "--exclude",
            "keep.tmp",
        ],
    );
    out.expect_ok();
    assert!(!snapshot_listing(&repo, &src).contains("keep.tmp"));
}

#[test]
fn larderignore_files_apply_below_their_directory_deeper_ones_last() {
    let repo = Repo::init(&[]);
    let src = repo.dir("src");
    TreeBuilder::new(&src)
        .file(".larderignore", b"*.o\n/top-only\nlogs/\n")
        .file(
            "sub/.larderignore",
            b"# re-include, and anchor at sub\n!keep.o\n/local\n",
        )
        .file("sub/deeper/.larderignore", b"*.md\n")
        .file("a.o", b"1\n")
        .file("keep.o", b"2\n")
        .file("top-only", b"3\n")
        .file("sub/top-only", b"4\n")
        .file("logs/x", b"5\n")
        .file("sub/logs/y", b"6\n")
        .file("sub/b.o", b"7\n")
        .file("sub/keep.o", b"8\n")
        .file("sub/local", b"9\n")
        .file("sub/deeper/local", b"10\n")
        .file("sub/deeper/keep.o", b"11\n")
        .file("sub/deeper/c.o", b"12\n")
        .file("sub/deeper/readme.md", b"13\n")
        .file("readme.md", b"14\n")
        .finish();
    let out = backup_with(&repo, &src, &[]);
    out.expect_ok();
    assert_eq!(out.json()["excluded"], 9, "{}", out.json());
    let kept = set(&[
        ".larderignore",
        "readme.md",
        "sub",
        "sub/.larderignore",
        "sub/deeper",
        "sub/deeper/.larderignore",
        "sub/deeper/keep.o",
        "sub/deeper/local",
        "sub/keep.o",
        "sub/top-only",
    ]);
    assert_eq!(snapshot_listing(&repo, &src), kept);
    let target = repo.new_path("target");
    repo.restore("latest", &target, &[]).expect_ok();
    let back = restored(&target, &src);
    assert_eq!(tree_listing(&back), kept);
    assert_eq!(fs::read(back.join("sub/deeper/keep.o")).unwrap(), b"11\n");
}

#[test]
fn a_bad_larderignore_line_is_reported_and_the_rest_applies() {
    let repo = Repo::init(&[]);
    let src = repo.dir("src");
    TreeBuilder::new(&src)
        .file("sub/.larderignore", b"*.o\nbroken[\n*.tmp\n")
        .file("sub/a.o", b"1\n")
        .file("sub/b.tmp", b"2\n")
        .file("sub/c.txt", b"3\n")
        .finish();
    let out = backup_with(&repo, &src, &[]);
    let ignore_file = src.join("sub/.larderignore");
    out.expect_code(3)
        .expect_stderr(&[ignore_file.to_str().unwrap(), "line 2", "invalid pattern"]);
    let summary = out.json();
    assert_eq!(summary["excluded"], 2, "{summary}");
    assert_eq!(
        snapshot_listing(&repo, &src),
        set(&["sub", "sub/.larderignore", "sub/c.txt"])
    );
}

#[test]
fn a_root_that_matches_an_exclude_is_not_backed_up() {
    let repo = Repo::init(&[]);
    let src = repo.dir("src");
    TreeBuilder::new(&src)
        .file("x.log", b"1\n")
        .file("y.txt", b"2\n")
        .finish();
    let log = src.join("x.log");
    let txt = src.join("y.txt");
    let out = repo.run([
        "--json",
        "backup",
        log.to_str().unwrap(),
        txt.to_str().unwrap(),
        "--exclude",
        "*.log",
    ]);
    out.expect_ok()
        .expect_stderr(&[log.to_str().unwrap(), "matches an exclude pattern"]);
    assert_eq!(out.json()["excluded"], 1);
    assert_eq!(snapshot_listing(&repo, &src), set(&["y.txt"]));
}

#[test]
fn invalid_patterns_are_usage_errors_and_change_nothing() {
    let repo = Repo::init(&[]);
    let src = repo.dir("src");
    TreeBuilder::new(&src).file("f", b"data").finish();
    let bad_file = repo.scratch.path().join("bad-excludes");
    fs::write(&bad_file, b"# fine\n*.tmp\n[z-a]\n").unwrap();
    let missing = repo.scratch.path().join("no-such-file");
    for (args, message) in [
        (vec!["--exclude", "a[b"], "invalid pattern \"a[b\""),
        (vec!["--exclude", "../x"], "`.` and `..`"),
        (vec!["--exclude", ""], "names no path"),
        (
            vec!["--exclude-file", bad_file.to_str().unwrap()],
            ":3: invalid pattern",
        ),
        (
            vec!["--exclude-file", missing.to_str().unwrap()],
            "cannot read --exclude-file",
        ),
    ] {
        let out = backup_with(&repo, &src, &args);
        out.expect_code(2).expect_stderr(&[message]);
        assert!(out.json()["error"].is_string(), "{out}");
    }
    assert!(
        repo.snapshots().is_empty(),
        "a refused backup saved a snapshot"
    );

    repo.backup(&[&src]);
    let target = repo.scratch.path().join("target");
    for args in [["--include", "[z-a]"], ["--exclude", "a//b"]] {
        repo.restore("latest", &target, &args)
            .expect_code(2)
            .expect_stderr(&["invalid pattern"]);
    }
    assert!(!target.exists(), "a refused restore created its target");
}

/// A tree for the restore tests; `docs` has an unusual mode and mtime, so that a
/// restored parent directory shows it got its snapshot metadata.
fn restore_source(repo: &Repo) -> PathBuf {
    let src = repo.dir("src");
    TreeBuilder::new(&src)
        .file("a.txt", b"a\n")
        .file("b.log", b"b\n")
        .file("docs/c.txt", b"c\n")
        .file("docs/img.png", b"png\n")
        .file("docs/old/d.txt", b"d\n")
        .dir("empty_dir")
        .symlink("link", "a.txt")
        .mode("docs", 0o750)
        .mtime("docs", 1_500_000_000, 42)
        .finish();
    src
}

fn restore_subset(repo: &Repo, src: &Path, name: &str, args: &[&str]) -> (Value, PathBuf) {
    let target = repo.new_path(name);
    let out = repo.restore("latest", &target, args);
    out.expect_ok();
    (out.json(), restored(&target, src))
}

#[test]
fn restore_include_brings_parent_directories_with_their_metadata() {
    let repo = Repo::init(&[]);
    let src = restore_source(&repo);
    repo.backup(&[&src]);
    let (summary, back) = restore_subset(&repo, &src, "t1", &["--include", "*.txt"]);
    assert_eq!(
        tree_listing(&back),
        set(&["a.txt", "docs", "docs/c.txt", "docs/old", "docs/old/d.txt"])
    );
    assert_eq!(summary["files"], 3);
    let total = repo.run(["--json", "ls", "latest"]).json()["count"]
        .as_u64()
        .unwrap();
    let restored_count = ["files", "dirs", "symlinks"]
        .iter()
        .map(|k| summary[k].as_u64().unwrap())
        .sum::<u64>();
    assert_eq!(summary["filtered_out"], total - restored_count, "{summary}");
    let docs = fs::metadata(back.join("docs")).unwrap();
    assert_eq!(docs.mode() & 0o7777, 0o750);
    assert_eq!((docs.mtime(), docs.mtime_nsec()), (1_500_000_000, 42));

    // An included directory brings everything inside it; the path may be anchored.
    let anchored = format!("{}/docs", src.display());
    let (_, back) = restore_subset(&repo, &src, "t2", &["--include", &anchored]);
    assert_eq!(
        tree_listing(&back),
        set(&[
            "docs",
            "docs/c.txt",
            "docs/img.png",
            "docs/old",
            "docs/old/d.txt"
        ])
    );
    let (_, back) = restore_subset(
        &repo,
        &src,
        "t3",
        &["--include", "link", "--include", "empty_dir/"],
    );
    assert_eq!(tree_listing(&back), set(&["empty_dir", "link"]));
    assert_eq!(
        fs::read_link(back.join("link")).unwrap(),
        Path::new("a.txt")
    );
}

#[test]
fn restore_exclude_skips_directories_whole() {
    let repo = Repo::init(&[]);
    let src = restore_source(&repo);
    repo.backup(&[&src]);
    let docs = format!("{}/docs", src.display());
    let (_, back) = restore_subset(&repo, &src, "t1", &["--exclude", &docs]);
    assert_eq!(
        tree_listing(&back),
        set(&["a.txt", "b.log", "empty_dir", "link"])
    );
    let (_, back) = restore_subset(
        &repo,
        &src,
        "t2",
        &["--include", "docs/", "--exclude", "old/"],
    );
    assert_eq!(
        tree_listing(&back),
        set(&["docs", "docs/c.txt", "docs/img.png"])
    );
    let (_, back) = restore_subset(
        &repo,
        &src,
        "t3",
        &[
            "--exclude",
            "*.txt",
            "--exclude",
            "!a.txt",
            "--exclude",
            "*.png",
        ],
    );
    assert_eq!(
        tree_listing(&back),
        set(&["a.txt", "b.log", "docs", "docs/old", "empty_dir", "link"])
    );
    let mode = fs::metadata(back.join("docs"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o7777, 0o750);
}
