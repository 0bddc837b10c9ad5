//! Key slots (docs/design/crypto.md, "Key slots"): `keys/<id>.key` in the repository,
//! listed, unlocked, added and removed. A slot is written whole in `tmp/` and renamed
//! into place, like every repository file.

use std::fs;
use std::path::{Path, PathBuf};

use larder_crypto::{KeySlot, RepoKeys};

use crate::backend::sync_dir;
use crate::error::{Result, StoreError};

const DIR: &str = "keys";
const EXTENSION: &str = "key";

fn slot_path(root: &Path, id: &str) -> PathBuf {
    root.join(DIR).join(format!("{id}.{EXTENSION}"))
}

/// Every slot file's id, sorted, with the slot or why it does not parse.
pub fn list_slots(root: &Path) -> Result<Vec<(String, Result<KeySlot>)>> {
    let dir = root.join(DIR);
    let entries = fs::read_dir(&dir).map_err(|e| match e.kind() {
        // A cluster node's repository: its key is the cluster's (docs/design/crypto.md).
        std::io::ErrorKind::NotFound => StoreError::Key(format!(
            "slots: {} is missing; a cluster node's repository has none (its key is the \
             cluster's: open it through the cluster)",
            dir.display()
        )),
        _ => StoreError::io(&dir, e),
    })?;
    let mut ids = Vec::new();
    for entry in entries {
        let path = entry.map_err(|e| StoreError::io(&dir, e))?.path();
        if path.extension().is_some_and(|e| e == EXTENSION) {
            if let Some(id) = path.file_stem().and_then(|s| s.to_str()) {
                ids.push(id.to_string());
            }
        }
    }
    ids.sort();
    Ok(ids
        .into_iter()
        .map(|id| {
            let path = slot_path(root, &id);
            let slot = fs::read(&path)
                .map_err(|e| StoreError::io(&path, e))
                .and_then(|bytes| {
                    KeySlot::parse(&bytes).map_err(|e| {
                        StoreError::Key(format!("file {} is damaged: {e}", path.display()))
                    })
                });
            (id, slot)
        })
        .collect())
}

/// Unlocks the repository's key with `password`: the first slot it opens
/// ([`unlock_among`] of the repository's slots). Returns the keys and the slot's id.
pub fn unlock(root: &Path, password: &[u8]) -> Result<(RepoKeys, String)> {
    unlock_among(list_slots(root)?, password, None)
}

/// Unlocks the first of `slots` (ids with the slot or why it does not parse, as
/// [`list_slots`] gives them) that `password` opens and, when `repo_id` is given,
/// whose key material is that repository's. Returns the keys and the slot's id.
/// Damaged slots are skipped; if none opens, the damage of the last damaged slot
/// (which may have been the one), else [`StoreError::WrongPassword`].
pub fn unlock_among(
    slots: Vec<(String, Result<KeySlot>)>,
    password: &[u8],
    repo_id: Option<[u8; 16]>,
) -> Result<(RepoKeys, String)> {
    let mut damage = None;
    for (id, slot) in slots {
        match slot {
            Ok(slot) => {
                if let Ok(keys) = slot.unlock(password, repo_id) {
                    return Ok((keys, id));
                }
            }
            Err(e) => damage = Some(e),
        }
    }
    Err(damage.unwrap_or(StoreError::WrongPassword))
}

/// Writes slot `id` durably; refuses to replace an existing one.
pub fn write_slot(root: &Path, id: &str, slot: &KeySlot) -> Result<()> {
    let dir = root.join(DIR);
    fs::create_dir_all(&dir).map_err(|e| StoreError::io(&dir, e))?;
    let dest = slot_path(root, id);
    if dest.exists() {
        return Err(StoreError::Key(format!("{id} already exists")));
    }
    let tmp = root.join("tmp").join(format!("{id}.{EXTENSION}"));
    crate::direct::write_durable(&tmp, &slot.to_bytes()).map_err(|e| StoreError::io(&tmp, e))?;
    fs::rename(&tmp, &dest).map_err(|e| StoreError::io(&dest, e))?;
    sync_dir(&dir)
}

/// Removes slot `id` durably. Refuses to remove the last slot of a full key.
pub fn remove_slot(root: &Path, id: &str) -> Result<()> {
    let slots = list_slots(root)?;
    let Some((_, target)) = slots.iter().find(|(s, _)| s == id) else {
        return Err(StoreError::Key(format!(
            "{id} does not exist (see `larder key list`)"
        )));
    };
    let is_full = |s: &Result<KeySlot>| {
        s.as_ref()
            .is_ok_and(|s| s.kind() == larder_crypto::KeyKind::Full)
    };
    let other_full = slots.iter().any(|(s, slot)| s != id && is_full(slot));
    if is_full(target) && !other_full {
        return Err(StoreError::Key(format!(
            "{id} is the repository's last full key; add another with `larder key add` first"
        )));
    }
    let path = slot_path(root, id);
    fs::remove_file(&path).map_err(|e| StoreError::io(&path, e))?;
    sync_dir(&root.join(DIR))
}
