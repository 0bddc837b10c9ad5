//! Encrypted repositories (docs/design/crypto.md): a backup restores byte for byte, no
//! repository file holds a plaintext string, a file name or a plain digest of any
//! chunk, a wrong password opens nothing, a write-only key backs up and deduplicates
//! but reads nothing back, and `check --read-data` names every tampered object.

use std::collections::HashSet;
use std::fs;
use std::path::{Path, PathBuf};

use larder_chunk::{ChunkerConfig, ChunkerKind};
use larder_crypto::{AeadKind, FingerprintKind, KeyKind, RepoKeys};
use larder_engine::{backup, check, restore, DEFAULT_RESTORE_CACHE};
use larder_hash::HashAlgo;
use larder_store::{keys, LockMode, RepoConfig, Repository, StoreError};

#[path = "support/bytes.rs"]
mod seeded;
use seeded::bytes;

#[path = "support/files.rs"]
mod tree_files;
use tree_files::files;

#[path = "support/unlock.rs"]
mod unlock;
use unlock::{init_with_keys, open, slot};

#[path = "support/options.rs"]
mod options;
use options::{backup_options, check_options, restore_options};

const PASSWORD: &[u8] = b"correct horse battery staple";
const MARKER: &str = "LARDER-SECRET-MARKER-6d1f2";
const NAME: &str = "quarterly-payroll-secret.xlsx";

fn init(root: &Path, hash: HashAlgo, aead: AeadKind) -> RepoKeys {
    init_sized(root, hash, aead, 4 << 20)
}

/// An encrypted repository with the keyed chunker (the default of encrypted ones) for
/// BLAKE3, FastCDC for SHA-256.
fn init_sized(root: &Path, hash: HashAlgo, aead: AeadKind, container_size: usize) -> RepoKeys {
    let chunker = ChunkerConfig {
        kind: match hash {
            HashAlgo::Blake3 => ChunkerKind::Keyed,
            _ => ChunkerKind::Fastcdc2020,
        },
        ..ChunkerConfig::default()
    };
    let mut config = RepoConfig::new(chunker, hash).with_encryption(aead);
    config.container_size = container_size;
    let fingerprint = match hash {
        HashAlgo::Sha256 => FingerprintKind::HmacSha256,
        _ => FingerprintKind::KeyedBlake3,
    };
    let keys = RepoKeys::generate(config.id_bytes().unwrap(), aead, fingerprint);
    init_with_keys(root, &config, &keys, PASSWORD);
    keys
}

fn source(dir: &Path) -> PathBuf {
    let src = dir.join("src");
    fs::create_dir_all(src.join("sub")).unwrap();
    let mut text = Vec::new();
    for i in 0..4000 {
        text.extend_from_slice(format!("line {i}: {MARKER} and some words\n").as_bytes());
    }
    fs::write(src.join(NAME), &text).unwrap();
    fs::write(src.join("tiny.txt"), MARKER).unwrap();
    let big = bytes(3, 3 << 20);
    fs::write(src.join("sub/big.bin"), &big).unwrap();
    fs::write(src.join("sub/copy.bin"), &big).unwrap();
    src
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack
        .windows(needle.len())
        .any(|w| w[0] == needle[0] && w == needle)
}

/// Plain digests (raw and hex) of every chunk an unkeyed FastCDC cuts from the
/// source's files, and of the files themselves: none may appear in the repository.
fn plain_digests(src: &Path) -> HashSet<Vec<u8>> {
    let chunker = ChunkerConfig::default().build();
    let mut out = HashSet::new();
    for data in files(src).values() {
        let mut pieces: Vec<&[u8]> = vec![data];
        let mut rest = &data[..];
        while !rest.is_empty() {
            let len = chunker.next_chunk_len(rest);
            pieces.push(&rest[..len]);
            rest = &rest[len..];
        }
        for piece in pieces {
            for algo in [HashAlgo::Blake3, HashAlgo::Sha256] {
                let fp = algo.fingerprint(piece);
                out.insert(fp.as_bytes().to_vec());
                out.insert(fp.to_hex().into_bytes());
            }
        }
    }
    out
}

