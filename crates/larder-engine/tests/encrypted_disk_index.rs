//! An encrypted repository with the disk index (docs/design/crypto.md, "Disk index
//! pages"): backups deduplicate through it and restore byte for byte, no file of
//! `index/disk/` holds a fingerprint, a chunk's location or length, or any plaintext,
//! a write-only key backs up through it, and a damaged page is named by the open,
//! which rebuilds the index (a writer) or falls back to the memory index (a reader),
//! losing nothing.

use std::fs;
use std::path::{Path, PathBuf};

use larder_crypto::{AeadKind, FingerprintKind, KeyKind, RepoKeys};
use larder_engine::{backup, check, restore, BackupSummary, DEFAULT_RESTORE_CACHE};
use larder_hash::HashAlgo;
use larder_store::{keys, DiskLookup, DiskState, IndexSettings, LockMode, RepoConfig, Repository};

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
const WRITER: &[u8] = b"write-only machine";
const MARKER: &str = "LARDER-DISK-INDEX-MARKER-91c3";
const NAME: &str = "salaries-by-name.csv";
/// The smallest budget, with chunks of 1 KiB: a backup spills runs of 384 entries and
/// merges them into the table.
const MEMORY: u64 = 1 << 20;

/// The keyed chunker with chunks of 1 KiB.
fn chunker() -> larder_chunk::ChunkerConfig {
    larder_chunk::ChunkerConfig {
        kind: larder_chunk::ChunkerKind::Keyed,
        min_size: 256,
        avg_size: 1 << 10,
        max_size: 8 << 10,
        level: 2,
        seed: 0,
    }
}

/// An encrypted repository (keyed chunker, keyed BLAKE3) with the disk index, and a
/// write-only key slot besides the full one.
fn init(root: &Path, aead: AeadKind, lookup: DiskLookup) {
    let chunker = chunker();
    let config = RepoConfig::new(chunker, HashAlgo::Blake3)
        .with_encryption(aead)
        .with_index(IndexSettings::Disk {
            lookup,
            memory: MEMORY,
        });
    let keys = RepoKeys::generate(
        config.id_bytes().unwrap(),
        aead,
        FingerprintKind::KeyedBlake3,
    );
    init_with_keys(root, &config, &keys, PASSWORD);
    keys::write_slot(
        &larder_store::LocalBackend::new(root),
        "00000000000000ff",
        &slot(&keys, KeyKind::WriteOnly, WRITER),
    )
    .unwrap();
}

fn run_backup(root: &Path, password: &[u8], src: &Path) -> BackupSummary {
    let mut repo = open(root, password, LockMode::Exclusive).unwrap();
    let summary = backup(&mut repo, &[src.to_path_buf()], &backup_options(2)).unwrap();
    assert!(summary.warnings.is_empty(), "{:?}", summary.warnings);
    summary
}

/// Text with a marker in every line, 8 MiB of random bytes and a copy of them.
fn source(dir: &Path) -> PathBuf {
    let src = dir.join("src");
    fs::create_dir_all(src.join("sub")).unwrap();
    let mut text = Vec::new();
    for i in 0..6000 {
        text.extend_from_slice(format!("row {i}: {MARKER}, someone, 4200\n").as_bytes());
    }
    fs::write(src.join(NAME), &text).unwrap();
    let big = bytes(11, 8 << 20);
    fs::write(src.join("sub/big.bin"), &big).unwrap();
    fs::write(src.join("sub/copy.bin"), &big).unwrap();
    src
}

/// Restores `snapshot` with the full key and compares it with `src`.
fn assert_restores(root: &Path, snapshot: &str, src: &Path, target: &Path) {
    let repo = open(root, PASSWORD, LockMode::Shared).unwrap();
    let restored = restore(
        &repo,
        snapshot,
        target,
        &restore_options(DEFAULT_RESTORE_CACHE),
    )
    .unwrap();
    assert!(restored.warnings.is_empty(), "{:?}", restored.warnings);
    assert!(files(&target.join(src.strip_prefix("/").unwrap())) == files(src));
    let report = check(&repo, &check_options(true)).unwrap();
    assert!(report.is_ok(), "{:?}", report.damage);
}

/// A second backup of data already stored: no new data chunk.
#[track_caller]
fn assert_nothing_new(s: &BackupSummary) {
    assert!(s.chunks_new <= s.tree_chunks_new, "{s:?}");
}

/// 8-byte strings to look for in the index's files: sorted, behind a bitmap of their
/// hashes so that most positions cost one bit test (the table is tens of MB).
struct Needles {
    sorted: Vec<u64>,
    bitmap: Vec<u64>,
}

fn hash(word: u64) -> usize {
    (word.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 44) as usize
}

