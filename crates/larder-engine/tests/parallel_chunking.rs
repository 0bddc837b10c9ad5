//! Large files are chunked on several threads (stage 1, `ParallelChunker`); their
//! recipes must be exactly those of chunking the whole file on one thread, whatever
//! the thread count: the same chunk boundaries mean the same fingerprints.

use std::path::Path;

use larder_chunk::{ChunkerConfig, ChunkerKind};
use larder_engine::{backup, load_tree, ChunkReader};
use larder_hash::{Fingerprint, HashAlgo};
use larder_store::{EntryKind, LockMode, RepoConfig, Repository};

#[path = "support/options.rs"]
mod options;
use options::backup_options;

/// 26 MiB over several 8 MiB blocks: random data, zero runs long enough to give only
/// maximum-size chunks, and a repeated stretch.
fn mixed_data() -> Vec<u8> {
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut data: Vec<u8> = (0..(20 << 20))
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 32) as u8
        })
        .collect();
    data[3_000_000..5_500_000].fill(0);
    data[9_000_001..9_100_000].fill(0);
    let repeat = data[100_000..3_000_000].to_vec();
    data.extend_from_slice(&repeat);
    data.extend(std::iter::repeat_n(7u8, 1 << 20));
    data.extend_from_slice(&repeat[..2_345_677]);
    data
}

/// The file's recipe after a backup with `threads` threads.
fn recipe(dir: &Path, config: ChunkerConfig, threads: usize, src: &Path) -> Vec<Fingerprint> {
    let repo_path = dir.join(format!("repo-{}-{threads}", config.kind.name()));
    Repository::init(&repo_path, &RepoConfig::new(config, HashAlgo::Blake3)).unwrap();
    let mut repo = Repository::open(&repo_path, LockMode::Exclusive).unwrap();
    let opts = backup_options(threads);
    let summary = backup(&mut repo, &[src.to_path_buf()], &opts).unwrap();
    assert!(!summary.is_partial(), "{:?}", summary.warnings);
    let (_, snap) = repo.find_snapshot(&summary.snapshot_id).unwrap();
    let mut reader = ChunkReader::new(&repo);
    let entries = load_tree(&mut reader, &snap.tree.fingerprints().unwrap()).unwrap();
    let file = entries
        .into_iter()
        .find(|e| e.kind == EntryKind::File)
        .expect("the snapshot holds the file");
    file.chunks
}

#[test]
fn recipes_equal_single_threaded_chunking_for_every_thread_count() {
    let dir = tempfile::tempdir().unwrap();
    let data = mixed_data();
    let src = dir.path().join("big.bin");
    std::fs::write(&src, &data).unwrap();
    let configs = [
        ChunkerConfig::default(),
        ChunkerConfig {
            kind: ChunkerKind::Rabin,
            ..ChunkerConfig::default()
        },
        ChunkerConfig {
            kind: ChunkerKind::Ae,
            min_size: 0,
            ..ChunkerConfig::default()
        },
    ];
    for config in configs {
        config.validate().unwrap();
        let mut start = 0;
        let expected: Vec<Fingerprint> = config
            .build()
            .chunk_lengths(&data)
            .into_iter()
            .map(|len| {
                start += len;
                HashAlgo::Blake3.fingerprint(&data[start - len..start])
            })
            .collect();
        for threads in [1, 2, 3, 5] {
            let got = recipe(dir.path(), config, threads, &src);
            assert_eq!(got.len(), expected.len(), "{config:?}, {threads} threads");
            assert!(
                got == expected,
                "{config:?}, {threads} threads: recipes differ"
            );
        }
    }
}
