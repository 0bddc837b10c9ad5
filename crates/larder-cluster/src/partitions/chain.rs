//! A partition's index on object storage as a chain of immutable objects
//! (docs/design/cluster.md, "Partitions on object storage"): the newest full object,
//! then deltas; each put create-only under a name ordered by epoch and sequence, and
//! sealed with the cluster's key in an encrypted cluster (docs/design/crypto.md,
//! "Cluster").

use std::collections::BTreeMap;
use std::ops::Range;

use larder_crypto::RepoKeys;
use larder_hash::Fingerprint;
use larder_index::disk::{decode_record_page, IndexFile, IndexIo, PageBuf, PAGE, RECORDS_PER_PAGE};
use larder_index::ChunkLocation;
use larder_store::{
    parse_object_name, ObjectBackend, PartitionObject, PartitionObjectKind, StoreError,
};

use super::{Covered, PartitionIndex};
use crate::error::{ClusterError, Result};
use crate::ids::PartitionId;

/// What the owner of a partition has put so far under its epoch.
#[derive(Debug, Clone, Default)]
pub(super) struct Chain {
    pub epoch: u64,
    /// The sequence number of the next object.
    pub next_seq: u32,
    /// Records of the index (positions in its metadata array) already in objects.
    pub uploaded: u64,
    /// Entries of the newest full object, and of the deltas put since.
    pub full_entries: u64,
    pub delta_entries: u64,
    /// The covered record of the newest object.
    pub covered: BTreeMap<u16, u64>,
}

/// An object made by a checkpoint, ready to put: what its name says, and its stored
/// bytes, made once (sealing draws a fresh salt), so that a put retried after a lost
/// answer sends the same bytes and finds them equal.
#[derive(Debug, Clone)]
pub(super) struct Outgoing {
    pub epoch: u64,
    pub kind: PartitionObjectKind,
    /// `<epoch>-<seq>.<kind>`.
    pub name: String,
    pub bytes: Vec<u8>,
}

/// One object of a partition, by name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Listed {
    pub epoch: u64,
    pub seq: u32,
    pub kind: PartitionObjectKind,
    pub key: String,
}

fn store_error(p: PartitionId, e: StoreError) -> ClusterError {
    ClusterError::Corrupt {
        what: format!("partition {}'s objects", p.0),
        reason: larder_store::error_chain(&e),
    }
}

fn dir(p: PartitionId) -> String {
    format!("{:05}", p.0)
}

/// Partition `p`'s objects in name order (epoch, then sequence); other keys ignored.
pub(super) fn list(objects: &ObjectBackend, p: PartitionId) -> Result<Vec<Listed>> {
    let mut listed: Vec<Listed> = objects
        .list_keys(&dir(p))
        .map_err(|e| store_error(p, e))?
        .into_iter()
        .filter_map(|name| {
            let (epoch, seq, kind) = parse_object_name(&name)?;
            Some(Listed {
                epoch,
                seq,
                kind,
                key: format!("{}/{name}", dir(p)),
            })
        })
        .collect();
    listed.sort();
    Ok(listed)
}

/// Refuses with [`ClusterError::Fenced`] when an object of a newer epoch than `epoch`
/// exists: a newer owner took the partition over.
pub(super) fn check_fence(p: PartitionId, listed: &[Listed], epoch: u64) -> Result<()> {
    match listed.iter().map(|l| l.epoch).max() {
        Some(newer) if newer > epoch => Err(ClusterError::Fenced {
            partition: p,
            epoch,
            newer,
        }),
        _ => Ok(()),
    }
}

/// The objects a takeover reads: the newest full object and every delta after it,
/// opened (with `keys` in an encrypted cluster) and decoded, up to the first that fails
/// to read, open or decode, names another object, or does not follow the one before
/// it (a delta's predecessor is the object of its epoch with the sequence number one
/// less: the owner puts them so, so a gap means an object is missing); each object's
/// covered record assumes every object before it. Empty when there is no usable full
/// object. Also returns the object that ended the chain early, if one did (where it
/// is, in words), with why.
pub(super) fn load(
    objects: &ObjectBackend,
    p: PartitionId,
    listed: &[Listed],
    keys: Option<&RepoKeys>,
) -> (Vec<PartitionObject>, Vec<(String, String)>) {
    let Some(start) = listed
        .iter()
        .rposition(|l| l.kind == PartitionObjectKind::Full)
    else {
        return (Vec::new(), Vec::new());
    };
    let mut chain: Vec<PartitionObject> = Vec::new();
    for l in &listed[start..] {
        let follows = chain
            .last()
            .is_none_or(|prev| prev.epoch == l.epoch && prev.seq.checked_add(1) == Some(l.seq));
        let name = l.key.rsplit('/').next().unwrap_or(&l.key);
        let loaded = if follows {
            objects
                .get(&l.key)
                .and_then(|bytes| PartitionObject::from_stored(&bytes, p.0, name, keys))
                .map_err(|e| larder_store::error_chain(&e))
        } else {
            Err("the object before it in the chain is missing".to_string())
        };
        match loaded {
            Ok(object) => chain.push(object),
            Err(reason) => {
                let object = objects.describe(&l.key).display().to_string();
                tracing::warn!(%object, "partition object refused, the chain stops before it (its entries come from the replay): {reason}");
                return (chain, vec![(object, reason)]);
            }
        }
    }
    (chain, Vec::new())
}

