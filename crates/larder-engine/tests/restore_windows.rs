//! Restore of fragmented repositories (docs/design/restore.md): many backups of
//! changing data scatter a snapshot's chunks over the containers of every backup.
//! Whatever the cache size, a restore must be byte-identical, and it must read exactly
//! the containers a model of the look-ahead windows says: each container once per
//! window that needs it, so with a cache that holds them all, each exactly once.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs;
use std::path::{Path, PathBuf};

use larder_chunk::{ChunkerConfig, ChunkerKind};
use larder_engine::{backup, load_tree, restore, ChunkReader, RestoreSummary};
use larder_hash::HashAlgo;
use larder_store::{EntryKind, LockMode, RepoConfig, Repository};
use proptest::prelude::*;

// Seeded pseudo-random bytes: incompressible, so chunks of them are stored raw.
#[path = "support/bytes.rs"]
mod seeded;
use seeded::bytes as noise;
#[path = "support/options.rs"]
mod options;
use options::{backup_options, restore_options};

/// Small containers and chunks, so a few hundred KiB spread over many containers.
const CONTAINER_SIZE: usize = 16 << 10;

/// Compressible text: chunks of it are stored as zstd frames.
fn text(seed: u64, len: usize) -> Vec<u8> {
    let words = noise(seed, len / 6 + 1);
    let mut out = Vec::with_capacity(len + 16);
    for w in words {
        out.extend_from_slice(
            ["alpha ", "beta ", "gamma ", "delta "][usize::from(w % 4)].as_bytes(),
        );
        if out.len() >= len {
            break;
        }
    }
    out.truncate(len);
    out
}

/// A source tree that changes from one generation to the next, and what each
/// generation held.
struct Source {
    root: PathBuf,
    files: BTreeMap<String, Vec<u8>>,
    seed: u64,
}

impl Source {
    fn new(root: PathBuf, files: usize, seed: u64) -> Self {
        let mut s = Source {
            root,
            files: BTreeMap::new(),
            seed,
        };
        for i in 0..files {
            let len = 1000 + (s.next() % 40_000) as usize;
            let data = if i % 3 == 0 {
                text(s.next(), len)
            } else {
                noise(s.next(), len)
            };
            s.files.insert(format!("d{}/f{i:02}", i % 3), data);
        }
        s.write();
        s
    }

    fn next(&mut self) -> u64 {
        self.seed = self
            .seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        self.seed >> 16
    }

    /// Edits a third of the files in place (a few bytes overwritten, a stretch
    /// inserted), appends to some, adds a file and removes one.
    fn change(&mut self, generation: usize) {
        let names: Vec<String> = self.files.keys().cloned().collect();
        for name in &names {
            if !self.next().is_multiple_of(3) {
                continue;
            }
            let at = (self.next() as usize) % self.files[name].len().max(1);
            let insert = noise(self.next(), 200 + (self.next() % 3000) as usize);
            let f = self.files.get_mut(name).unwrap();
            let end = (at + 64).min(f.len());
            f[at..end].fill(generation as u8);
            f.splice(at..at, insert);
        }
        let len = 500 + (self.next() % 20_000) as usize;
        let data = text(self.next(), len);
        self.files
            .insert(format!("d{}/new{generation}", generation % 3), data);
        let victim = names[(self.next() as usize) % names.len()].clone();
        self.files.remove(&victim);
        self.write();
    }

    fn write(&self) {
        if self.root.exists() {
            fs::remove_dir_all(&self.root).unwrap();
        }
        for (name, data) in &self.files {
            let path = self.root.join(name);
            fs::create_dir_all(path.parent().unwrap()).unwrap();
            fs::write(path, data).unwrap();
        }
    }
}

fn init(path: &Path) {
    let chunker = ChunkerConfig {
        kind: ChunkerKind::Fastcdc2020,
        min_size: 256,
        avg_size: 1024,
        max_size: 4096,
        level: 2,
        seed: 0,
    };
    let mut config = RepoConfig::new(chunker, HashAlgo::Blake3);
    config.container_size = CONTAINER_SIZE;
    Repository::init(path, &config).unwrap();
}

