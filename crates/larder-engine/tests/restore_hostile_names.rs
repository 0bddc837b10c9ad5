//! Restore's own defences against hostile names. Entries go to `restore_entries`
//! directly, past the tree decoder (which refuses a tree holding an unsafe path whole),
//! with `..`, `.`, empty components, absolute paths, NUL bytes, names longer than
//! NAME_MAX and paths longer than PATH_MAX, of every kind, repeated, with and without
//! `--overwrite` and `--delete`, into a target that already holds symlinks leading out
//! of it: nothing outside the target is ever created, removed or changed. The fuzz
//! target `restore_paths` (fuzz/fuzz_targets/restore_paths.rs) drives the same
//! property with libFuzzer's inputs.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use larder_chunk::ChunkerConfig;
use larder_engine::{restore_entries, RestoreOptions};
use larder_hash::HashAlgo;
use larder_store::{EntryKind, LockMode, RepoConfig, Repository, TreeEntry};
use proptest::prelude::*;

#[path = "support/listing.rs"]
mod listing;
use listing::listing;

/// One component of a generated path.
#[derive(Debug, Clone)]
enum Token {
    DotDot,
    Dot,
    Empty,
    Name(&'static str),
    Nul,
    /// A name of this many bytes (above 255: longer than NAME_MAX).
    Long(usize),
    /// The absolute path of the directory outside the target.
    Outside,
}

fn token() -> impl Strategy<Value = Token> {
    prop_oneof![
        Just(Token::DotDot),
        Just(Token::Dot),
        Just(Token::Empty),
        prop::sample::select(vec!["a", "b", "out", "abs", "f"]).prop_map(Token::Name),
        Just(Token::Nul),
        (200usize..300).prop_map(Token::Long),
        Just(Token::Outside),
    ]
}

fn path(tokens: &[Token], outside: &Path) -> Vec<u8> {
    let parts: Vec<Vec<u8>> = tokens
        .iter()
        .map(|t| match t {
            Token::DotDot => b"..".to_vec(),
            Token::Dot => b".".to_vec(),
            Token::Empty => Vec::new(),
            Token::Name(n) => n.as_bytes().to_vec(),
            Token::Nul => b"n\0ul".to_vec(),
            Token::Long(len) => vec![b'l'; *len],
            Token::Outside => outside.as_os_str().as_encoded_bytes().to_vec(),
        })
        .collect();
    parts.join(&b'/')
}

fn entry(kind: u8, tokens: &[Token], target: &[Token], outside: &Path) -> TreeEntry {
    let kind = [
        EntryKind::File,
        EntryKind::Dir,
        EntryKind::Symlink,
        EntryKind::Fifo,
    ][kind as usize % 4];
    TreeEntry {
        mode: if kind == EntryKind::Dir {
            0o40777
        } else {
            0o100666
        },
        mtime_sec: 1_000_000_000,
        target: path(target, outside),
        ..TreeEntry::new(kind, path(tokens, outside))
    }
}

struct Fixture {
    _dir: tempfile::TempDir,
    base: PathBuf,
    repo: Repository,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let base = fs::canonicalize(dir.path()).unwrap();
    let root = base.join("repo");
    Repository::init(
        &root,
        &RepoConfig::new(ChunkerConfig::default(), HashAlgo::Blake3),
    )
    .unwrap();
    let repo = Repository::open(&root, LockMode::Shared).unwrap();
    Fixture {
        _dir: dir,
        base,
        repo,
    }
}

/// A case's directory: `target/` holding symlinks out (relative and absolute) and
/// `outside/` holding a file, both below `case`.
fn case(base: &Path, n: usize) -> (PathBuf, PathBuf, PathBuf) {
    let case = base.join(format!("case{n}"));
    let (target, outside) = (case.join("target"), case.join("outside"));
    fs::create_dir_all(&target).unwrap();
    fs::create_dir_all(outside.join("dir")).unwrap();
    fs::write(outside.join("victim"), b"victim\n").unwrap();
    fs::set_permissions(outside.join("victim"), fs::Permissions::from_mode(0o600)).unwrap();
    std::os::unix::fs::symlink("../outside", target.join("out")).unwrap();
    std::os::unix::fs::symlink(&outside, target.join("abs")).unwrap();
    std::os::unix::fs::symlink(outside.join("victim"), target.join("f")).unwrap();
    (case, target, outside)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn hostile_names_never_reach_outside_the_target(
        entries in prop::collection::vec(
            (0u8..4, prop::collection::vec(token(), 1..24), prop::collection::vec(token(), 1..4)),
            1..10,
        ),
        overwrite in any::<bool>(),
        delete in any::<bool>(),
    ) {
        let f = fixture();
        let (case, target, outside) = case(&f.base, 0);
        let entries: Vec<TreeEntry> = entries
            .iter()
            .map(|(kind, p, t)| entry(*kind, p, t, &outside))
            .collect();
        let before = listing(&case);
        let opts = RestoreOptions {
            overwrite,
            delete,
            owners: false,
            threads: 2,
            ..RestoreOptions::default()
        };
        let summary = restore_entries(&f.repo, &entries, &target, &opts).unwrap();
        let after = listing(&case);
        for (path, what) in &before {
            if !path.starts_with(&target) {
                prop_assert_eq!(after.get(path), Some(what), "{} changed: {:?}", path.display(), summary.warnings);
            }
        }
        for path in after.keys() {
            prop_assert!(
                path.starts_with(&target) || before.contains_key(path),
                "{} was created outside the target: {:?}", path.display(), summary.warnings
            );
        }
        // Nothing beside the case either.
        let names: Vec<_> = fs::read_dir(&f.base).unwrap().map(|e| e.unwrap().file_name()).collect();
        prop_assert_eq!(names.len(), 2, "{:?}", names);
    }
}

/// A few hostile names by hand: each is refused with a warning naming it, and the
/// plain ones around them are restored.
#[test]
fn unsafe_paths_are_refused_one_by_one() {
    let f = fixture();
    let (_, target, outside) = case(&f.base, 1);
    let outside_abs = outside.join("escape");
    let hostile: Vec<Vec<u8>> = vec![
        b"../escape".to_vec(),
        b"a/../../escape".to_vec(),
        outside_abs.as_os_str().as_encoded_bytes().to_vec(),
        b"out/escape".to_vec(),
        b"abs/escape".to_vec(),
        b"a//b".to_vec(),
        b"a\0b".to_vec(),
        Vec::new(),
        vec![b'l'; 300],
    ];
    let mut entries = vec![TreeEntry::new(EntryKind::Dir, b"a".to_vec())];
    for p in &hostile {
        entries.push(TreeEntry::new(EntryKind::File, p.clone()));
    }
    entries.push(TreeEntry::new(EntryKind::File, b"a/fine".to_vec()));
    let opts = RestoreOptions {
        owners: false,
        ..RestoreOptions::default()
    };
    let summary = restore_entries(&f.repo, &entries, &target, &opts).unwrap();
    assert_eq!(
        summary.warnings.len(),
        hostile.len(),
        "{:?}",
        summary.warnings
    );
    assert_eq!(summary.files, 1);
    assert!(target.join("a/fine").is_file());
    assert_eq!(
        fs::read_dir(&outside).unwrap().count(),
        2,
        "{:?}",
        summary.warnings
    );
}

/// Regression guard: the first name of a hard link group with an unsafe path is
/// refused, and its later names (waiting for it) are restored with their own data
/// instead of waiting forever.
#[test]
fn a_refused_first_name_does_not_hold_up_its_links() {
    let f = fixture();
    let (_, target, _) = case(&f.base, 2);
    let linked = |path: &[u8]| TreeEntry {
        device: 1,
        inode: 5,
        nlink: 2,
        ..TreeEntry::new(EntryKind::File, path.to_vec())
    };
    let entries = [linked(b"../first"), linked(b"later")];
    let opts = RestoreOptions {
        owners: false,
        ..RestoreOptions::default()
    };
    let summary = restore_entries(&f.repo, &entries, &target, &opts).unwrap();
    assert_eq!((summary.files, summary.hard_links), (1, 0));
    assert_eq!(summary.warnings.len(), 1, "{:?}", summary.warnings);
    assert!(target.join("later").is_file());
}
