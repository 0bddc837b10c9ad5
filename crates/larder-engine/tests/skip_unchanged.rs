//! The skip logic (docs/design/nightly.md, "Skipping unchanged files"): unchanged files
//! are not read, and every snapshot still restores byte-identical whatever changed in
//! between; checkpoints let a failed backup's successor skip what it stored.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use larder_chunk::ChunkerConfig;
use larder_engine::{backup, restore, BackupOptions, BackupSummary, Parents, SkipRules};
use larder_hash::HashAlgo;
use larder_store::{
    Backend, Compression, FileKind, LocalBackend, LockMode, RepoConfig, Repository, StoreError,
};
use proptest::prelude::*;

#[path = "support/bytes.rs"]
mod seeded;
use seeded::bytes;

#[path = "support/options.rs"]
mod options;
use options::{backup_options, restore_options};

/// The racy window of these tests, slept past before each backup so that what the
/// previous backup saw is trusted.
const WINDOW: Duration = Duration::from_millis(40);

fn opts() -> BackupOptions {
    BackupOptions {
        skip: SkipRules {
            racy_window: WINDOW,
            ..SkipRules::default()
        },
        ..backup_options(2)
    }
}

struct Fixture {
    _dir: tempfile::TempDir,
    base: PathBuf,
    repo: PathBuf,
    src: PathBuf,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let base = fs::canonicalize(dir.path()).unwrap();
    let repo = base.join("repo");
    Repository::init(
        &repo,
        &RepoConfig::new(ChunkerConfig::default(), HashAlgo::Blake3)
            .with_compression(Compression::None),
    )
    .unwrap();
    let src = base.join("src");
    fs::create_dir_all(src.join("d")).unwrap();
    Fixture {
        _dir: dir,
        base,
        repo,
        src,
    }
}

impl Fixture {
    fn backup_with(&self, paths: &[&Path], opts: &BackupOptions) -> BackupSummary {
        std::thread::sleep(WINDOW + Duration::from_millis(10));
        let mut repo = Repository::open(&self.repo, LockMode::Exclusive).unwrap();
        let paths: Vec<PathBuf> = paths.iter().map(|p| p.to_path_buf()).collect();
        let s = backup(&mut repo, &paths, opts).unwrap();
        assert!(!s.is_partial(), "{:?}", s.warnings);
        s
    }

    fn backup(&self) -> BackupSummary {
        self.backup_with(&[&self.src], &opts())
    }

    /// Restores snapshot `id` and compares the restored copy of `src` with `src`.
    fn assert_restores(&self, id: &str) {
        let target = self.base.join(format!("restore-{}", &id[..12]));
        let repo = Repository::open(&self.repo, LockMode::Shared).unwrap();
        let s = restore(&repo, id, &target, &restore_options(64 << 20)).unwrap();
        assert!(s.warnings.is_empty(), "{:?}", s.warnings);
        let restored = target.join(self.src.strip_prefix("/").unwrap());
        assert_eq!(listing(&restored), listing(&self.src));
        fs::remove_dir_all(&target).unwrap();
    }

    fn write(&self, name: &str, data: &[u8]) {
        fs::write(self.src.join(name), data).unwrap();
    }
}

/// Every entry below `root`: file contents and modes, symlink targets, directories.
fn listing(root: &Path) -> BTreeMap<PathBuf, String> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            let m = fs::symlink_metadata(&p).unwrap();
            let rel = p.strip_prefix(root).unwrap().to_path_buf();
            let what = if m.file_type().is_symlink() {
                format!("-> {}", fs::read_link(&p).unwrap().display())
            } else if m.is_dir() {
                stack.push(p);
                format!("dir {:o}", m.mode() & 0o7777)
            } else {
                let data = fs::read(&p).unwrap();
                format!(
                    "{:o} {} {}",
                    m.mode() & 0o7777,
                    data.len(),
                    HashAlgo::Blake3.fingerprint(&data).to_hex()
                )
            };
            out.insert(rel, what);
        }
    }
    out
}

