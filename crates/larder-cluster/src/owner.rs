//! A node's partitions as their owner sees them (docs/design/cluster.md, "Lock on
//! new"): each owned partition's disk index, and the locks on fingerprints answered
//! `New` until their writer acknowledges where it stored the chunk.
//!
//! Pure logic over [`IndexIo`]: time is passed in, answers come out of
//! [`Owner::poll`], and the node's async layer routes them to the requests waiting by
//! their [`Ticket`]s. Storage ([`crate::partitions`]) and the network are the node's.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use larder_hash::Fingerprint;
use larder_index::disk::{Answer as IndexAnswer, DiskIndex, FingerprintHasher, IndexIo};
use larder_index::prefetch::prefetch_value;
use larder_index::{ChunkLocation, IndexError};

use crate::error::{ClusterError, Result};
use crate::ids::{container_writer, partition_of, NodeId, PartitionId};
use crate::partitions::Covered;
use crate::rpc::{Answer, GetAnswer};

/// One fingerprint of one lookup request: the requesting node and the request's own
/// number for it. Node 0 is the owner itself (an acknowledgement it could not match
/// with a lock, looked up to insert it if it is still absent).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ticket {
    pub node: NodeId,
    pub id: u64,
}

const OWN: NodeId = 0;

/// Counters of an owner's work, for `larder cluster status` and the benchmarks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct OwnerMetrics {
    /// Lookup requests (messages) served, and the fingerprints they held.
    pub requests: u64,
    pub fingerprints: u64,
    /// Answers by kind.
    pub known: u64,
    pub new: u64,
    pub moved: u64,
    /// Fingerprints that waited on another requester's lock.
    pub waited: u64,
    /// Acknowledgements: of a lock, and of a fingerprint not locked (late, after the
    /// lock expired, or after a failover), which is inserted if still absent.
    pub acks: u64,
    pub late_acks: u64,
    /// Acknowledgements for partitions this node does not own (dropped).
    pub moved_acks: u64,
    /// Acknowledgement entries refused: of a lock another node holds, or (every entry
    /// of the message) a location outside the sender's containers.
    pub refused_acks: u64,
    /// Locks whose acknowledgement did not come in time.
    pub expired: u64,
}

impl OwnerMetrics {
    /// Adds `other`'s counts to these (the owners of a service's groups of partitions).
    pub fn add(&mut self, other: &OwnerMetrics) {
        self.requests += other.requests;
        self.fingerprints += other.fingerprints;
        self.known += other.known;
        self.new += other.new;
        self.moved += other.moved;
        self.waited += other.waited;
        self.acks += other.acks;
        self.late_acks += other.late_acks;
        self.moved_acks += other.moved_acks;
        self.refused_acks += other.refused_acks;
        self.expired += other.expired;
    }
}

/// A lock on new: until when, and the node answered `New`, the only one whose
/// acknowledgement releases it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Lock {
    deadline: Instant,
    holder: NodeId,
}

/// An owned partition: its disk index (tokens are tickets) and its locks.
struct Part<I> {
    epoch: u64,
    index: DiskIndex<I, Ticket>,
    /// Fingerprints answered `New` and not acknowledged: their locks.
    /// Invariant: exactly the index's pending fingerprints. Fingerprints are uniform,
    /// so some of their bytes hash them (SipHash was a few percent of a lookup).
    locks: HashMap<Fingerprint, Lock, FingerprintHasher>,
    /// Locations of acknowledgements that found no lock, looked up under the owner's
    /// own ticket: inserted if the lookup answers `New`.
    late: HashMap<Fingerprint, ChunkLocation, FingerprintHasher>,
    /// The containers whose entries are all in the index (acknowledged, or replayed).
    covered: Covered,
    /// Whether it was acknowledged into since its last checkpoint.
    dirty: bool,
}

/// The owned partitions by id, each in a box: a partition's address is read from a
/// small dense table that stays in the processor's cache, so that its fields are
/// prefetched without loading the partition first. A hash map's lookup compared the
/// key stored beside the partition: a dependent miss on every partition a request
/// touched, a tenth of a small request's time on the owner (docs/performance.md,
/// "Cluster: the owner's lock sharded").
struct Parts<I>(Vec<Option<Box<Part<I>>>>);

impl<I> Parts<I> {
    fn get(&self, p: PartitionId) -> Option<&Part<I>> {
        self.0.get(p.0 as usize)?.as_deref()
    }

    fn get_mut(&mut self, p: PartitionId) -> Option<&mut Part<I>> {
        self.0.get_mut(p.0 as usize)?.as_deref_mut()
    }

