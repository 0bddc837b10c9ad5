//! Restore's path and name handling: whatever names a tree holds (`..`, `.`, empty
//! components, absolute paths, NUL bytes, names longer than NAME_MAX, paths longer
//! than PATH_MAX, repeated paths) and whatever kinds stand at them, a restore never
//! creates, removes or changes anything outside its target, whose symlinks lead out.
//! The entries go to `restore_entries` directly, past the tree decoder that refuses
//! unsafe paths, so what is fuzzed is restore's own defences; the engine's
//! `restore_hostile_names` test states the same property with proptest.
//!
//! Input: a flags byte (bit 0 `--overwrite`, bit 1 `--delete`), then entries, each a
//! kind byte (file, directory, symlink, FIFO), a count and that many path tokens, a
//! count and that many tokens of a symlink target. A token byte `t` is, by `t % 8`:
//! `..`, `.`, an empty component, a name (`a`, `b`, `out`, `abs`, `f`, by `t >> 3`), a
//! name holding a NUL, a name of 200 to 324 bytes, the absolute path of the directory
//! outside the target, `a`.
#![no_main]
use std::cell::RefCell;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use larder_chunk::ChunkerConfig;
use larder_engine::{restore_entries, RestoreOptions};
use larder_hash::HashAlgo;
use larder_store::{EntryKind, LockMode, RepoConfig, Repository, TreeEntry};
use libfuzzer_sys::fuzz_target;

#[path = "../../crates/larder-engine/tests/support/listing.rs"]
mod listing;
use listing::listing;

thread_local! {
    /// The scratch directory of this process and an empty repository in it.
    static FIXTURE: RefCell<Option<(PathBuf, Repository)>> = const { RefCell::new(None) };
}

fn token(t: u8, outside: &Path) -> Vec<u8> {
    match t % 8 {
        0 => b"..".to_vec(),
        1 => b".".to_vec(),
        2 => Vec::new(),
        3 => ["a", "b", "out", "abs", "f"][(t >> 3) as usize % 5].as_bytes().to_vec(),
        4 => b"n\0ul".to_vec(),
        5 => vec![b'l'; 200 + (t >> 3) as usize * 4],
        6 => outside.as_os_str().as_encoded_bytes().to_vec(),
        _ => b"a".to_vec(),
    }
}

/// Takes a count byte and that many tokens from `data`, joined by `/`.
fn path(data: &mut &[u8], max: u8, outside: &Path) -> Option<Vec<u8>> {
    let (&count, rest) = data.split_first()?;
    let count = (count % max) as usize + 1;
    let tokens = rest.get(..count)?;
    *data = &rest[count..];
    let parts: Vec<Vec<u8>> = tokens.iter().map(|&t| token(t, outside)).collect();
    Some(parts.join(&b'/'))
}

fn entries(mut data: &[u8], outside: &Path) -> Vec<TreeEntry> {
    let mut out = Vec::new();
    while let Some((&kind, rest)) = data.split_first() {
        data = rest;
        let kind = [EntryKind::File, EntryKind::Dir, EntryKind::Symlink, EntryKind::Fifo]
            [kind as usize % 4];
        let (Some(p), Some(target)) = (path(&mut data, 24, outside), path(&mut data, 4, outside))
        else {
            break;
        };
        out.push(TreeEntry {
            mode: if kind == EntryKind::Dir { 0o40777 } else { 0o100666 },
            mtime_sec: 1_000_000_000,
            target,
            ..TreeEntry::new(kind, p)
        });
        if out.len() == 16 {
            break;
        }
    }
    out
}

fn with_fixture(f: impl FnOnce(&Path, &Repository)) {
    FIXTURE.with(|cell| {
        let mut cell = cell.borrow_mut();
        let (base, repo) = cell.get_or_insert_with(|| {
            let base = std::env::temp_dir().join(format!("larder-fuzz-restore-{}", std::process::id()));
            let _ = fs::remove_dir_all(&base);
            fs::create_dir_all(&base).expect("scratch");
            let base = fs::canonicalize(&base).expect("canonical scratch");
            let root = base.join("repo");
            Repository::init(&root, &RepoConfig::new(ChunkerConfig::default(), HashAlgo::Blake3))
                .expect("init");
            let repo = Repository::open(&root, LockMode::Shared).expect("open");
            (base, repo)
        });
        f(base, repo)
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&flags, data)) = data.split_first() else {
        return;
    };
    with_fixture(|base, repo| {
        let case = base.join("case");
        if case.exists() {
            fs::remove_dir_all(&case).expect("clear the last case");
        }
        let (target, outside) = (case.join("target"), case.join("outside"));
        fs::create_dir_all(&target).expect("target");
        fs::create_dir_all(outside.join("dir")).expect("outside");
        fs::write(outside.join("victim"), b"victim\n").expect("victim");
        fs::set_permissions(outside.join("victim"), fs::Permissions::from_mode(0o600)).expect("chmod");
        std::os::unix::fs::symlink("../outside", target.join("out")).expect("link");
        std::os::unix::fs::symlink(&outside, target.join("abs")).expect("link");
        std::os::unix::fs::symlink(outside.join("victim"), target.join("f")).expect("link");
        let entries = entries(data, &outside);
        let before = listing(base);
        let opts = RestoreOptions {
            overwrite: flags & 1 != 0,
            delete: flags & 2 != 0,
            owners: false,
            threads: 1,
            ..RestoreOptions::default()
        };
        let summary = restore_entries(repo, &entries, &target, &opts).expect("restore");
        let after = listing(base);
        let repo_dir = base.join("repo");
        for (path, what) in &before {
            if !path.starts_with(&target) && !path.starts_with(&repo_dir) {
                assert_eq!(after.get(path), Some(what), "{} changed: {:?}", path.display(), summary.warnings);
            }
        }
        for path in after.keys() {
            assert!(
                path.starts_with(&target) || path.starts_with(&repo_dir) || before.contains_key(path),
                "{} was created outside the target: {:?}",
                path.display(),
                summary.warnings
            );
        }
    });
});
