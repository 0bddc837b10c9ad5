//! File attribute flags (`chattr +a`, `+i`, `+d`, ...) are backed up and restored, as
//! borg keeps them: read from files and directories where the file system has them,
//! set last on restore (after the times, which `+i` would forbid). Needs root
//! (`CAP_LINUX_IMMUTABLE`) and a file system with flags (ext4, btrfs, xfs, tmpfs since
//! Linux 6.0); skipped otherwise.

mod support;

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use support::{is_root, restored, Repo, TreeBuilder};

const IMMUTABLE: u32 = 0x10;
const APPEND: u32 = 0x20;
const NODUMP: u32 = 0x40;
const NOATIME: u32 = 0x80;
/// What the test compares: the flags larder records that ext4 and tmpfs both take
/// (tmpfs takes no `S`).
const COMPARED: u32 = IMMUTABLE | APPEND | NODUMP | NOATIME;

fn open(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
}

fn get_flags(path: &Path) -> io::Result<u32> {
    let f = open(path)?;
    let mut flags: libc::c_int = 0;
    // SAFETY: FS_IOC_GETFLAGS writes one int through the valid pointer.
    let rc = unsafe { libc::ioctl(f.as_raw_fd(), libc::FS_IOC_GETFLAGS, &mut flags) };
    if rc == 0 {
        Ok(flags as u32)
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Sets or clears `bits` on `path`, keeping its other flags.
fn change_flags(path: &Path, bits: u32, on: bool) -> io::Result<()> {
    let f = open(path)?;
    let current = get_flags(path)?;
    let flags = (if on { current | bits } else { current & !bits }) as libc::c_int;
    // SAFETY: FS_IOC_SETFLAGS reads one int through the valid pointer.
    let rc = unsafe { libc::ioctl(f.as_raw_fd(), libc::FS_IOC_SETFLAGS, &flags) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Clears `i` and `a` under `root` when dropped, so the scratch space can be removed.
struct Unflag(Vec<PathBuf>);

impl Drop for Unflag {
    fn drop(&mut self) {
        fn walk(p: &Path) {
            let _ = change_flags(p, IMMUTABLE | APPEND, false);
            if fs::symlink_metadata(p).is_ok_and(|m| m.is_dir()) {
                for e in fs::read_dir(p).into_iter().flatten().flatten() {
                    walk(&e.path());
                }
            }
        }
        self.0.iter().for_each(|p| walk(p));
    }
}

/// Guards against `chattr` flags being lost: a snapshot records `+a`, `+i`, `+d`,
/// `+A` on files and `+a` on a directory (`ls -l`, `ls --json` show them), an
/// unchanged file keeps them in the next snapshot, and a restore sets them with the
/// content, mode and mtime intact.
#[test]
fn attribute_flags_of_files_and_directories_are_kept() {
    if !is_root() {
        eprintln!("skipped: setting +i and +a needs root");
        return;
    }
    let repo = Repo::init(&[]);
    let src = repo.dir("src");
    let _unflag = Unflag(vec![src.clone(), repo.scratch.path().join("target")]);
    TreeBuilder::new(&src)
        .file("append", b"log\n")
        .file("immutable", b"fixed")
        .file("nodump-noatime", b"skip me")
        .file("plain", b"nothing special")
        .file("appenddir/inside", b"x")
        .finish();
    let flagged = [
        ("append", APPEND),
        ("immutable", IMMUTABLE),
        ("nodump-noatime", NODUMP | NOATIME),
        ("appenddir", APPEND),
    ];
    for (name, bits) in flagged {
        if let Err(e) = change_flags(&src.join(name), bits, true) {
            eprintln!("skipped: this file system takes no attribute flags ({e})");
            return;
        }
    }
    // Past the racy window (setting flags changes the ctime), so that the second
    // backup trusts the first's entries and skips the files.
    std::thread::sleep(larder_engine::RACY_WINDOW + std::time::Duration::from_millis(100));
    let first = repo.backup(&[&src]);
    let id = first["snapshot"].as_str().unwrap().to_string();
    let ls = repo.run(["--json", "ls", &id]);
    ls.expect_ok();
    let entries = ls.json()["entries"].as_array().unwrap().clone();
    let recorded = |name: &str| {
        entries
            .iter()
            .find(|e| {
                e["path"]
                    .as_str()
                    .unwrap()
                    .ends_with(&format!("/src/{name}"))
            })
            .unwrap_or_else(|| panic!("{name} is missing"))
            .get("attr_flags")
            .map(|f| f.as_str().unwrap().to_string())
    };
    assert_eq!(recorded("append").as_deref(), Some("+a"));
    assert_eq!(recorded("immutable").as_deref(), Some("+i"));
    assert_eq!(recorded("nodump-noatime").as_deref(), Some("+dA"));
    assert_eq!(recorded("appenddir").as_deref(), Some("+a"));
    assert_eq!(recorded("plain"), None);
    let long = repo.run(["ls", "-l", &id]);
    assert!(
        long.stdout
            .lines()
            .any(|l| l.ends_with("/src/immutable [attrs +i]")),
        "{long}"
    );

    // Not read again, the unchanged files keep their flags.
    let second = repo.backup(&[&src]);
    assert_eq!(second["files_unchanged"], 5, "{second}");
    let ls = repo.run(["--json", "ls", second["snapshot"].as_str().unwrap()]);
    assert_eq!(ls.stdout.matches("\"attr_flags\"").count(), 4, "{ls}");

    let target = repo.scratch.path().join("target");
    repo.restore(&id, &target, &[]).expect_ok();
    let back = restored(&target, &src);
    for (name, bits) in flagged
        .iter()
        .chain(&[("plain", 0), ("appenddir/inside", 0)])
    {
        let (from, to) = (src.join(name), back.join(name));
        assert_eq!(get_flags(&to).unwrap() & COMPARED, *bits, "{name}");
        let (a, b) = (fs::metadata(&from).unwrap(), fs::metadata(&to).unwrap());
        assert_eq!(
            (a.mode(), a.mtime(), a.mtime_nsec()),
            (b.mode(), b.mtime(), b.mtime_nsec()),
            "{name}"
        );
        if a.is_file() {
            assert_eq!(fs::read(&from).unwrap(), fs::read(&to).unwrap(), "{name}");
        }
    }
    // The restored immutable file is immutable.
    assert!(OpenOptions::new()
        .append(true)
        .open(back.join("immutable"))
        .is_err());
}
