//! `repair` (docs/design/repair.md) in an encrypted repository with compression
//! units: stopped after any of its file operations (as a killed process would be),
//! the repository stays one that the next `repair` finishes, which then leaves what
//! an uninterrupted repair leaves (one repaired copy per damaged snapshot, restoring
//! the same files); a reader between the steps never finds an indexed container
//! missing; after a backup of the same source `check --read-data` passes and the
//! originals restore identical. Also: a repair with the disk index.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

use larder_chunk::{ChunkerConfig, ChunkerKind};
use larder_crypto::{AeadKind, FingerprintKind, RepoKeys};
use larder_engine::{
    backup, check, load_tree, repair, restore, ChunkReader, RepairOptions, RepairReport,
    DEFAULT_RESTORE_CACHE,
};
use larder_hash::HashAlgo;
use larder_store::{DiskLookup, EntryKind, IndexSettings, LockMode, RepoConfig, Repository};

#[path = "support/bytes.rs"]
mod seeded;
use seeded::bytes;

#[path = "support/files.rs"]
mod tree_files;
use tree_files::files;

#[path = "support/unlock.rs"]
mod unlock;
use unlock::{init_with_keys, open};

#[path = "support/dirs.rs"]
mod dirs;
use dirs::copy_dir;

#[path = "support/options.rs"]
mod options;
use options::{backup_options, check_options, restore_options};

const PASSWORD: &[u8] = b"repair test password";

/// An encrypted repository (keyed chunker, compression units by default) with small
/// containers, so that a few MiB spread over many; with the disk index if `disk`.
fn init(root: &Path, disk: bool) {
    let chunker = ChunkerConfig {
        kind: ChunkerKind::Keyed,
        ..ChunkerConfig::default()
    };
    let mut config =
        RepoConfig::new(chunker, HashAlgo::Blake3).with_encryption(AeadKind::Aes256Gcm);
    config.container_size = 256 << 10;
    if disk {
        config = config.with_index(IndexSettings::Disk {
            lookup: DiskLookup::Lazy,
            memory: 4 << 20,
        });
    }
    let keys = RepoKeys::generate(
        config.id_bytes().unwrap(),
        AeadKind::Aes256Gcm,
        FingerprintKind::KeyedBlake3,
    );
    init_with_keys(root, &config, &keys, PASSWORD);
}

fn opened(root: &Path, mode: LockMode) -> Repository {
    open(root, PASSWORD, mode).unwrap()
}

/// Compressible lines: stored in compression units.
fn text(seed: u64, len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len + 64);
    let mut i = seed;
    while out.len() < len {
        out.extend_from_slice(format!("{i:08} the quick brown fox {}\n", i % 97).as_bytes());
        i = i
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407)
            >> 7;
    }
    out.truncate(len);
    out
}

struct Fixture {
    _dir: tempfile::TempDir,
    base: PathBuf,
    repo: PathBuf,
    src: PathBuf,
    /// Snapshot id and the files of the tree it was taken from.
    snapshots: Vec<(String, BTreeMap<PathBuf, Vec<u8>>)>,
}

fn backup_now(f: &mut Fixture) {
    let mut repo = opened(&f.repo, LockMode::Exclusive);
    let summary = backup(&mut repo, std::slice::from_ref(&f.src), &backup_options(2)).unwrap();
    assert!(!summary.is_partial(), "{:?}", summary.warnings);
    f.snapshots.push((summary.snapshot_id, files(&f.src)));
}

