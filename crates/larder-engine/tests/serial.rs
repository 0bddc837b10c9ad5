//! `BackupOptions::serial`: the stages take turns. A serial backup must store exactly
//! what the pipelined one stores (the same snapshot content, the same new chunks), and
//! on one thread its stages must never overlap: their working times, each measured
//! inside its turn, add up to no more than the backup's elapsed time.

use std::path::Path;

use larder_chunk::ChunkerConfig;
use larder_engine::{backup, restore, BackupOptions, BackupSummary};
use larder_hash::HashAlgo;
use larder_store::{LockMode, RepoConfig, Repository};

#[path = "support/options.rs"]
mod options;
use options::{backup_options, restore_options};

#[path = "support/bytes.rs"]
mod support;

/// Small files (read in parallel across files), two large files over several 8 MiB
/// blocks, and duplicates within and across files.
fn source(dir: &Path) {
    let big = support::bytes(1, 19 << 20);
    std::fs::create_dir_all(dir.join("small")).unwrap();
    for i in 0..40u64 {
        let data = support::bytes(100 + i % 7, 3000 + 997 * i as usize);
        std::fs::write(dir.join(format!("small/{i:02}")), data).unwrap();
    }
    std::fs::write(dir.join("big1"), &big).unwrap();
    let mut edited = big.clone();
    edited[5_000_000..5_000_100].fill(9);
    edited.extend_from_slice(&big[..3 << 20]);
    std::fs::write(dir.join("big2"), edited).unwrap();
}

fn backup_into(repo_path: &Path, src: &Path, serial: bool, threads: usize) -> BackupSummary {
    Repository::init(
        repo_path,
        &RepoConfig::new(ChunkerConfig::default(), HashAlgo::Blake3),
    )
    .unwrap();
    let mut repo = Repository::open(repo_path, LockMode::Exclusive).unwrap();
    let opts = BackupOptions {
        serial,
        remote: None,
        ..backup_options(threads)
    };
    let summary = backup(&mut repo, &[src.to_path_buf()], &opts).unwrap();
    assert!(!summary.is_partial(), "{:?}", summary.warnings);
    summary
}

#[test]
fn serial_backups_store_what_pipelined_ones_do_and_their_stages_never_overlap() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    source(&src);
    let pipelined = backup_into(&dir.path().join("pipelined"), &src, false, 2);
    for threads in [1, 2] {
        let repo_path = dir.path().join(format!("serial-{threads}"));
        let serial = backup_into(&repo_path, &src, true, threads);
        assert_eq!(
            (
                serial.bytes_in,
                serial.bytes_new,
                serial.chunks,
                serial.chunks_new
            ),
            (
                pipelined.bytes_in,
                pipelined.bytes_new,
                pipelined.chunks,
                pipelined.chunks_new
            ),
            "{threads} threads"
        );
        // With one thread every stage time is wall time (with more, `fingerprint` and
        // `compress` are summed over threads that work at once within one turn).
        if threads == 1 {
            let s = &serial.stages;
            let worked = s.walk + s.chunk + s.fingerprint + s.index + s.compress + s.write + s.sync;
            assert!(
                worked <= serial.elapsed,
                "stages worked {worked:?} in {:?}: they overlapped ({s:?})",
                serial.elapsed
            );
        }

        let repo = Repository::open(&repo_path, LockMode::Shared).unwrap();
        let target = dir.path().join(format!("restored-{threads}"));
        let opts = restore_options(larder_engine::DEFAULT_RESTORE_CACHE);
        restore(&repo, "latest", &target, &opts).unwrap();
        let restored = target.join(src.strip_prefix("/").unwrap());
        for name in ["big1", "big2", "small/00", "small/39"] {
            assert!(
                std::fs::read(src.join(name)).unwrap()
                    == std::fs::read(restored.join(name)).unwrap(),
                "{name} differs after a serial backup"
            );
        }
    }
}
