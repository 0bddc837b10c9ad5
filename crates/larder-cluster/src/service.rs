//! The owner behind a node's lookup service: its partitions in [`SHARDS`] groups, each
//! an [`Owner`] under its own lock, shared by the requests of every connection. A
//! request is split by group and its answers put back in request order; each part waits
//! for all of its answers (some wait on another requester's lock). Lock deadlines are
//! kept by a timer task, and checkpoints of the partitions go to shared storage.
//! Lookups and acknowledgements are taken only from the cluster's members, as the
//! node's view of `members/` in etcd has them (docs/design/cluster.md, "Who an owner
//! trusts").

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, TryLockError};
use std::time::{Duration, Instant};

use larder_hash::Fingerprint;
use larder_index::ChunkLocation;
use tokio::sync::oneshot;

use crate::error::{ClusterError, Result};
use crate::ids::{partition_of, NodeId, PartitionId};
use crate::owner::{check_writer, Owner, OwnerMetrics};
use crate::partitions::{PartitionIndex, PartitionStore, Replay};
use crate::router::MapView;
use crate::rpc::{Answer, GetAnswer, LookupHandler, RpcError};

/// Groups of partitions, each under its own lock: partition `p` is in group
/// `p % SHARDS`. A request touches every group (a batch spreads over every
/// partition), so more groups cost more per request; eight let eight requests be
/// answered at once. Every fingerprint's partition is in exactly one group, so the
/// copies of a fingerprint in a request are answered by one group in request order,
/// as one owner answered them (docs/design/cluster.md, "Lock on new").
pub const SHARDS: usize = 8;

fn shard_of(p: PartitionId) -> usize {
    p.0 as usize % SHARDS
}

/// A part of a request: its answers as they come in.
struct Pending {
    answers: Vec<Option<Answer>>,
    missing: usize,
    done: oneshot::Sender<Vec<Answer>>,
}

/// One group of partitions: its owner, and the parts of requests waiting on it.
struct Shard {
    owner: Owner<larder_index::disk::IndexDir>,
    /// The next ticket id: unique among this group's tickets, whoever asks.
    next_id: u64,
    /// The parts of requests waiting for answers, by their first ticket id: a part of
    /// `n` fingerprints holds the tickets `first .. first + n`, fingerprint `i` ticket
    /// `first + i`. One entry per part, not per fingerprint.
    waiting: BTreeMap<u64, Pending>,
}

/// A node's partitions, served to lookup requests.
#[derive(Clone)]
pub struct OwnerService {
    shards: Arc<[Mutex<Shard>]>,
    partitions: u32,
    /// Lookup requests served (the groups' owners count the parts).
    requests: Arc<AtomicU64>,
    /// What every takeover replayed, summed.
    replayed: Arc<Mutex<Replay>>,
    store: Arc<PartitionStore>,
    /// The node's view of the cluster: its `addrs` are the members, the only nodes
    /// whose lookups and acknowledgements are taken.
    view: Arc<RwLock<MapView>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl OwnerService {
    /// A service owning nothing yet, of the partitions in `store`, of a cluster of
    /// `partitions` partitions; a lock not acknowledged within `lock_timeout` passes on.
    /// It serves the members in `view` (the node's view of etcd's `members/`, kept
    /// current by its watch) and refuses every other node.
    pub fn new(
        store: PartitionStore,
        partitions: u32,
        lock_timeout: Duration,
        view: Arc<RwLock<MapView>>,
    ) -> Self {
        let shards = (0..SHARDS)
            .map(|_| {
                Mutex::new(Shard {
                    owner: Owner::new(partitions, lock_timeout),
                    next_id: 0,
                    waiting: BTreeMap::new(),
                })
            })
            .collect();
        Self {
            shards,
            partitions,
            requests: Arc::new(AtomicU64::new(0)),
            replayed: Arc::new(Mutex::new(Replay::default())),
            store: Arc::new(store),
            view,
        }
    }

    /// Refuses `what` from node `from` unless it is a member now. Retryable: a node
    /// that just joined may not be in this node's view yet.
    fn require_member(&self, from: NodeId, what: &'static str) -> Result<()> {
        let view = self.view.read().unwrap_or_else(|p| p.into_inner());
        if view.addrs.contains_key(&from) {
            return Ok(());
        }
        let refused = ClusterError::Refused {
            from,
            what,
            reason: "it is not a member of the cluster".into(),
            retryable: true,
        };
        tracing::warn!("{refused}");
        Err(refused)
    }

    fn shard(&self, p: PartitionId) -> MutexGuard<'_, Shard> {
        lock(&self.shards[shard_of(p)])
    }

