//! `larder mount`: the snapshots by id, by time, by host and as `latest`; every file
//! read back byte for byte through the kernel, with its recorded mode, mtime, owner
//! and extended attributes; writes refused with EROFS; SIGINT and SIGTERM unmount cleanly and release
//! the repository's lock.
//!
//! These tests need FUSE (/dev/fuse and fusermount3, Debian's fuse3). Without it they
//! fail and say so, unless `LARDER_SKIP_FUSE_TESTS=1` is set.

mod support;

use std::ffi::CString;
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use support::{assert_same_tree, is_root, pseudo_random, snapshot_path, Repo, TreeBuilder};

/// Whether FUSE tests should run: panics with advice where FUSE is missing, unless
/// `LARDER_SKIP_FUSE_TESTS=1` says to skip them.
fn fuse_or_skip() -> bool {
    if std::env::var_os("LARDER_SKIP_FUSE_TESTS").is_some_and(|v| v == "1") {
        eprintln!("skipped: LARDER_SKIP_FUSE_TESTS=1");
        return false;
    }
    assert!(
        Path::new("/dev/fuse").exists(),
        "larder mount's tests need FUSE, and /dev/fuse is missing (load the fuse module, or give the container --device /dev/fuse); set LARDER_SKIP_FUSE_TESTS=1 to skip them"
    );
    let fusermount = Command::new("fusermount3").arg("--version").output();
    assert!(
        fusermount.is_ok(),
        "larder mount's tests need fusermount3 (Debian's fuse3: scripts/install-deps --tests installs it); set LARDER_SKIP_FUSE_TESTS=1 to skip them"
    );
    true
}

/// A running `larder mount`; on drop, killed and its mount point detached, so that a
/// failed test leaves no mount behind.
struct Mounted {
    child: Option<Child>,
    dir: PathBuf,
}

