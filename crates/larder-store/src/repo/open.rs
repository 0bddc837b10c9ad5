//! Creating and opening a repository in any backend: its config, key slots and lock
//! through the backend, its local state (the disk index) in a local directory
//! (docs/design/remote.md, "Local state").

use std::fs;
use std::path::Path;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use larder_crypto::{KeySlot, RepoKeys};

use super::{io, objects, DiskState, IndexSettings, OpenReport, RepoConfig, RepoIndex, Repository};
use crate::backend::{
    create_private_dir, private_file_options, sync_dir, Backend, FileKind, LocalBackend,
    SplitBackend, CONFIG_NAME,
};
use crate::error::{Result, StoreError};
use crate::lock::{LockMode, RepoLock};

/// The directories of a local repository.
const LOCAL_DIRS: [&str; 5] = ["tmp", "containers", "index", "snapshots", "gc"];

impl Repository {
    /// Creates a repository at `root`, which must not exist or be an empty directory.
    pub fn init(root: &Path, config: &RepoConfig) -> Result<()> {
        Self::init_local(root, config, None, None)
    }

    /// Creates an encrypted repository at `root` whose keys are `keys` (made for
    /// `config`'s id) and whose first key slot is `slot`, named `slot_id`.
    pub fn init_encrypted(
        root: &Path,
        config: &RepoConfig,
        keys: &RepoKeys,
        slot_id: &str,
        slot: &KeySlot,
    ) -> Result<()> {
        Self::check_keys(config, keys)?;
        Self::init_local(root, config, Some(keys), Some((slot_id, slot)))
    }

    /// Creates an encrypted repository at `root` whose keys are `keys` (made for
    /// `config`'s id) with no key slot of its own: its key is kept elsewhere, as a
    /// cluster keeps its node repositories' in its shared storage
    /// (docs/design/crypto.md, "Cluster"), and it opens only with keys from there.
    pub fn init_encrypted_without_slot(
        root: &Path,
        config: &RepoConfig,
        keys: &RepoKeys,
    ) -> Result<()> {
        Self::check_keys(config, keys)?;
        Self::init_local(root, config, Some(keys), None)
    }

    fn check_keys(config: &RepoConfig, keys: &RepoKeys) -> Result<()> {
        if config.encryption.is_none() || config.id_bytes()? != keys.repo_id() {
            return Err(StoreError::Config(
                "the keys are not this config's encrypted repository's".into(),
            ));
        }
        Ok(())
    }

    /// Makes the directories of a local repository, then creates it there.
    fn init_local(
        root: &Path,
        config: &RepoConfig,
        keys: Option<&RepoKeys>,
        slot: Option<(&str, &KeySlot)>,
    ) -> Result<()> {
        config.validate()?;
        if root.exists() && fs::read_dir(root).map_err(io(root))?.next().is_some() {
            return Err(StoreError::AlreadyExists(root.to_path_buf()));
        }
        create_private_dir(root).map_err(io(root))?;
        for dir in LOCAL_DIRS {
            let p = root.join(dir);
            create_private_dir(&p).map_err(io(&p))?;
        }
        let lock = root.join("lock");
        private_file_options()
            .create(true)
            .truncate(false)
            .open(&lock)
            .map_err(io(&lock))?;
        super::gc_full::make_reserve(root);
        for dir in LOCAL_DIRS {
            sync_dir(&root.join(dir))?;
        }
        Self::init_in(&LocalBackend::new(root), root, config, keys, slot)?;
        if let Some(parent) = root.parent().filter(|p| !p.as_os_str().is_empty()) {
            sync_dir(parent)?;
        }
        Ok(())
    }

