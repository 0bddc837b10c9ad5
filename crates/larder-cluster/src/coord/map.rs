//! The partition-to-node map in etcd: `map/<p>` holds the owner of partition `p`,
//! and the key's mod_revision is the partition's epoch. Only the master writes the
//! map, in transactions guarded by its election key; owners check their epoch before
//! every durable write (the fencing check), so two nodes never write one partition.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Compare, CompareOp, EventType, KeyValue, TxnOp, TxnOpResponse, WatchOptions};
use larder_crypto::{AeadKind, FingerprintKind};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use super::{CoordError, Etcd, Leadership};

/// etcd's default `--max-txn-ops`: the most operations (and, separately, the most
/// comparisons) one transaction may carry.
pub const MAX_TXN_OPS: usize = 128;

/// Moves per `assign` transaction: each also compares (and, on failure, reads) the
/// master's election key, so one fewer than `MAX_TXN_OPS`.
pub const MOVES_PER_TXN: usize = MAX_TXN_OPS - 1;

const MAP: &str = "map/";
const CONFIG: &str = "config";

/// The version of the values this module writes (`config`, `map/<p>`).
pub const COORD_FORMAT_VERSION: u32 = 1;

fn map_key(partition: u32) -> String {
    format!("{MAP}{partition}")
}

fn map_value(owner: u16) -> Vec<u8> {
    format!("{{\"owner\":{owner}}}").into_bytes()
}

/// `map/<p>`'s value (JSON).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct MapValue {
    owner: u16,
}

/// A partition's owner and the epoch it was assigned at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Assignment {
    pub owner: u16,
    /// The mod_revision of `map/<p>` that made this assignment: it changes with every
    /// write of the key, so an owner holding an older epoch has been fenced.
    pub epoch: i64,
}

/// The whole map at one etcd revision.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PartitionMap {
    /// The etcd revision this map reflects: every map write up to it is included.
    pub revision: i64,
    pub partitions: BTreeMap<u32, Assignment>,
}

impl PartitionMap {
    pub fn get(&self, partition: u32) -> Option<Assignment> {
        self.partitions.get(&partition).copied()
    }

    /// The partitions `node` owns, ascending.
    pub fn owned_by(&self, node: u16) -> Vec<u32> {
        self.partitions
            .iter()
            .filter(|(_, a)| a.owner == node)
            .map(|(p, _)| *p)
            .collect()
    }
}

/// The `config` key's value (JSON), written once by `init_cluster`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterConfig {
    pub format_version: u32,
    /// `P`, the number of partitions: fixed for the cluster's life.
    pub partitions: u32,
    /// The chunker every node repository is created with, by name (`fastcdc2020`, or
    /// `keyed` in an encrypted cluster).
    pub chunking: String,
    /// The fingerprint algorithm.
    pub hash: String,
    /// How the cluster is encrypted; absent (and not written): a plaintext cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encryption: Option<ClusterEncryption>,
}

/// What an encrypted cluster's key must be (docs/design/crypto.md, "Cluster"): the
/// key slots in its shared storage hold key material of this cluster id, AEAD and
/// fingerprint. No key byte is in etcd.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterEncryption {
    pub aead: AeadKind,
    pub fingerprint: FingerprintKind,
    /// The cluster id, 32 lower-case hex digits: every node repository's id.
    pub id: String,
}

/// A read-mostly view of the map, kept current by a background watch. Clones share
/// one watch; reading is a lock-free `Arc` clone.
#[derive(Clone)]
pub struct MapCache {
    receiver: watch::Receiver<Arc<PartitionMap>>,
}

impl MapCache {
    /// The latest map seen.
    pub fn current(&self) -> Arc<PartitionMap> {
        self.receiver.borrow().clone()
    }

    pub fn get(&self, partition: u32) -> Option<Assignment> {
        self.receiver.borrow().get(partition)
    }

    /// Waits until the cache reflects etcd revision `revision` or later (for example
    /// the revision an `assign` returned) and returns that map.
    pub async fn wait_for_revision(&self, revision: i64) -> Result<Arc<PartitionMap>, CoordError> {
        self.wait_until(|map| map.revision >= revision).await
    }

