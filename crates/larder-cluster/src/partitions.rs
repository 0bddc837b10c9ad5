//! Partitions on shared storage (docs/design/cluster.md, "Shared storage" and
//! "Failover"): each partition's disk index, checkpointed with the containers it
//! covers, and its takeover by a new owner, which replays the entries of every
//! container written since from the writers' own containers. The containers are the
//! write-ahead log: a writer acknowledges a chunk only once its container is durable,
//! and a container's table lists its chunks' fingerprints.
//!
//! On object storage each partition's index lives in the owner's cache directory and
//! its checkpoints are put as immutable objects (`chain`; docs/design/cluster.md,
//! "Partitions on object storage"), from which a takeover rebuilds the index; sealed
//! with the cluster's key in an encrypted cluster (docs/design/crypto.md, "Cluster").

mod chain;

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use larder_crypto::RepoKeys;
use larder_hash::{Fingerprint, HashAlgo};
use larder_index::disk::{
    Answer, DirIo, DiskIndex, DiskIndexConfig, IndexDir, IndexFile, IndexIo, Lookup,
};
use larder_index::{ChunkLocation, IndexError};
use larder_store::{read_table, ChunkCodec, Compression, FileKind};
use serde::{Deserialize, Serialize};

use crate::error::{ClusterError, Result};
use crate::ids::{container_writer, partition_of, NodeId, PartitionId};
use crate::owner::Ticket;
use crate::storage::SharedStorage;

/// The name of a partition's checkpoint record, beside its index files.
const COVERED: &str = "covered.json";

/// The name of a partition's writer lock, beside its index files: an empty file on
/// which a node holds an exclusive `flock` while it writes the partition (a takeover,
/// a checkpoint). An old owner may still be taking a partition over when the master
/// moves it on (a node that owned every partition alone when the others joined); the
/// new owner's takeover waits for it instead of writing the same files at once. The
/// kernel drops the lock of a node that dies.
pub const WRITER_LOCK: &str = "writer.lock";

/// What a partition's index holds for sure: per writer node, the highest container id
/// whose entries (of this partition) are all in the index. Writers acknowledge their
/// containers in id order, so every lower container of that writer is covered too.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Covered {
    /// The epoch of the owner that wrote this record.
    pub epoch: u64,
    /// Writer node to container id.
    pub containers: BTreeMap<NodeId, u64>,
}

impl Covered {
    /// Records that container `container`'s entries are in the index.
    pub fn cover(&mut self, container: u64) {
        let high = self
            .containers
            .entry(container_writer(container))
            .or_insert(0);
        *high = (*high).max(container);
    }

    fn covers(&self, container: u64) -> bool {
        self.containers
            .get(&container_writer(container))
            .is_some_and(|&high| container <= high)
    }

    /// The bytes of `covered.json` (docs/design/cluster.md, "Shared storage layout").
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a map of integers serializes")
    }

    /// A `covered.json` read back from shared storage. Refuses, as
    /// [`ClusterError::Corrupt`], bytes that are not the record's JSON, and a record
    /// naming a container of another writer than its key: [`Covered::cover`] never
    /// writes one, and trusting it would skip the replay of that writer's containers.
    /// Never panics (fuzz target `covered`, docs/design/fuzzing.md).
    pub fn decode(bytes: &[u8]) -> Result<Covered> {
        let corrupt = |reason| ClusterError::Corrupt {
            what: COVERED.to_string(),
            reason,
        };
        let covered: Covered = serde_json::from_slice(bytes).map_err(|e| corrupt(e.to_string()))?;
        if let Some((node, high)) = covered
            .containers
            .iter()
            .find(|&(&node, &high)| container_writer(high) != node)
        {
            return Err(corrupt(format!(
                "container {high:#x} of node {node} was written by node {}",
                container_writer(*high)
            )));
        }
        Ok(covered)
    }
}

