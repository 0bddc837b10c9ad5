//! The owner behind a node's lookup service: [`Owner`] shared by the requests of every
//! connection, each request waiting for all of its answers (some wait on another
//! requester's lock), lock deadlines kept by a timer task, and checkpoints of the
//! partitions to shared storage.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use larder_hash::Fingerprint;
use larder_index::ChunkLocation;
use tokio::sync::oneshot;

use crate::error::{ClusterError, Result};
use crate::owner::Owner;
use crate::partition::{NodeId, PartitionId};
use crate::partitions::{PartitionIndex, PartitionStore, Replay};
use crate::rpc::{Answer, GetAnswer, LookupHandler, RpcError};

/// A request's answers as they come in.
struct Pending {
    answers: Vec<Option<Answer>>,
    missing: usize,
    done: oneshot::Sender<Vec<Answer>>,
}

struct Inner {
    owner: Owner<larder_index::disk::IndexDir>,
    /// The next ticket id: unique among this owner's tickets, whoever asks.
    next_id: u64,
    /// The requests waiting for answers, by their first ticket id: a request of `n`
    /// fingerprints holds the tickets `first .. first + n`, fingerprint `i` ticket
    /// `first + i`. One entry per request, not per fingerprint.
    waiting: BTreeMap<u64, Pending>,
    /// Partitions acknowledged into since their last checkpoint.
    dirty: BTreeSet<PartitionId>,
    /// What every takeover replayed, summed.
    replayed: Replay,
}