    fn insert(&mut self, p: PartitionId, part: Part<I>) {
        let at = p.0 as usize;
        if at >= self.0.len() {
            self.0.resize_with(at + 1, || None);
        }
        self.0[at] = Some(Box::new(part));
    }

    fn remove(&mut self, p: PartitionId) -> Option<Part<I>> {
        self.0.get_mut(p.0 as usize)?.take().map(|part| *part)
    }

    /// The owned partitions in order.
    fn iter(&self) -> impl Iterator<Item = (PartitionId, &Part<I>)> {
        self.0
            .iter()
            .enumerate()
            .filter_map(|(p, part)| Some((PartitionId(p as u32), part.as_deref()?)))
    }
}

/// The partitions this node owns, with their locks.
pub struct Owner<I> {
    partitions: u32,
    lock_timeout: Duration,
    parts: Parts<I>,
    /// Lock deadlines in the order they were set (so in deadline order, the timeout
    /// being fixed): an entry whose lock is gone or was set again later is skipped.
    expiries: VecDeque<(Instant, PartitionId, Fingerprint)>,
    output: VecDeque<(Ticket, Answer)>,
    metrics: OwnerMetrics,
}

impl<I: IndexIo> Owner<I> {
    /// An owner of no partitions yet, of a cluster of `partitions` partitions; a lock
    /// not acknowledged within `lock_timeout` passes to the next requester.
    pub fn new(partitions: u32, lock_timeout: Duration) -> Self {
        Self {
            partitions,
            lock_timeout,
            parts: Parts((0..partitions).map(|_| None).collect()),
            expiries: VecDeque::new(),
            output: VecDeque::new(),
            metrics: OwnerMetrics::default(),
        }
    }

    pub fn partition_count(&self) -> u32 {
        self.partitions
    }

    pub fn metrics(&self) -> &OwnerMetrics {
        &self.metrics
    }

    /// The partitions owned, with their epochs, in order.
    pub fn owned(&self) -> Vec<(PartitionId, u64)> {
        self.parts.iter().map(|(p, part)| (p, part.epoch)).collect()
    }

    pub fn owns(&self, partition: PartitionId) -> bool {
        self.parts.get(partition).is_some()
    }

    /// Starts serving `partition` under `epoch` with its opened index, which holds the
    /// entries of the containers `covered` names (the node replayed the rest).
    pub fn take(
        &mut self,
        partition: PartitionId,
        epoch: u64,
        index: DiskIndex<I, Ticket>,
        covered: Covered,
    ) {
        let part = Part {
            epoch,
            index,
            locks: HashMap::with_hasher(FingerprintHasher),
            late: HashMap::with_hasher(FingerprintHasher),
            covered,
            dirty: false,
        };
        self.parts.insert(partition, part);
    }

    /// Stops serving `partition`: every request waiting in it is answered `Moved`, its
    /// locks are dropped (their writers' acknowledgements go to the new owner, which
    /// inserts them as late ones), and its index is returned unsynced for the caller to
    /// checkpoint or drop (a fenced owner must not write it).
    pub fn release(&mut self, partition: PartitionId) -> Option<DiskIndex<I, Ticket>> {
        let mut part = self.parts.remove(partition)?;
        for (ticket, _) in part.index.abandon() {
            if ticket.node != OWN {
                self.answer(ticket, Answer::Moved);
            }
        }
        while let Some(r) = part.index.poll() {
            if r.token.node != OWN {
                self.answer(r.token, Answer::Moved);
            }
        }
        Some(part.index)
    }

