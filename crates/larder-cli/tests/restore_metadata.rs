//! `larder restore` brings back owners, extended attributes, ACLs, hard links and
//! special files as root, and as a user that is not root restores all the data with
//! one clear warning for each thing it may not set (exit code 3), and one notice for
//! the owners it may not give.
//!
//! Both tests need root to build their trees (owners, a device node, a `trusted.`
//! attribute) and print a notice and pass without it; CI runs as root. The restore
//! without root runs as `nobody` (`Repo::run_as`).

mod support;

use std::ffi::CString;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Command;

use support::{is_root, pseudo_random, restored, Repo, NOBODY};

fn c(path: &Path) -> CString {
    CString::new(path.as_os_str().as_bytes()).unwrap()
}

fn lchown(path: &Path, uid: u32, gid: u32) {
    // SAFETY: a valid NUL-terminated path; not retained.
    let rc = unsafe { libc::lchown(c(path).as_ptr(), uid, gid) };
    assert_eq!(rc, 0, "lchown: {}", std::io::Error::last_os_error());
}

fn set_xattr(path: &Path, name: &str, value: &[u8]) {
    let n = CString::new(name).unwrap();
    // SAFETY: valid NUL-terminated strings and a value buffer of its length.
    let rc = unsafe {
        libc::lsetxattr(
            c(path).as_ptr(),
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

fn get_xattr(path: &Path, name: &str) -> Option<Vec<u8>> {
    let n = CString::new(name).unwrap();
    let mut buf = vec![0u8; 4096];
    // SAFETY: valid NUL-terminated strings and a buffer of the length passed.
    let len = unsafe {
        libc::lgetxattr(
            c(path).as_ptr(),
            n.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    (len >= 0).then(|| buf[..len as usize].to_vec())
}

fn mknod(path: &Path, kind: libc::mode_t, dev: libc::dev_t) {
    // SAFETY: a valid NUL-terminated path; not retained.
    let rc = unsafe { libc::mknod(c(path).as_ptr(), kind | 0o644, dev) };
    assert_eq!(rc, 0, "mknod: {}", std::io::Error::last_os_error());
}

/// Gives `path` a POSIX access ACL with `setfacl` if it is installed (Debian package
/// `acl`), or as the raw attribute the kernel stores.
fn set_acl(path: &Path) {
    let ran = Command::new("setfacl")
        .args(["-m", "u::rw-,u:1234:r--,g::r--,m::r--,o::---"])
        .arg(path)
        .status();
    if ran.is_ok_and(|s| s.success()) {
        return;
    }
    let mut acl = 2u32.to_le_bytes().to_vec();
    for (tag, perm, id) in [
        (0x01u16, 6u16, u32::MAX),
        (0x02, 4, 1234),
        (0x04, 4, u32::MAX),
        (0x10, 4, u32::MAX),
        (0x20, 0, u32::MAX),
    ] {
        acl.extend_from_slice(&tag.to_le_bytes());
        acl.extend_from_slice(&perm.to_le_bytes());
        acl.extend_from_slice(&id.to_le_bytes());
    }
    set_xattr(path, "system.posix_acl_access", &acl);
}

/// The messages warned about `path`, from `restore --json`'s output.
fn warnings_for(out: &support::Output, path: &Path) -> Vec<String> {
    out.json()["warnings"]
        .as_array()
        .map(|ws| {
            ws.iter()
                .filter(|w| w["path"].as_str() == path.to_str())
                .map(|w| w["message"].as_str().unwrap().to_string())
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn a_file_linked_three_times_restores_as_one_inode_with_its_owner() {
    if !is_root() {
        eprintln!("skipped: giving files another owner needs root");
        return;
    }
    let repo = Repo::init(&[]);
    let src = repo.dir("src");
    fs::create_dir_all(src.join("x/y")).unwrap();
    let data = pseudo_random(7, 300_000);
    fs::write(src.join("one"), &data).unwrap();
    fs::hard_link(src.join("one"), src.join("x/two")).unwrap();
    fs::hard_link(src.join("one"), src.join("x/y/three")).unwrap();
    lchown(&src.join("one"), 1234, 5678);
    set_xattr(&src.join("one"), "user.larder", b"linked");
    repo.backup(&[&src]);

    let target = repo.dir("target");
    let out = repo.restore("latest", &target, &[]);
    out.expect_ok();
    let back = restored(&target, &src);
    let inodes: Vec<_> = ["one", "x/two", "x/y/three"]
        .iter()
        .map(|name| {
            let m = fs::metadata(back.join(name)).unwrap();
            assert_eq!(fs::read(back.join(name)).unwrap(), data, "{name}");
            (m.ino(), m.nlink(), m.uid(), m.gid())
        })
        .collect();
    assert_eq!(inodes[0].1, 3, "{out}");
    assert!(inodes.iter().all(|i| *i == inodes[0]), "{inodes:?}");
    assert_eq!((inodes[0].2, inodes[0].3), (1234, 5678));
    assert_eq!(
        get_xattr(&back.join("x/two"), "user.larder").as_deref(),
        Some(&b"linked"[..])
    );
    assert_eq!(out.json()["files"], 3, "{out}");
}

/// Regression guard: a restore that is not run as root must restore every file's data
/// and what it may set (its own ids, user attributes, ACLs, FIFOs, hard links), name
/// each file whose `trusted.` attribute or device node it could not restore, with what
/// failed, count the owners it may not give in one notice, and never fail the whole
/// restore.
#[test]
fn a_restore_without_root_warns_about_each_thing_it_cannot_set_and_keeps_the_data() {
    if !is_root() {
        eprintln!("skipped: building the tree (owners, a device node) needs root");
        return;
    }
    let mut repo = Repo::init(&[]);
    let src = repo.dir("src");
    let files = ["owned", "mine", "attrs", "acl", "one", "two"];
    for (i, name) in files.iter().enumerate() {
        if *name != "two" {
            fs::write(src.join(name), pseudo_random(i as u64, 10_000 + i * 999)).unwrap();
        }
    }
    fs::hard_link(src.join("one"), src.join("two")).unwrap();
    mknod(&src.join("device"), libc::S_IFCHR, libc::makedev(1, 3));
    mknod(&src.join("fifo"), libc::S_IFIFO, 0);
    for name in ["mine", "attrs", "acl", "one", "fifo"] {
        lchown(&src.join(name), NOBODY, NOBODY);
    }
    lchown(&src.join("owned"), 1234, 5678);
    set_xattr(&src.join("attrs"), "user.kept", b"yes");
    set_xattr(&src.join("attrs"), "trusted.root-only", b"no");
    set_acl(&src.join("acl"));
    let acl = get_xattr(&src.join("acl"), "system.posix_acl_access").unwrap();
    repo.backup(&[&src]);

    let target = repo.dir("target");
    repo.run_as(NOBODY);
    let out = repo.restore("latest", &target, &[]);
    out.expect_code(3);
    let back = restored(&target, &src);

    // Every file's data, whatever else failed.
    for name in files {
        assert!(
            fs::read(back.join(name)).unwrap() == fs::read(src.join(name)).unwrap(),
            "{name} restored wrong\n{out}"
        );
    }
    // Owners a user may not give are one notice for the whole restore, not an error
    // of each file (as with cp -a, rsync -a and restic).
    assert_eq!(
        warnings_for(&out, &back.join("owned")),
        Vec::<String>::new()
    );
    let json = out.json();
    let owners: Vec<&serde_json::Value> = json["warnings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|w| w["message"].as_str().unwrap().contains("were not restored"))
        .collect();
    assert_eq!(owners.len(), 1, "{out}");
    assert_eq!(owners[0]["is_error"], false, "{out}");
    assert_eq!(owners[0]["path"].as_str(), target.to_str(), "{out}");
    let attrs = warnings_for(&out, &back.join("attrs"));
    assert_eq!(attrs.len(), 1, "{out}");
    assert!(
        attrs[0].starts_with("cannot restore extended attribute trusted.root-only: "),
        "{out}"
    );
    assert_eq!(
        get_xattr(&back.join("attrs"), "user.kept").as_deref(),
        Some(&b"yes"[..])
    );
    let device = warnings_for(&out, &back.join("device"));
    assert_eq!(device.len(), 1, "{out}");
    assert!(
        device[0].contains("character device") && device[0].contains("needs root"),
        "{out}"
    );
    assert!(!back.join("device").exists());

    // What a user may set comes back without a word.
    for name in ["mine", "acl", "one", "two", "fifo"] {
        assert_eq!(warnings_for(&out, &back.join(name)), Vec::<String>::new());
    }
    assert_eq!(
        get_xattr(&back.join("acl"), "system.posix_acl_access"),
        Some(acl)
    );
    assert!(fs::symlink_metadata(back.join("fifo"))
        .unwrap()
        .file_type()
        .is_fifo());
    let (one, two) = (
        fs::metadata(back.join("one")).unwrap(),
        fs::metadata(back.join("two")).unwrap(),
    );
    assert_eq!((one.ino(), one.nlink()), (two.ino(), 2));
    assert_eq!((one.uid(), one.gid()), (NOBODY, NOBODY));
}

/// Regression guard: a setuid or setgid file of another user comes back with those
/// bits only where its recorded owner and group are given back. `--no-owner` as root
/// used to restore a user's setuid file setuid root; a restore by a user who may not
/// give files away (here `nobody`) made it setuid to that user. Both clear the bits,
/// as `cp -p` does; a plain restore as root keeps them with the owner.
#[test]
fn setuid_and_setgid_bits_come_back_only_with_their_owner() {
    if !is_root() {
        eprintln!("skipped: a file of another user needs root");
        return;
    }
    let mut repo = Repo::init(&[]);
    let src = repo.dir("src");
    for (name, mode) in [("suid", 0o4755), ("sgid", 0o2755), ("both", 0o6711)] {
        fs::write(src.join(name), b"#!/bin/sh\n").unwrap();
        lchown(&src.join(name), 1234, 5678);
        fs::set_permissions(src.join(name), fs::Permissions::from_mode(mode)).unwrap();
    }
    repo.backup(&[&src]);
    let mode_of = |path: &Path| {
        let m = fs::symlink_metadata(path).unwrap();
        (m.mode() & 0o7777, m.uid(), m.gid())
    };

    let target = repo.dir("kept");
    repo.restore("latest", &target, &[]).expect_ok();
    let back = restored(&target, &src);
    assert_eq!(mode_of(&back.join("suid")), (0o4755, 1234, 5678));
    assert_eq!(mode_of(&back.join("both")), (0o6711, 1234, 5678));

    let target = repo.dir("no-owner");
    let out = repo.restore("latest", &target, &["--no-owner"]);
    out.expect_ok();
    let back = restored(&target, &src);
    for (name, mode) in [("suid", 0o755), ("sgid", 0o755), ("both", 0o711)] {
        assert_eq!(mode_of(&back.join(name)), (mode, 0, 0), "{name}\n{out}");
    }

    let target = repo.dir("as-nobody");
    repo.run_as(NOBODY);
    let out = repo.restore("latest", &target, &[]);
    let back = restored(&target, &src);
    for (name, mode) in [("suid", 0o755), ("sgid", 0o755), ("both", 0o711)] {
        assert_eq!(
            mode_of(&back.join(name)),
            (mode, NOBODY, NOBODY),
            "{name}\n{out}"
        );
    }
}
