//! Stage 3's spool with the lazy disk index (docs/design/pipeline.md, "Stage 3 with
//! the disk index"): chunks waiting for lazy answers past the held share of
//! `--index-memory` go to a spool file; those answered new are stored byte for byte as
//! the memory index stores them, restores equal the source, and an error while
//! spooling fails the backup without committing anything.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use larder_chunk::ChunkerConfig;
use larder_engine::{
    backup, check, restore, BackupSummary, CheckOptions, NoProgress, PatternList, RestoreOptions,
};
use larder_hash::HashAlgo;
use larder_store::{DiskLookup, IndexSettings, LockMode, RepoConfig, Repository};

#[path = "support/bytes.rs"]
mod seeded;
use seeded::bytes;

#[path = "support/options.rs"]
mod options;
use options::backup_options;

/// A small budget: a held share of 1 MiB (768 KiB of chunk bytes, the bookkeeping of
/// 2048 chunks), far less than what waits.
const LAZY_4MIB: IndexSettings = IndexSettings::Disk {
    lookup: DiskLookup::Lazy,
    memory: 4 << 20,
};

fn init(root: &Path, index: IndexSettings) {
    Repository::init(
        root,
        &RepoConfig::new(ChunkerConfig::default(), HashAlgo::Blake3).with_index(index),
    )
    .unwrap();
}

fn run_backup(root: &Path, src: &Path) -> larder_engine::Result<BackupSummary> {
    let mut repo = Repository::open(root, LockMode::Exclusive).unwrap();
    backup(&mut repo, &[src.to_path_buf()], &backup_options(2))
}

/// Generation 1: 24 MiB in three files (one repeating part of another). Generation 2:
/// the same files with 1 MiB of new data in the middle of each, and a new file that
/// copies part of generation 1.
fn write_generation(src: &Path, generation: u32) {
    fs::create_dir_all(src).unwrap();
    for f in 0..3u64 {
        let mut data = bytes(f, 8 << 20);
        if f == 2 {
            data[..2 << 20].copy_from_slice(&bytes(0, 2 << 20));
        }
        if generation == 2 {
            let fresh = bytes(100 + f, 1 << 20);
            data.splice(4 << 20..4 << 20, fresh);
        }
        fs::write(src.join(format!("f{f}")), data).unwrap();
    }
    if generation == 2 {
        let mut copy = bytes(1, 3 << 20);
        copy.extend_from_slice(&bytes(7, 1 << 20));
        fs::write(src.join("copy"), copy).unwrap();
    }
}

/// Every container file, by name.
fn containers(root: &Path) -> BTreeMap<String, Vec<u8>> {
    fs::read_dir(root.join("containers"))
        .unwrap()
        .flat_map(|e| {
            let p = e.unwrap().path();
            if p.is_dir() {
                fs::read_dir(&p)
                    .unwrap()
                    .map(|e| e.unwrap().path())
                    .collect()
            } else {
                vec![p]
            }
        })
        .map(|p: PathBuf| {
            (
                p.strip_prefix(root).unwrap().display().to_string(),
                fs::read(&p).unwrap(),
            )
        })
        .collect()
}

fn restore_and_compare(root: &Path, src: &Path, target: &Path) {
    let repo = Repository::open(root, LockMode::Shared).unwrap();
    let summary = restore(
        &repo,
        "latest",
        target,
        &RestoreOptions {
            overwrite: false,
            include: PatternList::default(),
            exclude: PatternList::default(),
            cache_size: larder_engine::DEFAULT_RESTORE_CACHE,
            progress: Arc::new(NoProgress),
        },
    )
    .unwrap();
    assert!(summary.warnings.is_empty(), "{:?}", summary.warnings);
    let restored = target.join(src.strip_prefix("/").unwrap());
    for e in fs::read_dir(src).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap();
        assert!(
            fs::read(&p).unwrap() == fs::read(restored.join(name)).unwrap(),
            "{name:?} restores identical"
        );
    }
}

fn check_ok(root: &Path) {
    let repo = Repository::open(root, LockMode::Shared).unwrap();
    let report = check(
        &repo,
        &CheckOptions {
            read_data: true,
            progress: Arc::new(NoProgress),
        },
    )
    .unwrap();
    assert!(report.is_ok(), "{:?}", report.damage);
}

#[test]
fn spooled_chunks_are_stored_as_the_memory_index_stores_them() {
    let dir = tempfile::tempdir().unwrap();
    let base = fs::canonicalize(dir.path()).unwrap();
    let src = base.join("src");
    let (memory, lazy) = (base.join("memory"), base.join("lazy"));
    init(&memory, IndexSettings::Memory);
    init(&lazy, LAZY_4MIB);
    let mut spooled = 0;
    for generation in [1, 2] {
        write_generation(&src, generation);
        let m = run_backup(&memory, &src).unwrap();
        let l = run_backup(&lazy, &src).unwrap();
        assert_eq!(m.bytes_spooled, 0);
        assert_eq!(
            (m.chunks, m.chunks_new, m.bytes_new, m.bytes_new_stored),
            (l.chunks, l.chunks_new, l.bytes_new, l.bytes_new_stored),
            "generation {generation}"
        );
        spooled += l.bytes_spooled;
        // Containers are numbered alike and hold the same chunks in the same order.
        assert!(
            containers(&memory) == containers(&lazy),
            "generation {generation}"
        );
        let target = base.join(format!("restore-{generation}"));
        restore_and_compare(&lazy, &src, &target);
    }
    // Generation 2 is mostly chunks of generation 1, which wait in the lazy buffer
    // (a fresh open's cache is cold) far past the held share.
    assert!(spooled > 4 << 20, "spooled {spooled}");
    check_ok(&lazy);
    assert_eq!(
        fs::read_dir(lazy.join("tmp")).unwrap().count(),
        0,
        "the spool file is removed"
    );
}

#[test]
fn an_error_while_spooling_fails_the_backup_and_commits_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let base = fs::canonicalize(dir.path()).unwrap();
    let src = base.join("src");
    let repo = base.join("repo");
    init(&repo, LAZY_4MIB);
    write_generation(&src, 1);
    run_backup(&repo, &src).unwrap();
    write_generation(&src, 2);
    let before = containers(&repo);

    // A directory where the spool file would be: its creation fails (EISDIR).
    let mut open = Repository::open(&repo, LockMode::Exclusive).unwrap();
    let blocker = repo
        .join("tmp")
        .join(format!("spool-{}.tmp", std::process::id()));
    fs::create_dir(&blocker).unwrap();
    let err = backup(&mut open, &[src.clone()], &backup_options(2)).unwrap_err();
    assert!(err.to_string().contains("spool-"), "{err}");
    drop(open);
    fs::remove_dir(&blocker).unwrap();

    let reopened = Repository::open(&repo, LockMode::Shared).unwrap();
    let (snapshots, bad) = reopened.snapshots().unwrap();
    assert!(bad.is_empty());
    assert_eq!(snapshots.len(), 1, "no snapshot committed");
    drop(reopened);
    check_ok(&repo);

    // The next backup of the same data succeeds, keeps every container, and restores.
    let summary = run_backup(&repo, &src).unwrap();
    assert!(summary.bytes_spooled > 0);
    check_ok(&repo);
    restore_and_compare(&repo, &src, &base.join("restore"));
    let after = containers(&repo);
    assert!(before.keys().all(|k| after.contains_key(k)));
}
