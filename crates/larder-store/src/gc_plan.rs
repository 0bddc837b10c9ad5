//! GC plans: the record that makes garbage collection crash-safe
//! (docs/design/format.md, "GC plan"; the protocol is docs/design/gc.md).

use crate::container::le_u64;
use crate::error::{Result, StoreError};

const MAGIC: &[u8; 8] = b"LARDERG1";
const VERSION: u32 = 1;
/// Header: magic, version, zero, id, three counts.
const HEADER_LEN: usize = 48;
const SUM_LEN: usize = 32;

/// What one garbage collection will do, written durably before it changes anything.
///
/// Invariant: `id` is the sequence number of the index segment the collection writes;
/// that segment's existence is the commit record (docs/design/gc.md).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GcPlan {
    pub id: u64,
    /// Index segments that the new segment replaces (removed once it is durable).
    pub old_segments: Vec<u64>,
    /// Containers that leave the index and are then deleted: the empty and the
    /// repacked ones.
    pub delete: Vec<u64>,
    /// Containers the collection writes (the repacked chunks); deleted on roll-back.
    pub new_containers: Vec<u64>,
}

impl GcPlan {
    /// The plan's file name (without extension): its id in 16 hex digits.
    pub fn name(&self) -> String {
        format!("{:016x}", self.id)
    }

    pub fn encode(&self) -> Vec<u8> {
        let lists = [&self.old_segments, &self.delete, &self.new_containers];
        let ids: usize = lists.iter().map(|l| l.len()).sum();
        let mut out = Vec::with_capacity(HEADER_LEN + 8 * ids + SUM_LEN);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.extend_from_slice(&[0; 4]);
        out.extend_from_slice(&self.id.to_le_bytes());
        for list in lists {
            out.extend_from_slice(&(list.len() as u64).to_le_bytes());
        }
        for list in lists {
            for id in list.iter() {
                out.extend_from_slice(&id.to_le_bytes());
            }
        }
        let sum = blake3::hash(&out);
        out.extend_from_slice(sum.as_bytes());
        out
    }

    /// Parses and verifies plan file `name`. Never panics, whatever `bytes` holds.
    pub fn decode(bytes: &[u8], name: &str) -> Result<Self> {
        let bad = |reason: &str| StoreError::corrupt("gc plan", name, reason);
        if bytes.len() < HEADER_LEN + SUM_LEN {
            return Err(bad("too short"));
        }
        let (body, sum) = bytes.split_at(bytes.len() - SUM_LEN);
        if blake3::hash(body).as_bytes() != sum {
            return Err(bad("checksum mismatch"));
        }
        if &body[..8] != MAGIC {
            return Err(bad("bad magic"));
        }
        let version = u32::from_le_bytes([body[8], body[9], body[10], body[11]]);
        if version != VERSION {
            return Err(StoreError::UnsupportedVersion {
                what: "gc plan",
                version: u64::from(version),
                supported: "version 1",
            });
        }
        if body[12..16] != [0; 4] {
            return Err(bad("reserved bytes are not zero"));
        }
        let id = le_u64(&body[16..24]);
        if u64::from_str_radix(name, 16).ok() != Some(id) {
            return Err(bad("the id differs from the file name"));
        }
        let counts = [
            le_u64(&body[24..32]),
            le_u64(&body[32..40]),
            le_u64(&body[40..48]),
        ];
        let ids = (body.len() - HEADER_LEN) / 8;
        if !(body.len() - HEADER_LEN).is_multiple_of(8)
            || counts.iter().try_fold(0u64, |a, &c| a.checked_add(c)) != Some(ids as u64)
        {
            return Err(bad("the counts do not match the file's length"));
        }
        let mut ids = body[HEADER_LEN..].chunks_exact(8).map(le_u64);
        let mut take = |count: u64| ids.by_ref().take(count as usize).collect::<Vec<u64>>();
        let (old_segments, delete, new_containers) =
            (take(counts[0]), take(counts[1]), take(counts[2]));
        Ok(Self {
            id,
            old_segments,
            delete,
            new_containers,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn plan() -> GcPlan {
        GcPlan {
            id: 0x2a,
            old_segments: vec![3, 7, 0x29],
            delete: vec![1, 2, 5],
            new_containers: vec![9],
        }
    }

    #[test]
    fn round_trips_and_detects_every_flip() {
        let bytes = plan().encode();
        assert_eq!(bytes.len(), HEADER_LEN + 8 * 7 + SUM_LEN);
        assert_eq!(GcPlan::decode(&bytes, &plan().name()).unwrap(), plan());
        for i in 0..bytes.len() {
            for bit in [0x01, 0x80] {
                let mut d = bytes.clone();
                d[i] ^= bit;
                assert!(GcPlan::decode(&d, &plan().name()).is_err(), "flip at {i}");
            }
        }
        assert!(GcPlan::decode(&bytes[..bytes.len() - 1], &plan().name()).is_err());
    }

    #[test]
    fn a_plan_under_another_name_is_refused() {
        let err = GcPlan::decode(&plan().encode(), "000000000000002b").unwrap_err();
        assert!(
            err.to_string().contains("differs from the file name"),
            "{err}"
        );
    }

    #[test]
    fn counts_that_overflow_are_refused() {
        let mut body = plan().encode();
        body.truncate(body.len() - SUM_LEN);
        body[24..32].copy_from_slice(&u64::MAX.to_le_bytes());
        let sum = blake3::hash(&body);
        body.extend_from_slice(sum.as_bytes());
        assert!(GcPlan::decode(&body, &plan().name()).is_err());
    }

    proptest! {
        #[test]
        fn any_plan_round_trips(
            id in any::<u64>(),
            old in proptest::collection::vec(any::<u64>(), 0..20),
            delete in proptest::collection::vec(any::<u64>(), 0..20),
            new in proptest::collection::vec(any::<u64>(), 0..20),
        ) {
            let p = GcPlan { id, old_segments: old, delete, new_containers: new };
            prop_assert_eq!(GcPlan::decode(&p.encode(), &p.name()).unwrap(), p);
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = GcPlan::decode(&bytes, "000000000000002a");
        }
    }
}