    /// The positions of `keys` by group, in order within each: `(group, positions)`
    /// for every group that has some.
    fn split<'a>(&self, keys: impl Iterator<Item = &'a Fingerprint>) -> Vec<(usize, Vec<u32>)> {
        let mut groups: Vec<Vec<u32>> = vec![Vec::new(); SHARDS];
        for (i, fp) in keys.enumerate() {
            groups[shard_of(partition_of(fp, self.partitions))].push(i as u32);
        }
        groups
            .into_iter()
            .enumerate()
            .filter(|(_, positions)| !positions.is_empty())
            .collect()
    }

    /// The first of `parts`' groups that is not locked, locked, with its place in
    /// `parts`; else the first, once it is free. Requests on several threads visit
    /// the groups in different orders, instead of queueing behind one another from
    /// group to group.
    fn next_free(&self, parts: &[(usize, Vec<u32>)]) -> (usize, MutexGuard<'_, Shard>) {
        parts
            .iter()
            .enumerate()
            .find_map(|(k, &(s, _))| match self.shards[s].try_lock() {
                Ok(shard) => Some((k, shard)),
                Err(TryLockError::Poisoned(poisoned)) => Some((k, poisoned.into_inner())),
                Err(TryLockError::WouldBlock) => None,
            })
            .unwrap_or_else(|| (0, lock(&self.shards[parts[0].0])))
    }

    /// Answers `fps` for node `from`, in order, once every answer is known: at once,
    /// or when the locks some wait on are acknowledged or expire. Refused unless
    /// `from` is a member.
    pub async fn lookup(&self, from: NodeId, fps: Vec<Fingerprint>) -> Result<Vec<Answer>> {
        self.require_member(from, "lookup")?;
        if fps.is_empty() {
            return Ok(Vec::new());
        }
        self.requests.fetch_add(1, Ordering::Relaxed);
        let mut left = self.split(fps.iter());
        let mut parts = Vec::with_capacity(left.len());
        while !left.is_empty() {
            let (k, mut shard) = self.next_free(&left);
            let (_, positions) = left.swap_remove(k);
            let part: Vec<Fingerprint> = positions.iter().map(|&i| fps[i as usize]).collect();
            // On an error the parts already sent are dropped unanswered: their locks
            // expire like any unacknowledged lock.
            let answered = shard.lookup(from, &part)?;
            parts.push((positions, answered));
        }
        let mut answers = vec![Answer::Moved; fps.len()];
        for (positions, answered) in parts {
            let got = answered.await.map_err(|_| ClusterError::Dropped)?;
            for (i, answer) in positions.into_iter().zip(got) {
                answers[i as usize] = answer;
            }
        }
        Ok(answers)
    }

    /// Records member `from`'s acknowledgements: where it stored chunks it was
    /// answered `New` for, in durable containers of its own. Refused whole, nothing
    /// changed, when `from` is not a member or a location is outside its containers;
    /// an entry of a lock another node holds is refused alone and the rest taken
    /// ([`Owner::ack`]). Every refusal is logged.
    pub fn ack(&self, from: NodeId, entries: &[(Fingerprint, ChunkLocation)]) -> Result<()> {
        self.require_member(from, "acknowledgement")?;
        if let Err(e) = check_writer(from, entries) {
            tracing::warn!("{e}");
            return Err(e);
        }
        let mut failure = None;
        for (s, positions) in self.split(entries.iter().map(|(fp, _)| fp)) {
            let part: Vec<_> = positions.iter().map(|&i| entries[i as usize]).collect();
            let mut shard = lock(&self.shards[s]);
            let acked = shard.owner.ack(from, &part, Instant::now());
            shard.route();
            if let Err(e) = acked {
                failure.get_or_insert(e);
            }
        }
        if let Some(e @ ClusterError::Refused { .. }) = &failure {
            tracing::warn!("{e}");
        }
        failure.map_or(Ok(()), Err)
    }

    /// Reads without locking: `Known`, `Absent`, or `Moved`.
    pub fn get(&self, fps: &[Fingerprint]) -> Result<Vec<GetAnswer>> {
        let mut answers = vec![GetAnswer::Moved; fps.len()];
        for (s, positions) in self.split(fps.iter()) {
            let part: Vec<Fingerprint> = positions.iter().map(|&i| fps[i as usize]).collect();
            let got = lock(&self.shards[s]).owner.get(&part)?;
            for (i, answer) in positions.into_iter().zip(got) {
                answers[i as usize] = answer;
            }
        }
        Ok(answers)
    }

    /// Unlocks what passed its deadline; returns when to call again.
    pub fn expire(&self) -> Result<Option<Instant>> {
        let mut failure = None;
        let mut next: Option<Instant> = None;
        for shard in self.shards.iter() {
            let mut shard = lock(shard);
            let result = shard.owner.expire(Instant::now());
            shard.route();
            if let Err(e) = result {
                failure.get_or_insert(e);
            }
            next = match (next, shard.owner.next_deadline()) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
        }
        failure.map_or(Ok(next), Err)
    }

    /// Takes over `parts` under `epoch`: opens them from shared storage and replays the
    /// containers their checkpoints do not cover, then serves them. Slow (disk reads),
    /// done without holding the service: lookups of other partitions go on.
    pub fn take_over(&self, parts: &[PartitionId], epoch: u64) -> Result<Replay> {
        let (opened, replay) = self.store.take_over(parts, epoch)?;
        for (p, index, covered) in opened {
            self.shard(p).owner.take(p, epoch, index, covered);
        }
        let mut replayed = lock(&self.replayed);
        replayed.rebuilt += replay.rebuilt;
        replayed.containers_read += replay.containers_read;
        replayed.inserted += replay.inserted;
        Ok(replay)
    }

    /// Stops serving `p`; its waiting requests are answered `Moved`. With `checkpoint`
    /// (a graceful hand-over by an owner still holding its epoch) its index is
    /// checkpointed first; a fenced owner must not write it.
    pub fn release(&self, p: PartitionId, checkpoint: bool) -> Result<()> {
        let mut shard = self.shard(p);
        let saved = if checkpoint && shard.owner.owns(p) {
            let store = self.store.clone();
            shard
                .owner
                .checkpoint(p, |index, covered| store.checkpoint(p, index, covered))
        } else {
            Ok(())
        };
        let index: Option<PartitionIndex> = shard.owner.release(p);
        drop(index);
        shard.route();
        saved
    }

    /// Checkpoints every partition acknowledged into since its last checkpoint, one at
    /// a time: a group is locked for one partition's writes and syncs, never for
    /// all of them. Lookups take that lock on the runtime's threads; held across every
    /// dirty partition's fsyncs (seconds on a busy disk) it stalled the whole node,
    /// lease keepalives included, until the lease expired (tests/cluster.rs of
    /// larder-cli). A partition released meanwhile is skipped: it is no longer ours to
    /// write; one that a newer owner took over (fenced on disk) is released.
    pub fn checkpoint(&self) -> Result<usize> {
        let mut dirty: Vec<PartitionId> = Vec::new();
        for shard in self.shards.iter() {
            dirty.extend(lock(shard).owner.dirty());
        }
        dirty.sort_unstable();
        let mut done = 0;
        for p in dirty {
            let mut shard = self.shard(p);
            if !shard.owner.owns(p) {
                continue;
            }
            let store = self.store.clone();
            let saved = shard
                .owner
                .checkpoint(p, |index, covered| store.checkpoint(p, index, covered));
            drop(shard);
            match saved {
                Err(ClusterError::Fenced { epoch, newer, .. }) => {
                    // A newer owner has it: stop serving it, write nothing.
                    tracing::warn!(
                        partition = p.0,
                        epoch,
                        newer,
                        "fenced at checkpoint: dropping the partition"
                    );
                    self.release(p, false)?;
                }
                // This one and those after it stay dirty, for the next checkpoint.
                Err(e) => return Err(e),
                Ok(()) => done += 1,
            }
        }
        Ok(done)
    }

    /// The partitions served, with their epochs.
    pub fn owned(&self) -> Vec<(PartitionId, u64)> {
        let mut owned: Vec<_> = self
            .shards
            .iter()
            .flat_map(|shard| lock(shard).owner.owned())
            .collect();
        owned.sort_unstable();
        owned
    }

    /// What this service's takeovers replayed from the containers, summed.
    pub fn replayed(&self) -> Replay {
        lock(&self.replayed).clone()
    }

    /// The groups' counters summed; `requests` counts whole requests, not their parts.
    pub fn metrics(&self) -> OwnerMetrics {
        let mut sum = OwnerMetrics::default();
        for shard in self.shards.iter() {
            sum.add(lock(shard).owner.metrics());
        }
        sum.requests = self.requests.load(Ordering::Relaxed);
        sum
    }
}