/// Two snapshots of a tree of text and random files; then four bytes of one file
/// chunk overwritten, and another container (of file data only) truncated.
fn damaged_fixture(disk: bool) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let base = fs::canonicalize(dir.path()).unwrap();
    let repo = base.join("repo");
    init(&repo, disk);
    let src = base.join("src");
    fs::create_dir_all(src.join("docs")).unwrap();
    for i in 0..6u64 {
        fs::write(src.join(format!("docs/{i}.txt")), text(i, 150_000)).unwrap();
    }
    fs::write(src.join("random.bin"), bytes(7, 700_000)).unwrap();
    let mut f = Fixture {
        _dir: dir,
        base,
        repo,
        src,
        snapshots: Vec::new(),
    };
    backup_now(&mut f);
    fs::write(f.src.join("docs/later.txt"), text(99, 80_000)).unwrap();
    backup_now(&mut f);
    let (text_at, text_len, text_container) = place(&f, "docs/2.txt", 1);
    let (_, _, random_container) = place(&f, "random.bin", 20);
    assert_ne!(text_container, random_container);
    let path = container_file(&f.repo, text_container);
    let mut data = fs::read(&path).unwrap();
    for b in &mut data[(text_at + text_len / 2) as usize..][..4] {
        *b ^= 0xff;
    }
    fs::write(&path, data).unwrap();
    let path = container_file(&f.repo, random_container);
    let data = fs::read(&path).unwrap();
    fs::write(&path, &data[..data.len() / 3]).unwrap();
    f
}

fn container_file(repo: &Path, id: u64) -> PathBuf {
    repo.join("containers").join(format!("{id:016x}.ctr"))
}

/// Where chunk `i` of file `rel` of the first snapshot lies: offset, stored length,
/// container; asserting that its container holds no tree chunk (so that a backup can
/// make the originals whole again).
fn place(f: &Fixture, rel: &str, i: usize) -> (u64, u64, u64) {
    let repo = opened(&f.repo, LockMode::Shared);
    let (_, snap) = repo.find_snapshot(&f.snapshots[0].0).unwrap();
    let tree_fps = snap.tree.fingerprints().unwrap();
    let entries = load_tree(&mut ChunkReader::new(&repo), &tree_fps).unwrap();
    let want = f.src.join(rel);
    let want = want.strip_prefix("/").unwrap().to_str().unwrap().as_bytes();
    let entry = entries
        .iter()
        .find(|e| e.kind == EntryKind::File && e.path == want)
        .unwrap();
    let loc = repo.index().get(&entry.chunks[i]).unwrap().unwrap();
    let tree: BTreeSet<u64> = tree_fps
        .iter()
        .map(|fp| repo.index().get(fp).unwrap().unwrap().container)
        .collect();
    assert!(
        !tree.contains(&loc.container),
        "{rel} shares the tree's container"
    );
    (u64::from(loc.offset), u64::from(loc.length), loc.container)
}

fn run_repair(root: &Path, crash_after_ops: Option<usize>) -> RepairReport {
    let mut repo = opened(root, LockMode::Exclusive);
    let opts = RepairOptions {
        crash_after_ops,
        ..RepairOptions::default()
    };
    repair(&mut repo, &opts).unwrap()
}

fn container_ids(root: &Path) -> BTreeSet<u64> {
    fs::read_dir(root.join("containers"))
        .unwrap()
        .map(|e| {
            let name = e.unwrap().file_name().into_string().unwrap();
            u64::from_str_radix(name.strip_suffix(".ctr").unwrap(), 16).unwrap()
        })
        .collect()
}

/// The files snapshot `id` restores, relative to the source.
fn restored_files(f: &Fixture, root: &Path, id: &str) -> BTreeMap<PathBuf, Vec<u8>> {
    let repo = opened(root, LockMode::Shared);
    let target = tempfile::tempdir_in(&f.base).unwrap();
    let opts = restore_options(DEFAULT_RESTORE_CACHE);
    restore(&repo, id, target.path(), &opts).unwrap();
    files(&target.path().join(f.src.strip_prefix("/").unwrap()))
}

/// Each original's repaired copy's files, by original.
fn repaired_files(f: &Fixture, root: &Path) -> BTreeMap<String, BTreeMap<PathBuf, Vec<u8>>> {
    let repo = opened(root, LockMode::Shared);
    let (all, bad) = repo.snapshots().unwrap();
    assert!(bad.is_empty());
    let mut out = BTreeMap::new();
    for (id, s) in &all {
        if let Some(original) = &s.repaired_from {
            let files = restored_files(f, root, id);
            assert!(
                out.insert(original.clone(), files).is_none(),
                "two repaired copies of {original}"
            );
        }
    }
    out
}

