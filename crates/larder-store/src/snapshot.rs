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

/// Counts and byte totals of the backup that made a snapshot (informative).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotSummary {
    pub files: u64,
    pub dirs: u64,
    pub symlinks: u64,
    pub bytes_in: u64,
    pub bytes_new: u64,
    pub chunks: u64,
    pub chunks_new: u64,
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
}

impl Snapshot {
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
        let snap: Snapshot = serde_json::from_slice(bytes)
            .map_err(|e| StoreError::corrupt("snapshot", id, e.to_string()))?;
        if snap.version != 1 {
            return Err(StoreError::UnsupportedVersion {
                what: "snapshot",
                version: u64::from(snap.version),
                supported: "version 1",
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
        };
        let (bytes, id) = snap.encode();
        assert_eq!(Snapshot::decode(&bytes, &id).unwrap(), snap);
        let mut tampered = bytes.clone();
        tampered[10] ^= 1;
        assert!(Snapshot::decode(&tampered, &id).is_err());
    }
}