impl Shard {
    /// Looks up one part of a request for node `from`; its answers, in order, come
    /// through the receiver once all are known.
    fn lookup(
        &mut self,
        from: NodeId,
        fps: &[Fingerprint],
    ) -> Result<oneshot::Receiver<Vec<Answer>>> {
        let (tx, rx) = oneshot::channel();
        let first_id = self.next_id;
        self.next_id += fps.len() as u64;
        self.waiting.insert(
            first_id,
            Pending {
                answers: vec![None; fps.len()],
                missing: fps.len(),
                done: tx,
            },
        );
        let looked_up = self.owner.lookup(from, fps, first_id, Instant::now());
        if let Err(e) = looked_up {
            // Answers that still come for these tickets find no request and are
            // dropped; locks they take expire like any unacknowledged lock.
            self.waiting.remove(&first_id);
            self.route();
            return Err(e);
        }
        self.route();
        Ok(rx)
    }

    /// Hands every answer the owner has to its part, and completes the parts whose
    /// answers are all in.
    fn route(&mut self) {
        while let Some((ticket, reply)) = self.owner.poll() {
            // The part holding this ticket starts at or below it; a ticket past its end
            // belongs to a part that is gone (failed), whose answers are dropped.
            let Some((&first, pending)) = self.waiting.range_mut(..=ticket.id).next_back() else {
                continue;
            };
            let Some(answer) = pending.answers.get_mut((ticket.id - first) as usize) else {
                continue;
            };
            if answer.replace(reply).is_none() {
                pending.missing -= 1;
            }
            if pending.missing == 0 {
                let pending = self.waiting.remove(&first).expect("found above");
                let answers = pending
                    .answers
                    .into_iter()
                    .map(|a| a.expect("all in"))
                    .collect();
                // The requester may have gone: nothing to do then.
                let _ = pending.done.send(answers);
            }
        }
    }
}

