//! The partition owner's lock on new against a model simple enough to be obviously
//! right: every answer, after every operation, over random interleavings of lookups
//! from several nodes, acknowledgements (on time, late, duplicated, from a node that
//! does not hold the lock, of a location outside the sender's containers), lock
//! expiries and partition releases, with disk indexes small enough to evict
//! everything.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::{Duration, Instant};

use larder_cluster::ids::first_container;
use larder_cluster::partitions::Covered;
use larder_cluster::rpc::GetAnswer;
use larder_cluster::{partition_of, Answer, ClusterError, NodeId, Owner, PartitionId, Ticket};
use larder_hash::{Fingerprint, HashAlgo};
use larder_index::disk::{DiskIndex, DiskIndexConfig, Lookup, MemIo};
use larder_index::ChunkLocation;
use proptest::prelude::*;

const PARTITIONS: u32 = 4;
const TIMEOUT: Duration = Duration::from_secs(30);

fn fp(id: u64) -> Fingerprint {
    HashAlgo::Blake3.fingerprint(&id.to_le_bytes())
}

/// Location `n` in a container of `node`'s range (the only ones it may acknowledge).
fn loc(node: NodeId, n: u64) -> ChunkLocation {
    ChunkLocation {
        container: first_container(node) + n / 8 + 1,
        offset: (n % 8) as u32 * 4096,
        length: 4096,
    }
}

fn index(lookup: Lookup) -> DiskIndex<MemIo, Ticket> {
    let config = DiskIndexConfig {
        memory_budget: 16 << 10,
        expected_fingerprints: 50,
        buffered_chunk_bytes: 64,
        bft: 2,
        ..DiskIndexConfig::default()
    };
    DiskIndex::create(MemIo::new(), config, lookup).unwrap()
}

/// An owner of partitions `owned` of `PARTITIONS`.
fn owner(lookup: Lookup, owned: &[u32]) -> Owner<MemIo> {
    let mut owner = Owner::new(PARTITIONS, TIMEOUT);
    for &p in owned {
        owner.take(PartitionId(p), 1, index(lookup), Covered::default());
    }
    owner
}

fn answers(owner: &mut Owner<MemIo>) -> BTreeMap<(u16, u64), Answer> {
    std::iter::from_fn(|| owner.poll())
        .map(|(t, r)| ((t.node, t.id), r))
        .collect()
}

/// The rules of docs/design/cluster.md, "Lock on new", one fingerprint at a time.
#[derive(Default)]
struct Model {
    stored: HashMap<Fingerprint, ChunkLocation>,
    /// Locked fingerprints: deadline, holder, and the tickets waiting in arrival order.
    locked: HashMap<Fingerprint, (Instant, NodeId, VecDeque<Ticket>)>,
    owned: Vec<u32>,
}

impl Model {
    fn lookup(&mut self, t: Ticket, fp: Fingerprint, now: Instant) -> Option<Answer> {
        if !self.owned.contains(&partition_of(&fp, PARTITIONS).0) {
            return Some(Answer::Moved);
        }
        if let Some(&l) = self.stored.get(&fp) {
            return Some(Answer::Known(l));
        }
        if let Some((_, _, waiting)) = self.locked.get_mut(&fp) {
            waiting.push_back(t);
            return None;
        }
        self.locked
            .insert(fp, (now + TIMEOUT, t.node, VecDeque::new()));
        Some(Answer::New)
    }

    /// Whether `from` may acknowledge `fp` at `l`: a location in its own containers,
    /// and no other node holding the fingerprint's lock.
    fn may_ack(&self, from: NodeId, fp: Fingerprint, l: ChunkLocation) -> bool {
        let own = l.container >> 48 == u64::from(from);
        own && self
            .locked
            .get(&fp)
            .is_none_or(|&(_, holder, _)| holder == from)
    }

    /// `from`'s acknowledgement, if it may make it ([`Model::may_ack`]).
    fn ack(
        &mut self,
        from: NodeId,
        fp: Fingerprint,
        l: ChunkLocation,
        out: &mut Vec<(Ticket, Answer)>,
    ) {
        if !self.may_ack(from, fp, l)
            || !self.owned.contains(&partition_of(&fp, PARTITIONS).0)
            || self.stored.contains_key(&fp)
        {
            return;
        }
        self.stored.insert(fp, l);
        if let Some((_, _, waiting)) = self.locked.remove(&fp) {
            out.extend(waiting.into_iter().map(|t| (t, Answer::Known(l))));
        }
    }

    fn holder(&self, fp: &Fingerprint) -> Option<NodeId> {
        self.locked.get(fp).map(|&(_, holder, _)| holder)
    }

    fn expire(&mut self, now: Instant, out: &mut Vec<(Ticket, Answer)>) {
        let due: Vec<Fingerprint> = self
            .locked
            .iter()
            .filter(|(_, (d, _, _))| *d <= now)
            .map(|(fp, _)| *fp)
            .collect();
        for fp in due {
            let (_, _, mut waiting) = self.locked.remove(&fp).unwrap();
            if let Some(next) = waiting.pop_front() {
                out.push((next, Answer::New));
                self.locked.insert(fp, (now + TIMEOUT, next.node, waiting));
            }
        }
    }