/// What a takeover found and did, for the log and the tests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Replay {
    /// Partitions whose index was missing or not closed cleanly, so replayed in full.
    pub rebuilt: u32,
    /// Container tables read, and entries inserted from them.
    pub containers_read: u64,
    pub inserted: u64,
    /// Partition objects that ended their chain early, each with why: damaged, not
    /// opened by the cluster's key (changed, or moved from another name, partition or
    /// cluster), naming another object, or after a missing one. Their entries came from
    /// the replay instead.
    pub bad_objects: Vec<(String, String)>,
}

/// A cluster's partitions in its shared storage. In a shared directory,
/// `partitions/<p>/` holds partition `p`'s disk index files and its [`Covered`]
/// record; on object storage the index files are in this node's cache and
/// `partitions/<p>/` holds its objects. `nodes/<id>/` is node `id`'s repository,
/// whose containers the replay reads.
#[derive(Debug, Clone)]
pub struct PartitionStore {
    storage: SharedStorage,
    partitions: u32,
    /// Reads the writers' container tables in the replay: the cluster's fingerprint,
    /// and its key in an encrypted cluster, which also seals the partition objects.
    /// Compression plays no part in reading tables.
    codec: ChunkCodec,
    index: DiskIndexConfig,
    lookup: Lookup,
    /// On object storage: what this node put of each partition it took over.
    chains: Arc<Mutex<HashMap<PartitionId, chain::Chain>>>,
    /// On object storage: objects checkpoints made and `upload` has not put yet.
    uploads: Arc<Mutex<BTreeMap<PartitionId, VecDeque<chain::Outgoing>>>>,
}

/// A partition's open index, ready for its owner.
pub type PartitionIndex = DiskIndex<IndexDir, Ticket>;

/// A partition taken over: its index and what the index covers.
pub type Opened = (PartitionId, PartitionIndex, Covered);

impl PartitionStore {
    /// The partitions of the plaintext cluster in `root`, of `partitions` partitions,
    /// whose fingerprints are `algo`'s; each index is opened with `index` and `lookup`.
    pub fn new(
        root: &Path,
        partitions: u32,
        algo: HashAlgo,
        index: DiskIndexConfig,
        lookup: Lookup,
    ) -> Self {
        Self::with_storage(
            SharedStorage::from(root),
            partitions,
            algo,
            None,
            index,
            lookup,
        )
    }

    /// The partitions of the cluster whose shared storage is `storage`, encrypted with
    /// `keys` when given. Their indexes do not time their per-fingerprint calls
    /// ([`DiskIndexConfig::timed`]): an owner never reports those times.
    pub fn with_storage(
        storage: SharedStorage,
        partitions: u32,
        algo: HashAlgo,
        keys: Option<Arc<RepoKeys>>,
        index: DiskIndexConfig,
        lookup: Lookup,
    ) -> Self {
        let codec = match keys {
            Some(keys) => ChunkCodec::encrypted(Compression::None, algo, keys),
            None => ChunkCodec::new(Compression::None, algo),
        };
        Self {
            storage,
            partitions,
            codec,
            index: DiskIndexConfig {
                timed: false,
                ..index
            },
            lookup,
            chains: Arc::default(),
            uploads: Arc::default(),
        }
    }

    /// Where partition `p`'s disk index files are (the shared directory, or this
    /// node's cache).
    pub fn dir(&self, p: PartitionId) -> PathBuf {
        self.storage.partition_dir(p.0)
    }

    /// The local directory of node `node`'s repository.
    pub fn node_dir(&self, node: NodeId) -> PathBuf {
        self.storage.node_root(node)
    }

    fn chains(&self) -> std::sync::MutexGuard<'_, HashMap<PartitionId, chain::Chain>> {
        self.chains.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn uploads(
        &self,
    ) -> std::sync::MutexGuard<'_, BTreeMap<PartitionId, VecDeque<chain::Outgoing>>> {
        self.uploads.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The cluster's key, in an encrypted cluster.
    fn keys(&self) -> Option<&RepoKeys> {
        self.codec.keys().map(|k| &**k)
    }

