//! Finding, creating and opening the repository: `--repo` (or `LARDER_REPO`, or the
//! default one under `$XDG_DATA_HOME`, created on first use, encrypted with a generated
//! password kept under `$XDG_CONFIG_HOME`), its password, and `--retry-lock`. A
//! remote repository's metadata is cached under `$XDG_CACHE_HOME/larder/<id>/`, which
//! also holds its local state (docs/design/remote.md). Opening says what the
//! repository recovered from (interrupted gc, unindexed containers, a stale disk
//! index) in notes and warnings.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use larder_chunk::{ChunkerConfig, ChunkerKind};
use larder_crypto::{FingerprintKind, KdfParams, KeyKind, KeySlot, RepoKeys};
use larder_hash::HashAlgo;
use larder_store::{
    config_is_sealed, keys, Backend, CachedBackend, FileKind, LocalBackend, LockMode, OpenReport,
    RepoConfig, Repository, RetryPolicy, StoreError, CONFIG_NAME,
};

use crate::location::RepoLocation;
use crate::output::Output;
use crate::password::{self, Password, PasswordArgs};
use crate::security;

/// A remote repository's metadata cache, over its storage.
pub type Cache = CachedBackend<Arc<dyn Backend>>;

/// The global options that say which repository a command works on, its password, and
/// how long it waits for another process's lock.
pub struct RepoOpener {
    location: Option<RepoLocation>,
    retry_lock: Duration,
    /// Attempts per request to a remote repository (`--retries`).
    retries: u32,
    /// `--no-lock`: readers take no lock; writers refuse to run.
    no_lock: bool,
    pub password: PasswordArgs,
}

/// A repository's files and the local directory of its local state: its own directory,
/// or a remote repository's cache (known once its id is).
pub struct Storage {
    pub backend: Arc<dyn Backend>,
    pub local: Option<PathBuf>,
    /// Where it is, as `--repo` (or the default) names it.
    pub location: RepoLocation,
}

impl RepoOpener {
    pub fn new(
        location: Option<RepoLocation>,
        retry_lock: Duration,
        retries: u32,
        no_lock: bool,
        password: PasswordArgs,
    ) -> Self {
        Self {
            location,
            retry_lock,
            retries,
            no_lock,
            password,
        }
    }

    /// An opener of the repository at `location` with `password`, waiting for its lock
    /// and retrying its requests as this one does (`copy`'s source).
    pub fn other(&self, location: RepoLocation, password: PasswordArgs) -> RepoOpener {
        Self::new(
            Some(location),
            self.retry_lock,
            self.retries,
            self.no_lock,
            password,
        )
    }

    /// Whether the command works on the default repository.
    pub fn is_default(&self) -> bool {
        self.location.is_none()
    }

    /// Where `init` creates the repository: `--repo`, or the default path.
    pub fn init_location(&self) -> Result<RepoLocation> {
        match &self.location {
            Some(l) => Ok(l.clone()),
            None => Ok(RepoLocation::Local(default_repo()?)),
        }
    }

    /// The repository's storage; the default repository is created on first use.
    pub fn storage(&self, out: &Output) -> Result<Storage> {
        let location = match &self.location {
            Some(l) => l.clone(),
            None => RepoLocation::Local(self.default_path(out)?),
        };
        self.storage_at(&location)
    }

    /// The storage of the repository at `location`; a remote one's requests are
    /// retried as `--retries` says.
    pub fn storage_at(&self, location: &RepoLocation) -> Result<Storage> {
        let policy = RetryPolicy {
            attempts: self.retries,
            ..RetryPolicy::DEFAULT
        };
        match location {
            RepoLocation::Local(path) => Ok(Storage {
                backend: Arc::new(LocalBackend::new(path)),
                local: Some(path.clone()),
                location: location.clone(),
            }),
            remote => Ok(Storage {
                backend: remote.remote_backend(policy)?,
                local: None,
                location: location.clone(),
            }),
        }
    }

    /// The default repository's path, created on first use.
    fn default_path(&self, out: &Output) -> Result<PathBuf> {
        let path = default_repo()?;
        if !LocalBackend::new(&path).list(FileKind::Config)?.is_empty() {
            return Ok(path);
        }
        let chunker = ChunkerConfig {
            kind: ChunkerKind::Keyed,
            ..ChunkerConfig::default()
        };
        let config = RepoConfig::new(chunker, HashAlgo::Blake3)
            .with_encryption(larder_crypto::AeadKind::Aes256Gcm);
        let given = self.password.given()?;
        let generated = given.is_none();
        let password = match given {
            Some(p) => password::non_empty(p)?,
            None => password::generate_password_file(&password::default_password_file()?)?,
        };
        let params = if generated {
            KdfParams::GENERATED
        } else {
            KdfParams::DEFAULT
        };
        create(
            &self.storage_at(&RepoLocation::Local(path.clone()))?,
            &config,
            Some((&password, params)),
            out,
        )
        .with_context(|| format!("creating the default repository at {}", path.display()))?;
        out.note(&format!(
            "created the default repository at {} (encrypted{})",
            path.display(),
            if generated {
                format!(
                    "; its password is in {}: keep a copy of it",
                    password::default_password_file()?.display()
                )
            } else {
                String::new()
            }
        ));
        Ok(path)
    }