    fn release(&mut self, p: u32, out: &mut Vec<(Ticket, Answer)>) {
        self.owned.retain(|&o| o != p);
        let gone: Vec<Fingerprint> = self
            .locked
            .keys()
            .filter(|fp| partition_of(fp, PARTITIONS).0 == p)
            .copied()
            .collect();
        for fp in gone {
            let (_, _, waiting) = self.locked.remove(&fp).unwrap();
            out.extend(waiting.into_iter().map(|t| (t, Answer::Moved)));
        }
    }
}

#[derive(Debug, Clone)]
enum Op {
    /// A request from `node` for these fingerprint ids.
    Lookup(u16, Vec<u64>),
    /// The lock holder acknowledges the i-th `New` answered so far (modulo), at
    /// location `n` of its containers (node 1 when the lock is gone: a late one).
    Ack(usize, u64),
    /// An acknowledgement from `node` nobody asked it for (a late writer after a
    /// failover; refused while another node holds the lock).
    LateAck(u16, u64, u64),
    /// `node` acknowledges fingerprint `id` at a location in the next node's
    /// containers: always refused.
    ForeignAck(u16, u64, u64),
    /// Time passes by this many seconds, then locks expire.
    Wait(u64),
    /// Stop owning partition 0.
    Release,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => (1u16..4, proptest::collection::vec(0u64..24, 1..12)).prop_map(|(n, ids)| Op::Lookup(n, ids)),
        4 => (any::<usize>(), 0u64..1000).prop_map(|(i, n)| Op::Ack(i, n)),
        1 => (1u16..4, 0u64..24, 0u64..1000).prop_map(|(node, id, n)| Op::LateAck(node, id, n)),
        1 => (1u16..4, 0u64..24, 0u64..1000).prop_map(|(node, id, n)| Op::ForeignAck(node, id, n)),
        2 => (0u64..40).prop_map(Op::Wait),
        1 => Just(Op::Release),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn the_owner_answers_like_the_model(ops in proptest::collection::vec(op(), 1..60), lazy in any::<bool>()) {
        let lookup = if lazy { Lookup::Lazy } else { Lookup::Eager };
        let mut owner = owner(lookup, &[0, 1, 2]);
        let mut model = Model { owned: vec![0, 1, 2], ..Model::default() };
        let mut now = Instant::now();
        let mut next_id = 0u64;
        // What each ticket asked for, and every fingerprint answered `New` so far.
        let mut asked: HashMap<u64, Fingerprint> = HashMap::new();
        let mut news: Vec<Fingerprint> = Vec::new();
        for op in ops {
            let mut expected = Vec::new();
            match op {
                Op::Lookup(node, ids) => {
                    let fps: Vec<Fingerprint> = ids.iter().map(|&i| fp(i)).collect();
                    owner.lookup(node, &fps, next_id, now).unwrap();
                    for (i, f) in fps.iter().enumerate() {
                        let t = Ticket { node, id: next_id + i as u64 };
                        asked.insert(t.id, *f);
                        if let Some(r) = model.lookup(t, *f, now) {
                            expected.push((t, r));
                        }
                    }
                    next_id += fps.len() as u64;
                }
                Op::Ack(i, n) => {
                    if news.is_empty() {
                        continue;
                    }
                    let f = news[i % news.len()];
                    let from = model.holder(&f).unwrap_or(1);
                    owner.ack(from, &[(f, loc(from, n))], now).unwrap();
                    model.ack(from, f, loc(from, n), &mut expected);
                }
                Op::LateAck(node, id, n) | Op::ForeignAck(node, id, n) => {
                    let at = match op {
                        Op::LateAck(..) => loc(node, n),
                        _ => loc(node + 1, n),
                    };
                    let taken = owner.ack(node, &[(fp(id), at)], now);
                    prop_assert_eq!(taken.is_ok(), model.may_ack(node, fp(id), at), "{:?}", taken);
                    if let Err(e) = taken {
                        prop_assert!(matches!(e, ClusterError::Refused { .. }), "{}", e);
                    }
                    model.ack(node, fp(id), at, &mut expected);
                }
                Op::Wait(s) => {
                    now += Duration::from_secs(s);
                    owner.expire(now).unwrap();
                    model.expire(now, &mut expected);
                }
                Op::Release => {
                    if owner.owns(PartitionId(0)) {
                        owner.release(PartitionId(0)).unwrap();
                    }
                    model.release(0, &mut expected);
                }
            }
            let got = answers(&mut owner);
            let want: BTreeMap<(u16, u64), Answer> =
                expected.iter().map(|(t, r)| ((t.node, t.id), *r)).collect();
            prop_assert_eq!(&got, &want);
            news.extend(
                got.iter()
                    .filter(|(_, r)| **r == Answer::New)
                    .map(|((_, id), _)| asked[id]),
            );
        }
    }
}

