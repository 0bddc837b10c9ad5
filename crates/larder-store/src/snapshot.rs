//! Snapshots: JSON files naming the chunks of a tree stream (docs/design/format.md,
//! "Snapshot").

use larder_hash::Fingerprint;
use serde::{Deserialize, Serialize};

use crate::error::{Result, StoreError};

/// Where a snapshot's tree stream is stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TreeRef {
    pub size: u64,
    /// Hex fingerprints of the tree stream's chunks, in order.
    pub chunks: Vec<String>,
}

impl TreeRef {
    pub fn fingerprints(&self) -> Result<Vec<Fingerprint>> {
        self.chunks
            .iter()
            .map(|h| {
                Fingerprint::from_hex(h).ok_or_else(|| {
                    StoreError::corrupt("snapshot", "", format!("bad tree fingerprint {h:?}"))
                })
            })
            .collect()
    }
}

/// Counts and byte totals of the backup that made a snapshot (informative). Fields
/// added after version 1 read as 0 from older snapshots.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotSummary {
    pub files: u64,
    pub dirs: u64,
    pub symlinks: u64,
    /// FIFOs and device nodes.
    #[serde(default)]
    pub specials: u64,
    /// Bytes of the files the snapshot holds, read or not.
    pub bytes_in: u64,
    /// Bytes of file content actually read: files whose metadata showed them
    /// unchanged were not.
    #[serde(default)]
    pub bytes_read: u64,
    pub bytes_new: u64,
    pub chunks: u64,
    pub chunks_new: u64,
    /// Files no earlier snapshot held, files read again, and files whose recipe was
    /// reused unread.
    #[serde(default)]
    pub files_new: u64,
    #[serde(default)]
    pub files_changed: u64,
    #[serde(default)]
    pub files_unchanged: u64,
    pub errors: u64,
}

/// A snapshot as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Snapshot {
    pub version: u32,
    /// RFC 3339, UTC.
    pub time: String,
    pub hostname: String,
    pub username: String,
    pub paths: Vec<String>,
    pub tree: TreeRef,
    pub summary: SnapshotSummary,
    /// A checkpoint of a backup still running (or killed): its tree holds the entries
    /// completed so far (docs/design/nightly.md). Version 2.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub partial: bool,
    /// The snapshots whose entries the backup compared its files with, newest first.
    /// Version 2, informative.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parents: Vec<String>,
    /// The id of the snapshot `larder copy` copied this one from, in the repository it
    /// was copied from; a copy of a copy keeps the first snapshot's id. Absent in a
    /// snapshot a backup made. Informative, and what makes copying again skip it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub original: Option<String>,
    /// The id of the snapshot `larder repair` rewrote this one from, without the files
    /// that lost data (docs/design/repair.md). Absent in every other snapshot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repaired_from: Option<String>,
}

impl Snapshot {
    /// The version this larder writes; it reads 1 to 3. Version 3 snapshots have tree
    /// streams of version 3 (docs/design/format.md, "Version log").
    pub const VERSION: u32 = 3;

    /// The file's bytes and its id (BLAKE3 of those bytes, in hex).
    pub fn encode(&self) -> (Vec<u8>, String) {
        let bytes = serde_json::to_vec_pretty(self).expect("a snapshot always serializes");
        let id = blake3::hash(&bytes).to_hex().to_string();
        (bytes, id)
    }

    /// Parses a snapshot file and checks that it hashes to its name.
    pub fn decode(bytes: &[u8], id: &str) -> Result<Self> {
        // Fuzzing builds (`cfg(fuzzing)`) parse whatever the id, so that mutated bytes
        // reach the parser (docs/design/fuzzing.md); every other build stops here.
        if blake3::hash(bytes).to_hex().as_str() != id && !cfg!(fuzzing) {
            return Err(StoreError::corrupt(
                "snapshot",
                id,
                "content does not match its id",
            ));
        }
        Self::decode_opened(bytes, id)
    }

    /// Parses a snapshot's JSON whose integrity its caller checked: a plaintext file
    /// that hashes to its name, or an encrypted one's opened envelope.
    pub fn decode_opened(bytes: &[u8], id: &str) -> Result<Self> {
        let snap: Snapshot = serde_json::from_slice(bytes)
            .map_err(|e| StoreError::corrupt("snapshot", id, e.to_string()))?;
        if !(1..=Self::VERSION).contains(&snap.version) {
            return Err(StoreError::UnsupportedVersion {
                what: "snapshot",
                version: u64::from(snap.version),
                supported: "versions 1 to 3",
            });
        }
        Ok(snap)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        /// The in-CI twin of the `snapshot` fuzz target.
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..300)) {
            let id = blake3::hash(&bytes).to_hex();
            let _ = Snapshot::decode(&bytes, id.as_str());
        }
    }

    #[test]
    fn round_trips_and_detects_tampering() {
        let snap = Snapshot {
            version: 1,
            time: "2026-11-22T00:00:00Z".into(),
            hostname: "h".into(),
            username: "u".into(),
            paths: vec!["/x".into()],
            tree: TreeRef {
                size: 3,
                chunks: vec!["00".repeat(32)],
            },
            summary: SnapshotSummary::default(),
            partial: true,
            parents: vec!["ab".repeat(32)],
            original: Some("cd".repeat(32)),
            repaired_from: Some("ef".repeat(32)),
        };
        let (bytes, id) = snap.encode();
        assert_eq!(Snapshot::decode(&bytes, &id).unwrap(), snap);
        let mut tampered = bytes.clone();
        tampered[10] ^= 1;
        assert!(Snapshot::decode(&tampered, &id).is_err());
    }

    #[test]
    fn version_1_snapshots_read_and_unknown_versions_are_refused() {
        let v1 = br#"{"version":1,"time":"2026-01-01T00:00:00Z","hostname":"h","username":"u",
            "paths":["/x"],"tree":{"size":0,"chunks":[]},"summary":{"files":1,"dirs":0,
            "symlinks":0,"bytes_in":5,"bytes_new":5,"chunks":1,"chunks_new":1,"errors":0}}"#;
        let id = blake3::hash(v1).to_hex();
        let snap = Snapshot::decode(v1, &id).unwrap();
        assert!(!snap.partial && snap.parents.is_empty() && snap.original.is_none());
        assert!(snap.repaired_from.is_none());
        assert_eq!(snap.summary.bytes_read, 0);
        let v4 = String::from_utf8_lossy(v1).replace(r#""version":1"#, r#""version":4"#);
        let id = blake3::hash(v4.as_bytes()).to_hex();
        assert!(matches!(
            Snapshot::decode(v4.as_bytes(), &id),
            Err(StoreError::UnsupportedVersion { version: 4, .. })
        ));
    }
}
