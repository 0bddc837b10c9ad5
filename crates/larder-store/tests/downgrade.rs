//! `Repository::open_in` refuses a plaintext config where it may have replaced an
//! encrypted repository's (docs/design/crypto.md, "Threat model"): beside key slots,
//! or when the caller holds the repository's keys (it unlocked them from a sealed
//! config that the storage swapped since). Nothing is written before the refusal,
//! not even the lock. Callers without a password source (the cluster, the engine's
//! tests) get this much from the library; the CLI adds the password and what this
//! client remembers.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use larder_chunk::{ChunkerConfig, ChunkerKind};
use larder_crypto::{AeadKind, FingerprintKind, KdfParams, KeyKind, KeySlot, RepoKeys};
use larder_hash::HashAlgo;
use larder_store::{error_chain, LocalBackend, LockMode, RepoConfig, Repository, StoreError};

fn contents(dir: &Path) -> BTreeMap<PathBuf, Option<Vec<u8>>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                out.insert(p.clone(), None);
                stack.push(p);
            } else {
                out.insert(p.clone(), Some(fs::read(&p).unwrap()));
            }
        }
    }
    out
}

/// An encrypted repository at `root` and its keys.
fn encrypted(root: &Path) -> RepoKeys {
    let chunker = ChunkerConfig {
        kind: ChunkerKind::Keyed,
        ..ChunkerConfig::default()
    };
    let config = RepoConfig::new(chunker, HashAlgo::Blake3).with_encryption(AeadKind::Aes256Gcm);
    let keys = RepoKeys::generate(
        config.id_bytes().unwrap(),
        AeadKind::Aes256Gcm,
        FingerprintKind::KeyedBlake3,
    );
    let params = KdfParams {
        memory_kib: 8192,
        iterations: 1,
        parallelism: 1,
    };
    let slot = KeySlot::create(
        &keys,
        KeyKind::Full,
        b"pw",
        params,
        "h".into(),
        "u".into(),
        "2026-01-01T00:00:00Z".into(),
    )
    .unwrap();
    Repository::init_encrypted(root, &config, &keys, "00000000000000aa", &slot).unwrap();
    keys
}

fn swap_in_plaintext_config(root: &Path, scratch: &Path) {
    let plain = scratch.join("plain");
    Repository::init(
        &plain,
        &RepoConfig::new(ChunkerConfig::default(), HashAlgo::Blake3),
    )
    .unwrap();
    fs::copy(plain.join("config"), root.join("config")).unwrap();
}

fn refused(root: &Path, keys: Option<RepoKeys>, reason: &str) {
    let backend = Arc::new(LocalBackend::new(root));
    for mode in [LockMode::Shared, LockMode::Exclusive] {
        let keys = keys.clone();
        match Repository::open_in(backend.clone(), root, mode, Duration::ZERO, keys) {
            Err(e @ StoreError::PlaintextConfig { .. }) => {
                let message = error_chain(&e);
                assert!(message.contains(reason), "{message}");
                assert!(message.contains(&root.display().to_string()), "{message}");
            }
            Err(e) => panic!("refused for another reason: {}", error_chain(&e)),
            Ok(_) => panic!("a plaintext config beside key slots was opened"),
        }
    }
}

#[test]
fn a_plaintext_config_beside_key_slots_or_with_keys_is_refused_before_any_write() {
    let scratch = tempfile::tempdir().unwrap();
    let root = scratch.path().join("repo");
    let keys = encrypted(&root);
    swap_in_plaintext_config(&root, scratch.path());
    let before = contents(&root);
    refused(&root, None, "key slots");
    // The caller unlocked a sealed config a moment ago; the storage swapped it since.
    fs::remove_dir_all(root.join("keys")).unwrap();
    let before_keys = contents(&root);
    refused(&root, Some(keys), "sealed when its key was unlocked");
    assert_eq!(contents(&root), before_keys, "a refused open wrote");
    assert_eq!(
        before.len(),
        before_keys.len() + 2,
        "only keys/ was removed"
    );
}