#[test]
fn unchanged_files_are_not_read_and_an_append_reads_one_file() {
    let f = fixture();
    for i in 0..20u64 {
        f.write(&format!("d/f{i}"), &bytes(i, 3000 + 500 * i as usize));
    }
    let first = f.backup();
    assert_eq!((first.files_new, first.files_unchanged), (20, 0));
    assert_eq!(first.bytes_read, first.bytes_in);

    let second = f.backup();
    assert_eq!(second.bytes_read, 0, "{second:?}");
    assert_eq!((second.files_unchanged, second.files_changed), (20, 0));
    assert_eq!(second.bytes_skipped, first.bytes_in);
    assert_eq!(second.bytes_in, first.bytes_in);
    assert_eq!(
        second.parents.as_slice(),
        std::slice::from_ref(&first.snapshot_id)
    );
    // Only the tree changed: it records the time of the second snapshot's parents.
    assert_eq!(second.chunks_new, second.tree_chunks_new);
    f.assert_restores(&second.snapshot_id);

    let mut data = fs::read(f.src.join("d/f7")).unwrap();
    data.push(b'!');
    f.write("d/f7", &data);
    let third = f.backup();
    assert_eq!(third.bytes_read, data.len() as u64);
    assert_eq!((third.files_changed, third.files_unchanged), (1, 19));
    f.assert_restores(&third.snapshot_id);
}

#[test]
fn a_rewrite_that_keeps_size_and_mtime_is_caught_by_ctime() {
    let f = fixture();
    f.write("a", &bytes(1, 10_000));
    f.backup();
    let before = fs::metadata(f.src.join("a")).unwrap();
    f.write("a", &bytes(2, 10_000));
    let mtime = filetime(&before);
    fs::File::options()
        .write(true)
        .open(f.src.join("a"))
        .unwrap()
        .set_modified(mtime)
        .unwrap();
    let after = fs::metadata(f.src.join("a")).unwrap();
    assert_eq!(
        (after.len(), after.mtime(), after.mtime_nsec()),
        (before.len(), before.mtime(), before.mtime_nsec())
    );
    let s = f.backup();
    assert_eq!((s.files_changed, s.bytes_read), (1, 10_000));
    f.assert_restores(&s.snapshot_id);
    // Told to ignore ctime, the same rewrite again goes unseen: what the option means.
    f.write("a", &bytes(3, 10_000));
    fs::File::options()
        .write(true)
        .open(f.src.join("a"))
        .unwrap()
        .set_modified(mtime)
        .unwrap();
    let ignoring = BackupOptions {
        skip: SkipRules {
            ignore_ctime: true,
            racy_window: WINDOW,
            ..SkipRules::default()
        },
        ..backup_options(2)
    };
    let s = f.backup_with(&[&f.src], &ignoring);
    assert_eq!((s.files_unchanged, s.bytes_read), (1, 0));
}

fn filetime(m: &fs::Metadata) -> std::time::SystemTime {
    std::time::UNIX_EPOCH + Duration::new(m.mtime() as u64, m.mtime_nsec() as u32)
}

#[test]
fn a_backup_of_a_parent_skips_the_files_of_a_child_snapshot() {
    let f = fixture();
    f.write("top", &bytes(1, 5000));
    f.write("d/inner", &bytes(2, 7000));
    let child = f.backup_with(&[&f.src.join("d")], &opts());
    assert_eq!(child.files, 1);
    let parent = f.backup();
    assert_eq!((parent.files_new, parent.files_unchanged), (1, 1));
    assert_eq!(parent.bytes_read, 5000);
    f.assert_restores(&parent.snapshot_id);
    // And the other way round: a backup of the child after the parent reads nothing.
    let again = f.backup_with(&[&f.src.join("d")], &opts());
    assert_eq!(again.bytes_read, 0);
}

