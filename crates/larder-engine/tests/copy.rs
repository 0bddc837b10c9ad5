//! `copy` (docs/design/copy.md): snapshots copied between plaintext and encrypted
//! repositories, with the same or other keys, chunkers, hashes and compression,
//! restore byte for byte with the same tree metadata; `check --read-data` passes on
//! the destination; only the chunks the destination lacks are sent; copying again
//! copies nothing; checkpoints are copied only when named.

use std::collections::HashSet;
use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use larder_chunk::{ChunkerConfig, ChunkerKind};
use larder_crypto::{AeadKind, FingerprintKind, KeyKind, RepoKeys};
use larder_engine::{
    backup, check, copy, load_tree, restore, ChunkReader, CopyOptions, CopySummary, SkipReason,
    DEFAULT_RESTORE_CACHE,
};
use larder_hash::{Fingerprint, HashAlgo};
use larder_store::{
    config_is_sealed, Compression, DiskLookup, IndexSettings, LockMode, RepoConfig, Repository,
    Snapshot, TreeEntry,
};

#[path = "support/bytes.rs"]
mod seeded;
use seeded::bytes;

#[path = "support/files.rs"]
mod tree_files;
use tree_files::files;

#[path = "support/unlock.rs"]
mod unlock;
use unlock::{init_with_keys, slot};

#[path = "support/options.rs"]
mod options;
use options::{backup_options, check_options, restore_options};

const PASSWORD: &[u8] = b"copy test password";
/// Small containers, so that a few MiB spread over many of them.
const CONTAINER_SIZE: usize = 256 << 10;

/// How a test repository is made.
#[derive(Clone, Copy)]
struct Kind {
    chunker: ChunkerKind,
    hash: HashAlgo,
    compression: Compression,
    /// Encrypted (with fresh keys), or plaintext.
    encrypted: bool,
    index: IndexSettings,
}

/// A disk index with a small budget, so that its lookups wait and batch.
const DISK: IndexSettings = IndexSettings::Disk {
    lookup: DiskLookup::Lazy,
    memory: 4 << 20,
};

const PLAIN: Kind = Kind {
    chunker: ChunkerKind::Fastcdc2020,
    hash: HashAlgo::Blake3,
    compression: Compression::DEFAULT,
    encrypted: false,
    index: IndexSettings::Memory,
};

const KEYED: Kind = Kind {
    chunker: ChunkerKind::Keyed,
    hash: HashAlgo::Blake3,
    compression: Compression::DEFAULT,
    encrypted: true,
    index: IndexSettings::Memory,
};

fn config(kind: Kind) -> RepoConfig {
    let chunker = ChunkerConfig {
        kind: kind.chunker,
        ..ChunkerConfig::default()
    };
    let mut config = RepoConfig::new(chunker, kind.hash)
        .with_compression(kind.compression)
        .with_index(kind.index);
    if kind.encrypted {
        config = config.with_encryption(AeadKind::Aes256Gcm);
    }
    config.container_size = CONTAINER_SIZE;
    config
}

/// A new repository at `root`; an encrypted one with fresh keys.
fn init(root: &Path, kind: Kind) {
    let config = config(kind);
    if !kind.encrypted {
        return Repository::init(root, &config).unwrap();
    }
    let fingerprint = match kind.hash {
        HashAlgo::Sha256 => FingerprintKind::HmacSha256,
        _ => FingerprintKind::KeyedBlake3,
    };
    let keys = RepoKeys::generate(config.id_bytes().unwrap(), AeadKind::Aes256Gcm, fingerprint);
    init_with_keys(root, &config, &keys, PASSWORD);
}

/// Opens `root`, with [`PASSWORD`] if it is encrypted.
fn open(root: &Path, mode: LockMode) -> Repository {
    let sealed = config_is_sealed(&fs::read(root.join("config")).unwrap());
    match sealed {
        true => unlock::open(root, PASSWORD, mode).unwrap(),
        false => Repository::open(root, mode).unwrap(),
    }
}

