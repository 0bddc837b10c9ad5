//! What a backup takes from its source paths: a missing source path does not cost the
//! others; a path below a symlinked parent restores at the path given; mount points,
//! cache directories and tagged directories are left out on request
//! (`--one-file-system`, `--exclude-caches`, `--exclude-if-present`).

mod support;

use std::ffi::CString;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use serde_json::Value;
use support::{is_root, restored, snapshot_path, Repo, TreeBuilder};

const CACHEDIR_TAG: &[u8] = b"Signature: 8a477f597d28d172789f06886806bc55\n# a cache\n";

/// The paths `ls --json` lists in `snapshot`, without their leading `/`.
fn listed(repo: &Repo, snapshot: &str) -> Vec<String> {
    let out = repo.run(["--json", "ls", snapshot]);
    out.expect_ok();
    out.json()["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .map(|e| e["path"].as_str().expect("path")[1..].to_string())
        .collect()
}

fn warnings_of(summary: &Value) -> Vec<(String, String, bool)> {
    summary["warnings"]
        .as_array()
        .expect("warnings")
        .iter()
        .map(|w| {
            (
                w["path"].as_str().unwrap().to_string(),
                w["message"].as_str().unwrap().to_string(),
                w["is_error"].as_bool().unwrap(),
            )
        })
        .collect()
}

/// Guards against one missing source path aborting the whole backup with no
/// snapshot: the others are saved, the missing one is named, and the exit code is 3.
#[test]
fn a_missing_source_path_is_named_and_the_others_are_saved() {
    let repo = Repo::init(&[]);
    let src = repo.dir("src");
    TreeBuilder::new(&src).file("f", b"data").finish();
    let missing = repo.scratch.path().join("no-such-dir");
    let out = repo.backup_run(&[&src, &missing]);
    out.expect_code(3)
        .expect_stderr(&[missing.to_str().unwrap(), "No such file"]);
    let ws = warnings_of(&out.json());
    assert!(
        ws.iter()
            .any(|(path, _, error)| path == missing.to_str().unwrap() && *error),
        "{ws:?}"
    );
    let snaps = repo.snapshots();
    assert_eq!(snaps.len(), 1, "no snapshot was saved\n{out}");
    assert_eq!(
        snaps[0]["snapshot"]["paths"],
        serde_json::json!([src.to_str().unwrap()]),
        "the snapshot names a path it does not hold"
    );
    let target = repo.new_path("target");
    repo.restore("latest", &target, &[]).expect_ok();
    assert_eq!(
        fs::read(restored(&target, &src).join("f")).unwrap(),
        b"data"
    );
}

/// Guards against a path below a symlinked parent (Debian's `/lib` is a symlink to
/// `usr/lib`) restoring as the symlink alone: the parent is recorded as the directory
/// it resolves to, so the content restores at the path given. A source path that is
/// itself a symlink is recorded as one.
#[test]
fn a_path_below_a_symlinked_parent_restores_at_the_path_given() {
    let repo = Repo::init(&[]);
    let root = repo.dir("root");
    TreeBuilder::new(&root)
        .file("usr/lib/systemd/system/a.service", b"[Unit]\n")
        .file("usr/lib/systemd/system/b.service", b"[Service]\n")
        .symlink("lib", "usr/lib")
        .symlink("link-to-dir", "usr")
        .finish();
    let given = root.join("lib/systemd/system");
    let out = repo.backup_run(&[&given, &root.join("link-to-dir")]);
    out.expect_ok();
    let target = repo.new_path("target");
    repo.restore("latest", &target, &[]).expect_ok();
    let back = restored(&target, &given);
    assert_eq!(fs::read(back.join("a.service")).unwrap(), b"[Unit]\n");
    assert_eq!(fs::read(back.join("b.service")).unwrap(), b"[Service]\n");
    let lib = restored(&target, &root.join("lib"));
    assert!(fs::symlink_metadata(&lib).unwrap().is_dir());
    // The parent recorded is the directory `lib` resolves to.
    let recorded = fs::metadata(root.join("usr/lib")).unwrap();
    assert_eq!(
        fs::metadata(&lib).unwrap().permissions(),
        recorded.permissions()
    );
    let link = restored(&target, &root.join("link-to-dir"));
    assert_eq!(fs::read_link(&link).unwrap(), Path::new("usr"));
}

/// A tmpfs mounted for one test, unmounted when dropped.
struct Mount(PathBuf);

impl Mount {
    /// Mounts a tmpfs at `at` (created); `None` where this process may not mount.
    fn tmpfs(at: &Path) -> Option<Self> {
        fs::create_dir_all(at).unwrap();
        let c = |s: &[u8]| CString::new(s).unwrap();
        let (src, dir, fstype) = (c(b"larder-test"), c(at.as_os_str().as_bytes()), c(b"tmpfs"));
        // SAFETY: every pointer is a valid NUL-terminated string or null; mount retains
        // none of them.
        let rc = unsafe {
            libc::mount(
                src.as_ptr(),
                dir.as_ptr(),
                fstype.as_ptr(),
                0,
                std::ptr::null(),
            )
        };
        (rc == 0).then(|| Self(at.to_path_buf()))
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let dir = CString::new(self.0.as_os_str().as_bytes()).unwrap();
        // SAFETY: `dir` is a valid NUL-terminated path; umount2 does not retain it.
        unsafe { libc::umount2(dir.as_ptr(), libc::MNT_DETACH) };
    }
}

/// `--one-file-system` records a mount point below a source path as a directory and
/// leaves its contents out, as restic's `-x` does; a source path that is a mount
/// point itself is backed up whole. Needs root (it mounts a tmpfs).
#[test]
fn one_file_system_keeps_mount_points_but_not_their_contents() {
    if !is_root() {
        eprintln!("skipped: mounting a tmpfs needs root");
        return;
    }
    let repo = Repo::init(&[]);
    let src = repo.dir("src");
    TreeBuilder::new(&src)
        .file("here", b"on the source's file system")
        .finish();
    let Some(mount) = Mount::tmpfs(&src.join("mnt")) else {
        eprintln!("skipped: this process may not mount a tmpfs");
        return;
    };
    TreeBuilder::new(&mount.0)
        .file("there/f", b"on another file system")
        .finish();
    let x = repo.run([
        "--json",
        "backup",
        "--one-file-system",
        src.to_str().unwrap(),
    ]);
    x.expect_ok();
    let id = x.json()["snapshot"].as_str().unwrap().to_string();
    let paths = listed(&repo, &id);
    let rel = snapshot_path(&src);
    assert!(paths.contains(&format!("{rel}/here")), "{paths:?}");
    assert!(
        paths.contains(&format!("{rel}/mnt")),
        "the mount point is missing: {paths:?}"
    );
    assert!(
        !paths.iter().any(|p| p.starts_with(&format!("{rel}/mnt/"))),
        "a mount's contents were backed up: {paths:?}"
    );
    // Without the option, the mount's contents are backed up.
    let all = repo.backup(&[&src]);
    let paths = listed(&repo, all["snapshot"].as_str().unwrap());
    assert!(paths.contains(&format!("{rel}/mnt/there/f")), "{paths:?}");
    // A source path that is a mount point is backed up whole.
    let out = repo.run(["--json", "backup", "-x", mount.0.to_str().unwrap()]);
    out.expect_ok();
    let paths = listed(&repo, out.json()["snapshot"].as_str().unwrap());
    assert!(paths.contains(&format!("{rel}/mnt/there/f")), "{paths:?}");
}

/// `--exclude-caches` leaves out the contents of a directory holding a CACHEDIR.TAG
/// with the specification's header, keeping the directory and the tag file (restic
/// and borg do so); a tag without the header excludes nothing. `--exclude-if-present`
/// does the same for any name, with an optional header.
#[test]
fn tagged_directories_keep_their_tag_file_only() {
    let repo = Repo::init(&[]);
    let src = repo.dir("src");
    TreeBuilder::new(&src)
        .file("cache/CACHEDIR.TAG", CACHEDIR_TAG)
        .file("cache/blob", b"regenerable")
        .file("cache/sub/deep", b"regenerable too")
        .file("fake/CACHEDIR.TAG", b"Signature: not the one\n")
        .file("fake/kept", b"precious")
        .file("tmp/.nobackup", b"")
        .file("tmp/scratch", b"junk")
        .file("magic/TAG", b"MAGIC and more")
        .file("magic/x", b"junk")
        .file("nomagic/TAG", b"other")
        .file("nomagic/y", b"kept")
        .file("plain", b"kept")
        .finish();
    let s = |p: &str| src.join(p).to_str().unwrap().to_string();
    let out = repo.run([
        "--json".to_string(),
        "backup".to_string(),
        "--exclude-caches".to_string(),
        "--exclude-if-present".to_string(),
        ".nobackup".to_string(),
        "--exclude-if-present".to_string(),
        "TAG:MAGIC".to_string(),
        s(""),
    ]);
    out.expect_ok();
    let summary = out.json();
    assert_eq!(summary["excluded"], 4, "{summary}");
    let paths = listed(&repo, summary["snapshot"].as_str().unwrap());
    let rel = snapshot_path(&src);
    let has = |p: &str| paths.contains(&format!("{rel}/{p}"));
    for kept in [
        "cache",
        "cache/CACHEDIR.TAG",
        "fake/CACHEDIR.TAG",
        "fake/kept",
        "tmp",
        "tmp/.nobackup",
        "magic/TAG",
        "nomagic/y",
        "plain",
    ] {
        assert!(has(kept), "{kept} is missing: {paths:?}");
    }
    for left in ["cache/blob", "cache/sub", "tmp/scratch", "magic/x"] {
        assert!(!has(left), "{left} was backed up: {paths:?}");
    }
    let ws = warnings_of(&summary);
    assert!(
        ws.iter()
            .any(|(path, _, error)| path == &s("fake/CACHEDIR.TAG") && !*error),
        "the tag without its header is not named: {ws:?}"
    );
    // A tag name that is a path is a usage error.
    repo.run(["backup", "--exclude-if-present", "a/b", &s("")])
        .expect_code(2);
}
