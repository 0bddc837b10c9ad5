//! Key slots and opening for the tests of encrypted repositories.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use larder_crypto::{KdfParams, KeyKind, KeySlot, RepoKeys};
use larder_store::{keys, LocalBackend, LockMode, RepoConfig, Repository, StoreError};

/// A slot cheap enough for tests: the parameters of a generated password.
pub fn slot(keys: &RepoKeys, kind: KeyKind, password: &[u8]) -> KeySlot {
    KeySlot::create(
        keys,
        kind,
        password,
        KdfParams::GENERATED,
        "test".into(),
        "test".into(),
        "2026-11-28T00:00:00Z".into(),
    )
    .unwrap()
}

/// Creates an encrypted repository at `root` with `keys`, its first slot (id 1) a
/// full key opened by `password`.
pub fn init_with_keys(root: &Path, config: &RepoConfig, keys: &RepoKeys, password: &[u8]) {
    let first = slot(keys, KeyKind::Full, password);
    Repository::init_encrypted(root, config, keys, "0000000000000001", &first).unwrap();
}

/// Opens the repository at `root` with the key `password` unlocks.
pub fn open(root: &Path, password: &[u8], mode: LockMode) -> Result<Repository, StoreError> {
    let (keys, _) = keys::unlock(&larder_store::LocalBackend::new(root), password)?;
    Repository::open_with(
        root,
        mode,
        Duration::ZERO,
        Arc::new(LocalBackend::new(root)),
        Some(keys),
    )
}
