//! Stage 3 with the disk index holding chunks within its share of `--index-memory`
//! (docs/design/pipeline.md, "Stage 3 with the disk index"): with a share far smaller
//! than what waits for lazy answers (stage 3 then looks everything up early, over and
//! over), with a large one, and with the eager lookup, the chunks are stored byte for
//! byte as the memory index stores them, and restores equal the source.

use std::collections::HashSet;
use std::fs;
use std::path::Path;

use larder_chunk::ChunkerConfig;
use larder_engine::{backup, check, restore, BackupSummary};
use larder_hash::{Fingerprint, HashAlgo};
use larder_store::{DiskLookup, IndexSettings, LockMode, RepoConfig, Repository};

#[path = "support/bytes.rs"]
mod seeded;
use seeded::bytes;

#[path = "support/options.rs"]
mod options;
use options::{backup_options, check_options, restore_options};

/// A small budget: a held share of 1 MiB (768 KiB of chunk bytes, the bookkeeping of
/// 2048 chunks), far less than what waits.
const LAZY_4MIB: IndexSettings = IndexSettings::Disk {
    lookup: DiskLookup::Lazy,
    memory: 4 << 20,
};
/// The default budget: a held share of 64 MiB, more than the whole source.
const LAZY_256MIB: IndexSettings = IndexSettings::Disk {
    lookup: DiskLookup::Lazy,
    memory: 256 << 20,
};
const EAGER_4MIB: IndexSettings = IndexSettings::Disk {
    lookup: DiskLookup::Eager,
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

/// A chunk as a container stores it: fingerprint, offset, stored bytes.
type StoredChunk = (Fingerprint, u32, Vec<u8>);

/// Every container's data chunks: id, then each chunk's fingerprint, place and stored
/// bytes, in table order. Tree chunks are left out: the tree records the metadata of
/// the source's parent directories, which other processes change.
fn data_chunks(root: &Path) -> Vec<(u64, Vec<StoredChunk>)> {
    let repo = Repository::open(root, LockMode::Shared).unwrap();
    let mut tree: HashSet<Fingerprint> = HashSet::new();
    for (_, s) in repo.snapshots().unwrap().0 {
        tree.extend(s.tree.fingerprints().unwrap());
    }
    let mut ids: Vec<u64> = repo.indexed_containers().iter().copied().collect();
    ids.sort_unstable();
    ids.into_iter()
        .map(|id| {
            let c = repo.load_container(id).unwrap();
            let chunks = c
                .entries
                .iter()
                .filter(|e| !tree.contains(&e.fingerprint))
                .map(|e| {
                    let stored = c.chunk(e.offset, e.stored_len).unwrap().to_vec();
                    (e.fingerprint, e.offset, stored)
                })
                .collect();
            (id, chunks)
        })
        .collect()
}

fn restore_and_compare(root: &Path, src: &Path, target: &Path) {
    let repo = Repository::open(root, LockMode::Shared).unwrap();
    let summary = restore(
        &repo,
        "latest",
        target,
        &restore_options(larder_engine::DEFAULT_RESTORE_CACHE),
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
    let report = check(&repo, &check_options(true)).unwrap();
    assert!(report.is_ok(), "{:?}", report.damage);
}

#[test]
fn held_chunks_are_stored_as_the_memory_index_stores_them() {
    let dir = tempfile::tempdir().unwrap();
    let base = fs::canonicalize(dir.path()).unwrap();
    // The source apart: the tree records the mtimes of its parent directories, which
    // the repositories and restores change.
    let src_dir = tempfile::tempdir().unwrap();
    let src = fs::canonicalize(src_dir.path()).unwrap().join("src");
    let memory = base.join("memory");
    init(&memory, IndexSettings::Memory);
    let disk = [
        (base.join("lazy-4"), LAZY_4MIB),
        (base.join("lazy-256"), LAZY_256MIB),
        (base.join("eager-4"), EAGER_4MIB),
    ];
    for (root, settings) in &disk {
        init(root, *settings);
    }
    for generation in [1, 2] {
        write_generation(&src, generation);
        let m = run_backup(&memory, &src).unwrap();
        for (root, _) in &disk {
            let d = run_backup(root, &src).unwrap();
            assert_eq!(
                (m.chunks, m.chunks_new, m.bytes_new),
                (d.chunks, d.chunks_new, d.bytes_new),
                "generation {generation}, {}",
                root.display()
            );
            // Containers are numbered alike and hold the same data chunks, stored
            // alike, in the same order.
            assert!(
                data_chunks(&memory) == data_chunks(root),
                "generation {generation}, {}",
                root.display()
            );
            let target = base.join(format!("restore-{generation}"));
            restore_and_compare(root, &src, &target);
            fs::remove_dir_all(&target).unwrap();
        }
    }
    for (root, _) in &disk {
        check_ok(root);
    }
}