    /// Waits until `condition` holds for the cached map and returns that map.
    pub async fn wait_until(
        &self,
        condition: impl Fn(&PartitionMap) -> bool,
    ) -> Result<Arc<PartitionMap>, CoordError> {
        let mut receiver = self.receiver.clone();
        let map = receiver
            .wait_for(|map| condition(map))
            .await
            .map_err(|_| CoordError::Config("the map watch task ended".into()))?;
        Ok(map.clone())
    }
}

/// Reads and writes of the map and the cluster config.
#[derive(Clone)]
pub struct PartitionMapStore {
    etcd: Etcd,
}

fn malformed(kv: &KeyValue, detail: impl std::fmt::Display) -> CoordError {
    CoordError::Malformed {
        key: String::from_utf8_lossy(kv.key()).into_owned(),
        detail: detail.to_string(),
    }
}

impl PartitionMapStore {
    pub fn new(etcd: &Etcd) -> Self {
        Self { etcd: etcd.clone() }
    }

    /// Writes `config` if no config exists (create-if-absent transaction). Succeeds
    /// when the stored config equals `config` (so init is safe to repeat), and fails
    /// with `ConfigMismatch` when it differs.
    pub async fn init_cluster(&self, config: &ClusterConfig) -> Result<(), CoordError> {
        if config.partitions == 0 {
            return Err(CoordError::Config(
                "a cluster needs at least one partition".into(),
            ));
        }
        let key = self.etcd.key(CONFIG);
        let value = serde_json::to_vec(config).map_err(|e| CoordError::Config(e.to_string()))?;
        let response = self
            .etcd
            .txn(|| {
                etcd_client::Txn::new()
                    .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
                    .and_then([TxnOp::put(key.clone(), value.clone(), None)])
                    .or_else([TxnOp::get(key.clone(), None)])
            })
            .await?;
        if response.succeeded() {
            return Ok(());
        }
        let stored = self.config().await?.ok_or_else(|| CoordError::Malformed {
            key: key.clone(),
            detail: "the config existed, then vanished".into(),
        })?;
        if &stored == config {
            Ok(())
        } else {
            Err(CoordError::ConfigMismatch {
                stored: format!("{stored:?}"),
                asked: format!("{config:?}"),
            })
        }
    }

    /// The cluster's config, if initialized.
    pub async fn config(&self) -> Result<Option<ClusterConfig>, CoordError> {
        let response = self.etcd.get(CONFIG).await?;
        response
            .kvs()
            .first()
            .map(|kv| serde_json::from_slice(kv.value()).map_err(|e| malformed(kv, e)))
            .transpose()
    }

    /// Writes `moves` (partition, new owner) as the master holding `master`, and
    /// returns each moved partition's new epoch, in the order given.
    ///
    /// Each transaction carries at most `MOVES_PER_TXN` moves and compares (1) the
    /// master's election key still at its create revision, and (2) each moved key
    /// still at the mod_revision last read. (2) makes a retried transaction exact:
    /// an attempt that timed out on our side may still commit later, and without the
    /// compare it would rewrite the key after the retry and leave the returned epoch
    /// stale. When the compare fails with the master still in place, the key changed
    /// since it was read, and only this master writes the map while its key exists
    /// (every other writer's guard names a key that is gone): so a key that now holds
    /// the wanted owner at a newer revision was written by this call's own earlier
    /// attempt, and its revision is the epoch. Fails with `NotMaster`, writing
    /// nothing more, once the guard fails; moves in earlier transactions stay.
    pub async fn assign(
        &self,
        moves: &[(u32, u16)],
        master: &Leadership,
    ) -> Result<Vec<(u32, i64)>, CoordError> {
        let mut seen = BTreeSet::new();
        if let Some((p, _)) = moves.iter().find(|(p, _)| !seen.insert(*p)) {
            return Err(CoordError::Config(format!(
                "partition {p} moved twice in one assign"
            )));
        }
        if let Some((p, _)) = moves.iter().find(|(_, node)| *node == 0) {
            return Err(CoordError::Config(format!(
                "partition {p} assigned to node 0"
            )));
        }
        let mut epochs = Vec::with_capacity(moves.len());
        for chunk in moves.chunks(MOVES_PER_TXN) {
            epochs.extend(self.assign_chunk(chunk, master).await?);
        }
        Ok(epochs)
    }