#[test]
fn an_encrypted_backup_restores_and_leaks_no_plaintext() {
    for (hash, aead) in [
        (HashAlgo::Blake3, AeadKind::Aes256Gcm),
        (HashAlgo::Sha256, AeadKind::XChaCha20Poly1305),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("repo");
        init(&root, hash, aead);
        let src = source(dir.path());
        let summary = {
            let mut repo = open(&root, PASSWORD, LockMode::Exclusive).unwrap();
            backup(&mut repo, std::slice::from_ref(&src), &backup_options(2)).unwrap()
        };
        assert!(summary.warnings.is_empty(), "{:?}", summary.warnings);
        // The copy deduplicated: at most one container's worth more than the data.
        assert!(summary.bytes_new < (7 << 20), "{summary:?}");
        // What the summary says it stored is what the files hold: padding, headers
        // and envelopes included.
        let written: u64 = files(&root)
            .iter()
            .filter(|(path, _)| {
                ["containers", "index", "snapshots"]
                    .iter()
                    .any(|d| path.starts_with(d))
            })
            .map(|(_, content)| content.len() as u64)
            .sum();
        assert_eq!(summary.bytes_stored, written);

        let repo = open(&root, PASSWORD, LockMode::Shared).unwrap();
        let report = check(&repo, &check_options(true)).unwrap();
        assert!(report.is_ok(), "{:?}", report.damage);
        let target = dir.path().join("restored");
        let restored = restore(
            &repo,
            &summary.snapshot_id,
            &target,
            &restore_options(DEFAULT_RESTORE_CACHE),
        )
        .unwrap();
        assert!(restored.warnings.is_empty(), "{:?}", restored.warnings);
        assert!(files(&target.join(src.strip_prefix("/").unwrap())) == files(&src));
        drop(repo);

        let strings: [&[u8]; 5] = [
            MARKER.as_bytes(),
            NAME.as_bytes(),
            b"tiny.txt",
            b"big.bin",
            b"line 17",
        ];
        let digests = plain_digests(&src);
        for (path, content) in files(&root) {
            for needle in strings {
                assert!(
                    !contains(&content, needle),
                    "{} holds {:?}",
                    path.display(),
                    String::from_utf8_lossy(needle)
                );
            }
            for len in [32, 64] {
                let hit = content.windows(len).find(|w| digests.contains(*w));
                assert!(
                    hit.is_none(),
                    "{} holds a plain chunk digest",
                    path.display()
                );
            }
        }
    }
}

#[test]
fn a_wrong_password_opens_nothing_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("repo");
    init(&root, HashAlgo::Blake3, AeadKind::Aes256Gcm);
    let before = files(&root);
    let Err(err) = open(&root, b"wrong", LockMode::Exclusive) else {
        panic!("a wrong password opened the repository");
    };
    assert!(matches!(err, StoreError::WrongPassword), "{err}");
    assert_eq!(err.to_string(), "wrong password or no matching key");
    assert!(files(&root) == before);
    // Without any key, the sealed config is refused clearly.
    let Err(err) = Repository::open(&root, LockMode::Shared) else {
        panic!("opened without a key");
    };
    assert!(matches!(err, StoreError::NeedsKey(_)), "{err}");
}

