//! Restore brings back every piece of metadata a backup records (docs/design/restore.md,
//! docs/design/format.md "Tree stream"): owners, modes, times, extended attributes and
//! POSIX ACLs, hard links, holes, FIFOs, device nodes, symlinks and empty directories;
//! several writers restore exactly what one does; version 1 trees still restore.
//!
//! The test of everything needs root (owners, device nodes, `trusted.` attributes) and
//! prints a notice and passes without it; CI runs as root. The restore as a user that
//! is not root is in `crates/larder-cli/tests/restore_metadata.rs`.

use std::collections::{BTreeMap, HashMap};
use std::ffi::CString;
use std::fs;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use larder_chunk::ChunkerConfig;
use larder_engine::{
    backup, read_xattrs, restore, Pattern, PatternList, Progress, RestoreOptions, RestoreSummary,
};
use larder_hash::HashAlgo;
use larder_store::{LockMode, RepoConfig, Repository, Xattr};

#[path = "support/bytes.rs"]
mod seeded;
use seeded::bytes as noise;
#[path = "support/options.rs"]
mod options;
use options::backup_options;

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

fn c(path: &Path) -> CString {
    CString::new(path.as_os_str().as_bytes()).unwrap()
}

fn check(rc: libc::c_int, what: &str, path: &Path) {
    assert_eq!(
        rc,
        0,
        "{what} {}: {}",
        path.display(),
        std::io::Error::last_os_error()
    );
}

/// Sets attribute `name` of `path` itself; false if the file system refuses it.
fn try_set_xattr(path: &Path, name: &str, value: &[u8]) -> bool {
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
    rc == 0
}

fn set_xattr(path: &Path, name: &str, value: &[u8]) {
    assert!(
        try_set_xattr(path, name, value),
        "lsetxattr {name} on {}: {}",
        path.display(),
        std::io::Error::last_os_error()
    );
}

fn lchown(path: &Path, uid: u32, gid: u32) {
    // SAFETY: a valid NUL-terminated path; not retained.
    check(
        unsafe { libc::lchown(c(path).as_ptr(), uid, gid) },
        "lchown",
        path,
    );
}

