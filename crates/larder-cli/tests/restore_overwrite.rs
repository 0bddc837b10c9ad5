//! `restore --overwrite` replaces what the snapshot holds and never deletes anything
//! else: a directory of the target stands in the way of a symlink or file of the
//! snapshot only if it is empty, else the restore names it and exits 3. `--delete`
//! (restic's name) is the explicit way to remove what the restored directories hold
//! that the snapshot does not, and it never follows a symlink while doing so.

mod support;

use std::fs;
use std::path::Path;

use support::{list_tree, restored, Repo, TreeBuilder};

/// The errors a restore warned about (not notices), as path and message.
fn warned(out: &support::Output) -> Vec<(String, String)> {
    out.json()["warnings"]
        .as_array()
        .map(|ws| {
            ws.iter()
                .filter(|w| w["is_error"] == true)
                .map(|w| {
                    let s = |k: &str| w[k].as_str().unwrap_or_default().to_string();
                    (s("path"), s("message"))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Regression guard: the snapshot holds `lib -> usr/lib` (Debian's merged /usr) where
/// the target has a real directory `lib` holding files in no snapshot; `--overwrite`
/// used to remove that directory whole, files included.
#[test]
fn overwrite_never_removes_a_directory_holding_files() {
    let repo = Repo::init(&[]);
    let src = repo.dir("src");
    TreeBuilder::new(&src)
        .file("usr/lib/x", b"x\n")
        .file("usr/bin/y", b"y\n")
        .symlink("lib", "usr/lib")
        .symlink("bin", "usr/bin")
        .symlink("sbin", "usr/sbin")
        .finish();
    repo.backup(&[&src]);
    let target = repo.dir("target");
    let back = restored(&target, &src);
    fs::create_dir_all(back.join("lib/modules")).unwrap();
    fs::write(back.join("lib/modules/keep"), b"in no snapshot\n").unwrap();
    fs::create_dir_all(back.join("bin")).unwrap();
    fs::write(back.join("sbin"), b"a file in the way\n").unwrap();

    let out = repo.restore("latest", &target, &["--overwrite"]);
    out.expect_code(3);
    let warnings = warned(&out);
    assert_eq!(warnings.len(), 1, "{out}");
    assert_eq!(warnings[0].0, back.join("lib").to_str().unwrap(), "{out}");
    assert!(warnings[0].1.contains("not replaced"), "{out}");
    assert_eq!(
        fs::read(back.join("lib/modules/keep")).unwrap(),
        b"in no snapshot\n"
    );
    // An empty directory and a file are replaced by what the snapshot holds.
    assert_eq!(
        fs::read_link(back.join("bin")).unwrap(),
        Path::new("usr/bin")
    );
    assert_eq!(
        fs::read_link(back.join("sbin")).unwrap(),
        Path::new("usr/sbin")
    );
    assert_eq!(fs::read(back.join("usr/lib/x")).unwrap(), b"x\n");
    assert_eq!(out.json()["removed"], 1, "{out}");

    // With --delete, what the snapshot does not hold goes: the directory is emptied
    // and replaced by the symlink.
    let out = repo.restore("latest", &target, &["--overwrite", "--delete"]);
    out.expect_ok();
    assert_eq!(
        fs::read_link(back.join("lib")).unwrap(),
        Path::new("usr/lib")
    );
    assert_eq!(out.json()["removed"], 3, "{out}");
}

#[test]
fn delete_removes_only_what_the_snapshot_does_not_hold() {
    let repo = Repo::init(&[]);
    let src = repo.dir("src");
    TreeBuilder::new(&src)
        .file("dir/a", b"a\n")
        .file("dir/sub/b", b"b\n")
        .file("top", b"top\n")
        .finish();
    repo.backup(&[&src]);
    let outside = repo.dir("outside");
    fs::write(outside.join("victim"), b"victim\n").unwrap();
    let target = repo.dir("target");
    let back = restored(&target, &src);
    fs::create_dir_all(back.join("dir/extra-dir/deep")).unwrap();
    fs::create_dir_all(back.join("dir/sub")).unwrap();
    fs::write(back.join("dir/extra-dir/deep/f"), b"extra\n").unwrap();
    fs::write(back.join("dir/extra"), b"extra\n").unwrap();
    fs::write(back.join("dir/keep.log"), b"excluded: not ours to delete\n").unwrap();
    std::os::unix::fs::symlink(&outside, back.join("dir/sub/link-out")).unwrap();
    fs::write(target.join("unrelated"), b"beside what is restored\n").unwrap();

    let out = repo.restore("latest", &target, &["--delete", "--exclude", "*.log"]);
    out.expect_ok();
    // dir/extra, dir/extra-dir with deep and f, and the link (not what it names).
    assert_eq!(out.json()["removed"], 5, "{out}");
    assert_eq!(
        list_tree(&back),
        [
            "dir",
            "dir/a",
            "dir/keep.log",
            "dir/sub",
            "dir/sub/b",
            "top"
        ]
        .map(std::path::PathBuf::from)
    );
    assert_eq!(fs::read(outside.join("victim")).unwrap(), b"victim\n");
    assert_eq!(list_tree(&outside), [Path::new("victim")]);
    assert!(target.join("unrelated").exists());
}