#[test]
fn parents_can_be_chosen_or_refused() {
    let f = fixture();
    f.write("a", &bytes(1, 5000));
    let first = f.backup();
    let forced = f.backup_with(
        &[&f.src],
        &BackupOptions {
            parents: Parents::None,
            ..opts()
        },
    );
    assert_eq!((forced.bytes_read, forced.files_new), (5000, 1));
    assert!(forced.parents.is_empty());
    let named = f.backup_with(
        &[&f.src],
        &BackupOptions {
            parents: Parents::Snapshot(first.snapshot_id[..10].to_string()),
            ..opts()
        },
    );
    assert_eq!(named.bytes_read, 0);
    assert_eq!(
        named.parents.as_slice(),
        std::slice::from_ref(&first.snapshot_id)
    );
    // Another host's snapshots are not parents by default.
    let other = f.backup_with(
        &[&f.src],
        &BackupOptions {
            hostname: "elsewhere".into(),
            ..opts()
        },
    );
    assert_eq!(other.bytes_read, 5000);
}

#[test]
fn a_recipe_whose_chunks_are_gone_is_read_again() {
    let f = fixture();
    f.write("a", &bytes(1, 50_000));
    let first = f.backup();
    // The second snapshot's new chunks (b's and its tree's) go to a second container.
    f.write("b", &bytes(2, 50_000));
    let second = f.backup();
    assert_eq!((second.bytes_read, second.containers_written), (50_000, 1));
    // Lose the first container (a's chunks) and rebuild the index from what is left.
    let first_container = f.repo.join("containers").join(format!("{:016x}.ctr", 1));
    fs::remove_file(first_container).unwrap();
    Repository::open(&f.repo, LockMode::Exclusive)
        .unwrap()
        .rebuild_index()
        .unwrap();
    let third = f.backup();
    // a's metadata matches, but its recipe is not all in the index: read again.
    assert_eq!((third.files_changed, third.files_unchanged), (1, 1));
    assert_eq!(third.bytes_read, 50_000);
    assert_eq!(
        third.parents.as_slice(),
        std::slice::from_ref(&second.snapshot_id)
    );
    f.assert_restores(&third.snapshot_id);
    drop(first);
}

#[test]
fn a_damaged_previous_tree_reads_everything_with_a_warning() {
    let f = fixture();
    f.write("a", &bytes(1, 50_000));
    let first = f.backup();
    // A newer snapshot of the same paths whose tree names a chunk nobody stored.
    let repo = Repository::open(&f.repo, LockMode::Exclusive).unwrap();
    let (mut snapshots, _) = repo.snapshots().unwrap();
    let (_, mut damaged) = snapshots.pop().unwrap();
    damaged.time = "2999-01-01T00:00:00Z".into();
    damaged.tree.chunks = vec!["ab".repeat(32)];
    let damaged_id = repo.save_snapshot(&damaged).unwrap();
    drop(repo);
    let s = f.backup();
    assert_eq!(s.bytes_read, 50_000);
    assert!(s.parents.is_empty(), "{:?}", s.parents);
    let warning = s
        .warnings
        .iter()
        .find(|w| w.message.contains(&damaged_id[..8]))
        .unwrap_or_else(|| panic!("no warning names the damaged snapshot: {:?}", s.warnings));
    assert!(!warning.is_error, "the snapshot itself is complete");
    f.assert_restores(&s.snapshot_id);
    f.assert_restores(&first.snapshot_id);
}

/// A backend that fails container writes once `snapshots` snapshot files (the
/// checkpoints) were written: a backup killed after its first checkpoint.
struct FailAfterCheckpoint {
    inner: LocalBackend,
    snapshots: std::sync::atomic::AtomicUsize,
}

impl FailAfterCheckpoint {
    /// Fails every container written once a snapshot (the checkpoint) is.
    fn fail_after_a_snapshot(&self, kind: FileKind, name: &str) -> larder_store::Result<()> {
        if kind == FileKind::Container && self.snapshots.load(Ordering::SeqCst) > 0 {
            return Err(StoreError::io(
                name,
                std::io::Error::other("injected: the backup was killed"),
            ));
        }
        Ok(())
    }

    fn count_snapshot(&self, kind: FileKind) {
        if kind == FileKind::Snapshot {
            self.snapshots.fetch_add(1, Ordering::SeqCst);
        }
    }
}