    async fn assign_chunk(
        &self,
        chunk: &[(u32, u16)],
        master: &Leadership,
    ) -> Result<Vec<(u32, i64)>, CoordError> {
        let guard_key = master.key().to_vec();
        let guard_revision = master.revision();
        let not_master = || CoordError::NotMaster {
            key: String::from_utf8_lossy(&guard_key).into_owned(),
            revision: guard_revision,
        };
        let keys: Vec<String> = chunk
            .iter()
            .map(|(p, _)| self.etcd.key(&map_key(*p)))
            .collect();
        // The mod_revision each key had when last read (0: absent).
        let mut read = self.revisions(&keys).await?;
        let mut done: Vec<Option<i64>> = vec![None; chunk.len()];
        loop {
            let pending: Vec<usize> = (0..chunk.len()).filter(|&i| done[i].is_none()).collect();
            if pending.is_empty() {
                break;
            }
            let response = self
                .etcd
                .txn(|| {
                    let mut compares = vec![Compare::create_revision(
                        guard_key.clone(),
                        CompareOp::Equal,
                        guard_revision,
                    )];
                    let mut puts = Vec::with_capacity(pending.len());
                    let mut gets = vec![TxnOp::get(guard_key.clone(), None)];
                    for &i in &pending {
                        compares.push(Compare::mod_revision(
                            keys[i].clone(),
                            CompareOp::Equal,
                            read[i],
                        ));
                        let value = map_value(chunk[i].1);
                        puts.push(TxnOp::put(keys[i].clone(), value, None));
                        gets.push(TxnOp::get(keys[i].clone(), None));
                    }
                    etcd_client::Txn::new()
                        .when(compares)
                        .and_then(puts)
                        .or_else(gets)
                })
                .await?;
            if response.succeeded() {
                let epoch = response.header().map(|h| h.revision()).unwrap_or(0);
                for &i in &pending {
                    done[i] = Some(epoch);
                }
                break;
            }
            let answers: Vec<Option<KeyValue>> = response
                .op_responses()
                .into_iter()
                .map(|answer| match answer {
                    TxnOpResponse::Get(mut get) => get.take_kvs().into_iter().next(),
                    _ => None,
                })
                .collect();
            match answers.first() {
                Some(Some(guard)) if guard.create_revision() == guard_revision => {}
                _ => return Err(not_master()),
            }
            for (&i, answer) in pending.iter().zip(&answers[1..]) {
                let (owner, revision) = match answer {
                    Some(kv) => (self.parse(kv)?.1.owner, kv.mod_revision()),
                    None => (0, 0),
                };
                if owner == chunk[i].1 && revision > read[i] {
                    done[i] = Some(revision);
                } else {
                    read[i] = revision;
                }
            }
        }
        Ok(chunk
            .iter()
            .zip(done)
            .map(|(&(p, _), epoch)| (p, epoch.unwrap_or(0)))
            .collect())
    }

    /// The mod_revision of each of `keys` (absolute), 0 for an absent key, read in
    /// one transaction.
    async fn revisions(&self, keys: &[String]) -> Result<Vec<i64>, CoordError> {
        let response = self
            .etcd
            .txn(|| {
                let gets: Vec<TxnOp> = keys.iter().map(|k| TxnOp::get(k.clone(), None)).collect();
                etcd_client::Txn::new().and_then(gets)
            })
            .await?;
        Ok(response
            .op_responses()
            .iter()
            .map(|answer| match answer {
                TxnOpResponse::Get(get) => {
                    get.kvs().first().map(|kv| kv.mod_revision()).unwrap_or(0)
                }
                _ => 0,
            })
            .collect())
    }