impl Needles {
    fn new(needles: &[[u8; 8]]) -> Self {
        let mut sorted: Vec<u64> = needles.iter().map(|n| u64::from_le_bytes(*n)).collect();
        sorted.sort_unstable();
        let mut bitmap = vec![0u64; (1 << 20) / 64];
        for &w in &sorted {
            bitmap[hash(w) / 64] |= 1 << (hash(w) % 64);
        }
        Self { sorted, bitmap }
    }

    /// The first needle in `content`.
    fn find(&self, content: &[u8]) -> Option<[u8; 8]> {
        content.windows(8).find_map(|w| {
            let word = u64::from_le_bytes(w.try_into().unwrap());
            let h = hash(word);
            (self.bitmap[h / 64] & (1 << (h % 64)) != 0 && self.sorted.binary_search(&word).is_ok())
                .then(|| word.to_le_bytes())
        })
    }
}

fn first8(bytes: &[u8]) -> [u8; 8] {
    bytes[..8].try_into().unwrap()
}

#[test]
fn an_encrypted_disk_index_deduplicates_restores_and_holds_no_plaintext() {
    for (aead, lookup) in [
        (AeadKind::Aes256Gcm, DiskLookup::Lazy),
        (AeadKind::XChaCha20Poly1305, DiskLookup::Eager),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("repo");
        init(&root, aead, lookup);
        let src = source(dir.path());
        let first = run_backup(&root, PASSWORD, &src);
        // The copy deduplicated within the backup, and everything in the next one.
        assert!(first.bytes_new < first.bytes_in * 6 / 10, "{first:?}");
        let second = run_backup(&root, PASSWORD, &src);
        assert_nothing_new(&second);
        assert_restores(&root, &second.snapshot_id, &src, &dir.path().join("r"));

        let repo = open(&root, PASSWORD, LockMode::Shared).unwrap();
        assert!(repo.report().disk_fallback.is_none(), "{:?}", repo.report());
        repo.save_last_backup_counters(br#"{"fingerprints":1234}"#)
            .unwrap();
        assert_eq!(
            repo.last_backup_counters().unwrap(),
            br#"{"fingerprints":1234}"#
        );
        let index = files(&DiskState::dir_of(&root));
        for name in ["table", "meta", "bloom", "runs", "held", "last-backup"] {
            assert!(
                index.contains_key(Path::new(name)),
                "no {name}: {:?}",
                index.keys()
            );
        }
        if let Some(leak) = index_leak(&repo) {
            panic!("{leak}");
        }
    }
    // The control: the same scan finds what a plaintext disk index holds.
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("repo");
    let chunker = larder_chunk::ChunkerConfig {
        kind: larder_chunk::ChunkerKind::Fastcdc2020,
        ..chunker()
    };
    let config = RepoConfig::new(chunker, HashAlgo::Blake3).with_index(IndexSettings::Disk {
        lookup: DiskLookup::Lazy,
        memory: MEMORY,
    });
    Repository::init(&root, &config).unwrap();
    let src = source(dir.path());
    let mut repo = Repository::open(&root, LockMode::Exclusive).unwrap();
    backup(&mut repo, &[src], &backup_options(2)).unwrap();
    let leak = index_leak(&repo).unwrap_or_default();
    assert!(leak.contains(" holds "), "{leak}");
}

/// Where a file of the repository's disk index holds 8 bytes of what it must not
/// show: a string of the source, a magic of the plaintext formats, a chunk's
/// fingerprint (its first or last bytes), or its offset and stored length (what a
/// record's and an entry's location end with).
fn index_leak(repo: &Repository) -> Option<String> {
    let mut needles: Vec<[u8; 8]> = [MARKER, NAME, "fingerprints"]
        .iter()
        .map(|t| first8(t.as_bytes()))
        .collect();
    for magic in ["LDXTABLE", "LDXMETA1", "LDXBLOOM", "LDXHELD1", "LDXSEAL1"] {
        needles.push(first8(magic.as_bytes()));
    }
    let mut chunks = 0;
    for &id in repo.indexed_containers() {
        for e in repo.load_container_table(id).unwrap().entries {
            let l = e.location(id);
            needles.push(first8(e.fingerprint.as_bytes()));
            needles.push(first8(&e.fingerprint.as_bytes()[24..]));
            let mut place = l.offset.to_le_bytes().to_vec();
            place.extend_from_slice(&l.length.to_le_bytes());
            needles.push(first8(&place));
            chunks += 1;
        }
    }
    assert!(chunks > 5000, "{chunks} chunks");
    let needles = Needles::new(&needles);
    files(&DiskState::dir_of(repo.state_dir()))
        .into_iter()
        .find_map(|(path, content)| {
            let needle = needles.find(&content)?;
            Some(format!("{} holds {needle:02x?}", path.display()))
        })
}

#[test]
fn a_write_only_key_backs_up_through_the_disk_index() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("repo");
    init(&root, AeadKind::Aes256Gcm, DiskLookup::Lazy);
    let src = source(dir.path());
    let first = run_backup(&root, WRITER, &src);
    assert!(first.chunks_new > 100, "{first:?}");
    let second = run_backup(&root, WRITER, &src);
    assert_nothing_new(&second);
    // The full key uses the index the writer kept, as it is.
    let repo = open(&root, PASSWORD, LockMode::Exclusive).unwrap();
    assert!(repo.report().disk_rebuilt.is_none(), "{:?}", repo.report());
    assert!(
        repo.report().disk_caught_up.is_empty(),
        "{:?}",
        repo.report()
    );
    drop(repo);
    assert_restores(&root, &second.snapshot_id, &src, &dir.path().join("r"));
}