impl Backend for FailAfterCheckpoint {
    fn read(&self, kind: FileKind, name: &str) -> larder_store::Result<Vec<u8>> {
        self.inner.read(kind, name)
    }
    fn read_ranges(
        &self,
        kind: FileKind,
        name: &str,
        ranges: &[std::ops::Range<u64>],
    ) -> larder_store::Result<Vec<Vec<u8>>> {
        self.inner.read_ranges(kind, name, ranges)
    }
    fn file_len(&self, kind: FileKind, name: &str) -> larder_store::Result<u64> {
        self.inner.file_len(kind, name)
    }
    fn write(&self, kind: FileKind, name: &str, data: &[u8]) -> larder_store::Result<()> {
        self.fail_after_a_snapshot(kind, name)?;
        self.inner.write(kind, name, data)?;
        self.count_snapshot(kind);
        Ok(())
    }
    // Containers and snapshots are put in place create-only: the fault goes here too.
    fn write_new(&self, kind: FileKind, name: &str, data: &[u8]) -> larder_store::Result<bool> {
        self.fail_after_a_snapshot(kind, name)?;
        let written = self.inner.write_new(kind, name, data)?;
        self.count_snapshot(kind);
        Ok(written)
    }
    fn sync(&self, kind: FileKind) -> larder_store::Result<()> {
        self.inner.sync(kind)
    }
    fn list(&self, kind: FileKind) -> larder_store::Result<Vec<String>> {
        self.inner.list(kind)
    }
    fn remove(&self, kind: FileKind, name: &str) -> larder_store::Result<()> {
        self.inner.remove(kind, name)
    }
    fn location(&self) -> String {
        self.inner.location()
    }
}

#[test]
fn a_backup_that_fails_after_a_checkpoint_is_resumed_from_it() {
    let f = fixture();
    for i in 0..12u64 {
        f.write(&format!("d/f{i:02}"), &bytes(100 + i, 200_000));
    }
    let checkpointing = BackupOptions {
        // A round per file or so: a deadline that has always passed.
        checkpoint_interval: Some(Duration::from_nanos(1)),
        ..opts()
    };
    std::thread::sleep(WINDOW + Duration::from_millis(10));
    let backend = Arc::new(FailAfterCheckpoint {
        inner: LocalBackend::new(&f.repo),
        snapshots: Default::default(),
    });
    let mut repo =
        Repository::open_with_backend(&f.repo, LockMode::Exclusive, Duration::ZERO, backend)
            .unwrap();
    assert!(backup(&mut repo, std::slice::from_ref(&f.src), &checkpointing).is_err());
    drop(repo);
    let repo = Repository::open(&f.repo, LockMode::Shared).unwrap();
    let (snapshots, _) = repo.snapshots().unwrap();
    assert_eq!(snapshots.len(), 1);
    assert!(snapshots[0].1.partial);
    let covered = snapshots[0].1.summary.bytes_in;
    assert!(covered > 0);
    // `latest` is a complete snapshot: there is none yet.
    assert!(repo.find_snapshot("latest").is_err());
    drop(repo);

    let resumed = f.backup_with(&[&f.src], &checkpointing);
    assert_eq!(resumed.bytes_read, 12 * 200_000 - covered);
    assert_eq!(
        resumed.parents.as_slice(),
        std::slice::from_ref(&snapshots[0].0)
    );
    assert!(resumed.checkpoints > 0);
    // The checkpoints, the killed backup's included, are gone: one snapshot left.
    let repo = Repository::open(&f.repo, LockMode::Shared).unwrap();
    let (left, _) = repo.snapshots().unwrap();
    assert_eq!(left.len(), 1);
    assert!(!left[0].1.partial);
    drop(repo);
    f.assert_restores(&resumed.snapshot_id);
}

