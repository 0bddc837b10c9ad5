//! The repository's small objects as files: the config, index segments, gc plans and
//! snapshots, plaintext or, in an encrypted repository, each in its envelope
//! (docs/design/crypto.md, "Envelopes"). Every read and write of them goes through
//! here, so no caller sees the difference.

use std::sync::Arc;

use larder_chunk::Chunker;
use larder_crypto::{ObjectKind, RepoKeys};

use super::{RepoConfig, Repository};
use crate::backend::{create_file, FileKind};
use crate::error::{error_chain, Result, StoreError};
use crate::segment::{decode_segment, encode_segment, segment_len, SegmentContainer};
use crate::snapshot::Snapshot;

/// The first bytes of a sealed config (a metadata envelope).
const SEALED_CONFIG: &[u8; 8] = larder_crypto::envelope::METADATA_MAGIC;

/// Whether the bytes of a `config` file are sealed: the repository is encrypted.
pub fn config_is_sealed(raw: &[u8]) -> bool {
    raw.starts_with(SEALED_CONFIG)
}

/// Parses the bytes of a `config` file: opened with `keys` when sealed. The key
/// must be the repository's: the config's id must equal the key material's.
pub(crate) fn decode_config(raw: &[u8], name: &str, keys: Option<&RepoKeys>) -> Result<RepoConfig> {
    if !config_is_sealed(raw) {
        let config = RepoConfig::decode(raw, name)?;
        if config.encryption.is_some() {
            return Err(StoreError::Config(format!(
                "{name} names encryption but is not sealed"
            )));
        }
        return Ok(config);
    }
    let keys = keys.ok_or_else(|| {
        StoreError::Config(format!("{name} is sealed: the repository's key is needed"))
    })?;
    let plain = keys
        .open_object(ObjectKind::Config, b"", raw)
        .map_err(|e| StoreError::corrupt("config", name, error_chain(&e)))?;
    let config = RepoConfig::decode(&plain, name)?;
    if config.encryption.is_none() || config.id_bytes()? != keys.repo_id() {
        return Err(StoreError::corrupt(
            "config",
            name,
            "it does not belong to the repository of this key",
        ));
    }
    Ok(config)
}

/// The bytes of a `config` file: sealed with `keys` for an encrypted repository.
pub(crate) fn encode_config(config: &RepoConfig, keys: Option<&RepoKeys>) -> Vec<u8> {
    let json = serde_json::to_vec_pretty(config).expect("config always serializes");
    match keys {
        Some(keys) => keys.seal_object(ObjectKind::Config, b"", &json),
        None => json,
    }
}

/// A file's name as an envelope binds it: the number in its hex name (its name in the
/// repository that wrote it, `written`), as 8 little-endian bytes.
fn bound_name(kind: FileKind, name: &str, written: &str) -> Result<[u8; 8]> {
    u64::from_str_radix(written, 16)
        .map(u64::to_le_bytes)
        .map_err(|_| StoreError::corrupt(kind.dir(), name, "its name is not a hex number"))
}

fn object_kind(kind: FileKind) -> ObjectKind {
    match kind {
        FileKind::IndexSegment => ObjectKind::IndexSegment,
        FileKind::GcPlan => ObjectKind::GcPlan,
        FileKind::Snapshot => ObjectKind::Snapshot,
        FileKind::Container => ObjectKind::ContainerTable,
        // Invariant: `seal_file` and `open_file` see segments and gc plans only; the
        // config, key slots and lock objects have envelopes of their own.
        FileKind::Config | FileKind::Key | FileKind::Lock => {
            unreachable!("{kind:?} files are not sealed by name")
        }
    }
}

impl Repository {
    /// The repository's keys, if it is encrypted.
    pub fn keys(&self) -> Option<&Arc<RepoKeys>> {
        self.keys.as_ref()
    }

    /// The repository's chunker: keyed by its chunker secret in an encrypted
    /// repository (docs/design/chunking.md, "keyed").
    pub fn chunker(&self) -> Box<dyn Chunker> {
        match &self.keys {
            Some(keys) => self.config.chunker.build_keyed(Arc::new(keys.window_prf())),
            None => self.config.chunker.build(),
        }
    }

    /// Refuses what a write-only key cannot do (`action`, in words).
    pub fn require_full_key(&self, action: &'static str) -> Result<()> {
        match &self.keys {
            Some(keys) if !keys.is_full() => Err(StoreError::WriteOnly(action)),
            _ => Ok(()),
        }
    }

    /// The file bytes of a metadata object (segment or gc plan) named `name`.
    pub(crate) fn seal_file(&self, kind: FileKind, name: &str, plain: Vec<u8>) -> Result<Vec<u8>> {
        match &self.keys {
            None => Ok(plain),
            Some(keys) => {
                let bound = bound_name(kind, name, self.backend.written_name(kind, name))?;
                Ok(keys.seal_object(object_kind(kind), &bound, &plain))
            }
        }
    }