/// The records at positions `range` of the index's metadata array, which the last
/// `DiskIndex::checkpoint` made durable whole (its partial last page included).
pub(super) fn read_records(
    index: &mut PartitionIndex,
    p: PartitionId,
    range: Range<u64>,
) -> Result<Vec<(Fingerprint, ChunkLocation)>> {
    if range.is_empty() {
        return Ok(Vec::new());
    }
    let per_page = RECORDS_PER_PAGE as u64;
    let (first, last) = (range.start / per_page, (range.end - 1) / per_page);
    let mut buf = PageBuf::zeroed((last - first + 1) as usize * PAGE);
    index
        .io_mut()
        .read_at(IndexFile::Meta, (1 + first) * PAGE as u64, &mut buf)
        .map_err(|source| ClusterError::Io {
            what: format!("read partition {}'s index records", p.0),
            source,
        })?;
    let mut records = Vec::new();
    for page in buf.chunks_exact(PAGE) {
        decode_record_page(page, &mut records).map_err(|reason| ClusterError::Corrupt {
            what: format!("partition {}'s index records", p.0),
            reason,
        })?;
    }
    let skip = (range.start - first * per_page) as usize;
    let take = (range.end - range.start) as usize;
    if records.len() < skip + take {
        return Err(ClusterError::Corrupt {
            what: format!("partition {}'s index records", p.0),
            reason: format!(
                "{} records on disk, {} expected",
                records.len(),
                skip + take
            ),
        });
    }
    Ok(records[skip..skip + take]
        .iter()
        .map(|r| (r.fp, r.location))
        .collect())
}

/// Puts `object` create-only. A name already taken by the same bytes (a put retried
/// after its answer was lost) is success; by other bytes, an error: names are never
/// reused.
pub(super) fn put(objects: &ObjectBackend, p: PartitionId, object: &Outgoing) -> Result<()> {
    let key = format!("{}/{}", dir(p), object.name);
    if objects
        .put(&key, &object.bytes, true)
        .map_err(|e| store_error(p, e))?
    {
        return Ok(());
    }
    let there = objects.get(&key).map_err(|e| store_error(p, e))?;
    if there == object.bytes {
        Ok(())
    } else {
        Err(ClusterError::Corrupt {
            what: format!("partition object {key}"),
            reason: "the name is taken by another object".into(),
        })
    }
}

/// The partition's next object, its state advanced past it: a delta of the records not
/// yet in an object, or a full object when `force_full` (a takeover) or when the deltas
/// since the last full one would hold more entries than it. Without `force_full`,
/// `None` when neither the entries nor the covered record changed. The caller made the
/// index durable (`DiskIndex::checkpoint`) first. No request to the object store: the
/// owner calls this under its service lock, and [`upload`] puts the object after.
/// Sealed with `keys` in an encrypted cluster.
pub(super) fn next_object(
    p: PartitionId,
    index: &mut PartitionIndex,
    covered: &Covered,
    chain: &mut Chain,
    force_full: bool,
    keys: Option<&RepoKeys>,
) -> Result<Option<Outgoing>> {
    let len = index.len();
    let new = len.saturating_sub(chain.uploaded);
    if !force_full && new == 0 && chain.covered == covered.containers {
        return Ok(None);
    }
    let full = force_full || chain.delta_entries + new > chain.full_entries;
    let (kind, range) = if full {
        (PartitionObjectKind::Full, 0..len)
    } else {
        (PartitionObjectKind::Delta, chain.uploaded..len)
    };
    let object = PartitionObject {
        kind,
        partition: p.0,
        epoch: chain.epoch,
        seq: chain.next_seq,
        covered: covered.containers.clone(),
        entries: read_records(index, p, range)?,
    };
    chain.next_seq += 1;
    chain.uploaded = len;
    chain.covered = covered.containers.clone();
    if full {
        chain.full_entries = len;
        chain.delta_entries = 0;
    } else {
        chain.delta_entries += new;
    }
    Ok(Some(Outgoing {
        epoch: object.epoch,
        kind: object.kind,
        name: object.name(),
        bytes: object.to_stored(keys),
    }))
}

/// Puts `object` (create-only); after a full object, deletes every object of `listed`
/// named before it.
pub(super) fn upload(
    objects: &ObjectBackend,
    p: PartitionId,
    object: &Outgoing,
    listed: &[Listed],
) -> Result<()> {
    put(objects, p, object)?;
    if object.kind == PartitionObjectKind::Full {
        for old in listed {
            if old
                .key
                .rsplit('/')
                .next()
                .is_some_and(|n| n < object.name.as_str())
            {
                objects.delete(&old.key).map_err(|e| store_error(p, e))?;
            }
        }
    }
    Ok(())
}
