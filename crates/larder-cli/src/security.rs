//! What this client remembers about the repositories it opened, as borg's security
//! directory does: that a repository was encrypted, so that a plaintext config later
//! found at the same place is refused even when the storage also removed the key
//! slots and no password is given (docs/design/crypto.md, "Threat model").
//!
//! A record is `$XDG_CONFIG_HOME/larder/security/<key>` (else `~/.config/...`),
//! mode 0600 in a 0700 directory, holding JSON `{"location": L, "id": I,
//! "encrypted": true}`. Its key is the first 32 hex digits of the BLAKE3 hash of the
//! repository's location: the canonical path of a local directory (symlinks and `..`
//! resolved), or the URL of a remote one without trailing slashes. Invariant: the
//! key never depends on what the storage says. A record keyed by the repository id
//! would be worthless here, because the id is in the config, which is what a swapped
//! config chooses.

use std::fs;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::PathBuf;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use crate::location::RepoLocation;

/// What is remembered of one repository.
#[derive(Serialize, Deserialize)]
struct Record {
    location: String,
    id: String,
    encrypted: bool,
}

/// The directory of the records.
fn records_dir() -> Result<PathBuf> {
    let base = match std::env::var_os("XDG_CONFIG_HOME").filter(|v| !v.is_empty()) {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(std::env::var_os("HOME").context("HOME is not set")?).join(".config"),
    };
    Ok(base.join("larder").join("security"))
}

/// The location as records name it: see the module's documentation.
fn canonical(location: &RepoLocation) -> String {
    match location {
        RepoLocation::Local(path) => fs::canonicalize(path)
            .or_else(|_| std::path::absolute(path))
            .unwrap_or_else(|_| path.clone())
            .display()
            .to_string(),
        RepoLocation::S3(url) | RepoLocation::Sftp(url) => url.trim_end_matches('/').to_string(),
    }
}

/// The record file of the repository at `location`.
pub fn record_path(location: &RepoLocation) -> Result<PathBuf> {
    let hash = larder_hash::HashAlgo::Blake3
        .fingerprint(canonical(location).as_bytes())
        .to_hex();
    Ok(records_dir()?.join(&hash[..32]))
}

/// Whether this client remembers the repository at `location` as encrypted: the
/// record's path if it does. A record that cannot be read or parsed counts as one
/// (only larder writes there, and only for encrypted repositories).
pub fn remembered_encrypted(location: &RepoLocation) -> Result<Option<PathBuf>> {
    let path = record_path(location)?;
    match fs::read(&path) {
        Ok(bytes) => {
            let encrypted = serde_json::from_slice::<Record>(&bytes).map_or(true, |r| r.encrypted);
            Ok(encrypted.then_some(path))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(_) => Ok(Some(path)),
    }
}

/// Remembers that the repository at `location`, whose id is `id`, is encrypted
/// (written only when no such record is there yet).
pub fn remember_encrypted(location: &RepoLocation, id: &str) -> Result<()> {
    let path = record_path(location)?;
    let record = Record {
        location: canonical(location),
        id: id.to_string(),
        encrypted: true,
    };
    let bytes = serde_json::to_vec(&record).expect("a record serializes");
    if fs::read(&path).is_ok_and(|old| old == bytes) {
        return Ok(());
    }
    let dir = path.parent().expect("a record has a directory");
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("creating {}", dir.display()))?;
    let tmp = dir.join(format!(".{}.tmp", std::process::id()));
    let written = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .and_then(|mut f| f.write_all(&bytes).and_then(|()| f.sync_all()))
        .and_then(|()| fs::rename(&tmp, &path));
    if written.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    written.with_context(|| format!("writing {}", path.display()))
}

/// Forgets the repository at `location`: `init` made a plaintext one there, which is
/// the user's choice, not the storage's.
pub fn forget(location: &RepoLocation) -> Result<()> {
    let path = record_path(location)?;
    match fs::remove_file(&path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(e).with_context(|| format!("removing {}", path.display()))
        }
        _ => Ok(()),
    }
}