    /// The whole map, read at one revision.
    pub async fn load(&self) -> Result<PartitionMap, CoordError> {
        let response = self.etcd.get_prefix(MAP).await?;
        let mut map = PartitionMap {
            revision: response.header().map(|h| h.revision()).unwrap_or(0),
            partitions: BTreeMap::new(),
        };
        for kv in response.kvs() {
            let (partition, assignment) = self.parse(kv)?;
            map.partitions.insert(partition, assignment);
        }
        Ok(map)
    }

    fn parse(&self, kv: &KeyValue) -> Result<(u32, Assignment), CoordError> {
        let partition = self
            .partition_of_key(kv.key())
            .ok_or_else(|| malformed(kv, "not a map key"))?;
        let value: MapValue = serde_json::from_slice(kv.value()).map_err(|e| malformed(kv, e))?;
        Ok((
            partition,
            Assignment {
                owner: value.owner,
                epoch: kv.mod_revision(),
            },
        ))
    }

    fn partition_of_key(&self, key: &[u8]) -> Option<u32> {
        let key = std::str::from_utf8(key).ok()?;
        key.strip_prefix(self.etcd.prefix())?
            .strip_prefix(MAP)?
            .parse()
            .ok()
    }

    /// The fencing check: true exactly when `map/<partition>` is still at `epoch`.
    /// Linearizable: the transaction also reads the key. A transaction of comparisons
    /// alone counts as "serializable" in etcd 3.4 (no range in it asks otherwise) and
    /// is answered from the member's local state, which on a member catching up after
    /// a restart is stale: `killing_one_etcd_member_of_three_changes_nothing` saw a
    /// fresh epoch refused that way, and a fenced owner could pass the check the same
    /// way.
    pub async fn check_epoch(&self, partition: u32, epoch: i64) -> Result<bool, CoordError> {
        let key = self.etcd.key(&map_key(partition));
        let response = self
            .etcd
            .txn(|| {
                etcd_client::Txn::new()
                    .when([Compare::mod_revision(key.clone(), CompareOp::Equal, epoch)])
                    .and_then([TxnOp::get(key.clone(), None)])
                    .or_else([TxnOp::get(key.clone(), None)])
            })
            .await?;
        Ok(response.succeeded())
    }

    /// The fencing check for many partitions: one transaction per `MAX_TXN_OPS`
    /// partitions, linearizable like `check_epoch` (both branches read the keys).
    /// Returns the partitions whose epoch is no longer current (empty when every one
    /// still is), ascending.
    pub async fn check_epochs(&self, epochs: &[(u32, i64)]) -> Result<Vec<u32>, CoordError> {
        let mut stale = Vec::new();
        for chunk in epochs.chunks(MAX_TXN_OPS) {
            let keys: Vec<String> = chunk
                .iter()
                .map(|(p, _)| self.etcd.key(&map_key(*p)))
                .collect();
            let response = self
                .etcd
                .txn(|| {
                    let compares: Vec<Compare> = keys
                        .iter()
                        .zip(chunk)
                        .map(|(key, (_, epoch))| {
                            Compare::mod_revision(key.clone(), CompareOp::Equal, *epoch)
                        })
                        .collect();
                    let gets: Vec<TxnOp> = keys
                        .iter()
                        .map(|key| TxnOp::get(key.clone(), None))
                        .collect();
                    etcd_client::Txn::new()
                        .when(compares)
                        .and_then(gets.clone())
                        .or_else(gets)
                })
                .await?;
            if response.succeeded() {
                continue;
            }
            for (answer, &(partition, epoch)) in response.op_responses().iter().zip(chunk) {
                let current = match answer {
                    TxnOpResponse::Get(get) => {
                        get.kvs().first().map(|kv| kv.mod_revision()).unwrap_or(0)
                    }
                    _ => 0,
                };
                if current != epoch {
                    stale.push(partition);
                }
            }
        }
        stale.sort_unstable();
        stale.dedup();
        Ok(stale)
    }

    /// A cache of the map, loaded now and kept current by a watch on `map/`. After a
    /// watch error or a compaction the map is reloaded whole. The watch task ends when
    /// every clone of the cache is dropped.
    pub async fn cache(&self) -> Result<MapCache, CoordError> {
        let map = self.load().await?;
        let (sender, receiver) = watch::channel(Arc::new(map));
        tokio::spawn(follow_map(self.clone(), sender));
        Ok(MapCache { receiver })
    }
}