/// Writes generation `g` (1, 2, ...) of the data under `dir/data`: a large file
/// (streamed in blocks by a re-chunking copy) that each generation edits in the
/// middle, a copy of its first generation, small files, a text that compresses, an
/// empty file, a symlink, a hard link and a new file per generation.
fn write_generation(dir: &Path, g: u64) -> PathBuf {
    let data = dir.join("data");
    if data.exists() {
        fs::remove_dir_all(&data).unwrap();
    }
    fs::create_dir_all(data.join("small")).unwrap();
    let mut big = bytes(1, 3 << 20);
    fs::write(data.join("copy.bin"), &big).unwrap();
    for e in 2..=g {
        let at = (1 << 20) + (e as usize) * 4096;
        big.splice(at..at, bytes(100 + e, 1000));
    }
    fs::write(data.join("big.bin"), &big).unwrap();
    for i in 0..20 {
        fs::write(
            data.join(format!("small/{i:02}.txt")),
            bytes(10 + i, 1000 * i as usize),
        )
        .unwrap();
    }
    for e in 1..=g {
        fs::write(data.join(format!("new-{e}.bin")), bytes(200 + e, 70_000)).unwrap();
    }
    let text: String = (0..20_000)
        .map(|i| format!("line {i} of a text\n"))
        .collect();
    fs::write(data.join("text.txt"), text).unwrap();
    fs::write(data.join("empty"), b"").unwrap();
    symlink("big.bin", data.join("link")).unwrap();
    fs::hard_link(data.join("small/05.txt"), data.join("hard")).unwrap();
    data
}

/// Backs up generations 1..=n into `root`; returns the snapshot ids, oldest first.
fn backup_generations(root: &Path, dir: &Path, n: u64) -> Vec<String> {
    let mut repo = open(root, LockMode::Exclusive);
    (1..=n)
        .map(|g| {
            let data = write_generation(dir, g);
            let summary = backup(&mut repo, &[data], &backup_options(2)).unwrap();
            assert!(summary.warnings.is_empty(), "{:?}", summary.warnings);
            summary.snapshot_id
        })
        .collect()
}

fn copy_between(src: &Path, dst: &Path, names: &[&str]) -> CopySummary {
    let source = open(src, LockMode::Shared);
    let mut destination = open(dst, LockMode::Exclusive);
    let opts = CopyOptions {
        snapshots: names.iter().map(|n| n.to_string()).collect(),
        threads: 2,
        ..CopyOptions::default()
    };
    copy(&source, &mut destination, &opts).unwrap()
}

/// A snapshot's tree entries, recipes left out (they differ when re-chunked).
fn entries(repo: &Repository, snap: &Snapshot) -> Vec<TreeEntry> {
    let fps = snap.tree.fingerprints().unwrap();
    let mut tree = load_tree(&mut ChunkReader::new(repo), &fps).unwrap();
    for e in &mut tree {
        e.chunks.clear();
    }
    tree
}

/// Every chunk the snapshots reach: their tree streams' and their files'.
fn reached(repo: &Repository, ids: &[String]) -> HashSet<Fingerprint> {
    let mut out = HashSet::new();
    for id in ids {
        let (_, snap) = repo.find_snapshot(id).unwrap();
        let fps = snap.tree.fingerprints().unwrap();
        out.extend(fps.iter().copied());
        let tree = load_tree(&mut ChunkReader::new(repo), &fps).unwrap();
        out.extend(tree.into_iter().flat_map(|e| e.chunks));
    }
    out
}