    /// The password of a new default repository: a given one (not empty), else one
    /// generated into the default password file.
    pub fn new_default_password(&self) -> Result<Password> {
        match self.password.given()? {
            Some(p) => password::non_empty(p),
            None => password::generate_password_file(&password::default_password_file()?),
        }
    }

    /// Opens the repository with the lock `mode`, waiting up to `--retry-lock` for it;
    /// an encrypted one is unlocked with its password first.
    pub fn open(&self, mode: LockMode, out: &Output) -> Result<Repository> {
        Ok(self.open_keyed(mode, out)?.0)
    }

    /// Like [`RepoOpener::open`], also returning the id of the key slot that unlocked
    /// an encrypted repository.
    pub fn open_keyed(&self, mode: LockMode, out: &Output) -> Result<(Repository, Option<String>)> {
        let (repo, slot, _) = self.open_with_cache(mode, false, out)?;
        Ok((repo, slot))
    }

    /// Like [`RepoOpener::open`], with a remote repository's metadata read from its
    /// storage, never from the cache (`check`): the cache is returned in verifying
    /// mode, to say which of its entries differed from the storage and were refreshed
    /// (docs/design/remote.md, "Local state and cache"). `None` for a local one.
    pub fn open_verifying(
        &self,
        mode: LockMode,
        out: &Output,
    ) -> Result<(Repository, Option<Arc<Cache>>)> {
        let (repo, _, cache) = self.open_with_cache(mode, true, out)?;
        Ok((repo, cache))
    }

    fn open_with_cache(
        &self,
        mode: LockMode,
        verify: bool,
        out: &Output,
    ) -> Result<(Repository, Option<String>, Option<Arc<Cache>>)> {
        let mode = match (mode, self.no_lock) {
            (LockMode::Exclusive, true) => {
                self.require_lock("writes to the repository")?;
                mode
            }
            (LockMode::Shared, true) => LockMode::Unlocked,
            (mode, _) => mode,
        };
        let storage = self.storage(out)?;
        let (keys, slot) = match self.unlock(&storage, out)? {
            Some((keys, slot)) => (Some(keys), Some(slot)),
            None => (None, None),
        };
        let (backend, state, cache) = match storage.local {
            Some(dir) => (storage.backend, dir, None),
            None => {
                let dir = cache_dir(&repo_id(&*storage.backend, keys.as_ref())?)?;
                let cached = Arc::new(match verify {
                    true => CachedBackend::verifying(storage.backend, &dir)?,
                    false => CachedBackend::new(storage.backend, &dir)?,
                });
                (cached.clone() as Arc<dyn Backend>, dir, Some(cached))
            }
        };
        let repo = Repository::open_in(backend, &state, mode, self.retry_lock, keys)?;
        if let Some(why) = &repo.report().lock_note_failure {
            out.warn(&format!(
                "could not record this process in the lock file ({why}); the repository is locked all the same"
            ));
        }
        report_gc_recovery(repo.report(), out);
        report_index_recovery(repo.report(), out);
        Ok((repo, slot, cache))
    }

    /// Refuses `--no-lock` for a command that `does` something only a lock makes safe
    /// (in words: "writes to the repository").
    pub fn require_lock(&self, does: &str) -> Result<()> {
        if self.no_lock {
            bail!("--no-lock is only for commands that read: this one {does}");
        }
        Ok(())
    }

    /// The storage of the repository and, for an encrypted one whose lock is lock
    /// objects, its keys (which open them): what `unlock` needs. A local directory's
    /// lock needs no key, so no password is asked for there.
    pub fn lock_storage(&self, out: &Output) -> Result<(Storage, Option<RepoKeys>)> {
        let storage = self.storage(out)?;
        if storage.backend.flock_dir().is_some() {
            return Ok((storage, None));
        }
        let keys = self.unlock(&storage, out)?.map(|(keys, _)| keys);
        Ok((storage, keys))
    }

