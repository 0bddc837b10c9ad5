//! A cluster partition's index on object storage, as immutable objects
//! (docs/design/cluster.md, "Partitions on object storage"): a *full* object holds
//! every entry of the partition's index, a *delta* the entries inserted since the
//! owner's previous object; both carry the record of what the index covers as of
//! that object. Byte layout (all integers little-endian):
//!
//! ```text
//! 0   8  magic "LRDRPART"
//! 8   4  version (1)
//! 12  1  kind: 1 full, 2 delta
//! 13  3  reserved, zero
//! 16  4  partition
//! 20  4  sequence number within the epoch
//! 24  8  epoch (the owner's etcd revision)
//! 32  4  W: writers in the covered record
//! 36  4  reserved, zero
//! 40  8  N: entries
//! 48  W x 10: writer node (u16), highest covered container id (u64); writers
//!             strictly ascending
//! ..  N x 48: fingerprint (32), container (u64), offset (u32), length (u32); in the
//!             index's insertion order, fingerprints distinct
//! ..  32 BLAKE3 of every byte before
//! ```
//!
//! In an encrypted cluster the stored object is those bytes in a metadata envelope of
//! kind 5 whose name is the object's name in binary (docs/design/crypto.md, "Cluster"):
//!
//! ```text
//! 0   4  partition
//! 4   8  epoch
//! 12  4  sequence number
//! 16  1  kind: 1 full, 2 delta
//! ```

use std::collections::{BTreeMap, HashSet};

use larder_crypto::{ObjectKind, RepoKeys};
use larder_hash::Fingerprint;
use larder_index::ChunkLocation;

use crate::error::{error_chain, Result, StoreError};

const MAGIC: &[u8; 8] = b"LRDRPART";
const VERSION: u32 = 1;
const HEADER_LEN: usize = 48;
const WRITER_LEN: usize = 10;
const ENTRY_LEN: usize = 48;
const SUM_LEN: usize = 32;

/// Whether an object holds all of its partition's entries or only new ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum PartitionObjectKind {
    Full,
    Delta,
}

impl PartitionObjectKind {
    /// The object name's extension.
    pub fn extension(self) -> &'static str {
        match self {
            Self::Full => "full",
            Self::Delta => "delta",
        }
    }

    fn code(self) -> u8 {
        match self {
            Self::Full => 1,
            Self::Delta => 2,
        }
    }
}

/// One object of a partition's chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionObject {
    pub kind: PartitionObjectKind,
    pub partition: u32,
    pub epoch: u64,
    pub seq: u32,
    /// Writer node to the highest container id whose entries (of this partition) the
    /// chain up to this object holds.
    pub covered: BTreeMap<u16, u64>,
    pub entries: Vec<(Fingerprint, ChunkLocation)>,
}

fn le_u32(b: &[u8]) -> u32 {
    u32::from_le_bytes(b[..4].try_into().expect("4 bytes"))
}

fn le_u64(b: &[u8]) -> u64 {
    u64::from_le_bytes(b[..8].try_into().expect("8 bytes"))
}

impl PartitionObject {
    /// The object's name in its partition's directory:
    /// `<epoch:016x>-<seq:08x>.<full|delta>`, so that names sort in write order.
    pub fn name(&self) -> String {
        object_name(self.epoch, self.seq, self.kind)
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(
            HEADER_LEN + self.covered.len() * WRITER_LEN + self.entries.len() * ENTRY_LEN + SUM_LEN,
        );
        b.extend_from_slice(MAGIC);
        b.extend_from_slice(&VERSION.to_le_bytes());
        b.extend_from_slice(&[self.kind.code(), 0, 0, 0]);
        b.extend_from_slice(&self.partition.to_le_bytes());
        b.extend_from_slice(&self.seq.to_le_bytes());
        b.extend_from_slice(&self.epoch.to_le_bytes());
        b.extend_from_slice(&(self.covered.len() as u32).to_le_bytes());
        b.extend_from_slice(&[0; 4]);
        b.extend_from_slice(&(self.entries.len() as u64).to_le_bytes());
        for (&writer, &container) in &self.covered {
            b.extend_from_slice(&writer.to_le_bytes());
            b.extend_from_slice(&container.to_le_bytes());
        }
        for (fp, at) in &self.entries {
            b.extend_from_slice(fp.as_bytes());
            b.extend_from_slice(&at.container.to_le_bytes());
            b.extend_from_slice(&at.offset.to_le_bytes());
            b.extend_from_slice(&at.length.to_le_bytes());
        }
        let sum = blake3::hash(&b);
        b.extend_from_slice(sum.as_bytes());
        b
    }

