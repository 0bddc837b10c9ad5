//! The disk index's record of the segments it absorbed, with the version storage listed
//! for each (`index/disk/segments`, docs/design/format.md "Disk index", rules 5 and 6):
//! what binds a disk index kept in a remote repository's cache to one history of the
//! repository's storage.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

use super::index::checksum;
use crate::backend::{sync_dir, FileVersion};
use crate::error::{Result, StoreError};

const MAGIC: &[u8; 8] = b"LDXSEGS1";
/// The record's file in `index/disk/`.
pub(crate) const FILE: &str = "segments";
/// The longest segment name and version tag a record holds.
const MAX_NAME: usize = 255;
const MAX_TAG: usize = 1024;

/// Segment names with the versions they were absorbed as.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AbsorbedSegments(BTreeMap<String, FileVersion>);

impl AbsorbedSegments {
    pub fn new(segments: impl IntoIterator<Item = (String, FileVersion)>) -> Self {
        Self(segments.into_iter().collect())
    }

    pub fn contains(&self, name: &str) -> bool {
        self.0.contains_key(name)
    }

    /// Why this record is of another history than `listing` (storage's segments now):
    /// the first recorded segment listed with another version or not at all.
    pub fn foreign_to(&self, listing: &[(String, FileVersion)]) -> Option<String> {
        let listed: BTreeMap<&str, &FileVersion> =
            listing.iter().map(|(n, v)| (n.as_str(), v)).collect();
        self.0
            .iter()
            .find_map(|(name, version)| match listed.get(name.as_str()) {
                None => Some(format!("segment {name} it absorbed is gone from storage")),
                Some(v) if *v != version => Some(format!(
                    "segment {name} on storage is not the one it absorbed"
                )),
                Some(_) => None,
            })
    }

    /// The record's bytes; names and tags too long for it are left out (their
    /// segments then count as not absorbed).
    pub fn encode(&self) -> Vec<u8> {
        let kept: Vec<_> = self
            .0
            .iter()
            .filter(|(n, v)| n.len() <= MAX_NAME && v.tag.len() <= MAX_TAG)
            .collect();
        let mut out = Vec::new();
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&1u32.to_le_bytes());
        out.extend_from_slice(&(kept.len() as u32).to_le_bytes());
        for (name, version) in kept {
            out.extend_from_slice(&(name.len() as u16).to_le_bytes());
            out.extend_from_slice(name.as_bytes());
            out.extend_from_slice(&version.len.to_le_bytes());
            out.extend_from_slice(&(version.tag.len() as u16).to_le_bytes());
            out.extend_from_slice(version.tag.as_bytes());
        }
        out.extend_from_slice(&checksum(&out).to_le_bytes());
        out
    }

    /// Parses a record; never panics, whatever `raw` holds (the `absorbed_segments`
    /// fuzz target).
    pub fn decode(raw: &[u8]) -> Result<Self> {
        let bad = |reason: &str| StoreError::corrupt("disk index file", FILE, reason);
        if raw.len() < 24 || &raw[..8] != MAGIC {
            return Err(bad("not a segments record"));
        }
        let version = u32::from_le_bytes(raw[8..12].try_into().expect("4 bytes"));
        if version != 1 {
            return Err(StoreError::UnsupportedVersion {
                what: "disk index segments record",
                version: u64::from(version),
                supported: "version 1",
            });
        }
        let (body, sum) = raw.split_at(raw.len() - 8);
        // Fuzzing builds (`cfg(fuzzing)`) go on past a wrong checksum, to reach the
        // checks below (docs/design/fuzzing.md).
        if checksum(body) != u64::from_le_bytes(sum.try_into().expect("8 bytes")) && !cfg!(fuzzing)
        {
            return Err(bad("checksum mismatch"));
        }
        let n = u32::from_le_bytes(raw[12..16].try_into().expect("4 bytes"));
        let mut rest = &body[16..];
        let mut take = |len: usize| -> Result<&[u8]> {
            if rest.len() < len {
                return Err(bad("truncated"));
            }
            let (head, tail) = rest.split_at(len);
            rest = tail;
            Ok(head)
        };
        let mut segments = BTreeMap::new();
        for _ in 0..n {
            let name_len = usize::from(u16::from_le_bytes(take(2)?.try_into().expect("2 bytes")));
            if name_len > MAX_NAME {
                return Err(bad("a name is too long"));
            }
            let name = std::str::from_utf8(take(name_len)?)
                .map_err(|_| bad("a name is not UTF-8"))?
                .to_string();
            let len = u64::from_le_bytes(take(8)?.try_into().expect("8 bytes"));
            let tag_len = usize::from(u16::from_le_bytes(take(2)?.try_into().expect("2 bytes")));
            if tag_len > MAX_TAG {
                return Err(bad("a tag is too long"));
            }
            let tag = std::str::from_utf8(take(tag_len)?)
                .map_err(|_| bad("a tag is not UTF-8"))?
                .to_string();
            if segments
                .keys()
                .next_back()
                .is_some_and(|last| *last >= name)
            {
                return Err(bad("names out of order"));
            }
            segments.insert(name, FileVersion { len, tag });
        }
        if !rest.is_empty() {
            return Err(bad("bytes after the last segment"));
        }
        Ok(Self(segments))
    }

    /// The record in disk index directory `dir`; `None` when it is missing or
    /// damaged (which counts as another history).
    pub(crate) fn load(dir: &Path) -> Option<Self> {
        Self::decode(&fs::read(dir.join(FILE)).ok()?).ok()
    }

    /// Replaces the record in `dir` durably, through a file in `tmp`.
    pub(crate) fn save(&self, dir: &Path, tmp: &Path) -> Result<()> {
        let tmp = tmp.join(format!("{FILE}-{}.tmp", std::process::id()));
        crate::direct::write_durable(&tmp, &self.encode()).map_err(|e| StoreError::io(&tmp, e))?;
        let dest = dir.join(FILE);
        fs::rename(&tmp, &dest).map_err(|e| StoreError::io(&dest, e))?;
        sync_dir(dir)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(len: u64, tag: &str) -> FileVersion {
        FileVersion {
            len,
            tag: tag.into(),
        }
    }

    #[test]
    fn records_round_trip_and_refuse_damage() {
        let record = AbsorbedSegments::new([
            ("0000000000000001".to_string(), v(10, "\"a\"")),
            ("0000000000000002".to_string(), v(20, "")),
        ]);
        let bytes = record.encode();
        assert_eq!(AbsorbedSegments::decode(&bytes).unwrap(), record);
        for i in 0..bytes.len() {
            let mut b = bytes.clone();
            b[i] ^= 1;
            assert!(AbsorbedSegments::decode(&b).is_err(), "flip at {i}");
        }
        for len in 0..bytes.len() {
            assert!(AbsorbedSegments::decode(&bytes[..len]).is_err(), "{len}");
        }
    }

    #[test]
    fn another_version_or_a_missing_segment_is_another_history() {
        let record = AbsorbedSegments::new([("01".to_string(), v(10, "t1"))]);
        let same = [("01".to_string(), v(10, "t1")), ("02".into(), v(5, "t2"))];
        assert_eq!(record.foreign_to(&same), None, "new segments are caught up");
        let rewritten = [("01".to_string(), v(10, "t3"))];
        assert!(record.foreign_to(&rewritten).is_some());
        assert!(record.foreign_to(&[]).is_some());
    }
}