/// A node's partitions, served to lookup requests.
#[derive(Clone)]
pub struct OwnerService {
    inner: Arc<Mutex<Inner>>,
    store: Arc<PartitionStore>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl OwnerService {
    /// A service owning nothing yet, of the partitions in `store`, of a cluster of
    /// `partitions` partitions; a lock not acknowledged within `lock_timeout` passes on.
    pub fn new(store: PartitionStore, partitions: u32, lock_timeout: Duration) -> Self {
        Self {
            inner: Arc::new(Mutex::new(Inner {
                owner: Owner::new(partitions, lock_timeout),
                next_id: 0,
                waiting: BTreeMap::new(),
                dirty: BTreeSet::new(),
                replayed: Replay::default(),
            })),
            store: Arc::new(store),
        }
    }

    /// Answers `fps` for node `from`, in order, once every answer is known: at once,
    /// or when the locks some wait on are acknowledged or expire.
    pub async fn lookup(&self, from: NodeId, fps: Vec<Fingerprint>) -> Result<Vec<Answer>> {
        if fps.is_empty() {
            return Ok(Vec::new());
        }
        let (tx, rx) = oneshot::channel();
        {
            let mut inner = lock(&self.inner);
            let first_id = inner.next_id;
            inner.next_id += fps.len() as u64;
            inner.waiting.insert(
                first_id,
                Pending {
                    answers: vec![None; fps.len()],
                    missing: fps.len(),
                    done: tx,
                },
            );
            let looked_up = inner.owner.lookup(from, &fps, first_id, Instant::now());
            if let Err(e) = looked_up {
                // Answers that still come for these tickets find no request and are
                // dropped; locks they take expire like any unacknowledged lock.
                inner.waiting.remove(&first_id);
                route(&mut inner);
                return Err(e);
            }
            route(&mut inner);
        }
        rx.await.map_err(|_| ClusterError::Dropped)
    }

    /// Records a writer's acknowledgements: where it stored chunks it was answered
    /// `New` for, in durable containers.
    pub fn ack(&self, entries: &[(Fingerprint, ChunkLocation)]) -> Result<()> {
        let mut inner = lock(&self.inner);
        let partitions = inner.owner.partition_count();
        for (fp, _) in entries {
            let p = crate::partition::partition_of(fp, partitions);
            if inner.owner.owns(p) {
                inner.dirty.insert(p);
            }
        }
        let result = inner.owner.ack(entries, Instant::now());
        route(&mut inner);
        result
    }

    /// Reads without locking: `Known`, `Absent`, or `Moved`.
    pub fn get(&self, fps: &[Fingerprint]) -> Result<Vec<GetAnswer>> {
        lock(&self.inner).owner.get(fps)
    }

    /// Unlocks what passed its deadline; returns when to call again.
    pub fn expire(&self) -> Result<Option<Instant>> {
        let mut inner = lock(&self.inner);
        let result = inner.owner.expire(Instant::now());
        route(&mut inner);
        result.map(|()| inner.owner.next_deadline())
    }

    /// Takes over `parts` under `epoch`: opens them from shared storage and replays the
    /// containers their checkpoints do not cover, then serves them. Slow (disk reads),
    /// done without holding the service: lookups of other partitions go on.
    pub fn take_over(&self, parts: &[PartitionId], epoch: u64) -> Result<Replay> {
        let (opened, replay) = self.store.take_over(parts, epoch)?;
        let mut inner = lock(&self.inner);
        for (p, index, covered) in opened {
            inner.owner.take(p, epoch, index, covered);
        }
        inner.replayed.rebuilt += replay.rebuilt;
        inner.replayed.containers_read += replay.containers_read;
        inner.replayed.inserted += replay.inserted;
        Ok(replay)
    }

    /// Stops serving `p`; its waiting requests are answered `Moved`. With `checkpoint`
    /// (a graceful hand-over by an owner still holding its epoch) its index is
    /// checkpointed first; a fenced owner must not write it.
    pub fn release(&self, p: PartitionId, checkpoint: bool) -> Result<()> {
        let mut inner = lock(&self.inner);
        let saved = if checkpoint && inner.owner.owns(p) {
            let store = self.store.clone();
            inner
                .owner
                .checkpoint(p, |index, covered| store.checkpoint(p, index, covered))
        } else {
            Ok(())
        };
        let index: Option<PartitionIndex> = inner.owner.release(p);
        drop(index);
        inner.dirty.remove(&p);
        route(&mut inner);
        saved
    }

    /// Checkpoints every partition acknowledged into since its last checkpoint, one at
    /// a time: the service is locked for one partition's writes and syncs, never for
    /// all of them. Lookups take that lock on the runtime's threads; held across every
    /// dirty partition's fsyncs (seconds on a busy disk) it stalled the whole node,
    /// lease keepalives included, until the lease expired (tests/cluster.rs of
    /// larder-cli). A partition released meanwhile is skipped: it is no longer ours to
    /// write; one that a newer owner took over (fenced on disk) is released.
    pub fn checkpoint(&self) -> Result<usize> {
        let dirty = std::mem::take(&mut lock(&self.inner).dirty);
        let mut done = 0;
        for (i, &p) in dirty.iter().enumerate() {
            let mut inner = lock(&self.inner);
            if !inner.owner.owns(p) {
                continue;
            }
            let store = self.store.clone();
            let saved = inner
                .owner
                .checkpoint(p, |index, covered| store.checkpoint(p, index, covered));
            if let Err(ClusterError::Fenced { epoch, newer, .. }) = saved {
                // A newer owner has it: stop serving it, write nothing.
                drop(inner);
                tracing::warn!(
                    partition = p.0,
                    epoch,
                    newer,
                    "fenced at checkpoint: dropping the partition"
                );
                self.release(p, false)?;
                continue;
            }
            if let Err(e) = saved {
                let left: Vec<PartitionId> = dirty
                    .iter()
                    .skip(i)
                    .copied()
                    .filter(|&q| inner.owner.owns(q))
                    .collect();
                inner.dirty.extend(left);
                return Err(e);
            }
            done += 1;
        }
        Ok(done)
    }

    /// The partitions served, with their epochs.
    pub fn owned(&self) -> Vec<(PartitionId, u64)> {
        lock(&self.inner).owner.owned()
    }

    /// What this service's takeovers replayed from the containers, summed.
    pub fn replayed(&self) -> Replay {
        lock(&self.inner).replayed.clone()
    }

    pub fn metrics(&self) -> crate::owner::OwnerMetrics {
        *lock(&self.inner).owner.metrics()
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
        _from: u16,
        entries: Vec<(Fingerprint, ChunkLocation)>,
    ) -> impl std::future::Future<Output = std::result::Result<(), RpcError>> + Send {
        let acked = OwnerService::ack(self, &entries).map_err(refused);
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

/// Hands every answer the owner has to its request, and completes the requests whose
/// answers are all in.
fn route(inner: &mut Inner) {
    while let Some((ticket, reply)) = inner.owner.poll() {
        // The request holding this ticket starts at or below it; a ticket past its end
        // belongs to a request that is gone (failed), whose answers are dropped.
        let Some((&first, pending)) = inner.waiting.range_mut(..=ticket.id).next_back() else {
            continue;
        };
        let Some(answer) = pending.answers.get_mut((ticket.id - first) as usize) else {
            continue;
        };
        if answer.replace(reply).is_none() {
            pending.missing -= 1;
        }
        if pending.missing == 0 {
            let pending = inner.waiting.remove(&first).expect("found above");
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