/// Each copied snapshot keeps its source's fields and names it as `original`, has
/// the same tree metadata, and restores to the same bytes; `check --read-data`
/// passes on the destination.
fn assert_copied_faithfully(src: &Path, dst: &Path, summary: &CopySummary, dir: &Path) {
    let source = open(src, LockMode::Shared);
    let destination = open(dst, LockMode::Shared);
    for (n, c) in summary.copied.iter().enumerate() {
        let (_, from) = source.find_snapshot(&c.source).unwrap();
        let (_, to) = destination.find_snapshot(&c.destination).unwrap();
        assert_eq!(to.original.as_deref(), Some(c.source.as_str()));
        assert_eq!(
            (&to.time, &to.hostname, &to.username, &to.paths, to.partial),
            (
                &from.time,
                &from.hostname,
                &from.username,
                &from.paths,
                from.partial
            )
        );
        if !summary.rechunked {
            assert_eq!(to.tree, from.tree);
        }
        assert!(
            entries(&destination, &to) == entries(&source, &from),
            "tree of {}",
            c.source
        );
        let name = dst.file_name().unwrap().to_string_lossy();
        let restores = dir.join(format!("restores-into-{name}"));
        let (a, b) = (
            restores.join(format!("from-{n}")),
            restores.join(format!("to-{n}")),
        );
        for (repo, id, target) in [(&source, &c.source, &a), (&destination, &c.destination, &b)] {
            let restored = restore(repo, id, target, &restore_options(DEFAULT_RESTORE_CACHE));
            assert!(restored.unwrap().warnings.is_empty());
        }
        let (left, right) = (files(&a), files(&b));
        assert!(
            !left.is_empty() && left == right,
            "{} restores alike",
            c.source
        );
    }
    let report = check(&destination, &check_options(true)).unwrap();
    assert!(report.is_ok(), "{:?}", report.damage);
}

/// Copying again copies nothing: every snapshot is skipped as already copied.
fn assert_copy_again_copies_nothing(src: &Path, dst: &Path, snapshots: usize) {
    let again = copy_between(src, dst, &[]);
    assert_eq!((again.copied.len(), again.chunks_sent), (0, 0));
    assert_eq!(again.skipped.len(), snapshots);
    assert!(again
        .skipped
        .iter()
        .all(|s| s.reason == SkipReason::AlreadyCopied));
}

/// Copies every snapshot of a new `from` repository with two generations into a new
/// `to` one, checks the copy, and that copying again copies nothing. Returns the
/// summary.
fn copy_two_generations(from: Kind, to: Kind) -> CopySummary {
    let dir = tempfile::tempdir().unwrap();
    let (src, dst) = (dir.path().join("src"), dir.path().join("dst"));
    init(&src, from);
    init(&dst, to);
    let ids = backup_generations(&src, dir.path(), 2);
    let summary = copy_between(&src, &dst, &[]);
    assert_eq!(summary.copied.len(), 2);
    assert!(summary
        .copied
        .iter()
        .zip(&ids)
        .all(|(c, id)| &c.source == id));
    assert_copied_faithfully(&src, &dst, &summary, dir.path());
    assert_copy_again_copies_nothing(&src, &dst, 2);
    summary
}

#[test]
fn same_config_takes_the_fast_path_and_sends_exactly_what_is_missing() {
    let dir = tempfile::tempdir().unwrap();
    let (src, dst) = (dir.path().join("src"), dir.path().join("dst"));
    init(&src, PLAIN);
    init(&dst, PLAIN);
    let ids = backup_generations(&src, dir.path(), 3);
    // The destination already holds the first generation, backed up there itself.
    backup_generations(&dst, dir.path(), 1);
    let missing = {
        let source = open(&src, LockMode::Shared);
        let destination = open(&dst, LockMode::Shared);
        let all: Vec<Fingerprint> = reached(&source, &ids).into_iter().collect();
        let held = destination.index().get_batch(&all).unwrap();
        held.iter().filter(|h| h.is_none()).count() as u64
    };
    let summary = copy_between(&src, &dst, &[]);
    assert!(!summary.rechunked);
    assert_eq!(summary.copied.len(), 3);
    assert_eq!(summary.chunks_sent, missing);
    assert_eq!(summary.bytes_rechunked, 0);
    // The first generation's files were there: its snapshot needed its tree at most.
    assert!(summary.copied[0].bytes_sent < 64 << 10, "{summary:?}");
    assert_copied_faithfully(&src, &dst, &summary, dir.path());
    assert_copy_again_copies_nothing(&src, &dst, 3);
}