    /// Creates a repository in `backend`, which must hold none, with its local state in
    /// `state`; encrypted when `keys` are given (made for `config`'s id), with first
    /// key slot `slot` if given. The config is written last, create-only: until then
    /// there is no repository, and of two processes creating one, one fails.
    pub fn init_in(
        backend: &dyn Backend,
        state: &Path,
        config: &RepoConfig,
        keys: Option<&RepoKeys>,
        slot: Option<(&str, &KeySlot)>,
    ) -> Result<()> {
        config.validate()?;
        if let Some(keys) = keys {
            Self::check_keys(config, keys)?;
        }
        let exists = || StoreError::AlreadyExists(backend.location().into());
        if !backend.list(FileKind::Config)?.is_empty() {
            return Err(exists());
        }
        if let Some((id, slot)) = slot {
            crate::keys::write_slot(backend, id, slot)?;
        }
        let bytes = objects::encode_config(config, keys);
        if !backend.write_new(FileKind::Config, CONFIG_NAME, &bytes)? {
            return Err(exists());
        }
        backend.sync(FileKind::Config)?;
        if let IndexSettings::Disk { lookup, memory } = config.index {
            // An empty disk index; were this lost, the first writer's open would
            // build it.
            prepare_state(state)?;
            DiskState::rebuild(state, lookup, memory, &[], keys)?
                .absorb(super::absorbed::AbsorbedSegments::default())?;
        }
        Ok(())
    }

    /// Opens `root`, takes the lock, and loads the index (segments, then any container
    /// no segment names). Fails at once if the lock is taken.
    pub fn open(root: &Path, mode: LockMode) -> Result<Self> {
        Self::open_waiting(root, mode, Duration::ZERO)
    }

    /// Like [`Repository::open`], waiting up to `wait` for the lock. With the exclusive
    /// lock it first removes what is in `tmp/` and finishes or rolls back an
    /// interrupted garbage collection (docs/design/gc.md).
    pub fn open_waiting(root: &Path, mode: LockMode, wait: Duration) -> Result<Self> {
        Self::open_in(Arc::new(LocalBackend::new(root)), root, mode, wait, None)
    }

    /// Like [`Repository::open_waiting`], with the repository's files read and written
    /// through `backend` instead of the directory's own: the config, key slots and the
    /// lock stay in `root` ([`SplitBackend`]). A cluster opens a view this way whose
    /// backend reads every node's containers, segments and snapshots
    /// (docs/design/cluster.md, "Restores").
    pub fn open_with_backend(
        root: &Path,
        mode: LockMode,
        wait: Duration,
        backend: Arc<dyn Backend>,
    ) -> Result<Self> {
        Self::open_with(root, mode, wait, backend, None)
    }

    /// Like [`Repository::open_with_backend`], with the key of an encrypted
    /// repository (from [`crate::keys::unlock`]); `None` opens a plaintext one.
    pub fn open_with(
        root: &Path,
        mode: LockMode,
        wait: Duration,
        backend: Arc<dyn Backend>,
        keys: Option<RepoKeys>,
    ) -> Result<Self> {
        let split = Arc::new(SplitBackend::new(LocalBackend::new(root), backend));
        Self::open_in(split, root, mode, wait, keys)
    }