/// The owner's failures as the protocol reports them to the requester.
fn refused(e: ClusterError) -> RpcError {
    RpcError::Handler {
        retryable: e.is_retryable(),
        message: e.to_string(),
    }
}

/// The lookup protocol's server calls the service. Every future is cancel-safe: a
/// request dropped while it waits leaves its tickets to be answered to nobody, and the
/// locks they took expire.
impl LookupHandler for OwnerService {
    fn lookup(
        &self,
        from: u16,
        fps: Vec<Fingerprint>,
    ) -> impl std::future::Future<Output = std::result::Result<Vec<Answer>, RpcError>> + Send {
        let service = self.clone();
        async move {
            OwnerService::lookup(&service, from, fps)
                .await
                .map_err(refused)
        }
    }

    fn ack(
        &self,
        from: u16,
        entries: Vec<(Fingerprint, ChunkLocation)>,
    ) -> impl std::future::Future<Output = std::result::Result<(), RpcError>> + Send {
        let acked = OwnerService::ack(self, from, &entries).map_err(refused);
        async move { acked }
    }

    fn get(
        &self,
        fps: Vec<Fingerprint>,
    ) -> impl std::future::Future<Output = std::result::Result<Vec<GetAnswer>, RpcError>> + Send
    {
        let got = OwnerService::get(self, &fps).map_err(refused);
        async move { got }
    }
}