    /// Looks up the fingerprints of one request from `from`; fingerprint `i` gets the
    /// ticket `first_id + i`. Answers come out of [`Owner::poll`]: at once, or when a
    /// lock they wait on is acknowledged or expires. On an error the request's tickets
    /// may still be answered later; the caller fails the request, and its lookups that
    /// were answered `New` to nobody expire as any unacknowledged lock does.
    pub fn lookup(
        &mut self,
        from: NodeId,
        fps: &[Fingerprint],
        first_id: u64,
        now: Instant,
    ) -> Result<()> {
        debug_assert_ne!(from, OWN);
        self.metrics.requests += 1;
        self.metrics.fingerprints += fps.len() as u64;
        // Partition by partition, each partition's fingerprints in request order (so
        // of the copies of a new fingerprint the first is answered `New`): a batch
        // spreads over up to every partition, and one partition's index and cache
        // stay in the processor's cache for its whole group instead of being fetched
        // again for each fingerprint.
        let order = self.by_partition(fps.iter());
        let groups: Vec<&[(u32, u32)]> = order.chunk_by(|a, b| a.0 == b.0).collect();
        // Bloom words are several lines per fingerprint: worth loading ahead only for
        // groups of one or two (small requests); larger groups overlap them anyway.
        let bloom = fps.len() <= 2 * groups.len();
        let mut failure = None;
        for (g, &group) in groups.iter().enumerate() {
            self.prefetch_ahead(&groups, g, |i| &fps[i as usize], bloom);
            let p = PartitionId(group[0].0);
            let ticket = |i: u32| Ticket {
                node: from,
                id: first_id + u64::from(i),
            };
            let Some(part) = self.parts.get_mut(p) else {
                for &(_, i) in group {
                    self.answer(ticket(i), Answer::Moved);
                }
                continue;
            };
            for &(_, i) in group {
                let fp = &fps[i as usize];
                if part.index.is_pending(fp) {
                    self.metrics.waited += 1;
                }
                if let Err(source) = part.index.submit(*fp, ticket(i)) {
                    failure.get_or_insert(ClusterError::Index {
                        partition: p,
                        source,
                    });
                }
            }
            if let Err(e) = self.settle(p, now) {
                failure.get_or_insert(e);
            }
        }
        failure.map_or(Ok(()), Err)
    }

