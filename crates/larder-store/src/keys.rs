//! Key slots (docs/design/crypto.md, "Key slots"): the [`FileKind::Key`] files of a
//! repository (`keys/<id>.key`), listed, unlocked, added and removed through its
//! backend.

use larder_crypto::{KeySlot, RepoKeys};

use crate::backend::{Backend, FileKind, CONFIG_NAME};
use crate::error::{Result, StoreError};
use crate::repo::RepoConfig;

/// Every slot's id, sorted, with the slot or why it does not parse. A repository
/// without slots is an error: a cluster node's (its key is the cluster's).
pub fn list_slots(backend: &dyn Backend) -> Result<Vec<(String, Result<KeySlot>)>> {
    let ids = backend.list(FileKind::Key)?;
    if ids.is_empty() {
        return Err(StoreError::Key(format!(
            "slots: {} has none; a cluster node's repository has none (its key is the \
             cluster's: open it through the cluster)",
            backend.location()
        )));
    }
    Ok(ids
        .into_iter()
        .map(|id| {
            let slot = backend.read(FileKind::Key, &id).and_then(|bytes| {
                KeySlot::parse(&bytes).map_err(|e| {
                    StoreError::Key(format!(
                        "file {}/{} is damaged: {e}",
                        backend.location(),
                        FileKind::Key.relative_path(&id)
                    ))
                })
            });
            (id, slot)
        })
        .collect())
}

/// Unlocks the repository's key with `password`: the first slot it opens whose keys
/// also open the repository's sealed config ([`unlock_for_config`]), or, where there is
/// no config yet, the first slot it opens. Returns the keys and the slot's id.
pub fn unlock(backend: &dyn Backend, password: &[u8]) -> Result<(RepoKeys, String)> {
    match backend.read(FileKind::Config, CONFIG_NAME) {
        Ok(config) => unlock_for_config(backend, password, &config),
        Err(StoreError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
            unlock_among(list_slots(backend)?, password, None)
        }
        Err(e) => Err(e),
    }
}

/// Unlocks, of the slots `password` opens, the first whose keys open `config` (the
/// repository's config file as read). A slot of another repository copied into `keys/`
/// under the same password opens too: it is passed over, so that it cannot make the
/// repository unusable. If slots open but none opens the config, the config's error
/// with the first of them; if none opens, as [`unlock_among`].
pub fn unlock_for_config(
    backend: &dyn Backend,
    password: &[u8],
    config: &[u8],
) -> Result<(RepoKeys, String)> {
    let name = format!("{}/{CONFIG_NAME}", backend.location());
    let (mut refusal, mut damage) = (None, None);
    for (id, slot) in list_slots(backend)? {
        let slot = match slot {
            Ok(slot) => slot,
            Err(e) => {
                damage = Some(e);
                continue;
            }
        };
        let Ok(keys) = slot.unlock(password, None) else {
            continue;
        };
        match RepoConfig::decode_with(config, &name, Some(&keys)) {
            Ok(_) => return Ok((keys, id)),
            Err(e) => {
                refusal.get_or_insert(e);
            }
        }
    }
    Err(refusal.or(damage).unwrap_or(StoreError::WrongPassword))
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
pub fn write_slot(backend: &dyn Backend, id: &str, slot: &KeySlot) -> Result<()> {
    if !backend.write_new(FileKind::Key, id, &slot.to_bytes())? {
        return Err(StoreError::Key(format!("{id} already exists")));
    }
    backend.sync(FileKind::Key)
}

/// Removes slot `id` durably. Refuses to remove the last slot of a full key.
pub fn remove_slot(backend: &dyn Backend, id: &str) -> Result<()> {
    let slots = list_slots(backend)?;
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
    backend.remove(FileKind::Key, id)?;
    backend.sync(FileKind::Key)
}