    /// The bytes stored under [`PartitionObject::name`] in partition `self.partition`'s
    /// directory: [`PartitionObject::encode`]'s, sealed with `keys` in an encrypted
    /// cluster. Sealing draws a fresh salt: a caller that may put the same object twice
    /// keeps the bytes it made once.
    pub fn to_stored(&self, keys: Option<&RepoKeys>) -> Vec<u8> {
        let plain = self.encode();
        match keys {
            None => plain,
            Some(keys) => keys.seal_object(
                ObjectKind::PartitionObject,
                &bound_name(self.partition, self.epoch, self.seq, self.kind),
                &plain,
            ),
        }
    }

    /// The object stored as `name` in partition `partition`'s directory: opened with
    /// `keys` in an encrypted cluster (refused unless its envelope binds exactly this
    /// partition and name), decoded, and refused unless it is the object its name and
    /// directory say (its partition, epoch, sequence number and kind).
    pub fn from_stored(
        bytes: &[u8],
        partition: u32,
        name: &str,
        keys: Option<&RepoKeys>,
    ) -> Result<Self> {
        let bad = |reason: String| StoreError::corrupt("partition object", name, reason);
        let (epoch, seq, kind) =
            parse_object_name(name).ok_or_else(|| bad("not a partition object's name".into()))?;
        let object = match keys {
            None => Self::decode(bytes, name)?,
            Some(keys) => {
                let plain = keys
                    .open_object(
                        ObjectKind::PartitionObject,
                        &bound_name(partition, epoch, seq, kind),
                        bytes,
                    )
                    .map_err(|e| bad(error_chain(&e)))?;
                Self::decode(&plain, name)?
            }
        };
        if (object.partition, object.epoch, object.seq, object.kind)
            != (partition, epoch, seq, kind)
        {
            return Err(bad(format!(
                "it holds partition {}'s object {}",
                object.partition,
                object.name()
            )));
        }
        Ok(object)
    }

    /// Decodes object `name` (named in errors); every count, order and reserved byte is
    /// checked, so decoding then encoding gives the same bytes.
    pub fn decode(bytes: &[u8], name: &str) -> Result<Self> {
        let bad = |reason: &str| StoreError::corrupt("partition object", name, reason);
        if bytes.len() < HEADER_LEN + SUM_LEN {
            return Err(bad("too short"));
        }
        let (body, sum) = bytes.split_at(bytes.len() - SUM_LEN);
        // Fuzzing builds (`cfg(fuzzing)`) go on past a wrong checksum, to reach the
        // parser below (docs/design/fuzzing.md); every other build stops here.
        if blake3::hash(body).as_bytes() != sum && !cfg!(fuzzing) {
            return Err(bad("checksum mismatch"));
        }
        if &body[..8] != MAGIC {
            return Err(bad("bad magic"));
        }
        let version = le_u32(&body[8..]);
        if version != VERSION {
            return Err(StoreError::UnsupportedVersion {
                what: "partition object",
                version: u64::from(version),
                supported: "version 1",
            });
        }
        let kind = match body[12] {
            1 => PartitionObjectKind::Full,
            2 => PartitionObjectKind::Delta,
            _ => return Err(bad("unknown kind")),
        };
        if body[13..16] != [0; 3] || body[36..40] != [0; 4] {
            return Err(bad("reserved bytes are not zero"));
        }
        let partition = le_u32(&body[16..]);
        let seq = le_u32(&body[20..]);
        let epoch = le_u64(&body[24..]);
        let writers = le_u32(&body[32..]) as u64;
        let entries = le_u64(&body[40..]);
        let expected = writers
            .checked_mul(WRITER_LEN as u64)
            .zip(entries.checked_mul(ENTRY_LEN as u64))
            .and_then(|(w, e)| w.checked_add(e))
            .and_then(|n| n.checked_add(HEADER_LEN as u64));
        if expected != Some(body.len() as u64) {
            return Err(bad("the counts do not match the length"));
        }
        let mut covered = BTreeMap::new();
        let mut at = HEADER_LEN;
        for _ in 0..writers {
            let writer = u16::from_le_bytes([body[at], body[at + 1]]);
            if covered.last_key_value().is_some_and(|(&w, _)| w >= writer) {
                return Err(bad("writers are not strictly ascending"));
            }
            covered.insert(writer, le_u64(&body[at + 2..]));
            at += WRITER_LEN;
        }
        let mut list = Vec::with_capacity(entries as usize);
        let mut seen = HashSet::with_capacity(entries as usize);
        for chunk in body[at..].chunks_exact(ENTRY_LEN) {
            let fp = Fingerprint(chunk[..32].try_into().expect("32 bytes"));
            if !seen.insert(fp) {
                return Err(bad("a fingerprint appears twice"));
            }
            let location = ChunkLocation {
                container: le_u64(&chunk[32..]),
                offset: le_u32(&chunk[40..]),
                length: le_u32(&chunk[44..]),
            };
            list.push((fp, location));
        }
        Ok(Self {
            kind,
            partition,
            epoch,
            seq,
            covered,
            entries: list,
        })
    }
}