    /// Opens the repository in `backend` with its local state in `state`: reads the
    /// config, takes the lock in `mode` (waiting up to `wait`), and loads the index.
    /// `keys` open an encrypted repository (from [`crate::keys::unlock`]). With the
    /// exclusive lock it first removes what killed writers left half-written and
    /// finishes or rolls back an interrupted garbage collection (docs/design/gc.md).
    pub fn open_in(
        backend: Arc<dyn Backend>,
        state: &Path,
        mode: LockMode,
        wait: Duration,
        keys: Option<RepoKeys>,
    ) -> Result<Self> {
        let location = || backend.location().into();
        let raw = match backend.read(FileKind::Config, CONFIG_NAME) {
            Err(StoreError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
                return Err(StoreError::NotARepository(location()))
            }
            raw => raw?,
        };
        let sealed = objects::config_is_sealed(&raw);
        if sealed && keys.is_none() {
            return Err(StoreError::NeedsKey(location()));
        }
        let name = format!("{}/{CONFIG_NAME}", backend.location());
        let config = objects::decode_config(&raw, &name, keys.as_ref())?;
        if !sealed {
            refuse_plaintext(&*backend, keys.is_some())?;
        }
        let keys = keys.map(Arc::new);
        let lock = RepoLock::acquire(&backend, mode, wait, keys.as_ref())?;
        if !config.index.is_memory() {
            prepare_state(state)?;
        }
        let mut repo = Self {
            state: state.to_path_buf(),
            backend,
            config,
            index: RepoIndex::default(),
            mode,
            indexed_containers: Default::default(),
            chunk_bytes: Default::default(),
            pending: Vec::new(),
            segments: Vec::new(),
            next_container: AtomicU64::new(1),
            report: OpenReport {
                lock_note_failure: lock.note_failure().map(str::to_string),
                ..OpenReport::default()
            },
            keys,
            deletes_allowed: std::sync::OnceLock::new(),
            lock,
        };
        if mode == LockMode::Exclusive {
            repo.report.removed_tmp = repo.backend.clean_tmp()?;
            repo.recover_gc()?;
        }
        repo.load_index()?;
        Ok(repo)
    }

    /// Fails if the repository lock may no longer exclude others (a lock object that
    /// could not be refreshed in time): a writer must not commit then.
    pub(crate) fn check_lock(&self) -> Result<()> {
        match self.lock.is_lost() {
            true => Err(StoreError::LockLost(self.backend.location().into())),
            false => Ok(()),
        }
    }
}

impl Repository {
    /// Fails with [`StoreError::DeletesRefused`] if the repository's storage refuses
    /// deletes (append-only storage, docs/design/remote.md "Append-only storage"),
    /// before `action` deleted anything.
    pub fn require_deletes(&self, action: &'static str) -> Result<()> {
        match self.deletes_allowed()? {
            true => Ok(()),
            false => Err(StoreError::DeletesRefused {
                location: self.backend.location(),
                action,
            }),
        }
    }

    /// Whether the storage removes files: a local directory is taken to; elsewhere a
    /// probe lock object (`<random>-probe`, which lock readers skip) is written and
    /// removed, once per open. On append-only storage the probe stays behind.
    pub(crate) fn deletes_allowed(&self) -> Result<bool> {
        if let Some(&allowed) = self.deletes_allowed.get() {
            return Ok(allowed);
        }
        let allowed = match self.backend.flock_dir() {
            Some(_) => true,
            None => {
                let probe = format!("{}-probe", larder_crypto::random_id_hex(8));
                self.backend.write_new(FileKind::Lock, &probe, b"")?;
                match self.backend.remove(FileKind::Lock, &probe) {
                    Ok(()) => true,
                    Err(StoreError::Io { source, .. })
                        if source.kind() == std::io::ErrorKind::PermissionDenied =>
                    {
                        false
                    }
                    Err(e) => return Err(e),
                }
            }
        };
        Ok(*self.deletes_allowed.get_or_init(|| allowed))
    }
}

/// Refuses a plaintext config where it may have replaced an encrypted repository's
/// (docs/design/crypto.md, "Threat model"): when the caller holds the repository's
/// keys (it read a sealed config a moment ago), or when key slots stand beside it.
/// Reads only, so nothing is written before the refusal.
fn refuse_plaintext(backend: &dyn Backend, have_keys: bool) -> Result<()> {
    let reason = if have_keys {
        "it was sealed when its key was unlocked"
    } else if !backend.list(FileKind::Key)?.is_empty() {
        "key slots (keys/) stand beside it"
    } else {
        return Ok(());
    };
    Err(StoreError::PlaintextConfig {
        location: backend.location(),
        reason: reason.into(),
    })
}

/// Makes the local state directory's `tmp/` and `index/`, which the disk index uses.
pub(super) fn prepare_state(state: &Path) -> Result<()> {
    for dir in ["tmp", "index"] {
        let p = state.join(dir);
        create_private_dir(&p).map_err(io(&p))?;
    }
    Ok(())
}