#[test]
fn a_write_only_key_backs_up_and_deduplicates_but_reads_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("repo");
    let keys = init(&root, HashAlgo::Blake3, AeadKind::Aes256Gcm);
    keys::write_slot(
        &larder_store::LocalBackend::new(&root),
        "00000000000000ff",
        &slot(&keys, KeyKind::WriteOnly, b"writer"),
    )
    .unwrap();
    let src = source(dir.path());
    let first = {
        let mut repo = open(&root, b"writer", LockMode::Exclusive).unwrap();
        assert!(!repo.keys().unwrap().is_full());
        backup(&mut repo, std::slice::from_ref(&src), &backup_options(2)).unwrap()
    };
    let second = {
        let mut repo = open(&root, b"writer", LockMode::Exclusive).unwrap();
        backup(&mut repo, std::slice::from_ref(&src), &backup_options(2)).unwrap()
    };
    assert_eq!(
        second.bytes_read, second.bytes_in,
        "it cannot skip: {second:?}"
    );
    assert!(
        second.chunks_new <= second.tree_chunks_new + 1,
        "{second:?}"
    );
    assert_ne!(first.snapshot_id, second.snapshot_id);

    let writer = open(&root, b"writer", LockMode::Shared).unwrap();
    let err = restore(
        &writer,
        &first.snapshot_id,
        &dir.path().join("r"),
        &restore_options(1 << 20),
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("write-only"), "{err}");

    // The full key reads what the writer wrote.
    let repo = open(&root, PASSWORD, LockMode::Shared).unwrap();
    let (snapshots, bad) = repo.snapshots().unwrap();
    assert!(bad.is_empty(), "{bad:?}");
    assert_eq!(snapshots.len(), 2);
    let target = dir.path().join("restored");
    restore(
        &repo,
        &second.snapshot_id,
        &target,
        &restore_options(DEFAULT_RESTORE_CACHE),
    )
    .unwrap();
    assert!(files(&target.join(src.strip_prefix("/").unwrap())) == files(&src));
    let report = check(&repo, &check_options(true)).unwrap();
    assert!(report.is_ok(), "{:?}", report.damage);
}

/// A change made to a copy of a repository.
type Tamper<'a> = Box<dyn Fn(&Path) + 'a>;

/// A copy of the repository at `root` in `to`, with `tamper` applied to it.
fn tampered_copy(root: &Path, to: &Path, tamper: impl FnOnce(&Path)) {
    let _ = fs::remove_dir_all(to);
    for (rel, content) in files(root) {
        let dest = to.join(&rel);
        fs::create_dir_all(dest.parent().unwrap()).unwrap();
        fs::write(dest, content).unwrap();
    }
    for dir in ["tmp", "gc"] {
        fs::create_dir_all(to.join(dir)).unwrap();
    }
    tamper(to);
}

fn flip(path: &Path, at: impl FnOnce(usize) -> usize) {
    let mut bytes = fs::read(path).unwrap();
    let i = at(bytes.len());
    bytes[i] ^= 0x10;
    fs::write(path, bytes).unwrap();
}

fn only(dir: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    out.sort();
    out
}

/// What `check --read-data` reports for the tampered copy, or why it could not run.
fn check_copy(root: &Path) -> String {
    match open(root, PASSWORD, LockMode::Shared) {
        Ok(repo) => match check(&repo, &check_options(true)) {
            Ok(report) => format!("{:?}", report.damage),
            Err(e) => format!("check failed: {e}"),
        },
        Err(e) => format!("open failed: {e}"),
    }
}

