//! An encrypted cluster's key (docs/design/crypto.md, "Cluster"): one key for the whole
//! cluster, wrapped in key slots under `keys/` in the shared storage (a directory's
//! files or a bucket's objects, in the format of a repository's slots), made by
//! `larder cluster init` and unlocked by every node with the cluster's password. The
//! cluster's config in etcd says which cluster id, AEAD and fingerprint the key has.

use std::fs;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

use larder_crypto::{AeadKind, FingerprintKind, KeySlot, RepoKeys};
use larder_store::{keys::unlock_among, ObjectBackend, StoreError};

use crate::coord::ClusterEncryption;
use crate::error::{ClusterError, Result};
use crate::storage::{parse_dir, SharedStorage};

/// The directory (or key prefix) of the slots, and their extension.
const DIR: &str = "keys";
const EXTENSION: &str = "key";

/// Key slots as [`larder_store::keys::list_slots`] gives them: each id with its slot
/// or why it does not parse.
pub type Slots = Vec<(String, std::result::Result<KeySlot, StoreError>)>;

fn file_name(id: &str) -> String {
    format!("{id}.{EXTENSION}")
}

/// The id of a slot's file or object name, if it is one.
fn slot_id(name: &str) -> Option<&str> {
    name.strip_suffix(EXTENSION)
        .and_then(|stem| stem.strip_suffix('.'))
        .filter(|id| !id.is_empty() && !id.starts_with('.'))
}

fn parse_slot(
    name: String,
    bytes: std::result::Result<Vec<u8>, StoreError>,
) -> std::result::Result<KeySlot, StoreError> {
    bytes.and_then(|bytes| {
        KeySlot::parse(&bytes).map_err(|e| StoreError::Key(format!("file {name} is damaged: {e}")))
    })
}