#[test]
fn standard_input_is_a_file_of_its_own() {
    // Standard input is this test process's: empty under cargo test, or whatever the
    // harness gives; the entry holds exactly what was read, and never a parent.
    let f = fixture();
    let mut repo = Repository::open(&f.repo, LockMode::Exclusive).unwrap();
    let s = larder_engine::backup_stdin(&mut repo, "dumps/db.sql", &opts()).unwrap();
    assert_eq!((s.files, s.dirs), (1, 1));
    assert!(s.parents.is_empty());
    assert!(larder_engine::backup_stdin(&mut repo, "../x", &opts()).is_err());
}

/// One change between two backups, on names 0..5 in the source's directory `d`.
#[derive(Debug, Clone)]
enum Op {
    Create(u8, u64, usize),
    Append(u8, usize),
    /// New bytes of the same length, the old mtime put back.
    Rewrite(u8, u64),
    Chmod(u8, u32),
    Rename(u8, u8),
    HardLink(u8, u8),
    Symlink(u8),
}

fn op() -> impl Strategy<Value = Op> {
    let name = 0u8..5;
    prop_oneof![
        (name.clone(), any::<u64>(), 0usize..40_000).prop_map(|(n, s, l)| Op::Create(n, s, l)),
        (name.clone(), 1usize..3000).prop_map(|(n, l)| Op::Append(n, l)),
        (name.clone(), any::<u64>()).prop_map(|(n, s)| Op::Rewrite(n, s)),
        (
            name.clone(),
            prop_oneof![Just(0o600u32), Just(0o644), Just(0o755)]
        )
            .prop_map(|(n, m)| Op::Chmod(n, m)),
        (name.clone(), name.clone()).prop_map(|(a, b)| Op::Rename(a, b)),
        (name.clone(), name.clone()).prop_map(|(a, b)| Op::HardLink(a, b)),
        name.prop_map(Op::Symlink),
    ]
}

/// Applies `op` to the source; returns the names whose inode it changed (their
/// files must be read again), or `None` when it did nothing.
fn apply(src: &Path, op: &Op) -> Option<Vec<u8>> {
    let path = |n: u8| src.join(format!("d/n{n}"));
    let is_file = |n: u8| fs::symlink_metadata(path(n)).is_ok_and(|m| m.file_type().is_file());
    match *op {
        Op::Create(n, seed, len) => {
            let _ = fs::remove_file(path(n));
            fs::write(path(n), bytes(seed, len)).unwrap();
            Some(vec![n])
        }
        Op::Append(n, len) if is_file(n) => {
            use std::io::Write;
            let mut file = fs::OpenOptions::new().append(true).open(path(n)).unwrap();
            file.write_all(&bytes(len as u64, len)).unwrap();
            Some(vec![n])
        }
        Op::Rewrite(n, seed) if is_file(n) => {
            let m = fs::metadata(path(n)).unwrap();
            let file = fs::OpenOptions::new().write(true).open(path(n)).unwrap();
            use std::os::unix::fs::FileExt;
            file.write_all_at(&bytes(seed, m.len() as usize), 0)
                .unwrap();
            file.set_modified(filetime(&m)).unwrap();
            Some(vec![n])
        }
        Op::Chmod(n, mode) if is_file(n) => {
            fs::set_permissions(path(n), fs::Permissions::from_mode(mode)).unwrap();
            Some(vec![n])
        }
        Op::Rename(a, b) if a != b && is_file(a) => {
            fs::rename(path(a), path(b)).unwrap();
            Some(vec![a, b])
        }
        Op::HardLink(a, b) if a != b && is_file(a) => {
            let _ = fs::remove_file(path(b));
            fs::hard_link(path(a), path(b)).unwrap();
            Some(vec![a, b])
        }
        Op::Symlink(n) => {
            let _ = fs::remove_file(path(n));
            std::os::unix::fs::symlink(format!("n{}", (n + 1) % 5), path(n)).unwrap();
            Some(vec![n])
        }
        _ => None,
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]

    /// Random changes between backups: every snapshot restores byte-identical, and
    /// every file no change touched is skipped.
    #[test]
    fn every_snapshot_restores_whatever_changed(steps in proptest::collection::vec(proptest::collection::vec(op(), 0..3), 1..6)) {
        let f = fixture();
        for n in 0..3u8 {
            apply(&f.src, &Op::Create(n, u64::from(n), 20_000));
        }
        let mut snapshots = vec![f.backup()];
        for ops in &steps {
            // A hard link shares its inode: a change through one name changes every
            // name's ctime, and so does removing or replacing one of them (the link
            // count changes). So the inodes a name had before and after an op count.
            let inode = |n: u8| fs::symlink_metadata(f.src.join(format!("d/n{n}"))).ok().filter(|m| m.is_file()).map(|m| m.ino());
            let mut touched = std::collections::BTreeSet::new();
            let mut touched_inodes = Vec::new();
            for op in ops {
                let before: Vec<Option<u64>> = (0..5u8).map(inode).collect();
                if let Some(names) = apply(&f.src, op) {
                    for &n in &names {
                        touched_inodes.extend(before[usize::from(n)]);
                        touched_inodes.extend(inode(n));
                    }
                    touched.extend(names);
                }
            }
            let untouched = (0..5u8)
                .filter(|n| !touched.contains(n))
                .filter(|&n| inode(n).is_some_and(|i| !touched_inodes.contains(&i)))
                .count() as u64;
            let s = f.backup();
            prop_assert!(s.files_unchanged >= untouched, "{} unchanged, {untouched} untouched: {ops:?}", s.files_unchanged);
            f.assert_restores(&s.snapshot_id);
            snapshots.push(s);
        }
    }
}