    /// The keys of the repository in `storage` if it is encrypted, and the slot that
    /// opened them; `None` for a plaintext one, or where there is none (opening says).
    /// A plaintext config that may have replaced an encrypted one is refused
    /// ([`RepoOpener::refuse_plaintext`]) before anything is written; an encrypted
    /// repository, once unlocked, is remembered as one ([`security`]).
    fn unlock(&self, storage: &Storage, out: &Output) -> Result<Option<(RepoKeys, String)>> {
        let backend = &*storage.backend;
        let config = match backend.read(FileKind::Config, CONFIG_NAME) {
            Err(StoreError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
                return Ok(None)
            }
            config => config?,
        };
        if !config_is_sealed(&config) {
            // A config that is no config at all is named as such first.
            RepoConfig::decode(&config, &format!("{}/{CONFIG_NAME}", backend.location()))?;
            self.refuse_plaintext(storage)?;
            return Ok(None);
        }
        let default_file = match self.is_default() {
            true => Some(password::default_password_file()?),
            false => None,
        };
        let password = self
            .password
            .get(default_file.as_deref())
            .context("the repository is encrypted")?;
        let (keys, slot) = keys::unlock_for_config(backend, password.as_bytes(), &config)?;
        let id = hex(&keys.repo_id());
        if let Err(e) = security::remember_encrypted(&storage.location, &id) {
            out.warn(&format!(
                "cannot remember that repository {} is encrypted: {e:#}",
                storage.location
            ));
        }
        Ok(Some((keys, slot)))
    }