/// A copy of the repository at `root` in `to`.
fn copy_repo(root: &Path, to: &Path) {
    for (rel, content) in files(root) {
        let dest = to.join(&rel);
        fs::create_dir_all(dest.parent().unwrap()).unwrap();
        fs::write(dest, content).unwrap();
    }
    for dir in ["tmp", "gc"] {
        fs::create_dir_all(to.join(dir)).unwrap();
    }
}

/// Flips bit 4 of byte `at` of `index/disk/FILE` in the repository at `root`.
fn flip(root: &Path, file: &str, at: usize) {
    let path = DiskState::dir_of(root).join(file);
    let mut bytes = fs::read(&path).unwrap();
    bytes[at] ^= 0x10;
    fs::write(&path, bytes).unwrap();
}

#[test]
fn a_damaged_page_is_named_and_nothing_is_lost() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("repo");
    init(&root, AeadKind::Aes256Gcm, DiskLookup::Lazy);
    let src = source(dir.path());
    let first = run_backup(&root, PASSWORD, &src);
    // Logical page 0 of `table` and `meta` (their headers: read by every open) lies at
    // bytes 112 .. 4256; `held` is one envelope.
    for (file, at, expected) in [
        (
            "table",
            112 + 40,
            "damaged (table at byte 112: sealed page 0 does not open",
        ),
        (
            "meta",
            112 + 4000,
            "damaged (meta at byte 112: sealed page 0 does not open",
        ),
        (
            "meta",
            20,
            "damaged (meta at byte 0: its header is not the table's",
        ),
        ("held", 60, "damaged (held at byte 0: "),
    ] {
        let copy = dir.path().join(format!("copy-{file}-{at}"));
        copy_repo(&root, &copy);
        flip(&copy, file, at);
        // A reader names the damage and uses the memory index: nothing is lost.
        let repo = open(&copy, PASSWORD, LockMode::Shared).unwrap();
        let why = repo.report().disk_fallback.clone().unwrap_or_default();
        assert!(why.starts_with(expected), "{file}: {why}");
        drop(repo);
        assert_restores(&copy, &first.snapshot_id, &src, &copy.join("r"));
        // A writer names it, rebuilds the index, and it deduplicates again.
        let repo = open(&copy, PASSWORD, LockMode::Exclusive).unwrap();
        let why = repo.report().disk_rebuilt.clone().unwrap_or_default();
        assert!(why.starts_with(expected), "{file}: {why}");
        drop(repo);
        assert_nothing_new(&run_backup(&copy, PASSWORD, &src));
        let repo = open(&copy, PASSWORD, LockMode::Shared).unwrap();
        assert!(repo.report().disk_fallback.is_none(), "{:?}", repo.report());
    }

    // Every written bucket page of `table` damaged: the open reads none of them, the
    // first lookup that does fails, naming the file and the page, and `check` stops
    // with that error; a rebuild of the index repairs it, and nothing was lost.
    let copy = dir.path().join("copy-buckets");
    copy_repo(&root, &copy);
    let table = DiskState::dir_of(&copy).join("table");
    let mut bytes = fs::read(&table).unwrap();
    let mut damaged = 0;
    for page in bytes[112 + 4144..].chunks_mut(4144) {
        if page.len() == 4144 && page.iter().any(|&b| b != 0) {
            page[100] ^= 1;
            damaged += 1;
        }
    }
    assert!(damaged > 100, "{damaged} written bucket pages");
    fs::write(&table, bytes).unwrap();
    let repo = open(&copy, PASSWORD, LockMode::Shared).unwrap();
    assert!(repo.report().disk_fallback.is_none(), "{:?}", repo.report());
    // `check` reports the damage it met, or stops on it.
    let found = match check(&repo, &check_options(false)) {
        Ok(report) => format!("{:?}", report.damage),
        Err(e) => e.to_string(),
    };
    assert!(
        found.contains("corrupt disk index file table at byte") && found.contains("does not open"),
        "{found}"
    );
    drop(repo);
    let mut repo = open(&copy, PASSWORD, LockMode::Exclusive).unwrap();
    assert!(repo.rebuild_index().unwrap().is_empty());
    drop(repo);
    assert_restores(&copy, &first.snapshot_id, &src, &copy.join("r"));
    assert_nothing_new(&run_backup(&copy, PASSWORD, &src));
}