#[test]
fn a_destination_holding_some_snapshots_gets_only_the_others_chunks() {
    let dir = tempfile::tempdir().unwrap();
    let (src, dst) = (dir.path().join("src"), dir.path().join("dst"));
    init(&src, PLAIN);
    init(
        &dst,
        Kind {
            index: DISK,
            ..PLAIN
        },
    );
    let ids = backup_generations(&src, dir.path(), 2);
    let first = copy_between(&src, &dst, &[&ids[0][..8]]);
    assert_eq!(first.copied.len(), 1);
    let source = open(&src, LockMode::Shared);
    let expected = reached(&source, &ids[1..])
        .difference(&reached(&source, &ids[..1]))
        .count();
    drop(source);
    let rest = copy_between(&src, &dst, &[]);
    assert_eq!(rest.skipped.len(), 1);
    assert_eq!(rest.skipped[0].source, ids[0]);
    assert_eq!(rest.copied.len(), 1);
    assert_eq!(rest.chunks_sent, expected as u64);
    assert_copied_faithfully(&src, &dst, &rest, dir.path());
}

#[test]
fn checkpoints_are_copied_only_when_named() {
    let dir = tempfile::tempdir().unwrap();
    let (src, dst) = (dir.path().join("src"), dir.path().join("dst"));
    init(&src, PLAIN);
    init(&dst, PLAIN);
    let ids = backup_generations(&src, dir.path(), 1);
    let checkpoint = {
        let repo = open(&src, LockMode::Exclusive);
        let (_, mut snap) = repo.find_snapshot(&ids[0]).unwrap();
        snap.partial = true;
        snap.time = "2000-01-01T00:00:00Z".into();
        repo.save_snapshot(&snap).unwrap()
    };
    let all = copy_between(&src, &dst, &[]);
    assert_eq!(all.copied.len(), 1);
    assert_eq!(all.skipped.len(), 1);
    assert_eq!(
        (all.skipped[0].source.as_str(), all.skipped[0].reason),
        (checkpoint.as_str(), SkipReason::Checkpoint)
    );
    let named = copy_between(&src, &dst, &[&checkpoint]);
    assert_eq!(named.copied.len(), 1);
    // Its chunks were all there already.
    assert_eq!(named.chunks_sent, 0);
    let destination = open(&dst, LockMode::Shared);
    let (_, copied) = destination
        .find_snapshot(&named.copied[0].destination)
        .unwrap();
    assert!(copied.partial);
}

#[test]
fn plaintext_to_encrypted_cuts_again() {
    let summary = copy_two_generations(PLAIN, KEYED);
    assert!(summary.rechunked);
    assert!(summary.bytes_rechunked > 2 * (6 << 20));
}

#[test]
fn encrypted_to_encrypted_under_another_key_cuts_again_and_copying_back_copies_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    init(&a, KEYED);
    init(
        &b,
        Kind {
            index: DISK,
            ..KEYED
        },
    );
    backup_generations(&a, dir.path(), 2);
    let there = copy_between(&a, &b, &[]);
    assert!(there.rechunked);
    assert_eq!(there.copied.len(), 2);
    assert_copied_faithfully(&a, &b, &there, dir.path());
    assert_copy_again_copies_nothing(&a, &b, 2);
    // Back: the copies' originals are the snapshots `a` holds.
    assert_copy_again_copies_nothing(&b, &a, 2);
}

#[test]
fn another_chunker_hash_and_compression_cut_again() {
    let to = Kind {
        chunker: ChunkerKind::Rabin,
        hash: HashAlgo::Sha256,
        compression: Compression::None,
        encrypted: false,
        index: IndexSettings::Memory,
    };
    let summary = copy_two_generations(PLAIN, to);
    assert!(summary.rechunked);
    // Nothing compresses: what is stored is what was sent.
    assert_eq!(summary.bytes_stored, summary.bytes_sent);
}