    /// The positions of `fps` sorted by partition, in order within each partition:
    /// `(partition, position)`.
    fn by_partition<'a>(&self, fps: impl Iterator<Item = &'a Fingerprint>) -> Vec<(u32, u32)> {
        let mut order: Vec<(u32, u32)> = fps
            .enumerate()
            .map(|(i, fp)| (partition_of(fp, self.partitions).0, i as u32))
            .collect();
        order.sort_unstable();
        order
    }

    /// Starts loading what the groups after group `g` of a lookup or an
    /// acknowledgement will read (`fp(i)`: the fingerprint at position `i`), in two
    /// stages: a partition's own fields (its index's, spread over many lines)
    /// `PART_AHEAD` groups ahead, then its fingerprints' cache slots (and with `bloom`
    /// their Bloom words), found through those fields, `LOOKUP_AHEAD` groups ahead. A
    /// batch spread over many partitions touches each partition's cold fields once or
    /// a few times; waiting for them one partition at a time made most of a small
    /// request's cost.
    fn prefetch_ahead<'a>(
        &self,
        groups: &[&[(u32, u32)]],
        g: usize,
        fp: impl Fn(u32) -> &'a Fingerprint,
        bloom: bool,
    ) {
        const PART_AHEAD: usize = 4;
        const LOOKUP_AHEAD: usize = 2;
        let part = |group: &&[(u32, u32)]| self.parts.get(PartitionId(group[0].0));
        if let Some(part) = groups.get(g + PART_AHEAD).and_then(part) {
            prefetch_value(part);
        }
        if let Some(group) = groups.get(g + LOOKUP_AHEAD) {
            if let Some(part) = part(group) {
                for &(_, i) in *group {
                    part.index.prefetch_lookup(fp(i), bloom);
                }
            }
        }
    }

    /// Records where node `from` stored chunks it was answered `New` for: each unlocks
    /// its fingerprint and answers the requests waiting on it `Known`. An
    /// acknowledgement without a lock (it expired, or the partition changed owner)
    /// inserts the location if the fingerprint is still absent, so that a late
    /// writer's chunk is found. The chunks' containers must already be durable: they
    /// are the log a takeover replays (crate::partitions).
    ///
    /// Refused ([`ClusterError::Refused`]), nothing of it taken, when an entry names a
    /// container outside `from`'s range: a node writes only its own, so the message is
    /// forged. An entry whose fingerprint another node holds locked is refused alone
    /// (only the holder releases a lock), the others taken, and the call fails with a
    /// retryable refusal: once the holder acknowledges or its lock expires, the entry
    /// is a late acknowledgement.
    pub fn ack(
        &mut self,
        from: NodeId,
        entries: &[(Fingerprint, ChunkLocation)],
        now: Instant,
    ) -> Result<()> {
        if let Err(e) = check_writer(from, entries) {
            self.metrics.refused_acks += entries.len() as u64;
            return Err(e);
        }
        // Partition by partition, in order within each, loading ahead what the next
        // partitions' inserts write (their Bloom words and cache slots), as a lookup
        // does: a batch's acknowledgements spread over up to every partition.
        let order = self.by_partition(entries.iter().map(|(fp, _)| fp));
        let groups: Vec<&[(u32, u32)]> = order.chunk_by(|a, b| a.0 == b.0).collect();
        let mut failure = None;
        let mut locked_by_others: Vec<(Fingerprint, NodeId)> = Vec::new();
        for (g, &group) in groups.iter().enumerate() {
            self.prefetch_ahead(&groups, g, |i| &entries[i as usize].0, true);
            let p = PartitionId(group[0].0);
            let mut late = false;
            for &(_, i) in group {
                let (fp, location) = entries[i as usize];
                if let Some(holder) = self.other_holder(p, &fp, from) {
                    locked_by_others.push((fp, holder));
                    continue;
                }
                if let Err(e) = self.ack_one(p, fp, location, now, &mut late) {
                    failure.get_or_insert(e);
                }
            }
            if late {
                if let Err(e) = self.settle(p, now) {
                    failure.get_or_insert(e);
                }
            }
        }
        if let Some(&(fp, holder)) = locked_by_others.first() {
            self.metrics.refused_acks += locked_by_others.len() as u64;
            return Err(ClusterError::Refused {
                from,
                what: "acknowledgement",
                reason: format!(
                    "fingerprint {} is locked by node {holder} ({} of its {} entries refused)",
                    fp.to_hex(),
                    locked_by_others.len(),
                    entries.len()
                ),
                retryable: true,
            });
        }
        failure.map_or(Ok(()), Err)
    }

    /// The node holding `fp`'s lock in partition `p`, if it is another than `from`.
    fn other_holder(&self, p: PartitionId, fp: &Fingerprint, from: NodeId) -> Option<NodeId> {
        let lock = self.parts.get(p)?.locks.get(fp)?;
        (lock.holder != from).then_some(lock.holder)
    }

    /// Acknowledges one entry of partition `p`; sets `late` when it is looked up
    /// under the owner's own ticket (for the partition's settle to finish).
    fn ack_one(
        &mut self,
        p: PartitionId,
        fp: Fingerprint,
        location: ChunkLocation,
        now: Instant,
        late: &mut bool,
    ) -> Result<()> {
        let Some(part) = self.parts.get_mut(p) else {
            self.metrics.moved_acks += 1;
            return Ok(());
        };
        part.dirty = true;
        part.covered.cover(location.container);
        let result = if part.index.is_pending(&fp) {
            self.metrics.acks += 1;
            part.locks.remove(&fp);
            part.index.insert(fp, location)
        } else {
            self.metrics.late_acks += 1;
            if part.late.insert(fp, location).is_some() {
                return Ok(());
            }
            *late = true;
            part.index.submit(fp, Ticket { node: OWN, id: 0 })
        };
        let indexed = result.map_err(|source| ClusterError::Index {
            partition: p,
            source,
        });
        // Inserts answer the waiters at once: route them now.
        let drained = self.drain(p, now);
        indexed.and(drained)
    }

    /// Unlocks every fingerprint whose lock passed its deadline at `now`: the first
    /// request waiting on it is answered `New` in its turn (a new lock), or, with none
    /// waiting, the fingerprint is forgotten (the next copy is new).
    pub fn expire(&mut self, now: Instant) -> Result<()> {
        let mut failure = None;
        while let Some(&(deadline, p, fp)) = self.expiries.front() {
            if deadline > now {
                break;
            }
            self.expiries.pop_front();
            let Some(part) = self.parts.get_mut(p) else {
                continue;
            };
            if part.locks.get(&fp).map(|lock| lock.deadline) != Some(deadline) {
                continue;
            }
            part.locks.remove(&fp);
            self.metrics.expired += 1;
            part.index.unlock(&fp);
            if let Err(e) = self.drain(p, now) {
                failure.get_or_insert(e);
            }
        }
        failure.map_or(Ok(()), Err)
    }

    /// When [`Owner::expire`] next has work: the earliest lock deadline, if any.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.expiries.front().map(|&(deadline, _, _)| deadline)
    }

    /// Reads without locking (restore, check): `Known` where stored, `Absent` where not
    /// (or not yet acknowledged), `Moved` for partitions not owned.
    pub fn get(&mut self, fps: &[Fingerprint]) -> Result<Vec<GetAnswer>> {
        fps.iter()
            .map(|fp| {
                let p = partition_of(fp, self.partitions);
                let Some(part) = self.parts.get_mut(p) else {
                    return Ok(GetAnswer::Moved);
                };
                let found = part.index.get(fp).map_err(|source| ClusterError::Index {
                    partition: p,
                    source,
                })?;
                Ok(found.map_or(GetAnswer::Absent, GetAnswer::Known))
            })
            .collect()
    }

    /// Hands partition `p`'s index and what it covers to `save` (the node's checkpoint:
    /// [`crate::partitions::PartitionStore::checkpoint`]); once saved, `p` is no longer
    /// [`Owner::dirty`] until its next acknowledgement.
    pub fn checkpoint<F>(&mut self, p: PartitionId, save: F) -> Result<()>
    where
        F: FnOnce(&mut DiskIndex<I, Ticket>, &Covered) -> Result<()>,
    {
        let part = self.parts.get_mut(p).ok_or(ClusterError::NotOwner(p))?;
        let covered = Covered {
            epoch: part.epoch,
            ..part.covered.clone()
        };
        save(&mut part.index, &covered)?;
        part.dirty = false;
        Ok(())
    }

    /// The partitions acknowledged into since their last checkpoint, in order.
    pub fn dirty(&self) -> Vec<PartitionId> {
        self.parts
            .iter()
            .filter(|(_, part)| part.dirty)
            .map(|(p, _)| p)
            .collect()
    }

    /// The fingerprints a partition indexes (for status and tests).
    pub fn indexed(&self, p: PartitionId) -> Option<u64> {
        self.parts.get(p).map(|part| part.index.len())
    }

    /// The next answer for a request, if any.
    pub fn poll(&mut self) -> Option<(Ticket, Answer)> {
        self.output.pop_front()
    }

    /// Finishes the lookups submitted to partition `p` and routes every answer.
    fn settle(&mut self, p: PartitionId, now: Instant) -> Result<()> {
        let part = self.parts.get_mut(p).expect("settled partitions are owned");
        let finished = part.index.finish();
        let drained = self.drain(p, now);
        finished
            .map_err(|source| ClusterError::Index {
                partition: p,
                source,
            })
            .and(drained)
    }

    /// Routes partition `p`'s answers: `New` locks the fingerprint for its requester
    /// (or, for the owner's own ticket, inserts the late acknowledgement's location).
    fn drain(&mut self, p: PartitionId, now: Instant) -> Result<()> {
        let deadline = now + self.lock_timeout;
        let mut failure: Option<IndexError> = None;
        let part = self.parts.get_mut(p).expect("drained partitions are owned");
        // Inserting a late acknowledgement answers the copies that waited behind the
        // owner's own lookup: they come out of this same loop.
        while let Some(r) = part.index.poll() {
            if r.token.node == OWN {
                let location = part.late.remove(&r.fp).expect("late entries are kept");
                if r.answer == IndexAnswer::New {
                    if let Err(e) = part.index.insert(r.fp, location) {
                        failure.get_or_insert(e);
                    }
                }
                continue;
            }
            let reply = match r.answer {
                IndexAnswer::Duplicate(location) => Answer::Known(location),
                IndexAnswer::New => {
                    let holder = r.token.node;
                    part.locks.insert(r.fp, Lock { deadline, holder });
                    self.expiries.push_back((deadline, p, r.fp));
                    Answer::New
                }
            };
            answer(&mut self.metrics, &mut self.output, r.token, reply);
        }
        failure.map_or(Ok(()), |source| {
            Err(ClusterError::Index {
                partition: p,
                source,
            })
        })
    }

    fn answer(&mut self, ticket: Ticket, reply: Answer) {
        answer(&mut self.metrics, &mut self.output, ticket, reply);
    }
}

