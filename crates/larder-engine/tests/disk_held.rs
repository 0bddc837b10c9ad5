//! Stage 3 with the disk index holding chunks within its share of `--index-memory`
//! (docs/design/pipeline.md, "Stage 3 with the disk index"): with a share smaller
//! than what waits for lazy answers (stage 3 then looks buckets up early, over and
//! over), with a large one, and with the eager lookup, the chunks are stored byte for
//! byte as the memory index stores them, and restores equal the source. A lazy backup
//! at a budget far below its index finds exactly the eager one's duplicates with far
//! fewer lookup I/Os.

use std::collections::HashSet;
use std::fs;
use std::path::Path;

use larder_chunk::ChunkerConfig;
use larder_engine::{backup, check, restore, BackupSummary};
use larder_gen::{Config, Model, Workload};
use larder_hash::{Fingerprint, HashAlgo};
use larder_store::{DiskLookup, IndexSettings, LockMode, RepoConfig, Repository};

#[path = "support/bytes.rs"]
mod seeded;
use seeded::bytes;

#[path = "support/options.rs"]
mod options;
use options::{backup_options, check_options, restore_options};

/// A small budget: its quarter (1 MiB) is below the held share's floor, so stage 3
/// holds up to 16 MiB (12 MiB of chunk bytes: one whole batch), less than what waits,
/// and makes room over and over.
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
    init_with(root, ChunkerConfig::default(), index);
}

fn init_with(root: &Path, chunker: ChunkerConfig, index: IndexSettings) {
    Repository::init(
        root,
        &RepoConfig::new(chunker, HashAlgo::Blake3).with_index(index),
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

/// `count` generations of `size` bytes from `larder gen`'s model, each as `gen-NNN/data`
/// under `dir`.
fn gen_generations(dir: &Path, size: u64, count: u32) -> Vec<std::path::PathBuf> {
    let mut workload = Workload::new(Config {
        seed: 20,
        generation_size: size,
        generations: count,
        clients: 1,
        model: Model::default(),
    })
    .unwrap();
    let mut paths = Vec::new();
    while let Some(g) = workload.next_generation() {
        let path = dir.join(format!("gen-{:03}", g.truth.generation));
        fs::create_dir_all(&path).unwrap();
        let mut data = Vec::new();
        workload.write(&g, &mut data).unwrap();
        fs::write(path.join("data"), data).unwrap();
        paths.push(path);
    }
    paths
}

/// Inside a backup, the lazy lookup at `--index-memory 1MiB` saved few lookup
/// I/Os, since stage 3's share of the budget (256 KiB) held less than one batch and
/// every batch made it look the whole lazy buffer up. Generations of the generator's
/// model, 2 KiB chunks, the index many times the budget: the lazy backup stores exactly
/// the chunks the eager one stores, and its on-disk lookups of the later generations
/// take at most half the eager one's reads (471 against 142 when written; 462 against
/// 261 without the held share's floor).
#[test]
fn lazy_backup_finds_the_eager_duplicates_with_far_fewer_lookup_ios() {
    let dir = tempfile::tempdir().unwrap();
    let base = fs::canonicalize(dir.path()).unwrap();
    let src_dir = tempfile::tempdir().unwrap();
    let gens = gen_generations(&fs::canonicalize(src_dir.path()).unwrap(), 128 << 20, 3);
    let chunker = ChunkerConfig {
        min_size: 512,
        avg_size: 2 << 10,
        max_size: 16 << 10,
        ..ChunkerConfig::default()
    };
    let (eager, lazy) = (base.join("eager"), base.join("lazy"));
    for (root, lookup) in [(&eager, DiskLookup::Eager), (&lazy, DiskLookup::Lazy)] {
        let memory = 1 << 20;
        init_with(root, chunker, IndexSettings::Disk { lookup, memory });
    }
    let mut ios = (0, 0);
    for (i, src) in gens.iter().enumerate() {
        let e = run_backup(&eager, src).unwrap();
        let l = run_backup(&lazy, src).unwrap();
        assert_eq!(
            (e.chunks, e.chunks_new, e.bytes_new),
            (l.chunks, l.chunks_new, l.bytes_new),
            "generation {}",
            i + 1
        );
        assert!(
            data_chunks(&eager) == data_chunks(&lazy),
            "generation {}",
            i + 1
        );
        if i > 0 {
            ios.0 += e.disk_index.unwrap().lookup_ios;
            ios.1 += l.disk_index.unwrap().lookup_ios;
        }
    }
    assert!(
        ios.1 > 0 && 2 * ios.1 <= ios.0,
        "lookup I/Os, eager and lazy: {ios:?}"
    );
    restore_and_compare(&lazy, gens.last().unwrap(), &base.join("restore"));
    check_ok(&lazy);
}