fn backup_source(repo_path: &Path, src: &Source) -> String {
    let mut repo = Repository::open(repo_path, LockMode::Exclusive).unwrap();
    let opts = backup_options(2);
    let summary = backup(&mut repo, std::slice::from_ref(&src.root), &opts).unwrap();
    assert!(!summary.is_partial(), "{:?}", summary.warnings);
    summary.snapshot_id
}

fn restore_with(repo: &Repository, snapshot: &str, target: &Path, cache: usize) -> RestoreSummary {
    let summary = restore(repo, snapshot, target, &restore_options(cache)).unwrap();
    assert!(summary.warnings.is_empty(), "{:?}", summary.warnings);
    summary
}

/// Every file restored under `target` equals the generation's content, and nothing
/// else is there.
fn assert_identical(target: &Path, src: &Source, files: &BTreeMap<String, Vec<u8>>) {
    let restored = target.join(src.root.strip_prefix("/").unwrap());
    let mut found = BTreeMap::new();
    for dir in fs::read_dir(&restored).unwrap() {
        let dir = dir.unwrap();
        for f in fs::read_dir(dir.path()).unwrap() {
            let f = f.unwrap();
            let name = format!(
                "{}/{}",
                dir.file_name().to_str().unwrap(),
                f.file_name().to_str().unwrap()
            );
            found.insert(name, fs::read(f.path()).unwrap());
        }
    }
    assert_eq!(found.len(), files.len());
    for (name, data) in files {
        assert!(found[name] == *data, "{name} differs");
    }
}

/// The model: the snapshot's file chunks in restore order, as (container, start, end)
/// of their stored bytes, cut into windows whose containers' spans fit `cache`
/// (written here from the rule in docs/design/restore.md, not from the engine's code);
/// the reads are the windows' distinct containers, summed. Returns (reads, distinct).
fn model_reads(repo: &Repository, snapshot: &str, cache: u64) -> (u64, u64) {
    let (_, snap) = repo.find_snapshot(snapshot).unwrap();
    let mut reader = ChunkReader::new(repo);
    let entries = load_tree(&mut reader, &snap.tree.fingerprints().unwrap()).unwrap();
    let chunks: Vec<(u64, u64, u64)> = entries
        .iter()
        .filter(|e| e.kind == EntryKind::File)
        .flat_map(|e| e.chunks.iter())
        .map(|fp| {
            let loc = repo.index().get(fp).unwrap().unwrap();
            let start = u64::from(loc.offset);
            (loc.container, start, start + u64::from(loc.length))
        })
        .collect();
    let distinct: HashSet<u64> = chunks.iter().map(|c| c.0).collect();
    let mut reads = 0u64;
    let mut spans: HashMap<u64, (u64, u64)> = HashMap::new();
    for &(c, lo, hi) in &chunks {
        let mut trial = spans.clone();
        let s = trial.entry(c).or_insert((lo, hi));
        *s = (s.0.min(lo), s.1.max(hi));
        let total: u64 = trial.values().map(|(a, b)| b - a).sum();
        if !spans.is_empty() && total > cache {
            reads += spans.len() as u64;
            spans.clear();
            spans.insert(c, (lo, hi));
        } else {
            spans = trial;
        }
    }
    reads += spans.len() as u64;
    (reads, distinct.len() as u64)
}

/// A snapshot's id and the files its source held.
type Generation = (String, BTreeMap<String, Vec<u8>>);

/// Backs up `generations` generations of a changing tree; returns the snapshots with
/// the files each held.
fn fragmented_repo(
    dir: &Path,
    generations: usize,
    seed: u64,
) -> (PathBuf, Source, Vec<Generation>) {
    let repo_path = dir.join("repo");
    init(&repo_path);
    let mut src = Source::new(dir.join("src"), 12, seed);
    let mut snapshots = Vec::new();
    for g in 0..generations {
        if g > 0 {
            src.change(g);
        }
        snapshots.push((backup_source(&repo_path, &src), src.files.clone()));
    }
    (repo_path, src, snapshots)
}