/// 32 lower-case hex digits as 16 bytes.
fn parse_id(hex: &str) -> Option<[u8; 16]> {
    let digits = hex.as_bytes();
    if digits.len() != 32
        || !digits
            .iter()
            .all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f'))
    {
        return None;
    }
    let mut id = [0u8; 16];
    for (i, b) in id.iter_mut().enumerate() {
        *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(id)
}

fn key_error(what: &str, e: StoreError) -> ClusterError {
    ClusterError::Key(format!("{what}: {}", larder_store::error_chain(&e)))
}

impl ClusterEncryption {
    /// What etcd records of `keys`.
    pub fn of(keys: &RepoKeys) -> Self {
        Self {
            aead: keys.aead(),
            fingerprint: keys.fingerprint_kind(),
            id: keys.repo_id().iter().map(|b| format!("{b:02x}")).collect(),
        }
    }

    /// The cluster id as 16 bytes.
    pub fn id_bytes(&self) -> Result<[u8; 16]> {
        parse_id(&self.id).ok_or_else(|| {
            ClusterError::Key(format!(
                "the cluster's config in etcd: cluster id {:?} is not 32 lower-case hex digits",
                self.id
            ))
        })
    }

    /// Refuses `keys` unless they are this cluster's: its id, AEAD and fingerprint.
    pub fn check(&self, keys: &RepoKeys) -> Result<()> {
        let theirs = Self::of(keys);
        if &theirs != self {
            return Err(ClusterError::Key(format!(
                "the key is not this cluster's: the cluster is {} ({}, {}), the key {} ({}, {})",
                self.id,
                self.aead.name(),
                self.fingerprint.name(),
                theirs.id,
                theirs.aead.name(),
                theirs.fingerprint.name()
            )));
        }
        Ok(())
    }
}

/// Where a cluster's key slots are: `keys/` in its shared directory (`Dir`: the
/// directory) or bucket (`Object`: the cluster's root in it).
#[derive(Debug, Clone)]
pub enum KeySlots {
    Dir(PathBuf),
    Object(Arc<ObjectBackend>),
}

impl SharedStorage {
    /// The cluster's key slots in this storage.
    pub fn key_slots(&self) -> KeySlots {
        match self {
            Self::Dir(dir) => KeySlots::Dir(dir.clone()),
            Self::Object { root, .. } => KeySlots::Object(root.clone()),
        }
    }
}

impl KeySlots {
    /// The key slots of the shared storage at `url` (`s3://BUCKET/PREFIX`,
    /// `file://PATH` or `PATH`), for `cluster init`, which needs no cache directory.
    pub fn parse(url: &str) -> std::result::Result<Self, StoreError> {
        if url.starts_with("s3://") {
            return Ok(Self::Object(Arc::new(ObjectBackend::from_url(url)?)));
        }
        parse_dir(url).map(Self::Dir)
    }

    /// Where the key slots are, for messages.
    pub fn location(&self) -> PathBuf {
        match self {
            Self::Dir(dir) => dir.join(DIR),
            Self::Object(root) => root.describe(DIR),
        }
    }

    /// The cluster's key slots, sorted by id; none when there is no `keys/`.
    pub fn list(&self) -> std::result::Result<Slots, StoreError> {
        let mut slots = Vec::new();
        match self {
            Self::Dir(dir) => {
                let dir = dir.join(DIR);
                let listing = match fs::read_dir(&dir) {
                    Ok(listing) => listing,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(slots),
                    Err(e) => return Err(StoreError::io(&dir, e)),
                };
                for entry in listing {
                    let path = entry.map_err(|e| StoreError::io(&dir, e))?.path();
                    let Some(id) = path.file_name().and_then(|n| n.to_str()).and_then(slot_id)
                    else {
                        continue;
                    };
                    let bytes = fs::read(&path).map_err(|e| StoreError::io(&path, e));
                    slots.push((
                        id.to_string(),
                        parse_slot(path.display().to_string(), bytes),
                    ));
                }
            }
            Self::Object(root) => {
                for name in root.list_keys(DIR)? {
                    let Some(id) = slot_id(&name) else { continue };
                    let key = format!("{DIR}/{name}");
                    let bytes = root.get(&key);
                    slots.push((
                        id.to_string(),
                        parse_slot(root.describe(&key).display().to_string(), bytes),
                    ));
                }
            }
        }
        slots.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(slots)
    }

    /// Writes key slot `id` durably, create-only: a slot already there stays, and is an
    /// error. In a directory: written beside, fsynced, renamed, the directory fsynced.
    pub fn write(&self, id: &str, slot: &KeySlot) -> std::result::Result<(), StoreError> {
        let taken = || {
            StoreError::Key(format!(
                "{id} already exists in {}",
                self.location().display()
            ))
        };
        let bytes = slot.to_bytes();
        match self {
            Self::Dir(dir) => {
                let dir = dir.join(DIR);
                fs::create_dir_all(&dir).map_err(|e| StoreError::io(&dir, e))?;
                let dest = dir.join(file_name(id));
                if dest.exists() {
                    return Err(taken());
                }
                let tmp = dir.join(format!(".{id}.{EXTENSION}.tmp"));
                let mut file = fs::File::create(&tmp).map_err(|e| StoreError::io(&tmp, e))?;
                file.write_all(&bytes)
                    .and_then(|()| file.sync_all())
                    .map_err(|e| StoreError::io(&tmp, e))?;
                fs::rename(&tmp, &dest).map_err(|e| StoreError::io(&dest, e))?;
                fs::File::open(&dir)
                    .and_then(|d| d.sync_all())
                    .map_err(|e| StoreError::io(&dir, e))
            }
            Self::Object(root) => {
                if root.put(&format!("{DIR}/{}", file_name(id)), &bytes, true)? {
                    Ok(())
                } else {
                    Err(taken())
                }
            }
        }
    }

    /// Removes key slot `id`.
    pub fn remove(&self, id: &str) -> std::result::Result<(), StoreError> {
        match self {
            Self::Dir(dir) => {
                let path = dir.join(DIR).join(file_name(id));
                fs::remove_file(&path).map_err(|e| StoreError::io(&path, e))
            }
            Self::Object(root) => root.delete(&format!("{DIR}/{}", file_name(id))),
        }
    }

    /// Unlocks the key of the cluster whose config says `encryption`: the first slot
    /// that `password` opens and that holds this cluster's key material, which must
    /// also have the config's AEAD and fingerprint. None opening is
    /// [`ClusterError::Key`] "wrong password or no matching key".
    pub fn unlock(&self, password: &[u8], encryption: &ClusterEncryption) -> Result<RepoKeys> {
        let slots = self
            .list()
            .map_err(|e| key_error("the cluster's key slots", e))?;
        if slots.is_empty() {
            return Err(ClusterError::Key(format!(
                "the cluster is encrypted but {} holds no key slot",
                self.location().display()
            )));
        }
        let (keys, _) = unlock_among(slots, password, Some(encryption.id_bytes()?))
            .map_err(|e| ClusterError::Key(larder_store::error_chain(&e)))?;
        encryption.check(&keys)?;
        Ok(keys)
    }

    /// The key for `larder cluster init`: the key the slots in this storage already
    /// hold, unlocked with `password` (a repeated init, or etcd made again; the one of
    /// cluster `id` when etcd names one), which must have `aead` and `fingerprint`;
    /// else a new full key for a new random cluster id, with `aead` and `fingerprint`,
    /// whose first slot `new_slot` makes and which is written here. Returns the key and
    /// the id of the slot written, if one was.
    pub fn create_or_unlock_key(
        &self,
        password: &[u8],
        id: Option<&ClusterEncryption>,
        aead: AeadKind,
        fingerprint: FingerprintKind,
        new_slot: impl FnOnce(&RepoKeys) -> std::result::Result<KeySlot, String>,
    ) -> Result<(RepoKeys, Option<String>)> {
        let slots = self
            .list()
            .map_err(|e| key_error("the cluster's key slots", e))?;
        if !slots.is_empty() {
            let expected = id.map(ClusterEncryption::id_bytes).transpose()?;
            let (keys, _) = unlock_among(slots, password, expected).map_err(|e| {
                ClusterError::Key(format!(
                    "{} holds key slots already: {}",
                    self.location().display(),
                    larder_store::error_chain(&e)
                ))
            })?;
            if (keys.aead(), keys.fingerprint_kind()) != (aead, fingerprint) {
                return Err(ClusterError::Key(format!(
                    "the key in {} is {} with {} fingerprints, not {} with {}",
                    self.location().display(),
                    keys.aead().name(),
                    keys.fingerprint_kind().name(),
                    aead.name(),
                    fingerprint.name()
                )));
            }
            return Ok((keys, None));
        }
        if let Some(id) = id {
            return Err(ClusterError::Key(format!(
                "the cluster {} in etcd is encrypted, but {} holds no key slot: is this its storage?",
                id.id,
                self.location().display()
            )));
        }
        let cluster_id =
            parse_id(&larder_crypto::random_id_hex(16)).expect("random_id_hex gives hex digits");
        let keys = RepoKeys::generate(cluster_id, aead, fingerprint);
        let slot = new_slot(&keys).map_err(ClusterError::Key)?;
        let slot_id = larder_crypto::random_id_hex(8);
        self.write(&slot_id, &slot)
            .map_err(|e| key_error("writing the cluster's first key slot", e))?;
        Ok((keys, Some(slot_id)))
    }
}

/// `larder cluster init` of an encrypted cluster: `config` (its `encryption` is
/// filled in here) with the key of `slots` (unlocked with `password`: a repeated init,
/// or etcd made again), else a new key with `aead` and `fingerprint` whose first slot
/// `new_slot` makes. When etcd refuses the config (another cluster under the prefix,
/// or another init that won a race), the slot this call wrote is removed again, so
/// that only slots of the cluster etcd names stay. Returns the config written.
pub async fn init_encrypted_cluster(
    etcd: &crate::node::EtcdTarget,
    slots: &KeySlots,
    mut config: crate::coord::ClusterConfig,
    password: &[u8],
    (aead, fingerprint): (AeadKind, FingerprintKind),
    new_slot: impl FnOnce(&RepoKeys) -> std::result::Result<KeySlot, String>,
) -> Result<crate::coord::ClusterConfig> {
    let existing = crate::node::cluster_config(etcd).await?;
    let existing_key = match &existing {
        // A plaintext cluster: another config, refused with no slot written.
        Some(c) if c.encryption.is_none() => {
            return Err(crate::coord::CoordError::ConfigMismatch {
                stored: format!("{c:?}"),
                asked: format!("{config:?}, encrypted"),
            }
            .into())
        }
        Some(c) => c.encryption.as_ref(),
        None => None,
    };
    let (keys, written) =
        slots.create_or_unlock_key(password, existing_key, aead, fingerprint, new_slot)?;
    config.encryption = Some(ClusterEncryption::of(&keys));
    if let Err(e) = crate::node::init_cluster(etcd, &config).await {
        if let Some(id) = written {
            if let Err(removing) = slots.remove(&id) {
                tracing::warn!("removing key slot {id}, which no cluster uses: {removing}");
            }
        }
        return Err(e);
    }
    Ok(config)
}

#[cfg(test)]
mod tests {
    use larder_crypto::{KdfParams, KeyKind};

    use super::*;

    const PASSWORD: &[u8] = b"cluster password";
    const ALGORITHMS: (AeadKind, FingerprintKind) =
        (AeadKind::Aes256Gcm, FingerprintKind::KeyedBlake3);

    fn slot(keys: &RepoKeys) -> std::result::Result<KeySlot, String> {
        KeySlot::create(
            keys,
            KeyKind::Full,
            PASSWORD,
            KdfParams::GENERATED,
            "host".into(),
            "user".into(),
            "2026-11-28T00:00:00Z".into(),
        )
        .map_err(|e| e.to_string())
    }

    fn create(slots: &KeySlots) -> Result<(RepoKeys, Option<String>)> {
        slots.create_or_unlock_key(PASSWORD, None, ALGORITHMS.0, ALGORITHMS.1, slot)
    }

    #[test]
    fn only_slot_files_are_slots() {
        assert_eq!(slot_id("0123abcd.key"), Some("0123abcd"));
        for name in [
            ".0123abcd.key.tmp",
            ".x.key",
            ".key",
            "key",
            "x.keys",
            "x-key",
        ] {
            assert_eq!(slot_id(name), None, "{name}");
        }
        assert_eq!(
            parse_id("00112233445566778899aabbccddeeff").unwrap()[15],
            0xff
        );
        for bad in [
            "00112233445566778899AABBCCDDEEFF",
            "0011",
            "+0112233445566778899aabbccddeeff",
        ] {
            assert_eq!(parse_id(bad), None, "{bad}");
        }
    }

    #[test]
    fn init_makes_one_slot_and_every_later_init_and_node_unlocks_it() {
        let dir = tempfile::tempdir().unwrap();
        let slots = KeySlots::Dir(dir.path().to_path_buf());
        assert!(slots.list().unwrap().is_empty());
        let (keys, written) = create(&slots).unwrap();
        let id = written.expect("a first slot");
        assert!(dir.path().join(format!("keys/{id}.key")).is_file());
        let encryption = ClusterEncryption::of(&keys);
        assert_eq!(encryption.id_bytes().unwrap(), keys.repo_id());

        // Again: the same key, no new slot; with the id etcd names, too.
        let (again, written) = create(&slots).unwrap();
        assert_eq!((again.repo_id(), written), (keys.repo_id(), None));
        let named = slots.create_or_unlock_key(
            PASSWORD,
            Some(&encryption),
            ALGORITHMS.0,
            ALGORITHMS.1,
            slot,
        );
        assert_eq!(named.unwrap().0.repo_id(), keys.repo_id());
        assert_eq!(slots.list().unwrap().len(), 1);
        // Another AEAD than the key's, or another password: refused.
        let other = slots.create_or_unlock_key(
            PASSWORD,
            None,
            AeadKind::XChaCha20Poly1305,
            ALGORITHMS.1,
            slot,
        );
        assert!(other
            .unwrap_err()
            .to_string()
            .contains("xchacha20-poly1305"));
        let wrong = slots.create_or_unlock_key(b"other", None, ALGORITHMS.0, ALGORITHMS.1, slot);
        assert!(wrong
            .unwrap_err()
            .to_string()
            .contains("wrong password or no matching key"));

        assert_eq!(
            slots.unlock(PASSWORD, &encryption).unwrap().repo_id(),
            keys.repo_id()
        );
        let wrong = slots.unlock(b"other", &encryption).unwrap_err().to_string();
        assert_eq!(wrong, "wrong password or no matching key");
        // A slot of another cluster in the same place is not this cluster's key.
        let mut elsewhere = encryption.clone();
        elsewhere.id = "00112233445566778899aabbccddeeff".into();
        assert!(slots.unlock(PASSWORD, &elsewhere).is_err());

        slots.remove(&id).unwrap();
        assert!(slots.list().unwrap().is_empty());
        let none = slots.unlock(PASSWORD, &encryption).unwrap_err().to_string();
        assert!(none.contains("holds no key slot"), "{none}");
    }

    #[test]
    fn a_slot_is_never_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let slots = KeySlots::Dir(dir.path().to_path_buf());
        let (keys, written) = create(&slots).unwrap();
        let refused = slots.write(&written.unwrap(), &slot(&keys).unwrap());
        assert!(refused.unwrap_err().to_string().contains("already exists"));
    }
}