/// After a backup of the source, `check --read-data` passes and every original
/// restores identical.
fn assert_healed(f: &Fixture, root: &Path) {
    let mut repo = opened(root, LockMode::Exclusive);
    backup(&mut repo, std::slice::from_ref(&f.src), &backup_options(2)).unwrap();
    let report = check(&repo, &check_options(true)).unwrap();
    assert!(report.is_ok(), "{:?}", report.damage);
    drop(repo);
    for (id, expected) in &f.snapshots {
        assert!(
            restored_files(f, root, id) == *expected,
            "{id} restores different"
        );
    }
}

/// Regression guard for repair's order: deleting a damaged container before the
/// segment that drops it is durable, writing a repaired snapshot before its tree's
/// chunks are committed, or repairing a snapshot twice fails here at some stop.
#[test]
fn a_repair_stopped_after_any_file_operation_is_finished_by_the_next() {
    let f = damaged_fixture(false);
    let reference = f.base.join("reference");
    copy_dir(&f.repo, &reference);
    let complete = run_repair(&reference, None);
    assert_eq!(complete.containers.len(), 2, "{:?}", complete.containers);
    assert_eq!(complete.snapshots.len(), 2, "both snapshots lose data");
    assert!(complete.containers.iter().any(|c| c.salvaged > 0));
    let expected = repaired_files(&f, &reference);
    assert_eq!(expected.len(), 2);

    let mut stops = 0;
    for ops in 0.. {
        let root = f.base.join(format!("stopped-{ops}"));
        copy_dir(&f.repo, &root);
        if !run_repair(&root, Some(ops)).interrupted {
            break;
        }
        stops += 1;
        // A reader finds every indexed container's file.
        let reader = opened(&root, LockMode::Shared);
        let on_disk = container_ids(&root);
        let missing: Vec<_> = reader
            .indexed_containers()
            .iter()
            .filter(|id| !on_disk.contains(id))
            .collect();
        assert!(
            missing.is_empty(),
            "stop {ops}: indexed but gone {missing:?}"
        );
        drop(reader);
        // The next repair finishes: the same repaired copies, nothing left over.
        let finished = run_repair(&root, None);
        assert!(!finished.interrupted);
        assert!(
            repaired_files(&f, &root) == expected,
            "stop {ops}: the repaired copies differ"
        );
        let repo = opened(&root, LockMode::Exclusive);
        assert!(repo.pending_gc_plans().unwrap().is_empty(), "stop {ops}");
        assert_eq!(
            repo.indexed_containers(),
            &container_ids(&root),
            "stop {ops}"
        );
        drop(repo);
        if ops % 4 == 0 {
            assert_healed(&f, &root);
        }
        fs::remove_dir_all(&root).unwrap();
    }
    // Plan, salvage and tree containers, segment, two snapshots, old segments,
    // two containers, plan.
    let minimum = 1 + complete.containers_written + 1 + 2 + 1 + 2 + 1;
    assert!(stops >= minimum, "only {stops} stopping points");
    assert_healed(&f, &reference);
}

/// The disk index has no delete: after repair it is rebuilt without the damaged
/// containers, and the next backup stores the lost chunks again.
#[test]
fn repair_with_the_disk_index() {
    let f = damaged_fixture(true);
    let report = run_repair(&f.repo.clone(), None);
    assert_eq!(report.containers.len(), 2);
    let root = f.repo.clone();
    assert_healed(&f, &root);
    // A dry run afterwards finds nothing more to salvage.
    let mut repo = opened(&root, LockMode::Exclusive);
    let opts = RepairOptions {
        dry_run: true,
        ..RepairOptions::default()
    };
    let again = repair(&mut repo, &opts).unwrap();
    assert!(again.containers.is_empty() && again.snapshots.is_empty());
}