fn set_mtime(path: &Path, sec: i64, nsec: u32) {
    let ts = libc::timespec {
        tv_sec: sec as libc::time_t,
        tv_nsec: nsec as libc::c_long,
    };
    let times = [ts, ts];
    // SAFETY: a valid NUL-terminated path and two timespecs; neither retained.
    let rc = unsafe {
        libc::utimensat(
            libc::AT_FDCWD,
            c(path).as_ptr(),
            times.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    check(rc, "utimensat", path);
}

fn mknod(path: &Path, kind: libc::mode_t, mode: u32, dev: libc::dev_t) {
    // SAFETY: a valid NUL-terminated path; not retained.
    let rc = unsafe { libc::mknod(c(path).as_ptr(), kind | mode as libc::mode_t, dev) };
    check(rc, "mknod", path);
}

fn chmod(path: &Path, mode: u32) {
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
}

/// A POSIX access ACL as the kernel stores it (`system.posix_acl_access`): version 2,
/// then (tag, permissions, id) entries sorted by tag and id.
fn raw_acl(entries: &[(u16, u16, u32)]) -> Vec<u8> {
    let mut out = 2u32.to_le_bytes().to_vec();
    for &(tag, perm, id) in entries {
        out.extend_from_slice(&tag.to_le_bytes());
        out.extend_from_slice(&perm.to_le_bytes());
        out.extend_from_slice(&id.to_le_bytes());
    }
    out
}

/// Gives `path` an ACL: with `setfacl` (Debian package `acl`) if it is installed, or
/// the same ACL written as a raw attribute.
fn set_acl(path: &Path, default: bool) {
    let spec = "u::rwx,u:1234:r-x,g::r-x,g:5678:rw-,m::rwx,o::---";
    let ran = Command::new("setfacl")
        .args(if default {
            &["-d", "-m"][..]
        } else {
            &["-m"][..]
        })
        .arg(spec)
        .arg(path)
        .status();
    if ran.is_ok_and(|s| s.success()) {
        return;
    }
    const UNDEFINED: u32 = u32::MAX;
    let acl = raw_acl(&[
        (0x01, 7, UNDEFINED),
        (0x02, 5, 1234),
        (0x04, 5, UNDEFINED),
        (0x08, 6, 5678),
        (0x10, 7, UNDEFINED),
        (0x20, 0, UNDEFINED),
    ]);
    let name = if default {
        "system.posix_acl_default"
    } else {
        "system.posix_acl_access"
    };
    set_xattr(path, name, &acl);
}

/// What a tree holds, by relative path: everything restore must bring back.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Node {
    kind: &'static str,
    mode: u32,
    uid: u32,
    gid: u32,
    mtime: (i64, i64),
    nlink: u64,
    size: u64,
    rdev: u64,
    target: Option<PathBuf>,
    xattrs: Vec<Xattr>,
    /// Files: the bytes, for a byte-for-byte comparison.
    data: Option<Vec<u8>>,
}

/// Every entry under `root` (not `root` itself), with its inode for link checks.
fn describe(root: &Path) -> BTreeMap<PathBuf, (Node, u64)> {
    fn walk(root: &Path, rel: &Path, out: &mut BTreeMap<PathBuf, (Node, u64)>) {
        for e in fs::read_dir(root.join(rel)).unwrap() {
            let rel = rel.join(e.unwrap().file_name());
            let path = root.join(&rel);
            let m = fs::symlink_metadata(&path).unwrap();
            let ft = m.file_type();
            let kind = if ft.is_dir() {
                "directory"
            } else if ft.is_symlink() {
                "symlink"
            } else if ft.is_file() {
                "file"
            } else if ft.is_fifo() {
                "fifo"
            } else if ft.is_char_device() {
                "char device"
            } else {
                "other"
            };
            let node = Node {
                kind,
                // A symlink's mode is always 0777 on Linux.
                mode: m.mode(),
                uid: m.uid(),
                gid: m.gid(),
                mtime: (m.mtime(), m.mtime_nsec()),
                nlink: m.nlink(),
                size: if ft.is_dir() { 0 } else { m.len() },
                rdev: m.rdev(),
                target: ft.is_symlink().then(|| fs::read_link(&path).unwrap()),
                xattrs: read_xattrs(&path).unwrap(),
                data: ft.is_file().then(|| fs::read(&path).unwrap()),
            };
            out.insert(rel.clone(), (node, m.ino()));
            if ft.is_dir() {
                walk(root, &rel, out);
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(root, Path::new(""), &mut out);
    out
}

/// The differences between two trees: every field of every entry, and whether names
/// that share an inode in one share one in the other (and only those).
fn differences(expected: &Path, actual: &Path) -> Vec<String> {
    let (e, a) = (describe(expected), describe(actual));
    let mut diffs = Vec::new();
    let mut inodes: HashMap<u64, u64> = HashMap::new();
    let mut back: HashMap<u64, u64> = HashMap::new();
    for path in e
        .keys()
        .chain(a.keys())
        .collect::<std::collections::BTreeSet<_>>()
    {
        match (e.get(path), a.get(path)) {
            (Some((en, ei)), Some((an, ai))) => {
                if en != an {
                    let mut en = en.clone();
                    let mut an = an.clone();
                    if en.data != an.data {
                        diffs.push(format!("{}: contents differ", path.display()));
                    }
                    en.data = None;
                    an.data = None;
                    if en != an {
                        diffs.push(format!("{}: {an:?}, expected {en:?}", path.display()));
                    }
                }
                if en.kind == "file"
                    && (*inodes.entry(*ei).or_insert(*ai) != *ai
                        || *back.entry(*ai).or_insert(*ei) != *ei)
                {
                    diffs.push(format!("{}: hard links differ", path.display()));
                }
            }
            (Some(_), None) => diffs.push(format!("{}: missing", path.display())),
            (None, _) => diffs.push(format!("{}: unexpected", path.display())),
        }
    }
    diffs
}

#[track_caller]
fn assert_same(expected: &Path, actual: &Path) {
    let diffs = differences(expected, actual);
    assert!(
        diffs.is_empty(),
        "restore differs:\n  {}",
        diffs.join("\n  ")
    );
}

fn init(path: &Path) {
    let config = RepoConfig::new(ChunkerConfig::default(), HashAlgo::Blake3);
    Repository::init(path, &config).unwrap();
}

fn backup_tree(repo_path: &Path, src: &Path) {
    let mut repo = Repository::open(repo_path, LockMode::Exclusive).unwrap();
    let summary = backup(&mut repo, &[src.to_path_buf()], &backup_options(2)).unwrap();
    assert!(summary.warnings.is_empty(), "{:?}", summary.warnings);
}

/// Records the progress total, to see what restore plans to read.
#[derive(Default)]
struct Totals(AtomicU64);

impl Progress for Totals {
    fn set_total(&self, bytes: u64) {
        self.0.store(bytes, Ordering::Relaxed);
    }
}

fn restore_into(repo_path: &Path, target: &Path, opts: &RestoreOptions) -> RestoreSummary {
    let repo = Repository::open(repo_path, LockMode::Shared).unwrap();
    restore(&repo, "latest", target, opts).unwrap()
}

/// Where `src` (absolute) lands under `target`.
fn restored(target: &Path, src: &Path) -> PathBuf {
    target.join(src.strip_prefix("/").unwrap())
}

const SPARSE_LEN: u64 = 64 << 20;

/// A tree with everything restore must bring back. Returns the root.
fn metadata_tree(root: &Path) -> PathBuf {
    let src = root.join("src");
    for d in ["data/b", "other", "plain", "acl", "empty", "specials"] {
        fs::create_dir_all(src.join(d)).unwrap();
    }
    // One file with three names, owned by 1234:5678, with attributes of its own.
    let linked = src.join("data/a.txt");
    fs::write(&linked, noise(1, 100_000)).unwrap();
    fs::hard_link(&linked, src.join("data/b/link2.txt")).unwrap();
    fs::hard_link(&linked, src.join("other/link3.txt")).unwrap();
    lchown(&linked, 1234, 5678);
    chmod(&linked, 0o640);
    set_xattr(&linked, "user.origin", b"three names");

    let plain = src.join("plain");
    fs::write(plain.join("attrs"), noise(2, 5000)).unwrap();
    set_xattr(&plain.join("attrs"), "user.a", b"");
    set_xattr(&plain.join("attrs"), "user.b", &[0, 1, 2, 255]);
    set_xattr(&plain.join("attrs"), "trusted.larder", b"root only");
    // setuid and owned by someone else: chown after chmod would clear the bit.
    fs::write(plain.join("setuid"), b"#!/bin/true\n").unwrap();
    lchown(&plain.join("setuid"), 1234, 5678);
    chmod(&plain.join("setuid"), 0o4755);
    // Read-only, with a user attribute.
    fs::write(plain.join("readonly"), b"read only\n").unwrap();
    set_xattr(&plain.join("readonly"), "user.note", b"kept");
    chmod(&plain.join("readonly"), 0o444);
    fs::write(plain.join("empty-file"), b"").unwrap();

    // ACLs: an access ACL on a file, a default ACL on a directory.
    let acl = src.join("acl");
    fs::write(acl.join("file"), b"acl'd\n").unwrap();
    set_acl(&acl.join("file"), false);
    set_acl(&acl, true);

    // 64 MiB, almost all holes.
    let sparse = src.join("sparse.img");
    let mut f = fs::File::create(&sparse).unwrap();
    f.set_len(SPARSE_LEN).unwrap();
    f.write_all(b"start").unwrap();
    use std::os::unix::fs::FileExt;
    f.write_all_at(b"middle", 32 << 20).unwrap();
    f.write_all_at(b"!", SPARSE_LEN - 1).unwrap();
    drop(f);

    let specials = src.join("specials");
    mknod(&specials.join("fifo"), libc::S_IFIFO, 0o640, 0);
    lchown(&specials.join("fifo"), 1234, 5678);
    mknod(
        &specials.join("null"),
        libc::S_IFCHR,
        0o666,
        libc::makedev(1, 3),
    );
    chmod(&specials.join("null"), 0o666);
    std::os::unix::fs::symlink("../data/a.txt", src.join("other/rel-link")).unwrap();
    std::os::unix::fs::symlink("/nonexistent/target", src.join("dangling")).unwrap();
    lchown(&src.join("dangling"), 1234, 5678);

    let empty = src.join("empty");
    chmod(&empty, 0o700);
    set_xattr(&empty, "user.dir", b"empty");
    lchown(&empty, 1234, 5678);

    // Times last, directories deepest first.
    let all = describe(&src);
    let mut n = 0;
    for (rel, (node, _)) in &all {
        if node.kind != "directory" {
            n += 1;
            set_mtime(&src.join(rel), 1_500_000_000 + n * 1000, (n * 7919) as u32);
        }
    }
    let mut dirs: Vec<&PathBuf> = all
        .iter()
        .filter(|(_, (node, _))| node.kind == "directory")
        .map(|(rel, _)| rel)
        .collect();
    dirs.sort_by_key(|rel| std::cmp::Reverse(rel.components().count()));
    for rel in dirs {
        n += 1;
        set_mtime(
            &src.join(rel),
            1_400_000_000 + n * 1000,
            (n * 104_729) as u32,
        );
    }
    set_mtime(&src, 1_300_000_000, 5);
    src
}

#[test]
fn every_recorded_piece_of_metadata_is_restored_as_root() {
    if !is_root() {
        eprintln!("skipped: restoring owners, device nodes and trusted. attributes needs root");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let src = metadata_tree(dir.path());
    let repo = dir.path().join("repo");
    init(&repo);
    backup_tree(&repo, &src);
    let target = dir.path().join("target");
    let totals = Arc::new(Totals::default());
    let summary = restore_into(
        &repo,
        &target,
        &RestoreOptions {
            threads: 4,
            progress: totals.clone(),
            ..RestoreOptions::default()
        },
    );
    assert!(summary.warnings.is_empty(), "{:?}", summary.warnings);
    let back = restored(&target, &src);
    assert_same(&src, &back);

    // One inode, three names; its data planned (and read) once.
    let m = fs::metadata(back.join("data/a.txt")).unwrap();
    assert_eq!(m.nlink(), 3);
    assert_eq!(
        m.ino(),
        fs::metadata(back.join("other/link3.txt")).unwrap().ino()
    );
    assert_eq!(summary.hard_links, 2);
    let data_bytes: u64 = 100_000 + 5000 + 12 + 10 + 6 + SPARSE_LEN;
    assert_eq!(summary.bytes, data_bytes);
    assert_eq!(totals.0.load(Ordering::Relaxed), data_bytes);
    // Spot checks of what the comparison covers, for a readable failure.
    let setuid = fs::metadata(back.join("plain/setuid")).unwrap();
    assert_eq!(
        (setuid.mode() & 0o7777, setuid.uid(), setuid.gid()),
        (0o4755, 1234, 5678)
    );
    assert!(read_xattrs(&back.join("acl/file"))
        .unwrap()
        .iter()
        .any(|x| x.name == b"system.posix_acl_access"));
    assert!(fs::symlink_metadata(back.join("specials/fifo"))
        .unwrap()
        .file_type()
        .is_fifo());

    // Holes stay holes.
    let sparse = fs::metadata(back.join("sparse.img")).unwrap();
    assert_eq!(sparse.len(), SPARSE_LEN);
    assert!(
        sparse.blocks() * 512 <= 1 << 20,
        "the sparse file takes {} bytes of disk",
        sparse.blocks() * 512
    );
}

/// Regression guard for the hard links of a partial restore: with the first name
/// excluded, the first name selected carries the data and the other links to it; with
/// the first name already in the target (so not restored), the later names are
/// restored with their own data instead of being left out.
#[test]
fn later_hard_links_get_the_data_when_the_first_is_not_restored() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    fs::create_dir_all(src.join("x")).unwrap();
    let data = noise(3, 70_000);
    fs::write(src.join("a"), &data).unwrap();
    fs::hard_link(src.join("a"), src.join("b")).unwrap();
    fs::hard_link(src.join("a"), src.join("x/c")).unwrap();
    let repo = dir.path().join("repo");
    init(&repo);
    backup_tree(&repo, &src);

    let target = dir.path().join("t1");
    let exclude = PatternList::new(vec![Pattern::parse(b"a").unwrap()]);
    let summary = restore_into(
        &repo,
        &target,
        &RestoreOptions {
            exclude,
            threads: 3,
            ..RestoreOptions::default()
        },
    );
    assert!(summary.warnings.is_empty(), "{:?}", summary.warnings);
    let back = restored(&target, &src);
    assert!(!back.join("a").exists());
    assert_eq!(fs::read(back.join("b")).unwrap(), data);
    let (b, c) = (
        fs::metadata(back.join("b")).unwrap(),
        fs::metadata(back.join("x/c")).unwrap(),
    );
    assert_eq!((b.ino(), b.nlink()), (c.ino(), 2));
    assert_eq!((summary.hard_links, summary.bytes), (1, data.len() as u64));

    // The first name is taken in the target: it is not restored (a warning), and the
    // later two carry the data themselves, linked to each other.
    let target = dir.path().join("t2");
    let back = restored(&target, &src);
    fs::create_dir_all(&back).unwrap();
    fs::write(back.join("a"), b"in the way").unwrap();
    let summary = restore_into(
        &repo,
        &target,
        &RestoreOptions {
            threads: 3,
            ..RestoreOptions::default()
        },
    );
    let warned: Vec<_> = summary.warnings.iter().map(|w| w.path.clone()).collect();
    assert_eq!(warned, [back.join("a")], "{:?}", summary.warnings);
    assert!(summary.warnings[0].message.contains("already exists"));
    assert_eq!(fs::read(back.join("a")).unwrap(), b"in the way");
    assert_eq!(fs::read(back.join("b")).unwrap(), data);
    assert_eq!(fs::read(back.join("x/c")).unwrap(), data);
    let (b, c) = (
        fs::metadata(back.join("b")).unwrap(),
        fs::metadata(back.join("x/c")).unwrap(),
    );
    assert_eq!((b.ino(), b.nlink()), (c.ino(), 2));
    assert_eq!(summary.files, 2);
}

/// A tree of many directories, for the parallel writers: files of many sizes (empty,
/// small, several slices' worth, runs of zeros), hard links across directories,
/// symlinks, attributes where the file system takes them, modes and times.
fn many_directories(root: &Path) -> PathBuf {
    let src = root.join("src");
    let mut seed = 10;
    for d in 0..24 {
        let dir = src.join(format!("d{:02}/e{}", d / 4, d % 4));
        fs::create_dir_all(&dir).unwrap();
        for f in 0..12 {
            seed += 1;
            let len = match (d * 12 + f) % 7 {
                0 => 0,
                1 => 1,
                2 => 4096,
                3 => 200_000,
                4 => 1_200_000,
                _ => (seed * 7919 % 60_000) as usize,
            };
            let mut data = noise(seed, len);
            if f % 5 == 0 && len > 8192 {
                data[4096..len - 100].fill(0);
            }
            let path = dir.join(format!("f{f:02}"));
            fs::write(&path, &data).unwrap();
            chmod(&path, 0o600 + (f as u32 % 3) * 0o40);
            if f == 3 {
                try_set_xattr(&path, "user.n", format!("{d}/{f}").as_bytes());
            }
        }
        if d > 0 {
            let first = src.join(format!("d{:02}/e{}/f01", (d - 1) / 4, (d - 1) % 4));
            fs::hard_link(first, dir.join("linked")).unwrap();
        }
        std::os::unix::fs::symlink("f00", dir.join("sym")).unwrap();
        set_mtime(&dir, 1_600_000_000 + d as i64, d as u32);
    }
    src
}

#[test]
fn parallel_writers_restore_what_one_writer_restores() {
    let dir = tempfile::tempdir().unwrap();
    let src = many_directories(dir.path());
    let repo = dir.path().join("repo");
    init(&repo);
    backup_tree(&repo, &src);
    let mut summaries = Vec::new();
    for threads in [1, 7] {
        let target = dir.path().join(format!("t{threads}"));
        let summary = restore_into(
            &repo,
            &target,
            &RestoreOptions {
                threads,
                // Small windows: many slices, each file's pieces from several.
                cache_size: 1 << 20,
                ..RestoreOptions::default()
            },
        );
        assert!(summary.warnings.is_empty(), "{:?}", summary.warnings);
        assert_same(&src, &restored(&target, &src));
        summaries.push(summary);
    }
    assert_same(
        &restored(&dir.path().join("t1"), &src),
        &restored(&dir.path().join("t7"), &src),
    );
    let counts = |s: &RestoreSummary| (s.files, s.hard_links, s.dirs, s.symlinks, s.bytes);
    assert_eq!(counts(&summaries[0]), counts(&summaries[1]));
    assert_eq!(summaries[0].hard_links, 23);
}

/// Regression guard for version 1 trees (testdata/repo-v1, written before tree
/// version 2): they record no inode, device, link count or attributes, and must
/// restore as before: no file becomes a link to another.
#[test]
fn a_version_1_tree_restores_with_no_links() {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/repo-v1");
    let dir = tempfile::tempdir().unwrap();
    let repo = dir.path().join("repo");
    let status = Command::new("cp")
        .arg("-r")
        .arg(fixture.join("repo"))
        .arg(&repo)
        .status()
        .unwrap();
    assert!(status.success());
    let target = dir.path().join("target");
    let summary = restore_into(
        &repo,
        &target,
        &RestoreOptions {
            threads: 3,
            // The recorded owner is whoever made the fixture.
            owners: false,
            ..RestoreOptions::default()
        },
    );
    assert!(summary.warnings.is_empty(), "{:?}", summary.warnings);
    assert_eq!((summary.files, summary.hard_links), (3, 0));
    let back = target.join("tmp/larder-v1/source");
    for file in ["hello.txt", "random.bin", "sub/words.txt"] {
        let m = fs::metadata(back.join(file)).unwrap();
        assert_eq!(m.nlink(), 1, "{file}");
        assert!(
            fs::read(back.join(file)).unwrap()
                == fs::read(fixture.join("source").join(file)).unwrap(),
            "{file} restored wrong"
        );
    }
    assert_eq!(
        fs::read_link(back.join("link")).unwrap(),
        Path::new("hello.txt")
    );
}