#[test]
fn fragmented_restores_are_identical_and_read_what_the_model_says() {
    let dir = tempfile::tempdir().unwrap();
    let (repo_path, src, snapshots) = fragmented_repo(dir.path(), 8, 7);
    let repo = Repository::open(&repo_path, LockMode::Shared).unwrap();
    let (latest, files) = snapshots.last().unwrap();
    let unlimited = 1usize << 40;
    let caches = [
        0,
        1,
        CONTAINER_SIZE,
        3 * CONTAINER_SIZE,
        64 << 10,
        unlimited,
    ];
    let mut by_cache = Vec::new();
    for (i, &cache) in caches.iter().enumerate() {
        let target = dir.path().join(format!("out-{i}"));
        let summary = restore_with(&repo, latest, &target, cache);
        assert_identical(&target, &src, files);
        let (reads, distinct) = model_reads(&repo, latest, cache as u64);
        assert_eq!(summary.reads.container_reads, reads, "cache {cache}");
        // A 16 KiB container has no gap over 64 KiB: one read per container a window needs.
        assert_eq!(summary.reads.range_reads, reads, "cache {cache}");
        assert_eq!(summary.reads.distinct_containers, distinct, "cache {cache}");
        assert_eq!(summary.reads.table_reads, distinct);
        assert!(summary.reads.tree_container_reads >= 1);
        by_cache.push(summary.reads);
    }
    let total_chunks: u64 = {
        let (_, snap) = repo.find_snapshot(latest).unwrap();
        let mut reader = ChunkReader::new(&repo);
        let entries = load_tree(&mut reader, &snap.tree.fingerprints().unwrap()).unwrap();
        entries.iter().map(|e| e.chunks.len() as u64).sum()
    };
    let distinct = by_cache[0].distinct_containers;
    // Fragmented: the latest snapshot needs containers of many backups.
    assert!(distinct >= 8, "only {distinct} containers");
    // A cache of nothing reads one container per chunk; one that holds everything
    // reads each container exactly once; one container's worth sits in between.
    assert_eq!(by_cache[0].container_reads, total_chunks);
    assert_eq!(by_cache[5].container_reads, distinct);
    assert!(by_cache[2].container_reads > distinct);
    assert!(by_cache[2].container_reads < total_chunks);
    for older in [0, snapshots.len() / 2] {
        let (id, files) = &snapshots[older];
        let target = dir.path().join(format!("older-{older}"));
        let summary = restore_with(&repo, id, &target, CONTAINER_SIZE);
        assert_identical(&target, &src, files);
        assert_eq!(
            summary.reads.container_reads,
            model_reads(&repo, id, CONTAINER_SIZE as u64).0
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 6, ..ProptestConfig::default() })]

    /// Any history and any cache size: the restore is identical and reads what the
    /// model says.
    #[test]
    fn any_history_and_cache_restores_identically(
        seed in any::<u64>(),
        generations in 1usize..5,
        cache in prop_oneof![0usize..(4 * CONTAINER_SIZE), Just(1usize << 40)],
    ) {
        let dir = tempfile::tempdir().unwrap();
        let (repo_path, src, snapshots) = fragmented_repo(dir.path(), generations, seed);
        let repo = Repository::open(&repo_path, LockMode::Shared).unwrap();
        let (latest, files) = snapshots.last().unwrap();
        let target = dir.path().join("out");
        let summary = restore_with(&repo, latest, &target, cache);
        assert_identical(&target, &src, files);
        let (reads, distinct) = model_reads(&repo, latest, cache as u64);
        prop_assert_eq!(summary.reads.container_reads, reads);
        prop_assert_eq!(summary.reads.distinct_containers, distinct);
        prop_assert!(reads >= distinct);
    }
}