/// The name a sealed object's envelope binds: the object's name in binary (module
/// docs).
fn bound_name(partition: u32, epoch: u64, seq: u32, kind: PartitionObjectKind) -> [u8; 17] {
    let mut name = [0u8; 17];
    name[..4].copy_from_slice(&partition.to_le_bytes());
    name[4..12].copy_from_slice(&epoch.to_le_bytes());
    name[12..16].copy_from_slice(&seq.to_le_bytes());
    name[16] = kind.code();
    name
}

/// `<epoch:016x>-<seq:08x>.<extension>`.
pub fn object_name(epoch: u64, seq: u32, kind: PartitionObjectKind) -> String {
    format!("{epoch:016x}-{seq:08x}.{}", kind.extension())
}

/// The epoch, sequence number and kind a name of [`object_name`]'s form gives; `None`
/// for any other name.
pub fn parse_object_name(name: &str) -> Option<(u64, u32, PartitionObjectKind)> {
    let (stem, ext) = name.split_once('.')?;
    let kind = match ext {
        "full" => PartitionObjectKind::Full,
        "delta" => PartitionObjectKind::Delta,
        _ => return None,
    };
    let (epoch, seq) = stem.split_once('-')?;
    if epoch.len() != 16 || seq.len() != 8 {
        return None;
    }
    let hex = |s: &str| {
        s.bytes()
            .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c))
    };
    if !hex(epoch) || !hex(seq) {
        return None;
    }
    Some((
        u64::from_str_radix(epoch, 16).ok()?,
        u32::from_str_radix(seq, 16).ok()?,
        kind,
    ))
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn object(seed: u64, entries: usize, writers: u16) -> PartitionObject {
        PartitionObject {
            kind: if seed.is_multiple_of(2) {
                PartitionObjectKind::Full
            } else {
                PartitionObjectKind::Delta
            },
            partition: (seed % 1024) as u32,
            epoch: seed.wrapping_mul(31),
            seq: (seed % 7) as u32,
            covered: (0..writers)
                .map(|w| (w * 3 + 1, u64::from(w) << 48 | seed))
                .collect(),
            entries: (0..entries as u64)
                .map(|i| {
                    let fp =
                        larder_hash::HashAlgo::Blake3.fingerprint(&(seed ^ i << 20).to_le_bytes());
                    let at = ChunkLocation {
                        container: i,
                        offset: (i * 7) as u32,
                        length: (i * 13) as u32,
                    };
                    (fp, at)
                })
                .collect(),
        }
    }

    proptest! {
        #[test]
        fn round_trips(seed in any::<u64>(), entries in 0usize..200, writers in 0u16..5) {
            let o = object(seed, entries, writers);
            let bytes = o.encode();
            let back = PartitionObject::decode(&bytes, "x").unwrap();
            prop_assert_eq!(&back, &o);
            prop_assert_eq!(back.encode(), bytes);
            prop_assert_eq!(parse_object_name(&o.name()), Some((o.epoch, o.seq, o.kind)));
        }

        #[test]
        fn every_flipped_bit_is_refused(seed in any::<u64>(), bit in any::<usize>()) {
            let mut bytes = object(seed, 3, 2).encode();
            let bit = bit % (bytes.len() * 8);
            bytes[bit / 8] ^= 1 << (bit % 8);
            prop_assert!(PartitionObject::decode(&bytes, "x").is_err());
        }
    }

    #[test]
    fn names_sort_in_write_order() {
        let mut names = [
            object_name(0x1_0000, 2, PartitionObjectKind::Delta),
            object_name(0xff, 9, PartitionObjectKind::Full),
            object_name(0x1_0000, 0, PartitionObjectKind::Full),
            object_name(0x1_0000, 1, PartitionObjectKind::Delta),
        ];
        names.sort();
        let parsed: Vec<_> = names
            .iter()
            .map(|n| parse_object_name(n).unwrap())
            .collect();
        let mut ordered = parsed.clone();
        ordered.sort();
        assert_eq!(parsed, ordered);
        for bad in [
            "00000000000000ff-00000009.snap",
            "ff-9.full",
            "00000000000000FF-00000009.full",
            "x",
        ] {
            assert_eq!(parse_object_name(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_repeated_fingerprint_or_unordered_writers_are_refused() {
        let mut o = object(4, 2, 0);
        o.entries[1].0 = o.entries[0].0;
        assert!(PartitionObject::decode(&o.encode(), "x").is_err());
        let o = object(5, 0, 2);
        let mut bytes = o.encode();
        // Swap the two writer records, then fix the checksum.
        let (a, b) = (HEADER_LEN, HEADER_LEN + WRITER_LEN);
        let first: Vec<u8> = bytes[a..b].to_vec();
        bytes.copy_within(b..b + WRITER_LEN, a);
        bytes[b..b + WRITER_LEN].copy_from_slice(&first);
        let n = bytes.len() - SUM_LEN;
        let sum = blake3::hash(&bytes[..n]);
        bytes[n..].copy_from_slice(sum.as_bytes());
        assert!(PartitionObject::decode(&bytes, "x").is_err());
    }

    fn cluster_key() -> RepoKeys {
        RepoKeys::generate(
            [7; 16],
            larder_crypto::AeadKind::Aes256Gcm,
            larder_crypto::FingerprintKind::KeyedBlake3,
        )
    }

    #[test]
    fn a_plaintext_cluster_stores_the_encoding_unchanged() {
        let o = object(6, 4, 2);
        assert_eq!(o.to_stored(None), o.encode());
        let back = PartitionObject::from_stored(&o.encode(), o.partition, &o.name(), None);
        assert_eq!(back.unwrap(), o);
    }

    #[test]
    fn a_sealed_object_opens_only_under_its_own_name_partition_and_key() {
        let keys = cluster_key();
        let o = object(8, 5, 3);
        let stored = o.to_stored(Some(&keys));
        assert!(!stored.starts_with(MAGIC) && stored.len() > o.encode().len());
        let back = PartitionObject::from_stored(&stored, o.partition, &o.name(), Some(&keys));
        assert_eq!(back.unwrap(), o);
        let moved = [
            (o.partition + 1, o.name()),
            (o.partition, object_name(o.epoch + 1, o.seq, o.kind)),
            (o.partition, object_name(o.epoch, o.seq + 1, o.kind)),
            (
                o.partition,
                object_name(o.epoch, o.seq, PartitionObjectKind::Delta),
            ),
        ];
        for (partition, name) in moved {
            let err = PartitionObject::from_stored(&stored, partition, &name, Some(&keys))
                .unwrap_err()
                .to_string();
            assert!(err.contains("authentication"), "{partition} {name}: {err}");
        }
        let other = cluster_key();
        assert!(
            PartitionObject::from_stored(&stored, o.partition, &o.name(), Some(&other)).is_err()
        );
        // The plaintext encoding is refused by a key: an encrypted cluster never reads
        // an unsealed object.
        assert!(
            PartitionObject::from_stored(&o.encode(), o.partition, &o.name(), Some(&keys)).is_err()
        );
    }

    #[test]
    fn a_plaintext_object_under_another_name_is_refused() {
        let o = object(10, 2, 1);
        let name = object_name(o.epoch, o.seq + 1, o.kind);
        let err = PartitionObject::from_stored(&o.encode(), o.partition, &name, None)
            .unwrap_err()
            .to_string();
        assert!(err.contains(&o.name()), "{err}");
        assert!(
            PartitionObject::from_stored(&o.encode(), o.partition + 1, &o.name(), None).is_err()
        );
        assert!(PartitionObject::from_stored(&o.encode(), o.partition, "x.full", None).is_err());
    }

    proptest! {
        #[test]
        fn every_flipped_bit_of_a_sealed_object_is_refused(seed in any::<u64>(), bit in any::<usize>()) {
            let keys = cluster_key();
            let o = object(seed, 3, 2);
            let mut stored = o.to_stored(Some(&keys));
            let bit = bit % (stored.len() * 8);
            stored[bit / 8] ^= 1 << (bit % 8);
            prop_assert!(PartitionObject::from_stored(&stored, o.partition, &o.name(), Some(&keys)).is_err());
        }
    }

    /// Writes the fuzz target's committed seed (scripts/fuzz-smoke): a delta of 3
    /// entries covering 2 writers.
    #[test]
    #[ignore = "writes fuzz/seeds/partition_object/seed-delta"]
    fn write_the_fuzz_seed() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../fuzz/seeds/partition_object");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("seed-delta"), object(1, 3, 2).encode()).unwrap();
    }
}