    /// Opens `parts` for a new owner under `epoch`: each index as last checkpointed
    /// (empty, and replayed in full, when it is missing or was not closed cleanly), then
    /// the entries of every container its checkpoint does not cover, read once from the
    /// writers' containers for all of `parts`, then a checkpoint of each. Containers that
    /// do not verify are skipped (`check` reports them; their chunks were never
    /// acknowledged). On object storage a partition with objects of a newer epoch is
    /// left out of the result: a newer owner has it.
    pub fn take_over(&self, parts: &[PartitionId], epoch: u64) -> Result<(Vec<Opened>, Replay)> {
        // In ascending order, as every node takes them: two takeovers never wait on
        // each other in a cycle.
        let mut in_order = parts.to_vec();
        in_order.sort_unstable();
        let _locks = in_order
            .iter()
            .map(|&p| self.lock_writer(p))
            .collect::<Result<Vec<_>>>()?;
        let mut replay = Replay::default();
        let mut opened = Vec::with_capacity(parts.len());
        let mut listed = Vec::with_capacity(parts.len());
        for &p in parts {
            let (index, covered, rebuilt) = match self.storage.partition_objects() {
                None => self.open(p)?,
                Some(objects) => {
                    let objects_of_p = chain::list(&objects, p)?;
                    // The map moved on while this node was catching up: a newer owner
                    // holds the partition; it is not this node's to open.
                    if let Err(e) = chain::check_fence(p, &objects_of_p, epoch) {
                        tracing::warn!(partition = p.0, epoch, "takeover skipped: {e}");
                        continue;
                    }
                    let loaded = self.open_from_objects(&objects, p, &objects_of_p, &mut replay)?;
                    listed.push(objects_of_p);
                    loaded
                }
            };
            replay.rebuilt += u32::from(rebuilt);
            opened.push((p, index, covered));
        }
        let slot: BTreeMap<PartitionId, usize> = opened
            .iter()
            .enumerate()
            .map(|(i, (p, _, _))| (*p, i))
            .collect();
        for (writer, ids) in self.containers()? {
            let backend = self.storage.node_backend(writer);
            for id in ids {
                if opened.iter().all(|(_, _, covered)| covered.covers(id)) {
                    continue;
                }
                let Ok(table) = read_table(&*backend, id, &self.codec) else {
                    continue;
                };
                replay.containers_read += 1;
                for entry in table.entries {
                    let p = partition_of(&entry.fingerprint, self.partitions);
                    let Some(&i) = slot.get(&p) else { continue };
                    let (_, index, covered) = &mut opened[i];
                    if covered.covers(id) {
                        continue;
                    }
                    if insert_if_absent(index, entry.fingerprint, entry.location(id)).map_err(
                        |source| ClusterError::Index {
                            partition: p,
                            source,
                        },
                    )? {
                        replay.inserted += 1;
                    }
                }
                for (_, _, covered) in opened.iter_mut() {
                    covered.cover(id);
                }
            }
        }
        match self.storage.partition_objects() {
            None => {
                for (p, index, covered) in opened.iter_mut() {
                    covered.epoch = epoch;
                    self.write_checkpoint(*p, index, covered)?;
                }
            }
            Some(objects) => {
                for ((p, index, covered), objects_of_p) in opened.iter_mut().zip(&listed) {
                    covered.epoch = epoch;
                    index.checkpoint().map_err(|source| ClusterError::Index {
                        partition: *p,
                        source,
                    })?;
                    let mut state = chain::Chain {
                        epoch,
                        next_seq: objects_of_p
                            .iter()
                            .filter(|l| l.epoch == epoch)
                            .map(|l| l.seq + 1)
                            .max()
                            .unwrap_or(0),
                        ..chain::Chain::default()
                    };
                    // Objects a previous ownership of this node left unput are
                    // dropped: the full object below holds their entries.
                    self.uploads().remove(p);
                    if let Some(full) =
                        chain::next_object(*p, index, covered, &mut state, true, self.keys())?
                    {
                        chain::upload(&objects, *p, &full, objects_of_p)?;
                    }
                    self.chains().insert(*p, state);
                }
            }
        }
        Ok((opened, replay))
    }

