//! Compression units (docs/design/compression-units.md) in real backups, plaintext
//! and encrypted: containers hold units of consecutive new chunks; restore, the chunk
//! reader and `check --read-data` give back every byte; gc keeps a unit whose members
//! are all live as it is stored and compresses the live members of a partly dead one
//! again, alone; and the repository is smaller than one compressing each chunk alone.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use larder_chunk::ChunkerConfig;
use larder_crypto::{AeadKind, FingerprintKind, RepoKeys};
use larder_engine::{backup, check, forget, gc, restore, ChunkReader};
use larder_hash::HashAlgo;
use larder_store::{
    ChunkEntry, Compression, GcOptions, LockMode, RepoConfig, Repository, DEFAULT_UNIT_CHUNKS,
};

#[path = "support/options.rs"]
mod options;
use options::{backup_options, check_options, restore_options};

#[path = "support/unlock.rs"]
mod unlock;
use unlock::init_with_keys;

const PASSWORD: &[u8] = b"units test password";

/// Text that compresses, different for every `seed`, with lines repeating across
/// chunks (what a unit finds and a chunk alone does not).
fn text(seed: u64, lines: usize) -> Vec<u8> {
    let mut rng = larder_gen::Xoshiro256::new(seed);
    (0..lines)
        .flat_map(|i| {
            let word = rng.next_u64() % 50;
            format!("{seed}: line {} of file {seed}, word {word}\n", i % 97).into_bytes()
        })
        .collect()
}

/// Writes generation `g` under `dir`: files `a`..`d` of text; generation 2 drops `b`
/// and `c` and edits `d`.
fn write_generation(dir: &Path, g: u64) -> BTreeMap<PathBuf, Vec<u8>> {
    let _ = fs::remove_dir_all(dir);
    fs::create_dir_all(dir).unwrap();
    let mut files = BTreeMap::new();
    let names: &[&str] = if g == 1 {
        &["a", "b", "c", "d"]
    } else {
        &["a", "d"]
    };
    for (i, name) in names.iter().enumerate() {
        let mut data = text(i as u64 + 1, 20_000);
        if g == 2 && *name == "d" {
            data.splice(100_000..100_000, text(99, 2_000));
        }
        fs::write(dir.join(name), &data).unwrap();
        files.insert(PathBuf::from(name), data);
    }
    files
}

fn config(compression: Compression, encrypted: bool) -> RepoConfig {
    let mut config =
        RepoConfig::new(ChunkerConfig::default(), HashAlgo::Blake3).with_compression(compression);
    if encrypted {
        config = config.with_encryption(AeadKind::Aes256Gcm);
    }
    config.container_size = 512 << 10;
    config
}

fn init(root: &Path, compression: Compression, encrypted: bool) {
    let config = config(compression, encrypted);
    if !encrypted {
        return Repository::init(root, &config).unwrap();
    }
    let keys = RepoKeys::generate(
        config.id_bytes().unwrap(),
        AeadKind::Aes256Gcm,
        FingerprintKind::KeyedBlake3,
    );
    init_with_keys(root, &config, &keys, PASSWORD);
}

fn open(root: &Path, encrypted: bool) -> Repository {
    match encrypted {
        true => unlock::open(root, PASSWORD, LockMode::Exclusive).unwrap(),
        false => Repository::open(root, LockMode::Exclusive).unwrap(),
    }
}

/// Every container's table, by id.
fn tables(repo: &Repository, root: &Path) -> BTreeMap<u64, Vec<ChunkEntry>> {
    fs::read_dir(root.join("containers"))
        .unwrap()
        .map(|e| {
            let name = e.unwrap().file_name().into_string().unwrap();
            let id = u64::from_str_radix(name.trim_end_matches(".ctr"), 16).unwrap();
            (id, repo.load_container_table(id).unwrap().entries)
        })
        .collect()
}

fn restores_exactly(repo: &Repository, snapshot: &str, files: &BTreeMap<PathBuf, Vec<u8>>) {
    let target = tempfile::tempdir().unwrap();
    restore(repo, snapshot, target.path(), &restore_options(1 << 20)).unwrap();
    for (name, data) in files {
        let found: Vec<PathBuf> = walk(target.path())
            .into_iter()
            .filter(|p| p.file_name() == Some(name.as_os_str()))
            .collect();
        assert_eq!(found.len(), 1, "{name:?}");
        assert!(fs::read(&found[0]).unwrap() == *data, "{name:?} differs");
    }
}

