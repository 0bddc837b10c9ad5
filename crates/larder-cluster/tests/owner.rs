//! The partition owner's lock on new against a model simple enough to be obviously
//! right: every answer, after every operation, over random interleavings of lookups
//! from several nodes, acknowledgements (on time, late, duplicated), lock expiries and
//! partition releases, with disk indexes small enough to evict everything.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::{Duration, Instant};

use larder_cluster::partitions::Covered;
use larder_cluster::{partition_of, Answer, Owner, PartitionId, Ticket};
use larder_hash::{Fingerprint, HashAlgo};
use larder_index::disk::{DiskIndex, DiskIndexConfig, Lookup, MemIo};
use larder_index::ChunkLocation;
use proptest::prelude::*;

const PARTITIONS: u32 = 4;
const TIMEOUT: Duration = Duration::from_secs(30);

fn fp(id: u64) -> Fingerprint {
    HashAlgo::Blake3.fingerprint(&id.to_le_bytes())
}

fn loc(n: u64) -> ChunkLocation {
    ChunkLocation {
        container: n / 8 + 1,
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
    /// Locked fingerprints: deadline, and the tickets waiting in arrival order.
    locked: HashMap<Fingerprint, (Instant, VecDeque<Ticket>)>,
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
        if let Some((_, waiting)) = self.locked.get_mut(&fp) {
            waiting.push_back(t);
            return None;
        }
        self.locked.insert(fp, (now + TIMEOUT, VecDeque::new()));
        Some(Answer::New)
    }

    fn ack(&mut self, fp: Fingerprint, l: ChunkLocation, out: &mut Vec<(Ticket, Answer)>) {
        if !self.owned.contains(&partition_of(&fp, PARTITIONS).0) || self.stored.contains_key(&fp) {
            return;
        }
        self.stored.insert(fp, l);
        if let Some((_, waiting)) = self.locked.remove(&fp) {
            out.extend(waiting.into_iter().map(|t| (t, Answer::Known(l))));
        }
    }

    fn expire(&mut self, now: Instant, out: &mut Vec<(Ticket, Answer)>) {
        let due: Vec<Fingerprint> = self
            .locked
            .iter()
            .filter(|(_, (d, _))| *d <= now)
            .map(|(fp, _)| *fp)
            .collect();
        for fp in due {
            let (_, mut waiting) = self.locked.remove(&fp).unwrap();
            if let Some(next) = waiting.pop_front() {
                out.push((next, Answer::New));
                self.locked.insert(fp, (now + TIMEOUT, waiting));
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
            let (_, waiting) = self.locked.remove(&fp).unwrap();
            out.extend(waiting.into_iter().map(|t| (t, Answer::Moved)));
        }
    }
}

#[derive(Debug, Clone)]
enum Op {
    /// A request from `node` for these fingerprint ids.
    Lookup(u16, Vec<u64>),
    /// Acknowledge the i-th `New` answered so far (modulo), at location `n`.
    Ack(usize, u64),
    /// An acknowledgement nobody was asked for (a late writer after a failover).
    LateAck(u64, u64),
    /// Time passes by this many seconds, then locks expire.
    Wait(u64),
    /// Stop owning partition 0.
    Release,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => (1u16..4, proptest::collection::vec(0u64..24, 1..12)).prop_map(|(n, ids)| Op::Lookup(n, ids)),
        4 => (any::<usize>(), 0u64..1000).prop_map(|(i, n)| Op::Ack(i, n)),
        1 => (0u64..24, 0u64..1000).prop_map(|(id, n)| Op::LateAck(id, n)),
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
                    owner.ack(&[(f, loc(n))], now).unwrap();
                    model.ack(f, loc(n), &mut expected);
                }
                Op::LateAck(id, n) => {
                    owner.ack(&[(fp(id), loc(n))], now).unwrap();
                    model.ack(fp(id), loc(n), &mut expected);
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
