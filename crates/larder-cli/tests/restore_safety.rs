//! Restore keeps every entry inside its target, whatever the snapshot says and whatever
//! the target already holds: no `..`, no absolute paths, no empty components, no writing
//! through a symlink, be it restored from the snapshot or found in the target.
//!
//! Hostile snapshots are written with larder-store's public API (containers, index
//! segments and snapshots as `backup` writes them), with tree streams no honest backup
//! produces.

mod support;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use larder_store::{
    encode_tree_header, ContainerBuilder, EntryKind, FileKind, LockMode, SegmentContainer,
    Snapshot, SnapshotSummary, TreeEntry, TreeRef,
};
use support::{assert_same_tree, list_tree, restored, Repo, TreeBuilder};

/// One entry of a hostile tree stream.
enum Hostile<'a> {
    File(&'a [u8], &'a [u8]),
    Dir(&'a [u8]),
    Symlink(&'a [u8], &'a [u8]),
}

/// Writes a snapshot whose tree stream holds exactly `entries`, in this order, with
/// every file's data in a new container; returns the snapshot id.
fn craft_snapshot(repo_path: &Path, entries: &[Hostile<'_>]) -> String {
    let mut repo = support::open_store(repo_path, LockMode::Exclusive);
    let codec = repo.codec();
    let id = repo.allocate_container_id();
    let mut container =
        ContainerBuilder::for_codec(id, &codec, 1 << 20, repo.config().container_size);
    let mut stream = Vec::new();
    encode_tree_header(&mut stream);
    for e in entries {
        let (kind, path, mode) = match e {
            Hostile::File(p, _) => (EntryKind::File, p, 0o100_644),
            Hostile::Dir(p) => (EntryKind::Dir, p, 0o040_777),
            Hostile::Symlink(p, _) => (EntryKind::Symlink, p, 0o120_777),
        };
        let mut entry = TreeEntry {
            mode,
            mtime_sec: 1_000_000_000,
            ..TreeEntry::new(kind, path.to_vec())
        };
        match e {
            Hostile::File(_, data) => {
                let fp = codec.fingerprint(data);
                if !container.entries().iter().any(|c| c.fingerprint == fp) {
                    container.push(fp, data);
                }
                entry.chunks = vec![fp];
                entry.size = data.len() as u64;
            }
            Hostile::Symlink(_, target) => entry.target = target.to_vec(),
            Hostile::Dir(_) => {}
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

/// Every path in the scratch space outside the repository, for before/after checks.
fn scratch_listing(repo: &Repo) -> Vec<PathBuf> {
    list_tree(repo.scratch.path())
        .into_iter()
        .filter(|p| !p.starts_with("repo"))
        .collect()
}

fn warned_paths(out: &support::Output) -> Vec<String> {
    let mut paths: Vec<String> = out.json()["warnings"]
        .as_array()
        .unwrap_or_else(|| panic!("no warnings\n{out}"))
        .iter()
        .map(|w| w["path"].as_str().unwrap().to_string())
        .collect();
    paths.sort();
    paths
}

#[test]
fn hostile_paths_are_refused_and_nothing_is_written() {
    let repo = Repo::init(&[]);
    let outside = repo.dir("outside");
    let abs = outside.join("absolute-escape");
    let abs = abs.to_str().unwrap().as_bytes();
    let hostile: [&[u8]; 10] = [
        b"../escape",
        b"a/../../escape",
        b"a/../../../escape",
        b"..",
        abs,
        b"a//b",
        b"a/",
        b"./a",
        b"a/./b",
        b"",
    ];
    let work = repo.dir("work");
    let before = scratch_listing(&repo);
    for (i, path) in hostile.iter().enumerate() {
        let kinds = [
            Hostile::File(path, b"pwned"),
            Hostile::Dir(path),
            Hostile::Symlink(path, b"/etc/passwd"),
        ];
        for (k, entry) in kinds.into_iter().enumerate() {
            let id = craft_snapshot(&repo.path, &[Hostile::Dir(b"a"), entry]);
            let target = work.join(format!("t{i}-{k}")).join("target");
            let out = repo.restore(&id, &target, &[]);
            out.expect_code(1).expect_stderr(&["unsafe path"]);
            repo.restore(&id, &target, &["--overwrite"])
                .expect_code(1)
                .expect_stderr(&["unsafe path"]);
            assert_eq!(
                scratch_listing(&repo),
                before,
                "restoring path {:?} wrote something",
                String::from_utf8_lossy(path)
            );
        }
    }
}

#[test]
fn a_symlink_in_the_snapshot_is_never_a_parent() {
    let repo = Repo::init(&[]);
    let outside = repo.dir("outside");
    let abs_target = outside.to_str().unwrap().as_bytes().to_vec();
    let id = craft_snapshot(
        &repo.path,
        &[
            Hostile::Symlink(b"a", &abs_target),
            Hostile::File(b"a/x", b"pwned through an absolute link"),
            Hostile::Dir(b"a/sub"),
            Hostile::Symlink(b"a/l", b"/etc/passwd"),
            // From TARGET/b, ../.. is the scratch space, where `outside` is.
            Hostile::Symlink(b"b", b"../../outside"),
            Hostile::File(b"b/y", b"pwned through a relative link"),
            Hostile::File(b"f", b"a plain file"),
            Hostile::File(b"f/z", b"under a file"),
        ],
    );
    for (i, extra) in [&[][..], &["--overwrite"][..]].into_iter().enumerate() {
        let target = repo.dir(&format!("t{i}")).join("target");
        let out = repo.restore(&id, &target, extra);
        out.expect_code(3);
        let refused: Vec<String> = ["a/l", "a/sub", "a/x", "b/y", "f/z"]
            .iter()
            .map(|p| target.join(p).to_str().unwrap().to_string())
            .collect();
        assert_eq!(warned_paths(&out), refused, "{out}");
        assert_eq!(list_tree(&outside), Vec::<PathBuf>::new(), "wrote outside");
        // The links themselves are restored as links, the plain file as a file.
        assert_eq!(fs::read_link(target.join("a")).unwrap(), outside);
        assert_eq!(
            fs::read_link(target.join("b")).unwrap(),
            Path::new("../../outside")
        );
        assert_eq!(fs::read(target.join("f")).unwrap(), b"a plain file");
    }
}

#[test]
fn a_directory_replaced_by_a_symlink_is_not_written_through() {
    let repo = Repo::init(&[]);
    let outside = repo.dir("outside");
    fs::set_permissions(&outside, fs::Permissions::from_mode(0o700)).unwrap();
    let abs_target = outside.to_str().unwrap().as_bytes().to_vec();
    let id = craft_snapshot(
        &repo.path,
        &[
            Hostile::Dir(b"a"),
            Hostile::Symlink(b"a", &abs_target),
            Hostile::File(b"a/x", b"pwned"),
        ],
    );
    for (i, extra) in [&[][..], &["--overwrite"][..]].into_iter().enumerate() {
        let target = repo.dir(&format!("t{i}")).join("target");
        let out = repo.restore(&id, &target, extra);
        assert_eq!(
            list_tree(&outside),
            Vec::<PathBuf>::new(),
            "restore {extra:?} wrote outside the target\n{out}"
        );
        assert_eq!(
            fs::metadata(&outside).unwrap().permissions().mode() & 0o7777,
            0o700,
            "restore {extra:?} changed the mode of a directory outside the target\n{out}"
        );
    }
}

#[test]
fn duplicate_entries_without_overwrite_stay_inside() {
    let repo = Repo::init(&[]);
    let outside = repo.dir("outside");
    fs::write(outside.join("victim"), b"victim").unwrap();
    let victim = outside.join("victim");
    let id = craft_snapshot(
        &repo.path,
        &[
            Hostile::Dir(b"a"),
            Hostile::Symlink(b"a", outside.to_str().unwrap().as_bytes()),
            Hostile::File(b"a/x", b"inside"),
            Hostile::Symlink(b"v", victim.to_str().unwrap().as_bytes()),
            Hostile::File(b"v", b"pwned"),
        ],
    );
    let target = repo.dir("t").join("target");
    let out = repo.restore(&id, &target, &[]);
    out.expect_code(3);
    assert_eq!(
        warned_paths(&out),
        [
            target.join("a").to_str().unwrap(),
            target.join("v").to_str().unwrap()
        ],
        "{out}"
    );
    assert!(fs::symlink_metadata(target.join("a")).unwrap().is_dir());
    assert_eq!(fs::read(target.join("a/x")).unwrap(), b"inside");
    assert_eq!(fs::read(&victim).unwrap(), b"victim");
    assert_eq!(list_tree(&outside), [Path::new("victim")]);
}

/// A tree to back up honestly, for the tests of targets that hold symlinks.
fn honest_backup(repo: &Repo) -> PathBuf {
    let src = repo.dir("src");
    TreeBuilder::new(&src)
        .file("top", b"top\n")
        .file("dir/file", b"in dir\n")
        .file("dir/sub/deep", b"deeper\n")
        .finish();
    repo.backup(&[&src]);
    src
}

#[test]
fn a_symlink_already_in_the_target_is_not_written_through() {
    let repo = Repo::init(&[]);
    let src = honest_backup(&repo);
    let outside = repo.dir("outside");
    fs::write(outside.join("victim"), b"victim").unwrap();
    let first = src
        .strip_prefix("/")
        .unwrap()
        .components()
        .next()
        .unwrap()
        .as_os_str()
        .to_owned();

    // The target's first directory, e.g. TARGET/tmp, links outside.
    let target = repo.dir("t1");
    std::os::unix::fs::symlink(&outside, target.join(&first)).unwrap();
    let out = repo.restore("latest", &target, &[]);
    out.expect_code(3)
        .expect_stderr(&["already exists", "refusing to restore through"]);
    assert_eq!(list_tree(&outside), [Path::new("victim")]);
    assert!(fs::symlink_metadata(target.join(&first))
        .unwrap()
        .file_type()
        .is_symlink());

    // A directory deep inside links outside; a file's place holds a link to a victim.
    let target = repo.dir("t2");
    let back = restored(&target, &src);
    fs::create_dir_all(&back).unwrap();
    std::os::unix::fs::symlink(&outside, back.join("dir")).unwrap();
    std::os::unix::fs::symlink(outside.join("victim"), back.join("top")).unwrap();
    let out = repo.restore("latest", &target, &[]);
    out.expect_code(3);
    let refused: Vec<String> = ["dir", "dir/file", "dir/sub", "dir/sub/deep", "top"]
        .iter()
        .map(|p| back.join(p).to_str().unwrap().to_string())
        .collect();
    assert_eq!(warned_paths(&out), refused, "{out}");
    assert_eq!(list_tree(&outside), [Path::new("victim")]);
    assert_eq!(fs::read(outside.join("victim")).unwrap(), b"victim");

    // --overwrite replaces the links; it never writes through them.
    for target in [repo.scratch.path().join("t1"), target] {
        repo.restore("latest", &target, &["--overwrite"])
            .expect_ok();
        assert_same_tree(&src, &restored(&target, &src));
    }
    assert_eq!(list_tree(&outside), [Path::new("victim")]);
    assert_eq!(fs::read(outside.join("victim")).unwrap(), b"victim");
}

/// Reads file `rel` below `root` one directory at a time (`openat`), as a path longer
/// than PATH_MAX cannot be opened whole.
fn read_deep(root: &Path, rel: &[&[u8]]) -> Vec<u8> {
    use std::io::Read;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    let c = |b: &[u8]| std::ffi::CString::new(b).unwrap();
    let open = |dir: libc::c_int, name: &[u8], flags: libc::c_int| {
        // SAFETY: a valid NUL-terminated name; openat retains nothing, and a
        // descriptor it returns is owned by the OwnedFd alone.
        let fd = unsafe { libc::openat(dir, c(name).as_ptr(), flags | libc::O_CLOEXEC) };
        assert!(fd >= 0, "openat: {}", std::io::Error::last_os_error());
        // SAFETY: `fd` was just opened and is owned by nothing else.
        unsafe { OwnedFd::from_raw_fd(fd) }
    };
    let root_bytes = root.as_os_str().as_encoded_bytes();
    let mut dir = open(libc::AT_FDCWD, root_bytes, libc::O_DIRECTORY);
    for name in &rel[..rel.len() - 1] {
        dir = open(dir.as_raw_fd(), name, libc::O_DIRECTORY | libc::O_NOFOLLOW);
    }
    let file = open(dir.as_raw_fd(), rel[rel.len() - 1], libc::O_RDONLY);
    let mut data = Vec::new();
    fs::File::from(file).read_to_end(&mut data).unwrap();
    data
}

/// Regression guard: a path longer than PATH_MAX (4,096 bytes) restores, where a
/// restore that opened full paths failed with "File name too long".
#[test]
fn a_tree_deeper_than_path_max_restores() {
    let repo = Repo::init(&[]);
    let names: Vec<Vec<u8>> = (0..24)
        .map(|i| format!("{i:02}{}", "d".repeat(198)).into_bytes())
        .collect();
    let mut paths: Vec<Vec<u8>> = Vec::new();
    for name in &names {
        let mut p = paths.last().cloned().unwrap_or_default();
        if !p.is_empty() {
            p.push(b'/');
        }
        p.extend_from_slice(name);
        paths.push(p);
    }
    let mut file = paths.last().unwrap().clone();
    file.extend_from_slice(b"/deepest");
    assert!(file.len() > 4096);
    let mut entries: Vec<Hostile<'_>> = paths.iter().map(|p| Hostile::Dir(p)).collect();
    entries.push(Hostile::File(&file, b"at the bottom\n"));
    let id = craft_snapshot(&repo.path, &entries);
    let target = repo.dir("t").join("target");
    repo.restore(&id, &target, &[]).expect_ok();
    let mut rel: Vec<&[u8]> = names.iter().map(Vec::as_slice).collect();
    rel.push(b"deepest");
    assert_eq!(read_deep(&target, &rel), b"at the bottom\n");
}