/// Node 2 acknowledges (in its own containers) a fingerprint node 1 was answered
/// `New` for: refused, and nothing changes: the waiter still waits, node 1's own
/// acknowledgement then releases it with node 1's location.
#[test]
fn an_acknowledgement_from_a_node_not_holding_the_lock_is_refused() {
    let mut owner = owner(Lookup::Eager, &[0, 1, 2, 3]);
    let now = Instant::now();
    let f = fp(7);
    owner.lookup(1, &[f], 0, now).unwrap();
    owner.lookup(3, &[f], 1, now).unwrap();
    assert_eq!(answers(&mut owner), BTreeMap::from([((1, 0), Answer::New)]));
    let err = owner.ack(2, &[(f, loc(2, 5))], now).unwrap_err();
    assert!(
        matches!(
            err,
            ClusterError::Refused {
                from: 2,
                retryable: true,
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("locked by node 1"), "{err}");
    assert_eq!(owner.metrics().refused_acks, 1);
    assert!(answers(&mut owner).is_empty(), "the waiter still waits");
    assert_eq!(owner.get(&[f]).unwrap(), [GetAnswer::Absent]);
    owner.ack(1, &[(f, loc(1, 9))], now).unwrap();
    assert_eq!(
        answers(&mut owner),
        BTreeMap::from([((3, 1), Answer::Known(loc(1, 9)))])
    );
    assert_eq!(owner.get(&[f]).unwrap(), [GetAnswer::Known(loc(1, 9))]);
}

/// The lock holder itself names a location in another node's containers (a node
/// writes only its own): refused, nothing inserted, the lock still its; an
/// acknowledgement of no lock (late) elsewhere than the sender's containers is refused
/// too, and one entry out of range refuses the whole acknowledgement.
#[test]
fn an_acknowledgement_outside_the_senders_containers_is_refused() {
    let mut owner = owner(Lookup::Eager, &[0, 1, 2, 3]);
    let now = Instant::now();
    let (f, g, late) = (fp(7), fp(8), fp(9));
    owner.lookup(1, &[f, g], 0, now).unwrap();
    assert_eq!(answers(&mut owner).len(), 2);
    for entries in [
        vec![(f, loc(2, 5))],
        vec![(f, loc(1, 5)), (g, loc(4, 6))],
        vec![(late, loc(0, 1))],
    ] {
        let err = owner.ack(1, &entries, now).unwrap_err();
        assert!(
            matches!(
                err,
                ClusterError::Refused {
                    from: 1,
                    retryable: false,
                    ..
                }
            ),
            "{err}"
        );
        assert!(err.to_string().contains("not the sender's"), "{err}");
    }
    assert_eq!(
        owner.get(&[f, g, late]).unwrap(),
        [GetAnswer::Absent, GetAnswer::Absent, GetAnswer::Absent]
    );
    assert_eq!(owner.metrics().refused_acks, 4, "every entry of each");
    // The lock is still node 1's: another node's lookup waits on it.
    owner.lookup(2, &[f], 2, now).unwrap();
    assert!(answers(&mut owner).is_empty());
    owner
        .ack(1, &[(f, loc(1, 5)), (g, loc(1, 6))], now)
        .unwrap();
    assert_eq!(
        answers(&mut owner),
        BTreeMap::from([((2, 2), Answer::Known(loc(1, 5)))])
    );
}

/// An acknowledgement of two fingerprints, one locked for the sender and one for
/// another node: the sender's is taken (its waiter answered), the other refused alone,
/// still locked for its holder.
#[test]
fn only_the_entries_of_another_nodes_locks_are_refused() {
    let mut owner = owner(Lookup::Eager, &[0, 1, 2, 3]);
    let now = Instant::now();
    let (mine, theirs) = (fp(7), fp(8));
    owner.lookup(1, &[mine], 0, now).unwrap();
    owner.lookup(2, &[theirs], 1, now).unwrap();
    owner.lookup(3, &[mine, theirs], 2, now).unwrap();
    assert_eq!(answers(&mut owner).len(), 2);
    let err = owner
        .ack(1, &[(mine, loc(1, 1)), (theirs, loc(1, 2))], now)
        .unwrap_err();
    assert!(
        err.is_retryable() && err.to_string().contains("locked by node 2"),
        "{err}"
    );
    assert_eq!(owner.metrics().refused_acks, 1);
    assert_eq!(
        owner.get(&[mine, theirs]).unwrap(),
        [GetAnswer::Known(loc(1, 1)), GetAnswer::Absent]
    );
    owner.ack(2, &[(theirs, loc(2, 2))], now).unwrap();
    assert_eq!(
        answers(&mut owner),
        BTreeMap::from([
            ((3, 2), Answer::Known(loc(1, 1))),
            ((3, 3), Answer::Known(loc(2, 2)))
        ])
    );
}