/// Sets user attribute `name` of `path`; false where the file system takes none.
fn set_xattr(path: &Path, name: &str, value: &[u8]) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let p = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    let n = std::ffi::CString::new(name).unwrap();
    // SAFETY: valid NUL-terminated strings and a value buffer of its length.
    unsafe {
        libc::lsetxattr(
            p.as_ptr(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        ) == 0
    }
}

/// The entries of snapshot `id`, by path.
fn entries(repo: &Path, id: &str) -> BTreeMap<Vec<u8>, larder_store::TreeEntry> {
    let repo = Repository::open(repo, LockMode::Shared).unwrap();
    let (_, snapshot) = repo.find_snapshot(id).unwrap();
    let mut reader = larder_engine::ChunkReader::new(&repo);
    larder_engine::load_tree(&mut reader, &snapshot.tree.fingerprints().unwrap())
        .unwrap()
        .into_iter()
        .map(|e| (e.path.clone(), e))
        .collect()
}

#[test]
fn attributes_and_symlink_targets_that_changed_are_recorded_again() {
    let f = fixture();
    f.write("a", &bytes(1, 1000));
    if !set_xattr(&f.src.join("a"), "user.k", b"one") {
        eprintln!("skipped: the temporary directory's file system takes no user attributes");
        return;
    }
    std::os::unix::fs::symlink("a", f.src.join("l")).unwrap();
    let rel = |name: &str| {
        f.src
            .join(name)
            .strip_prefix("/")
            .unwrap()
            .as_os_str()
            .as_encoded_bytes()
            .to_vec()
    };
    let first = f.backup();
    let e = entries(&f.repo, &first.snapshot_id);
    assert_eq!(e[&rel("a")].xattrs[0].value, b"one");
    assert_eq!(e[&rel("l")].target, b"a");
    // Taken over unread, they stay what they were.
    let same = f.backup();
    let e = entries(&f.repo, &same.snapshot_id);
    assert_eq!(e[&rel("a")].xattrs[0].value, b"one");
    assert_eq!(e[&rel("l")].target, b"a");
    // Changed: the attribute's change moves the ctime; the new link is a new inode.
    assert!(set_xattr(&f.src.join("a"), "user.k", b"two"));
    fs::remove_file(f.src.join("l")).unwrap();
    std::os::unix::fs::symlink("elsewhere", f.src.join("l")).unwrap();
    let changed = f.backup();
    let e = entries(&f.repo, &changed.snapshot_id);
    assert_eq!(e[&rel("a")].xattrs[0].value, b"two");
    assert_eq!(e[&rel("l")].target, b"elsewhere");
    assert_eq!(changed.files_changed, 1);
}