fn walk(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in fs::read_dir(root).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

fn stored(tables: &BTreeMap<u64, Vec<ChunkEntry>>) -> u64 {
    tables.values().map(|t| larder_store::stored_bytes(t)).sum()
}

#[test]
fn units_round_trip_through_backup_restore_check_and_gc() {
    for encrypted in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let (root, src) = (dir.path().join("repo"), dir.path().join("src"));
        init(&root, Compression::DEFAULT, encrypted);
        let mut repo = open(&root, encrypted);
        let gen1 = write_generation(&src, 1);
        let s1 = backup(&mut repo, std::slice::from_ref(&src), &backup_options(2)).unwrap();
        let gen2 = write_generation(&src, 2);
        let s2 = backup(&mut repo, std::slice::from_ref(&src), &backup_options(2)).unwrap();

        let before = tables(&repo, &root);
        // A unit's table entries count when a container is filled: an encrypted one
        // that ran past its size would be padded to the next power of two.
        for e in fs::read_dir(root.join("containers")).unwrap() {
            let len = e.unwrap().metadata().unwrap().len();
            assert!(len <= 512 << 10, "a container of {len} bytes");
        }
        let members = before.values().flatten().filter(|e| e.is_member()).count();
        let all = before.values().map(Vec::len).sum::<usize>();
        assert!(members * 10 > all * 8, "{members} of {all} chunks in units");
        let largest = before
            .values()
            .flat_map(|t| (0..t.len()).map(|i| larder_store::unit_span(t, i).len()))
            .max();
        assert_eq!(largest, Some(DEFAULT_UNIT_CHUNKS as usize));

        restores_exactly(&repo, &s1.snapshot_id, &gen1);
        restores_exactly(&repo, &s2.snapshot_id, &gen2);
        let report = check(&repo, &check_options(true)).unwrap();
        assert!(report.is_ok(), "{:?}", report.damage);

        // Every chunk read alone through the chunk reader, members in reverse order.
        let mut reader = ChunkReader::new(&repo);
        for (id, table) in before.iter().rev() {
            for e in table.iter().rev() {
                let mut out = Vec::new();
                reader.read_into(&e.fingerprint, &mut out).unwrap();
                assert_eq!(out.len(), e.raw_len as usize, "container {id:016x}");
            }
        }

        // Generation 1 alone used `b` and `c`, and the old middle of `d`: its units
        // are partly dead after it is forgotten.
        forget(&repo, std::slice::from_ref(&s1.snapshot_id)).unwrap();
        let opts = GcOptions {
            repack_threshold: 100,
            ..GcOptions::default()
        };
        let summary = gc(&mut repo, &opts).unwrap();
        assert!(summary.sweep.containers_repacked > 0, "{:?}", summary.sweep);
        let after = tables(&repo, &root);
        let alone = after.values().flatten().filter(|e| !e.is_member()).count();
        assert!(
            after.values().flatten().any(|e| e.is_member()),
            "whole units kept"
        );
        assert!(alone > 0, "live members of dead units compressed alone");
        restores_exactly(&repo, &s2.snapshot_id, &gen2);
        let report = check(&repo, &check_options(true)).unwrap();
        assert!(report.is_ok(), "{:?}", report.damage);
        assert!(stored(&after) < stored(&before));
    }
}

#[test]
fn units_store_less_than_chunks_compressed_alone() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    write_generation(&src, 1);
    let mut sizes = Vec::new();
    for compression in [
        Compression::Zstd {
            level: 3,
            unit_chunks: 1,
        },
        Compression::DEFAULT,
    ] {
        let root = dir.path().join(compression.name());
        init(&root, compression, false);
        let mut repo = open(&root, false);
        backup(&mut repo, std::slice::from_ref(&src), &backup_options(2)).unwrap();
        let t = tables(&repo, &root);
        let members = t.values().flatten().filter(|e| e.is_member()).count();
        assert_eq!(members > 0, compression.unit_chunks() > 1);
        sizes.push(stored(&t));
    }
    assert!(
        sizes[1] < sizes[0],
        "units {} against alone {}",
        sizes[1],
        sizes[0]
    );
}