    /// The plaintext of a metadata object's file bytes.
    pub(crate) fn open_file(&self, kind: FileKind, name: &str, bytes: Vec<u8>) -> Result<Vec<u8>> {
        match &self.keys {
            None => Ok(bytes),
            Some(keys) => {
                let bound = bound_name(kind, name, self.backend.written_name(kind, name))?;
                keys.open_object(object_kind(kind), &bound, &bytes)
                    .map_err(|e| StoreError::corrupt(kind.dir(), name, error_chain(&e)))
            }
        }
    }

    /// Reads and verifies index segment `name`.
    pub(crate) fn read_segment(&self, name: &str) -> Result<Vec<SegmentContainer>> {
        let bytes = self.backend.read(FileKind::IndexSegment, name)?;
        let plain = self.open_file(FileKind::IndexSegment, name, bytes)?;
        decode_segment(&plain, name, &self.codec())
    }

    /// Writes index segment `name` naming `containers` (durable only after a sync),
    /// replacing one of that name: a gc or repair plan's segment, written again when
    /// an interrupted plan is finished.
    pub(crate) fn write_segment(&self, name: &str, containers: &[SegmentContainer]) -> Result<()> {
        let bytes = self.segment_bytes(name, containers)?;
        self.backend.write(FileKind::IndexSegment, name, &bytes)
    }

    /// Creates index segment `name` naming `containers` (durable only after a sync),
    /// never replacing one: a segment of that name is another writer's, and the
    /// commit fails ([`StoreError::NameTaken`]) instead of destroying it.
    pub(crate) fn create_segment(&self, name: &str, containers: &[SegmentContainer]) -> Result<()> {
        let bytes = self.segment_bytes(name, containers)?;
        create_file(
            &*self.backend,
            FileKind::IndexSegment,
            name,
            &bytes,
            "index segment",
        )
    }

    fn segment_bytes(&self, name: &str, containers: &[SegmentContainer]) -> Result<Vec<u8>> {
        let plain = encode_segment(&self.codec(), containers);
        self.seal_file(FileKind::IndexSegment, name, plain)
    }

    /// The length of the segment file [`Repository::commit`] writes for `containers`.
    pub fn segment_file_len(&self, containers: &[SegmentContainer]) -> u64 {
        segment_len(containers) + self.envelope_overhead()
    }

    /// The length of the file [`Repository::save_snapshot`] writes for `snapshot`.
    pub fn snapshot_file_len(&self, snapshot: &Snapshot) -> u64 {
        snapshot.encode().0.len() as u64 + self.envelope_overhead()
    }

    /// What sealing adds to a metadata or sealed envelope's plaintext: nothing in a
    /// plaintext repository.
    fn envelope_overhead(&self) -> u64 {
        match self.keys {
            Some(_) => larder_crypto::ENVELOPE_OVERHEAD as u64,
            None => 0,
        }
    }

    /// Writes a snapshot durably (rule 3) and returns its id: the BLAKE3 of its file,
    /// which in an encrypted repository is a sealed envelope that only a full key opens.
    pub fn save_snapshot(&self, snapshot: &Snapshot) -> Result<String> {
        self.check_lock()?;
        let (mut bytes, mut id) = snapshot.encode();
        if let Some(keys) = &self.keys {
            bytes = keys.seal_sealed(ObjectKind::Snapshot, b"", &bytes);
            id = blake3::hash(&bytes).to_hex().to_string();
        }
        // Named by the hash of its bytes: a file of that name with other bytes is
        // damage or another writer's doing, never replaced.
        create_file(&*self.backend, FileKind::Snapshot, &id, &bytes, "snapshot")?;
        self.backend.sync(FileKind::Snapshot)?;
        Ok(id)
    }

    /// Reads snapshot `id`, checking that its file hashes to its name, and opening it
    /// in an encrypted repository (full keys only).
    pub(crate) fn read_snapshot(&self, id: &str) -> Result<Snapshot> {
        let bytes = self.backend.read(FileKind::Snapshot, id)?;
        let Some(keys) = &self.keys else {
            return Snapshot::decode(&bytes, id);
        };
        if blake3::hash(&bytes).to_hex().as_str() != id {
            return Err(StoreError::corrupt(
                "snapshot",
                id,
                "content does not match its id",
            ));
        }
        if !keys.is_full() {
            return Err(StoreError::WriteOnly("read snapshots"));
        }
        let plain = keys
            .open_sealed(ObjectKind::Snapshot, b"", &bytes)
            .map_err(|e| StoreError::corrupt("snapshot", id, error_chain(&e)))?;
        Snapshot::decode_opened(&plain, id)
    }
}