/// Refuses node `from`'s acknowledgement of `entries` unless every location is in one
/// of its own containers (`container >> 48 == from`): a node writes only those, so an
/// entry elsewhere is forged, and would hand out a chunk that is not where it says.
pub(crate) fn check_writer(from: NodeId, entries: &[(Fingerprint, ChunkLocation)]) -> Result<()> {
    match entries
        .iter()
        .find(|(_, at)| container_writer(at.container) != from)
    {
        None => Ok(()),
        Some((_, at)) => Err(ClusterError::Refused {
            from,
            what: "acknowledgement",
            reason: format!(
                "container {:#x} is node {}'s, not the sender's",
                at.container,
                container_writer(at.container)
            ),
            retryable: false,
        }),
    }
}

/// Counts `reply` and queues it for [`Owner::poll`]; apart from `Owner` so that it
/// borrows only these two fields while a partition is borrowed too.
fn answer(
    metrics: &mut OwnerMetrics,
    output: &mut VecDeque<(Ticket, Answer)>,
    ticket: Ticket,
    reply: Answer,
) {
    match reply {
        Answer::Known(_) => metrics.known += 1,
        Answer::New => metrics.new += 1,
        Answer::Moved => metrics.moved += 1,
    }
    output.push_back((ticket, reply));
}
