//! Reading byte ranges of one file through `ChunkCache` (docs/design/mount.md,
//! "Reading files"): whatever the cache bound, every range, sequential or not, across
//! chunk, run and container boundaries and past the end, reads back exactly the
//! file's bytes; a file whose chunks repeat (dedup inside the file) too.

use std::fs;
use std::path::Path;
use std::sync::Arc;

use larder_chunk::{ChunkerConfig, ChunkerKind};
use larder_engine::{backup, ChunkCache, SnapshotPath, SnapshotTree};
use larder_hash::HashAlgo;
use larder_store::{LockMode, RepoConfig, Repository};

#[path = "support/bytes.rs"]
mod seeded;
use seeded::bytes as noise;
#[path = "support/options.rs"]
mod options;
use options::backup_options;

/// Small chunks in 16 KiB containers: a few hundred KiB span many containers, so
/// runs end at container boundaries often.
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
    config.container_size = 16 << 10;
    Repository::init(path, &config).unwrap();
}

/// Noise, a block repeated three times, and compressible text.
fn content() -> Vec<u8> {
    let mut data = noise(1, 150_000);
    let block = noise(2, 20_000);
    for _ in 0..3 {
        data.extend_from_slice(&block);
    }
    data.extend(b"larder mount ".iter().cycle().take(90_000));
    data
}

#[test]
fn every_range_reads_back_exactly_whatever_the_cache_bound() {
    let dir = tempfile::tempdir().unwrap();
    let (repo_path, src) = (dir.path().join("repo"), dir.path().join("src"));
    init(&repo_path);
    fs::create_dir(&src).unwrap();
    let data = content();
    fs::write(src.join("f"), &data).unwrap();
    let mut repo = Repository::open(&repo_path, LockMode::Exclusive).unwrap();
    backup(&mut repo, std::slice::from_ref(&src), &backup_options(2)).unwrap();
    drop(repo);

    let repo = Arc::new(Repository::open(&repo_path, LockMode::Shared).unwrap());
    let tree = SnapshotTree::load(&repo, "latest").unwrap();
    let path = SnapshotPath::parse(src.join("f").as_os_str().as_encoded_bytes()).unwrap();
    let entry = tree.entry(&path).unwrap();
    let size = data.len() as u64;
    for bound in [0, 4 << 10, 64 << 20] {
        let cache = Arc::new(ChunkCache::new(repo.clone(), bound));
        let file = Arc::new(cache.layout(entry, "test").unwrap());
        assert_eq!(file.size(), size);
        // Sequential, as the kernel reads: reads ahead.
        let mut back = Vec::new();
        for offset in (0..size).step_by(4096) {
            back.extend(cache.read_at(&file, offset, 4096).unwrap());
        }
        assert!(back == data, "sequential read differs with bound {bound}");
        // Anywhere, any length, past the end.
        let mut x = 7u64;
        for _ in 0..300 {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            let offset = (x >> 33) % (size + 100);
            let len = (x >> 13) % 70_000;
            let got = cache.read_at(&file, offset, len).unwrap();
            let lo = offset.min(size) as usize;
            let hi = (offset + len).min(size) as usize;
            assert!(
                got == data[lo..hi.max(lo)],
                "{offset}+{len} differs with bound {bound}"
            );
        }
    }
}