    /// Partition `p`'s index rebuilt in this node's cache from its objects (`listed`):
    /// a fresh index holding the entries of the newest full object and the deltas
    /// after it, and the covered record of the last of them; `true` when there was
    /// none (then everything is replayed). The cache's old files are never trusted:
    /// they may be from an earlier ownership. Objects that end the chain early are
    /// named in `replay`.
    fn open_from_objects(
        &self,
        objects: &larder_store::ObjectBackend,
        p: PartitionId,
        listed: &[chain::Listed],
        replay: &mut Replay,
    ) -> Result<(PartitionIndex, Covered, bool)> {
        let dir = self.dir(p);
        let io_err = |what: &str, source| ClusterError::Io {
            what: format!("{what} {}", dir.display()),
            source,
        };
        for file in [
            IndexFile::Table,
            IndexFile::Meta,
            IndexFile::Bloom,
            IndexFile::Runs,
        ] {
            let path = DirIo::open(&dir, false)
                .map_err(|e| io_err("open", e))?
                .path(file);
            match std::fs::remove_file(&path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(io_err("clear", e))
                }
                _ => {}
            }
        }
        let io = IndexDir::open(&dir, self.keys()).map_err(|e| io_err("open", e))?;
        let mut index =
            DiskIndex::create(io, self.index.clone(), self.lookup).map_err(|source| {
                ClusterError::Index {
                    partition: p,
                    source,
                }
            })?;
        let (loaded, bad) = chain::load(objects, p, listed, self.keys());
        replay.bad_objects.extend(bad);
        let mut covered = Covered::default();
        for object in &loaded {
            for &(fp, location) in &object.entries {
                insert_if_absent(&mut index, fp, location).map_err(|source| {
                    ClusterError::Index {
                        partition: p,
                        source,
                    }
                })?;
            }
            covered.containers = object.covered.clone();
        }
        Ok((index, covered, loaded.is_empty()))
    }

    /// Makes partition `p`'s index durable, then records what it covers, under its
    /// writer lock. Refused with [`ClusterError::Fenced`], writing nothing, when the
    /// record on disk carries a newer epoch than `covered`'s: a newer owner took the
    /// partition over (epochs are etcd revisions, which only grow), and this owner's
    /// index is stale. With the writer lock this closes the window between an owner's
    /// epoch check in etcd and its write. On object storage the index is made durable
    /// in the cache and the partition's next object queued: [`PartitionStore::upload`]
    /// puts it, and finds the fencing there.
    pub fn checkpoint(
        &self,
        p: PartitionId,
        index: &mut PartitionIndex,
        covered: &Covered,
    ) -> Result<()> {
        if self.storage.partition_objects().is_some() {
            return self.checkpoint_objects(p, index, covered);
        }
        let _lock = self.lock_writer(p)?;
        let on_disk = self.read_covered(p)?.map_or(0, |c| c.epoch);
        if on_disk > covered.epoch {
            return Err(ClusterError::Fenced {
                partition: p,
                epoch: covered.epoch,
                newer: on_disk,
            });
        }
        self.write_checkpoint(p, index, covered)
    }

    /// The object-storage checkpoint: the index made durable in the cache and the
    /// partition's next object queued for [`PartitionStore::upload`]. No request to the
    /// object store: the owner holds its service lock across this call, and lookups
    /// wait on that lock on the runtime's threads (where a stall of a few seconds
    /// loses the node's lease).
    fn checkpoint_objects(
        &self,
        p: PartitionId,
        index: &mut PartitionIndex,
        covered: &Covered,
    ) -> Result<()> {
        index.checkpoint().map_err(|source| ClusterError::Index {
            partition: p,
            source,
        })?;
        let mut chains = self.chains();
        let state = chains
            .get_mut(&p)
            .filter(|c| c.epoch == covered.epoch)
            .ok_or(ClusterError::NotOwner(p))?;
        if let Some(object) = chain::next_object(p, index, covered, state, false, self.keys())? {
            self.uploads().entry(p).or_default().push_back(object);
        }
        Ok(())
    }

    /// Puts the objects checkpoints queued, in order per partition, each partition's
    /// after a check that no newer epoch's object exists. Returns the partitions found
    /// fenced (their queues dropped: the caller must stop serving them). A partition
    /// whose put fails keeps its queue from that object on, for the next call: an
    /// object is never put before the ones it follows. Nothing to do on a shared
    /// directory.
    pub fn upload(&self) -> Result<Vec<PartitionId>> {
        let Some(objects) = self.storage.partition_objects() else {
            return Ok(Vec::new());
        };
        let pending: Vec<PartitionId> = self.uploads().keys().copied().collect();
        let mut fenced = Vec::new();
        let mut failure = None;
        for p in pending {
            let Some(epoch) = self
                .uploads()
                .get(&p)
                .and_then(|q| q.front())
                .map(|o| o.epoch)
            else {
                continue;
            };
            let listed = match chain::list(&objects, p) {
                Ok(listed) => listed,
                Err(e) => {
                    failure.get_or_insert(e);
                    continue;
                }
            };
            if chain::check_fence(p, &listed, epoch).is_err() {
                self.uploads().remove(&p);
                fenced.push(p);
                continue;
            }
            loop {
                let Some(object) = self.uploads().get(&p).and_then(|q| q.front().cloned()) else {
                    break;
                };
                if let Err(e) = chain::upload(&objects, p, &object, &listed) {
                    failure.get_or_insert(e);
                    break;
                }
                let mut uploads = self.uploads();
                if let Some(queue) = uploads.get_mut(&p) {
                    queue.pop_front();
                    if queue.is_empty() {
                        uploads.remove(&p);
                    }
                }
            }
        }
        failure.map_or(Ok(fenced), Err)
    }

    /// Partition `p`'s record of what its index covers, if it has one.
    fn read_covered(&self, p: PartitionId) -> Result<Option<Covered>> {
        let path = self.dir(p).join(COVERED);
        match std::fs::read(&path) {
            Ok(bytes) => match Covered::decode(&bytes) {
                Ok(covered) => Ok(Some(covered)),
                Err(ClusterError::Corrupt { reason, .. }) => Err(ClusterError::Corrupt {
                    what: path.display().to_string(),
                    reason,
                }),
                Err(e) => Err(e),
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(ClusterError::Io {
                what: format!("read {}", path.display()),
                source,
            }),
        }
    }

    /// Waits for partition `p`'s writer lock and holds it until the file is dropped.
    pub fn lock_writer(&self, p: PartitionId) -> Result<std::fs::File> {
        let dir = self.dir(p);
        let io = |what: &str, source| ClusterError::Io {
            what: format!("{what} {}", dir.join(WRITER_LOCK).display()),
            source,
        };
        std::fs::create_dir_all(&dir).map_err(|e| io("create the directory of", e))?;
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join(WRITER_LOCK))
            .map_err(|e| io("open", e))?;
        file.lock().map_err(|e| io("lock", e))?;
        Ok(file)
    }

    /// Makes partition `p`'s index durable, then records what it covers. In that
    /// order: a crash between the two leaves an older record, which only replays more.
    /// The caller holds `p`'s writer lock.
    fn write_checkpoint(
        &self,
        p: PartitionId,
        index: &mut PartitionIndex,
        covered: &Covered,
    ) -> Result<()> {
        index.checkpoint().map_err(|source| ClusterError::Index {
            partition: p,
            source,
        })?;
        let dir = self.dir(p);
        let bytes = covered.encode();
        let tmp = dir.join(format!("{COVERED}.tmp"));
        let io = |what: &str, source| ClusterError::Io {
            what: format!("{what} {}", dir.join(COVERED).display()),
            source,
        };
        let mut file = std::fs::File::create(&tmp).map_err(|e| io("create", e))?;
        file.write_all(&bytes).map_err(|e| io("write", e))?;
        file.sync_all().map_err(|e| io("sync", e))?;
        std::fs::rename(&tmp, dir.join(COVERED)).map_err(|e| io("rename", e))?;
        std::fs::File::open(&dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| io("sync the directory of", e))
    }

    /// Partition `p`'s index and record, or a new empty index with an empty record when
    /// the index is missing or cannot be trusted (then `true`: replay everything).
    fn open(&self, p: PartitionId) -> Result<(PartitionIndex, Covered, bool)> {
        let dir = self.dir(p);
        let io_err = |what: &str, source| ClusterError::Io {
            what: format!("{what} {}", dir.display()),
            source,
        };
        std::fs::create_dir_all(&dir).map_err(|e| io_err("create", e))?;
        let io = IndexDir::open(&dir, self.keys()).map_err(|e| io_err("open", e))?;
        let index_err = |source| ClusterError::Index {
            partition: p,
            source,
        };
        match DiskIndex::open(io, self.index.clone(), self.lookup) {
            Ok(index) => Ok((index, self.read_covered(p)?.unwrap_or_default(), false)),
            Err(IndexError::Missing(_) | IndexError::NeedsRebuild | IndexError::Corrupt { .. }) => {
                let io = IndexDir::open(&dir, self.keys()).map_err(|e| io_err("open", e))?;
                let index =
                    DiskIndex::create(io, self.index.clone(), self.lookup).map_err(index_err)?;
                Ok((index, Covered::default(), true))
            }
            Err(source) => Err(index_err(source)),
        }
    }

    /// Every node's container ids, per node, in order.
    fn containers(&self) -> Result<BTreeMap<NodeId, BTreeSet<u64>>> {
        let mut out = BTreeMap::new();
        let nodes = self
            .storage
            .nodes(false)
            .map_err(|source| ClusterError::Store {
                what: "the node repositories".into(),
                source,
            })?;
        for node in nodes {
            let backend = self.storage.node_backend(node);
            let names =
                backend
                    .list(FileKind::Container)
                    .map_err(|source| ClusterError::Store {
                        what: format!("containers of node {node}"),
                        source,
                    })?;
            let ids = names
                .iter()
                .filter_map(|n| u64::from_str_radix(n, 16).ok())
                .filter(|&id| container_writer(id) == node)
                .collect();
            out.insert(node, ids);
        }
        Ok(out)
    }
}

/// Node `node`'s repository in the shared cluster directory `root`.
pub fn node_dir(root: &Path, node: NodeId) -> PathBuf {
    root.join("nodes").join(node.to_string())
}

/// Inserts `fp` at `location` unless the index has it; `true` if inserted. Only for an
/// index with no lookups in flight (a takeover, before the owner serves it).
fn insert_if_absent(
    index: &mut PartitionIndex,
    fp: Fingerprint,
    location: ChunkLocation,
) -> std::result::Result<bool, IndexError> {
    let own = Ticket { node: 0, id: 0 };
    index.submit(fp, own)?;
    index.finish()?;
    let answer = index.poll().expect("a finished lookup is answered").answer;
    debug_assert!(index.poll().is_none());
    match answer {
        Answer::New => index.insert(fp, location).map(|()| true),
        Answer::Duplicate(_) => Ok(false),
    }
}