impl Mounted {
    /// Starts `larder mount DIR` and waits until the file system answers.
    #[track_caller]
    fn start(repo: &Repo, dir: &Path) -> Self {
        let mut cmd = repo.command([Path::new("mount"), dir]);
        cmd.stdout(Stdio::null());
        let child = cmd.spawn().expect("start larder mount");
        let mut m = Self {
            child: Some(child),
            dir: dir.to_path_buf(),
        };
        let started = Instant::now();
        while !dir.join("ids").is_dir() {
            if let Some(status) = m.child().try_wait().expect("poll larder mount") {
                panic!(
                    "larder mount exited with {status} before mounting: {}",
                    m.stderr()
                );
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "larder mount did not mount within 30 s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        m
    }

    fn child(&mut self) -> &mut Child {
        self.child.as_mut().expect("larder mount is running")
    }

    fn stderr(&mut self) -> String {
        let mut s = String::new();
        if let Some(mut e) = self.child().stderr.take() {
            let _ = e.read_to_string(&mut s);
        }
        s
    }

    /// Sends `signal` and waits for larder to exit; returns its exit code and stderr.
    #[track_caller]
    fn stop(mut self, signal: libc::c_int) -> (Option<i32>, String) {
        let pid = self.child().id() as libc::pid_t;
        // SAFETY: kill has no memory-safety preconditions; the child is not reaped.
        assert_eq!(unsafe { libc::kill(pid, signal) }, 0);
        let started = Instant::now();
        let status = loop {
            if let Some(status) = self.child().try_wait().expect("wait for larder mount") {
                break status;
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "larder mount did not exit within 30 s of signal {signal}"
            );
            std::thread::sleep(Duration::from_millis(50));
        };
        let stderr = self.stderr();
        self.child = None;
        (status.code(), stderr)
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = Command::new("fusermount3")
            .args(["-u", "-z", "-q", "--"])
            .arg(&self.dir)
            .stderr(Stdio::null())
            .status();
    }
}

/// Whether `dir` is a mount point now, by /proc/self/mountinfo.
fn is_mounted(dir: &Path) -> bool {
    let dir = dir.canonicalize().expect("canonical mount point");
    let info = fs::read_to_string("/proc/self/mountinfo").expect("read mountinfo");
    info.lines()
        .any(|l| l.split(' ').nth(4) == Some(dir.to_str().expect("UTF-8 path")))
}

/// A source tree with files of varied sizes (empty, small, several MiB), nested
/// directories, an empty one, a symlink, and unusual modes and mtimes.
fn build_source(repo: &Repo) -> PathBuf {
    let src = repo.dir("src");
    TreeBuilder::new(&src)
        .file("empty", b"")
        .file("small.txt", b"hello, mount\n")
        .mode("small.txt", 0o640)
        .mtime("small.txt", 1_700_000_000, 123_456_789)
        .file("big.bin", pseudo_random(1, (5 << 20) + 12_345))
        .file("nested/deeper/mid.bin", pseudo_random(2, 300_001))
        .file("nested/deeper/script.sh", b"#!/bin/sh\necho hi\n")
        .mode("nested/deeper/script.sh", 0o750)
        .dir("nested/empty-dir")
        .symlink("nested/link", "../small.txt")
        .finish();
    src
}

fn c_path(path: &Path) -> CString {
    CString::new(path.as_os_str().as_bytes()).expect("path without NUL")
}

fn set_xattr(path: &Path, name: &str, value: &[u8]) {
    let n = CString::new(name).unwrap();
    // SAFETY: valid NUL-terminated strings and a value buffer of its length.
    let rc = unsafe {
        libc::lsetxattr(
            c_path(path).as_ptr(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    assert_eq!(
        rc,
        0,
        "lsetxattr {name}: {}",
        std::io::Error::last_os_error()
    );
}

fn get_xattr(path: &Path, name: &str) -> std::io::Result<Vec<u8>> {
    let n = CString::new(name).unwrap();
    let mut buf = vec![0u8; 4096];
    // SAFETY: valid NUL-terminated strings and a buffer of the length passed.
    let len = unsafe {
        libc::lgetxattr(
            c_path(path).as_ptr(),
            n.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    if len < 0 {
        return Err(std::io::Error::last_os_error());
    }
    buf.truncate(len as usize);
    Ok(buf)
}

fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read_dir {}: {e}", dir.display()))
        .map(|e| {
            e.expect("dir entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    names.sort();
    names
}

fn link(path: &Path) -> String {
    fs::read_link(path)
        .unwrap_or_else(|e| panic!("readlink {}: {e}", path.display()))
        .to_string_lossy()
        .into_owned()
}

#[test]
fn snapshots_by_id_time_host_and_latest_read_back_identical() {
    if !fuse_or_skip() {
        return;
    }
    let repo = Repo::init(&[]);
    let src = build_source(&repo);
    set_xattr(&src.join("small.txt"), "user.larder", b"kept");
    repo.backup(&[&src]);
    let added = src.join("nested/added.bin");
    fs::write(&added, pseudo_random(3, 70_000)).unwrap();
    repo.backup(&[&src]);
    let snaps = repo.snapshots();
    let ids: Vec<String> = snaps
        .iter()
        .map(|s| s["id"].as_str().unwrap().to_string())
        .collect();
    let host = snaps[0]["snapshot"]["hostname"]
        .as_str()
        .unwrap()
        .to_string();

    let mnt = repo.dir("mnt");
    let m = Mounted::start(&repo, &mnt);
    assert_eq!(names(&mnt), ["hosts", "ids", "latest", "snapshots"]);
    let mut sorted_ids = ids.clone();
    sorted_ids.sort();
    assert_eq!(names(&mnt.join("ids")), sorted_ids);
    assert_eq!(link(&mnt.join("latest")), format!("ids/{}", ids[1]));

    // By time: one symlink per snapshot, to its directory under ids/.
    let times = names(&mnt.join("snapshots"));
    assert_eq!(times.len(), 2, "{times:?}");
    let targets: Vec<String> = times
        .iter()
        .map(|t| link(&mnt.join("snapshots").join(t)))
        .collect();
    assert_eq!(
        targets,
        [format!("../ids/{}", ids[0]), format!("../ids/{}", ids[1])]
    );
    assert!(
        times[0].ends_with('Z') || times[0].contains("Z-"),
        "{times:?}"
    );
    assert_eq!(names(&mnt.join("hosts")), std::slice::from_ref(&host));
    assert_eq!(names(&mnt.join("hosts").join(&host)), times);

    // Every file byte for byte, every mode and mtime, through the latest snapshot,
    // through its time name and through its host name.
    let rel = snapshot_path(&src);
    assert_same_tree(&src, &mnt.join("latest").join(&rel));
    assert_same_tree(&src, &mnt.join("snapshots").join(&times[1]).join(&rel));
    assert_same_tree(
        &src,
        &mnt.join("hosts").join(&host).join(&times[1]).join(&rel),
    );
    // The first snapshot, by id, has all but the file added after it.
    fs::remove_file(&added).unwrap();
    let first = mnt.join("ids").join(&ids[0]).join(&rel);
    assert_eq!(
        names(&first.join("nested")),
        ["deeper", "empty-dir", "link"]
    );
    assert_eq!(
        fs::read(first.join("big.bin")).unwrap(),
        fs::read(src.join("big.bin")).unwrap()
    );

    // stat: owner and size as recorded.
    for name in [
        "empty",
        "small.txt",
        "big.bin",
        "nested/deeper",
        "nested/link",
    ] {
        let (want, got) = (
            fs::symlink_metadata(src.join(name)).unwrap(),
            fs::symlink_metadata(first.join(name)).unwrap(),
        );
        assert_eq!((got.uid(), got.gid()), (want.uid(), want.gid()), "{name}");
        if !want.is_dir() {
            assert_eq!(got.len(), want.len(), "{name}");
        }
    }

    assert_eq!(
        get_xattr(&first.join("small.txt"), "user.larder").unwrap(),
        b"kept"
    );
    let none = get_xattr(&first.join("big.bin"), "user.larder").unwrap_err();
    assert_eq!(none.raw_os_error(), Some(libc::ENODATA), "{none}");

    // Random access: a range across chunk boundaries deep inside the big file.
    let want = fs::read(src.join("big.bin")).unwrap();
    let mut f = File::open(first.join("big.bin")).unwrap();
    let mut got = vec![0; 200_000];
    f.seek(SeekFrom::Start(3_000_000)).unwrap();
    f.read_exact(&mut got).unwrap();
    assert!(
        got == want[3_000_000..3_200_000],
        "a range read back differs"
    );

    let (code, stderr) = m.stop(libc::SIGTERM);
    assert_eq!(code, Some(0), "larder mount after SIGTERM: {stderr}");
    assert!(!is_mounted(&mnt));
}

#[test]
fn writes_are_refused_with_erofs() {
    if !fuse_or_skip() {
        return;
    }
    let repo = Repo::init(&[]);
    let src = build_source(&repo);
    repo.backup(&[&src]);
    let mnt = repo.dir("mnt");
    let m = Mounted::start(&repo, &mnt);
    let dir = mnt.join("latest").join(snapshot_path(&src));
    let file = dir.join("small.txt");
    let erofs = |what: &str, r: std::io::Result<()>| {
        let e = r
            .err()
            .unwrap_or_else(|| panic!("{what} succeeded on the mount"));
        assert_eq!(e.raw_os_error(), Some(libc::EROFS), "{what}: {e}");
    };
    erofs("create", File::create(dir.join("new")).map(drop));
    erofs(
        "open for writing",
        OpenOptions::new().write(true).open(&file).map(drop),
    );
    erofs(
        "append",
        OpenOptions::new().append(true).open(&file).map(drop),
    );
    erofs("mkdir", fs::create_dir(dir.join("newdir")));
    erofs("unlink", fs::remove_file(&file));
    erofs("rmdir", fs::remove_dir(dir.join("nested/empty-dir")));
    erofs("rename", fs::rename(&file, dir.join("renamed")));
    erofs(
        "chmod",
        fs::set_permissions(&file, fs::Permissions::from_mode(0o777)),
    );
    erofs(
        "symlink",
        std::os::unix::fs::symlink("x", dir.join("newlink")),
    );
    erofs("mkdir at the top", fs::create_dir(mnt.join("ids/new")));
    assert_eq!(
        fs::read(&file).unwrap(),
        b"hello, mount\n",
        "the file is unchanged"
    );
    let (code, stderr) = m.stop(libc::SIGINT);
    assert_eq!(code, Some(0), "{stderr}");
}

#[test]
fn sigint_unmounts_cleanly_and_releases_the_shared_lock() {
    if !fuse_or_skip() {
        return;
    }
    let repo = Repo::init(&[]);
    let src = build_source(&repo);
    repo.backup(&[&src]);
    let mnt = repo.dir("mnt");
    let m = Mounted::start(&repo, &mnt);
    assert!(is_mounted(&mnt));
    // The mount holds the shared lock: readers go on, gc (exclusive) waits for it.
    repo.run(["ls", "latest"]).expect_ok();
    let gc = repo.run(["gc"]);
    assert_ne!(gc.code, Some(0), "gc ran while mounted\n{gc}");
    let (code, stderr) = m.stop(libc::SIGINT);
    assert_eq!(code, Some(0), "larder mount after SIGINT: {stderr}");
    assert!(!is_mounted(&mnt), "still mounted after SIGINT");
    assert!(names(&mnt).is_empty(), "the mount point is not empty again");
    repo.run(["gc"]).expect_ok();
}

#[test]
fn a_damaged_chunk_fails_its_reads_with_eio_and_names_the_file() {
    if !fuse_or_skip() {
        return;
    }
    let repo = Repo::init_plain(&[]);
    let src = build_source(&repo);
    repo.backup(&[&src]);
    // The largest container holds big.bin's chunks: flip a byte in its data.
    let containers = repo.path.join("containers");
    let largest = fs::read_dir(&containers)
        .unwrap()
        .map(|e| e.unwrap().path())
        .max_by_key(|p| fs::metadata(p).unwrap().len())
        .unwrap();
    let mut bytes = fs::read(&largest).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0xff;
    fs::write(&largest, bytes).unwrap();

    let mnt = repo.dir("mnt");
    let m = Mounted::start(&repo, &mnt);
    let dir = mnt.join("latest").join(snapshot_path(&src));
    let e = fs::read(dir.join("big.bin")).expect_err("a damaged file read back");
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
    assert_eq!(fs::read(dir.join("small.txt")).unwrap(), b"hello, mount\n");
    let (code, stderr) = m.stop(libc::SIGINT);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stderr.contains("big.bin") && stderr.contains("damaged"),
        "stderr does not name the damaged file: {stderr}"
    );
}

/// Regression guard: as root, the unmount takes off larder's own mount, not whatever
/// is mounted where the mount point's path leads when larder stops. Another user who
/// may write the directory above the mount point's parent renames that parent away
/// and puts a symlink in its place, to a directory with another mount at the same
/// name; larder unmounted by path, and so took that other mount off.
#[test]
fn the_unmount_takes_off_its_own_mount_wherever_its_path_now_leads() {
    if !fuse_or_skip() {
        return;
    }
    if !is_root() {
        eprintln!("skipped: larder mounts by descriptor as root only (fusermount3 otherwise)");
        return;
    }
    let repo = Repo::init(&[]);
    let src = build_source(&repo);
    repo.backup(&[&src]);
    let parent = repo.dir("theirs");
    let mnt = parent.join("mnt");
    fs::create_dir(&mnt).unwrap();
    let victim = repo.dir("victim").join("mnt");
    fs::create_dir(&victim).unwrap();
    let tmpfs = CString::new("tmpfs").unwrap();
    // SAFETY: valid NUL-terminated strings and no data; mount retains nothing.
    let rc = unsafe {
        libc::mount(
            tmpfs.as_ptr(),
            c_path(&victim).as_ptr(),
            tmpfs.as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    assert_eq!(rc, 0, "mount tmpfs: {}", std::io::Error::last_os_error());
    let mut m = Mounted::start(&repo, &mnt);
    let moved = repo.scratch.path().join("theirs.moved");
    fs::rename(&parent, &moved).unwrap();
    std::os::unix::fs::symlink(victim.parent().unwrap(), &parent).unwrap();
    // Where the cleanup of a failed run finds larder's mount.
    m.dir = moved.join("mnt");
    let (code, stderr) = m.stop(libc::SIGTERM);
    let victim_kept = is_mounted(&victim);
    // SAFETY: a valid NUL-terminated path; umount retains nothing.
    unsafe { libc::umount2(c_path(&victim).as_ptr(), libc::MNT_DETACH) };
    assert!(victim_kept, "larder unmounted another mount: {stderr}");
    assert_eq!(code, Some(0), "larder mount after SIGTERM: {stderr}");
    assert!(
        !is_mounted(&moved.join("mnt")),
        "larder's own mount is still there"
    );
}