#[test]
fn check_read_data_names_every_tampered_object() {
    let dir = tempfile::tempdir().unwrap();
    let (root, other) = (dir.path().join("repo"), dir.path().join("other"));
    init_sized(&root, HashAlgo::Blake3, AeadKind::Aes256Gcm, 256 << 10);
    init(&other, HashAlgo::Blake3, AeadKind::Aes256Gcm);
    let src = dir.path().join("src");
    fs::create_dir_all(&src).unwrap();
    for i in 0..3u64 {
        fs::write(src.join(format!("f{i}")), bytes(i, 300_000)).unwrap();
    }
    for repo_root in [&root, &other] {
        let mut repo = open(repo_root, PASSWORD, LockMode::Exclusive).unwrap();
        backup(&mut repo, std::slice::from_ref(&src), &backup_options(2)).unwrap();
    }
    assert_eq!(check_copy(&root), "[]");
    let containers = only(&root.join("containers"));
    assert!(containers.len() >= 2, "{containers:?}");
    let copy = dir.path().join("copy");
    let container = containers[0].strip_prefix(&root).unwrap().to_path_buf();
    let id = container.file_stem().unwrap().to_str().unwrap().to_string();
    let cases: Vec<(&str, &str, Tamper)> = vec![
        (
            "header",
            &id,
            Box::new(|r| flip(&r.join(&container), |_| 20)),
        ),
        (
            "key block",
            &id,
            Box::new(|r| flip(&r.join(&container), |_| 70)),
        ),
        (
            "table salt",
            &id,
            Box::new(|r| flip(&r.join(&container), |_| 120)),
        ),
        (
            "first chunk",
            &id,
            Box::new(|r| flip(&r.join(&container), |_| 150)),
        ),
        (
            "chunk data",
            &id,
            Box::new(|r| flip(&r.join(&container), |n| n / 3)),
        ),
        (
            "table or padding",
            &id,
            Box::new(|r| flip(&r.join(&container), |n| n - 200)),
        ),
        (
            "footer",
            &id,
            Box::new(|r| flip(&r.join(&container), |n| n - 40)),
        ),
        (
            "end magic",
            &id,
            Box::new(|r| flip(&r.join(&container), |n| n - 1)),
        ),
        (
            "index segment",
            "Segment",
            Box::new(|r| flip(&only(&r.join("index"))[0], |n| n / 2)),
        ),
        (
            "snapshot",
            "Snapshot",
            Box::new(|r| flip(&only(&r.join("snapshots"))[0], |n| n / 2)),
        ),
        (
            "swapped containers",
            &id,
            Box::new(|r| {
                let all = only(&r.join("containers"));
                let tmp = r.join("tmp/swap");
                fs::rename(&all[0], &tmp).unwrap();
                fs::rename(&all[1], &all[0]).unwrap();
                fs::rename(&tmp, &all[1]).unwrap();
            }),
        ),
        (
            "snapshot from another repository",
            "Snapshot",
            Box::new(|r| {
                let theirs = &only(&other.join("snapshots"))[0];
                fs::copy(
                    theirs,
                    r.join("snapshots").join(theirs.file_name().unwrap()),
                )
                .unwrap();
            }),
        ),
    ];
    for (what, named, tamper) in cases {
        tampered_copy(&root, &copy, tamper);
        let found = check_copy(&copy);
        assert!(found.contains(named), "{what}: check found {found}");
    }
}

#[test]
fn two_repositories_cut_the_same_data_apart_and_full_containers_are_one_size() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    fs::create_dir_all(&src).unwrap();
    fs::write(src.join("data"), bytes(9, 3 << 20)).unwrap();
    let container_size = 256 << 10;
    let mut cuts = Vec::new();
    for name in ["one", "two"] {
        let root = dir.path().join(name);
        init_sized(&root, HashAlgo::Blake3, AeadKind::Aes256Gcm, container_size);
        let mut repo = open(&root, PASSWORD, LockMode::Exclusive).unwrap();
        backup(&mut repo, std::slice::from_ref(&src), &backup_options(2)).unwrap();
        let mut lengths = Vec::new();
        let mut sizes = Vec::new();
        for id in repo
            .indexed_containers()
            .iter()
            .copied()
            .collect::<Vec<_>>()
        {
            lengths.extend(
                repo.load_container_table(id)
                    .unwrap()
                    .entries
                    .iter()
                    .map(|e| e.raw_len),
            );
            let path = root.join(format!("containers/{id:016x}.ctr"));
            sizes.push(fs::metadata(path).unwrap().len() as usize);
        }
        // Every container but the backup's last (or two: data and tree) is full, and
        // every full one has exactly the container size; the others a power of two.
        let full = sizes.iter().filter(|&&s| s == container_size).count();
        assert!(full + 2 >= sizes.len() && full >= 8, "{sizes:?}");
        assert!(
            sizes
                .iter()
                .all(|s| *s == container_size || s.is_power_of_two()),
            "{sizes:?}"
        );
        lengths.sort_unstable();
        cuts.push(lengths);
    }
    assert_ne!(
        cuts[0], cuts[1],
        "two keys cut the same data at the same points"
    );
}
