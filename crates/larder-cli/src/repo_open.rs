//! Finding, creating and opening the repository: `--repo` (or `LARDER_REPO`, or the
//! default one under `$XDG_DATA_HOME`, created on first use, encrypted with a generated
//! password kept under `$XDG_CONFIG_HOME`), its password, and `--retry-lock`. Opening
//! says what the repository recovered from (interrupted gc, unindexed containers, a
//! stale disk index) in notes and warnings.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use larder_chunk::{ChunkerConfig, ChunkerKind};
use larder_crypto::{FingerprintKind, KdfParams, KeyKind, KeySlot, RepoKeys};
use larder_hash::HashAlgo;
use larder_store::{
    config_is_sealed, keys, LocalBackend, LockMode, OpenReport, RepoConfig, Repository,
};

use crate::output::Output;
use crate::password::{self, Password, PasswordArgs};

/// The global options that say which repository a command works on, its password, and
/// how long it waits for another process's lock.
pub struct RepoOpener {
    path: Option<PathBuf>,
    retry_lock: Duration,
    pub password: PasswordArgs,
}

impl RepoOpener {
    pub fn new(path: Option<PathBuf>, retry_lock: Duration, password: PasswordArgs) -> Self {
        Self {
            path,
            retry_lock,
            password,
        }
    }

    /// Whether the command works on the default repository.
    pub fn is_default(&self) -> bool {
        self.path.is_none()
    }

    /// Where `init` creates the repository: `--repo`, or the default path.
    pub fn init_path(&self) -> Result<PathBuf> {
        match &self.path {
            Some(p) => Ok(p.clone()),
            None => default_repo(),
        }
    }

    /// The repository to use; the default one is created on first use.
    pub fn path(&self, out: &Output) -> Result<PathBuf> {
        if let Some(p) = &self.path {
            return Ok(p.clone());
        }
        let path = default_repo()?;
        if !path.join("config").exists() {
            let chunker = ChunkerConfig {
                kind: ChunkerKind::Keyed,
                ..ChunkerConfig::default()
            };
            let config = RepoConfig::new(chunker, HashAlgo::Blake3)
                .with_encryption(larder_crypto::AeadKind::Aes256Gcm);
            let generated = self.password.given()?.is_none();
            let password = self.new_default_password()?;
            let params = if generated {
                KdfParams::GENERATED
            } else {
                KdfParams::DEFAULT
            };
            create_encrypted(&path, &config, &password, params).with_context(|| {
                format!("creating the default repository at {}", path.display())
            })?;
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
        }
        Ok(path)
    }

    /// The password of a new default repository: a given one, else one generated into
    /// the default password file.
    pub fn new_default_password(&self) -> Result<Password> {
        match self.password.given()? {
            Some(p) => Ok(p),
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
        let path = self.path(out)?;
        let (keys, slot) = match self.unlock(&path)? {
            Some((keys, slot)) => (Some(keys), Some(slot)),
            None => (None, None),
        };
        let backend = Arc::new(LocalBackend::new(&path));
        let repo = Repository::open_with(&path, mode, self.retry_lock, backend, keys)?;
        report_gc_recovery(repo.report(), out);
        report_index_recovery(repo.report(), out);
        Ok((repo, slot))
    }

    /// The keys of the repository at `path` if it is encrypted, and the slot that
    /// opened them.
    fn unlock(&self, path: &Path) -> Result<Option<(RepoKeys, String)>> {
        let Ok(config) = std::fs::read(path.join("config")) else {
            return Ok(None);
        };
        if !config_is_sealed(&config) {
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
        Ok(Some(keys::unlock(path, password.as_bytes())?))
    }
}

/// Creates an encrypted repository at `path` with `config` (which names its AEAD), its
/// first key slot wrapped under `password`.
pub fn create_encrypted(
    path: &Path,
    config: &RepoConfig,
    password: &Password,
    params: KdfParams,
) -> Result<()> {
    let aead = config
        .encryption
        .context("the config names no encryption")?
        .aead;
    let fingerprint = match config.hash {
        HashAlgo::Sha256 => FingerprintKind::HmacSha256,
        _ => FingerprintKind::KeyedBlake3,
    };
    let keys = RepoKeys::generate(config.id_bytes()?, aead, fingerprint);
    let slot = new_slot(&keys, KeyKind::Full, password, params)?;
    Repository::init_encrypted(path, config, &keys, &larder_crypto::random_id_hex(8), &slot)?;
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
            "finished garbage collection {id:016x}, which was interrupted after it committed"
        ));
    }
    for id in &report.rolled_back_gc {
        out.note(&format!(
            "rolled back garbage collection {id:016x}, which was interrupted before it committed; nothing was deleted"
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
    if !report.adopted_containers.is_empty() {
        out.note(&format!(
            "indexed {} container(s) that no index segment names (left by an interrupted backup); the next backup records them",
            report.adopted_containers.len()
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