    /// Refuses the plaintext config of the repository in `storage` where it may have
    /// replaced an encrypted one's (docs/design/crypto.md, "Threat model"): when key
    /// slots stand beside it, when a password was given (the default repository's
    /// generated password file counts), or when this client remembers the repository
    /// as encrypted. Reads only.
    fn refuse_plaintext(&self, storage: &Storage) -> Result<()> {
        let mut reasons = Vec::new();
        if !storage.backend.list(FileKind::Key)?.is_empty() {
            reasons.push("key slots (keys/) stand beside it".to_string());
        }
        if let Some(source) = self.password.source() {
            reasons.push(format!(
                "a password was given ({source}); to open a plaintext repository, give none"
            ));
        }
        let default_file = self
            .is_default()
            .then(password::default_password_file)
            .and_then(Result::ok)
            .filter(|f| f.exists());
        if let Some(file) = default_file {
            reasons.push(format!(
                "the default repository's password file {} exists",
                file.display()
            ));
        }
        if let Some(record) = security::remembered_encrypted(&storage.location)? {
            reasons.push(format!(
                "it was encrypted when this client last opened it (if you replaced it with a \
                 plaintext repository yourself, remove {})",
                record.display()
            ));
        }
        if reasons.is_empty() {
            return Ok(());
        }
        Err(StoreError::PlaintextConfig {
            location: storage.location.to_string(),
            reason: reasons.join("; "),
        }
        .into())
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The id of the repository in `backend`: its key's, or its plaintext config's.
fn repo_id(backend: &dyn Backend, keys: Option<&RepoKeys>) -> Result<String> {
    if let Some(keys) = keys {
        return Ok(hex(&keys.repo_id()));
    }
    let raw = match backend.read(FileKind::Config, CONFIG_NAME) {
        Err(StoreError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
            return Err(StoreError::NotARepository(backend.location().into()).into())
        }
        raw => raw?,
    };
    Ok(RepoConfig::decode(&raw, &backend.location())?.id)
}

/// The cache of the remote repository `id`: `$XDG_CACHE_HOME/larder/<id>` (else
/// `~/.cache/larder/<id>`), in a directory marked as a cache (CACHEDIR.TAG) so that
/// backup tools skip it, private to its owner (0700) as its files are (0600).
pub fn cache_dir(id: &str) -> Result<PathBuf> {
    let base = match std::env::var_os("XDG_CACHE_HOME").filter(|v| !v.is_empty()) {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(
            std::env::var_os("HOME").context("neither XDG_CACHE_HOME nor HOME is set")?,
        )
        .join(".cache"),
    };
    let root = base.join("larder");
    larder_store::create_private_dir(&root)
        .with_context(|| format!("creating {}", root.display()))?;
    let tag = root.join("CACHEDIR.TAG");
    if !tag.exists() {
        let _ = larder_store::private_file_options()
            .create_new(true)
            .open(&tag)
            .and_then(|mut f| {
                std::io::Write::write_all(
                    &mut f,
                    b"Signature: 8a477f597d28d172789f06886806bc55\n# larder's cache of remote repositories' metadata\n",
                )
            });
    }
    Ok(root.join(id))
}

/// Creates a repository with `config` in `storage`: encrypted under the password
/// given (with its Argon2id parameters) if the config names encryption. This client
/// then remembers whether it is encrypted ([`security`]): creating is the user's own
/// say, whatever was there before.
pub fn create(
    storage: &Storage,
    config: &RepoConfig,
    password: Option<(&Password, KdfParams)>,
    out: &Output,
) -> Result<()> {
    let keys = match config.encryption {
        None => None,
        Some(encryption) => {
            let fingerprint = match config.hash {
                HashAlgo::Sha256 => FingerprintKind::HmacSha256,
                _ => FingerprintKind::KeyedBlake3,
            };
            let keys = RepoKeys::generate(config.id_bytes()?, encryption.aead, fingerprint);
            let (password, params) =
                password.context("an encrypted repository needs a password")?;
            let slot = new_slot(&keys, KeyKind::Full, password, params)?;
            Some((keys, slot))
        }
    };
    let slot_id = larder_crypto::random_id_hex(8);
    match (&storage.local, &keys) {
        (Some(path), None) => Repository::init(path, config)?,
        (Some(path), Some((keys, slot))) => {
            Repository::init_encrypted(path, config, keys, &slot_id, slot)?
        }
        (None, keys) => {
            let state = cache_dir(&config.id)?;
            let keys_slot = keys.as_ref().map(|(k, s)| (k, (slot_id.as_str(), s)));
            Repository::init_in(
                &*storage.backend,
                &state,
                config,
                keys_slot.map(|(k, _)| k),
                keys_slot.map(|(_, s)| s),
            )?
        }
    }
    let remembered = match config.encryption {
        Some(_) => security::remember_encrypted(&storage.location, &config.id),
        None => security::forget(&storage.location),
    };
    if let Err(e) = remembered {
        out.warn(&format!(
            "cannot remember whether repository {} is encrypted: {e:#}",
            storage.location
        ));
    }
    Ok(())
}

/// A key slot of `kind` for `keys` under `password`, naming this host, user and time.
pub fn new_slot(
    keys: &RepoKeys,
    kind: KeyKind,
    password: &Password,
    params: KdfParams,
) -> Result<KeySlot> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let created = larder_engine::utc_rfc3339(now.as_secs() as i64, 0).replace(".000000000Z", "Z");
    Ok(KeySlot::create(
        keys,
        kind,
        password.as_bytes(),
        params,
        crate::host::hostname(),
        crate::host::username(),
        created,
    )?)
}

fn default_repo() -> Result<PathBuf> {
    let base = match std::env::var_os("XDG_DATA_HOME").filter(|v| !v.is_empty()) {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(
            std::env::var_os("HOME").context("neither --repo, LARDER_REPO nor HOME is set")?,
        )
        .join(".local/share"),
    };
    Ok(base.join("larder").join("repo"))
}

/// What opening did about garbage collections that were interrupted.
fn report_gc_recovery(report: &OpenReport, out: &Output) {
    for id in &report.finished_gc {
        out.note(&format!(
            "finished garbage collection (or repair) {id:016x}, which was interrupted after it committed"
        ));
    }
    for id in &report.rolled_back_gc {
        out.note(&format!(
            "rolled back garbage collection (or repair) {id:016x}, which was interrupted before it committed; nothing was deleted"
        ));
    }
    for (name, reason) in &report.bad_gc_plans {
        out.warn(&format!(
            "gc plan {name} is damaged ({reason}); removed it and deleted nothing"
        ));
    }
}

/// What opening found and did about the index and the containers.
fn report_index_recovery(report: &OpenReport, out: &Output) {
    let lost = report.adopted_below_named.len();
    if report.adopted_containers.len() > lost {
        out.note(&format!(
            "indexed {} container(s) that no index segment names (left by an interrupted backup, or by a lost segment: `larder check` tells them apart); the next backup records them",
            report.adopted_containers.len() - lost
        ));
    }
    if lost > 0 && report.bad_segments.is_empty() {
        out.warn(&format!(
            "{lost} container(s) that no index segment names lie below named ones: an index segment was deleted or lost; `larder repair` (or `larder index rebuild`) writes it again"
        ));
    }
    for (name, reason) in &report.bad_segments {
        out.warn(&format!(
            "index segment {name} is damaged ({reason}); its containers were read directly"
        ));
    }
    if !report.disk_caught_up.is_empty() {
        out.note(&format!(
            "the disk index caught up with {} container(s) it lacked",
            report.disk_caught_up.len()
        ));
    }
    if let Some(why) = &report.disk_rebuilt {
        out.note(&format!(
            "the disk index was {why}: rebuilt it from the index segments"
        ));
    }
    if let Some(why) = &report.disk_fallback {
        out.warn(&format!(
            "the disk index is {why}: using the memory index for this command; a writer (e.g. `larder index rebuild`) repairs it"
        ));
    }
    for (id, reason) in &report.bad_containers {
        out.warn(&format!(
            "container {id:016x} is damaged and ignored: {reason}"
        ));
    }
}