#[test]
fn encrypted_repositories_sharing_a_key_take_the_fast_path_with_their_own_compression() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b, c) = (
        dir.path().join("a"),
        dir.path().join("b"),
        dir.path().join("c"),
    );
    let config = config(KEYED);
    let keys = RepoKeys::generate(
        config.id_bytes().unwrap(),
        AeadKind::Aes256Gcm,
        FingerprintKind::KeyedBlake3,
    );
    init_with_keys(&a, &config, &keys, PASSWORD);
    // A cluster's nodes share a key this way; the second stores chunks uncompressed.
    let uncompressed = config.clone().with_compression(Compression::None);
    init_with_keys(
        &b,
        &uncompressed.with_encryption(AeadKind::Aes256Gcm),
        &keys,
        PASSWORD,
    );
    // The third compresses as the first: its chunks keep the first's zstd frames.
    init_with_keys(&c, &config, &keys, PASSWORD);
    backup_generations(&a, dir.path(), 2);
    let summary = copy_between(&a, &b, &[]);
    assert!(!summary.rechunked);
    assert_eq!(summary.bytes_stored, summary.bytes_sent);
    assert_copied_faithfully(&a, &b, &summary, dir.path());
    assert_copy_again_copies_nothing(&a, &b, 2);
    let same = copy_between(&a, &c, &[]);
    assert!(!same.rechunked);
    assert!(same.bytes_stored < same.bytes_sent, "{same:?}");
    assert_copied_faithfully(&a, &c, &same, dir.path());
}

#[test]
fn a_damaged_source_chunk_fails_the_copy_and_writes_no_snapshot() {
    for to in [PLAIN, KEYED] {
        let dir = tempfile::tempdir().unwrap();
        let (src, dst) = (dir.path().join("src"), dir.path().join("dst"));
        init(&src, PLAIN);
        init(&dst, to);
        backup_generations(&src, dir.path(), 1);
        // A byte in the middle of the largest container: chunk data, not its table.
        let containers = src.join("containers");
        let largest = fs::read_dir(&containers)
            .unwrap()
            .map(|e| e.unwrap().path())
            .max_by_key(|p| fs::metadata(p).unwrap().len())
            .unwrap();
        let mut bytes = fs::read(&largest).unwrap();
        let middle = bytes.len() / 2;
        bytes[middle] ^= 0x55;
        fs::write(&largest, bytes).unwrap();
        let source = open(&src, LockMode::Shared);
        let mut destination = open(&dst, LockMode::Exclusive);
        let err = copy(&source, &mut destination, &CopyOptions::default()).unwrap_err();
        assert!(err.to_string().contains("damaged"), "{err}");
        // Cut again, the files that hold the chunk are named.
        if to.encrypted {
            assert!(
                err.to_string().contains("data/big.bin: cannot read"),
                "{err}"
            );
        }
        let (snapshots, _) = destination.snapshots().unwrap();
        assert!(snapshots.is_empty());
        let report = check(&destination, &check_options(true)).unwrap();
        assert!(report.is_ok(), "{:?}", report.damage);
    }
}

#[test]
fn a_write_only_destination_key_is_refused_before_anything_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let (src, dst) = (dir.path().join("src"), dir.path().join("dst"));
    init(&src, PLAIN);
    let config = config(KEYED);
    let keys = RepoKeys::generate(
        config.id_bytes().unwrap(),
        AeadKind::Aes256Gcm,
        FingerprintKind::KeyedBlake3,
    );
    init_with_keys(&dst, &config, &keys, PASSWORD);
    let writer = slot(&keys, KeyKind::WriteOnly, b"writer");
    larder_store::keys::write_slot(
        &larder_store::LocalBackend::new(&dst),
        "00000000000000ff",
        &writer,
    )
    .unwrap();
    backup_generations(&src, dir.path(), 1);
    let before = files(&dst.join("containers"));
    let source = open(&src, LockMode::Shared);
    let mut destination = unlock::open(&dst, b"writer", LockMode::Exclusive).unwrap();
    let err = copy(&source, &mut destination, &CopyOptions::default()).unwrap_err();
    assert!(err.to_string().contains("write-only"), "{err}");
    assert!(files(&dst.join("containers")) == before);
}