/// Applies map events to the cache. Invariant: the cached map equals etcd's `map/`
/// keys at the cached `revision` (events are applied in revision order, and any gap,
/// a stream error or a compaction, is closed by a full reload).
async fn follow_map(store: PartitionMapStore, sender: watch::Sender<Arc<PartitionMap>>) {
    loop {
        let start = sender.borrow().revision + 1;
        let options = WatchOptions::new().with_prefix().with_start_revision(start);
        let stream = tokio::select! {
            _ = sender.closed() => return,
            stream = store.etcd.watch(MAP, options) => stream,
        };
        if let Ok(mut stream) = stream {
            loop {
                let message = tokio::select! {
                    _ = sender.closed() => return,
                    message = stream.message() => message,
                };
                let response = match message {
                    Ok(Some(response)) if !response.canceled() => response,
                    Ok(Some(response)) => {
                        tracing::info!(
                            compacted = response.compact_revision(),
                            reason = response.cancel_reason(),
                            "map watch cancelled: reloading"
                        );
                        break;
                    }
                    _ => break,
                };
                if response.events().is_empty() {
                    continue;
                }
                let mut map = PartitionMap::clone(&sender.borrow());
                for event in response.events() {
                    let Some(kv) = event.kv() else { continue };
                    map.revision = map.revision.max(kv.mod_revision());
                    match event.event_type() {
                        EventType::Put => match store.parse(kv) {
                            Ok((partition, assignment)) => {
                                map.partitions.insert(partition, assignment);
                            }
                            Err(error) => tracing::warn!(%error, "ignoring a malformed map entry"),
                        },
                        EventType::Delete => {
                            if let Some(partition) = store.partition_of_key(kv.key()) {
                                map.partitions.remove(&partition);
                            }
                        }
                    }
                }
                sender.send_replace(Arc::new(map));
            }
        }
        // A gap: reload the whole map, then watch from its revision.
        loop {
            tokio::time::sleep(Duration::from_millis(100)).await;
            if sender.is_closed() {
                return;
            }
            if let Ok(map) = store.load().await {
                sender.send_replace(Arc::new(map));
                break;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// `map_value` writes by hand exactly what serde writes for `MapValue`, so the
        /// cache and `load` parse every owner back.
        #[test]
        fn map_value_is_the_documented_json(owner in any::<u16>()) {
            let bytes = map_value(owner);
            prop_assert_eq!(&bytes, &serde_json::to_vec(&MapValue { owner }).unwrap());
            prop_assert_eq!(serde_json::from_slice::<MapValue>(&bytes).unwrap(), MapValue { owner });
        }
    }

    /// docs/design/cluster.md's `config` value, byte for byte.
    #[test]
    fn config_value_is_the_documented_json() {
        let config = ClusterConfig {
            format_version: 1,
            partitions: 1024,
            chunking: "...".into(),
            hash: "blake3".into(),
            encryption: None,
        };
        assert_eq!(
            serde_json::to_string(&config).unwrap(),
            r#"{"format_version":1,"partitions":1024,"chunking":"...","hash":"blake3"}"#
        );
        let encrypted = ClusterConfig {
            chunking: "keyed".into(),
            encryption: Some(ClusterEncryption {
                aead: AeadKind::Aes256Gcm,
                fingerprint: FingerprintKind::KeyedBlake3,
                id: "00112233445566778899aabbccddeeff".into(),
            }),
            ..config
        };
        let json = serde_json::to_string(&encrypted).unwrap();
        assert_eq!(
            json,
            r#"{"format_version":1,"partitions":1024,"chunking":"keyed","hash":"blake3","encryption":{"aead":"aes-256-gcm","fingerprint":"keyed-blake3","id":"00112233445566778899aabbccddeeff"}}"#
        );
        assert_eq!(
            serde_json::from_str::<ClusterConfig>(&json).unwrap(),
            encrypted
        );
        assert_eq!(map_value(3), br#"{"owner":3}"#);
    }
}
