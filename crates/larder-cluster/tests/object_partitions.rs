//! Partitions on object storage (docs/design/cluster.md, "Partitions on object
//! storage"): a takeover rebuilds each index from the newest full object and the
//! deltas after it, then replays only the containers they do not cover; checkpoints put
//! deltas, compacted into a full object when they outgrow it; a stale owner is fenced
//! by a newer epoch's objects. Run against object_store's in-memory store and a real
//! S3 server (s3s-fs), plaintext and encrypted (docs/design/crypto.md, "Cluster"): an
//! encrypted cluster's objects are sealed, and one that is changed, moved, put again
//! or withheld ends its chain with the reason named, its entries coming back from the
//! replay.

mod support;

use std::collections::HashMap;
use std::sync::Arc;

use larder_cluster::partitions::{Opened, PartitionStore};
use larder_cluster::{partition_of, PartitionId, SharedStorage, Ticket};
use larder_crypto::{AeadKind, FingerprintKind, RepoKeys};
use larder_hash::{Fingerprint, HashAlgo};
use larder_index::disk::{Answer, Lookup};
use larder_index::ChunkLocation;
use larder_store::{ChunkCodec, Compression, ObjectBackend, PartitionObject};
use object_store::memory::InMemory;
use object_store::ObjectStore;
use support::containers::write_container_with;
use support::s3s::S3sServer;
use support::small_index;

const PARTITIONS: u32 = 4;

/// A node's view of the cluster in `bucket`, with its own cache directory.
fn storage(store: &Arc<dyn ObjectStore>, cache: &std::path::Path) -> SharedStorage {
    SharedStorage::Object {
        root: Arc::new(ObjectBackend::new(store.clone(), "cluster", "test://").unwrap()),
        cache: cache.to_path_buf(),
    }
}

/// A cluster's key, or none for a plaintext cluster.
type Keys = Option<Arc<RepoKeys>>;

fn cluster_key() -> Keys {
    Some(Arc::new(RepoKeys::generate(
        [3; 16],
        AeadKind::Aes256Gcm,
        FingerprintKind::KeyedBlake3,
    )))
}

fn partition_store(storage: SharedStorage, keys: &Keys) -> PartitionStore {
    PartitionStore::with_storage(
        storage,
        PARTITIONS,
        HashAlgo::Blake3,
        keys.clone(),
        small_index(),
        Lookup::Eager,
    )
}

/// The codec a node repository of the cluster writes containers with.
fn codec(keys: &Keys) -> ChunkCodec {
    match keys {
        Some(keys) => ChunkCodec::encrypted(Compression::None, HashAlgo::Blake3, keys.clone()),
        None => ChunkCodec::new(Compression::None, HashAlgo::Blake3),
    }
}

/// What an owner does with an acknowledgement: insert unless present.
fn insert(opened: &mut Opened, fp: Fingerprint, location: ChunkLocation) {
    let (_, index, covered) = opened;
    index.submit(fp, Ticket { node: 0, id: 0 }).unwrap();
    index.finish().unwrap();
    if index.poll().unwrap().answer == Answer::New {
        index.insert(fp, location).unwrap();
    }
    covered.cover(location.container);
}

/// Every partition of `opened` answers exactly `all`'s entries of it.
fn assert_exact(opened: &mut [Opened], all: &HashMap<Fingerprint, ChunkLocation>) {
    for (fp, location) in all {
        let p = partition_of(fp, PARTITIONS);
        for (q, index, _) in opened.iter_mut() {
            let expected = (*q == p).then_some(*location);
            assert_eq!(index.get(fp).unwrap(), expected, "partition {}", q.0);
        }
    }
}

/// The names of partition `p`'s objects.
fn objects(storage: &SharedStorage, p: PartitionId) -> Vec<String> {
    let SharedStorage::Object { root, .. } = storage else {
        unreachable!()
    };
    root.list_keys(&format!("partitions/{:05}", p.0)).unwrap()
}

fn chain_round_trip(store: Arc<dyn ObjectStore>, keys: Keys) {
    let caches: Vec<tempfile::TempDir> = (0..4).map(|_| tempfile::tempdir().unwrap()).collect();
    let codec = codec(&keys);
    let write_container_to = |backend: &dyn larder_store::Backend, node, seq, ids| {
        write_container_with(backend, &codec, node, seq, ids)
    };
    let partition_store = |storage| partition_store(storage, &keys);
    let a = storage(&store, caches[0].path());
    let mut all: HashMap<Fingerprint, ChunkLocation> = HashMap::new();
    for (node, seq, ids) in [(1, 0, 0..300), (1, 1, 300..600), (2, 0, 600..900)] {
        all.extend(write_container_to(&*a.node_backend(node), node, seq, ids));
    }
    let parts: Vec<PartitionId> = (0..PARTITIONS).map(PartitionId).collect();

    // A first owner: no objects yet, so everything is replayed; a full object each.
    let store_a = partition_store(a.clone());
    let (mut opened, replay) = store_a.take_over(&parts, 7).unwrap();
    assert_eq!(
        (replay.rebuilt, replay.containers_read, replay.inserted),
        (4, 3, 900)
    );
    assert_exact(&mut opened, &all);
    for &p in &parts {
        assert_eq!(objects(&a, p), ["0000000000000007-00000000.full"]);
    }

    // Acknowledgements into partition 0, then a checkpoint: a delta of exactly them.
    let p0 = PartitionId(0);
    let written = write_container_to(&*a.node_backend(2), 2, 1, 900..1200);
    let of_p0: Vec<_> = written
        .iter()
        .filter(|(fp, _)| partition_of(fp, PARTITIONS) == p0)
        .copied()
        .collect();
    for &(fp, location) in &of_p0 {
        insert(&mut opened[0], fp, location);
    }
    all.extend(of_p0.iter().copied());
    let (p, index, covered) = &mut opened[0];
    store_a.checkpoint(*p, index, covered).unwrap();
    // Queued by the checkpoint, put by the upload (outside the owner's lock).
    assert_eq!(objects(&a, p0), ["0000000000000007-00000000.full"]);
    assert_eq!(store_a.upload().unwrap(), []);
    assert_eq!(
        objects(&a, p0),
        [
            "0000000000000007-00000000.full",
            "0000000000000007-00000001.delta"
        ]
    );
    let SharedStorage::Object { root, .. } = &a else {
        unreachable!()
    };
    let delta = PartitionObject::from_stored(
        &root
            .get("partitions/00000/0000000000000007-00000001.delta")
            .unwrap(),
        0,
        "0000000000000007-00000001.delta",
        keys.as_deref(),
    )
    .unwrap();
    assert_eq!(delta.entries, of_p0);
    assert_eq!(delta.covered, covered.containers);
    // Nothing new: nothing put.
    store_a.checkpoint(*p, index, covered).unwrap();
    assert_eq!(store_a.upload().unwrap(), []);
    assert_eq!(objects(&a, p0).len(), 2);

    // A new owner with an empty cache: the full object and the delta give partition
    // 0 every entry; only the container no object covers is read (for the other
    // partitions, whose objects do not cover container 2/1).
    let b = storage(&store, caches[1].path());
    let store_b = partition_store(b.clone());
    let (mut opened_b, replay) = store_b.take_over(&parts, 9).unwrap();
    assert_eq!(replay.rebuilt, 0);
    assert_eq!(
        replay.containers_read, 1,
        "only container 2/1 is uncovered somewhere"
    );
    let others = written
        .iter()
        .filter(|(fp, _)| partition_of(fp, PARTITIONS) != p0)
        .count() as u64;
    assert_eq!(
        replay.inserted, others,
        "partition 0's entries came from its delta"
    );
    all.extend(written.iter().copied());
    assert_exact(&mut opened_b, &all);
    // Its full objects replaced every older object.
    for &p in &parts {
        assert_eq!(objects(&b, p), ["0000000000000009-00000000.full"]);
    }

    // The stale owner is fenced at its next upload and puts nothing.
    // Sixty chunks, so that partition 0 gets some under any random cluster key (ten
    // gave it none under 6% of keys: 0.75^10).
    let more = write_container_to(&*a.node_backend(1), 1, 2, 1200..1260);
    for &(fp, location) in &more {
        if partition_of(&fp, PARTITIONS) == p0 {
            insert(&mut opened[0], fp, location);
        }
    }
    let (p, index, covered) = &mut opened[0];
    store_a.checkpoint(*p, index, covered).unwrap();
    assert_eq!(store_a.upload().unwrap(), [p0], "fenced");
    assert_eq!(objects(&a, p0), ["0000000000000009-00000000.full"]);
    // Container 1/2's entries of the other partitions were acknowledged to no one:
    // a later takeover replays them. Its partition-0 entries went to the fenced owner
    // only, and the new owner's record will cover container 1/2 once it covers a later
    // container of node 1: an index without them costs deduplication, never data.
    let more_others: Vec<_> = more
        .iter()
        .filter(|(fp, _)| partition_of(fp, PARTITIONS) != p0)
        .copied()
        .collect();
    all.extend(more_others.iter().copied());

    // Small checkpoints pile deltas up until they hold more entries than the full
    // object; then one full object replaces them all.
    let full_len = opened_b[0].1.len();
    let mut next = 2000u64;
    let mut seq = 3u64;
    let mut deltas_seen = 0;
    let mut loop_others = 0u64;
    loop {
        let chunk = write_container_to(&*b.node_backend(1), 1, seq, next..next + 40);
        seq += 1;
        next += 40;
        for &(fp, location) in &chunk {
            if partition_of(&fp, PARTITIONS) == p0 {
                insert(&mut opened_b[0], fp, location);
                all.insert(fp, location);
            }
        }
        for &(fp, location) in &chunk {
            if partition_of(&fp, PARTITIONS) != p0 {
                all.insert(fp, location);
                loop_others += 1;
            }
        }
        let (p, index, covered) = &mut opened_b[0];
        store_b.checkpoint(*p, index, covered).unwrap();
        assert_eq!(store_b.upload().unwrap(), []);
        let names = objects(&b, p0);
        if names.len() == 1 {
            assert!(names[0].ends_with(".full"), "{names:?}");
            assert!(deltas_seen > 0);
            assert!(
                index.len() > 2 * full_len,
                "compacted once the deltas outgrew the full object"
            );
            break;
        }
        deltas_seen = names.len() - 1;
        assert!(
            names.iter().skip(1).all(|n| n.ends_with(".delta")),
            "{names:?}"
        );
        assert!(next < 20_000, "never compacted: {names:?}");
    }

    // A node dies without a checkpoint: its last acknowledgements come back from the
    // replay of the containers no object covers, exactly (the other partitions' objects
    // never covered the loop's containers either: their entries are replayed too).
    let late = write_container_to(&*b.node_backend(2), 2, 2, 5000..5300);
    for &(fp, location) in &late {
        if partition_of(&fp, PARTITIONS) == p0 {
            insert(&mut opened_b[0], fp, location);
        }
    }
    all.extend(late.iter().copied());
    drop(opened_b);
    let c = storage(&store, caches[2].path());
    let (mut opened_c, replay) = partition_store(c).take_over(&parts, 11).unwrap();
    assert_eq!(replay.rebuilt, 0);
    assert!(replay.containers_read >= 1);
    assert_eq!(
        replay.inserted,
        late.len() as u64 + loop_others + more_others.len() as u64
    );
    assert_exact(&mut opened_c, &all);
}

#[test]
fn partition_chains_in_memory() {
    chain_round_trip(Arc::new(InMemory::new()), None);
}

#[test]
fn partition_chains_on_s3s() {
    let server = S3sServer::start(&["larder"]);
    chain_round_trip(server.store("larder"), None);
}

#[test]
fn sealed_partition_chains_in_memory() {
    chain_round_trip(Arc::new(InMemory::new()), cluster_key());
}

/// What the storage does to partition 0's chain of a full object and two deltas
/// before a new owner takes it over.
#[derive(Debug, Clone, Copy)]
enum Tamper {
    /// One bit of the first delta flipped.
    FlipBit,
    /// The two deltas' bytes swapped between their names.
    Swap,
    /// The first delta put again under the next name in the chain.
    Replay,
    /// The first delta deleted.
    Withhold,
}

/// Partition 0's chain tampered with as `tamper` says: the new owner names the object
/// that ends the chain, with `reason`, and still answers every entry exactly, the rest
/// coming from the replay of the containers the chain's record does not cover.
fn tampered_chain(keys: Keys, tamper: Tamper, bad: &str, reason: &str) {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let caches: Vec<tempfile::TempDir> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
    let codec = codec(&keys);
    let a = storage(&store, caches[0].path());
    let mut all: HashMap<Fingerprint, ChunkLocation> = HashMap::new();
    // Deltas much smaller than the full object: no compaction.
    all.extend(write_container_with(
        &*a.node_backend(1),
        &codec,
        1,
        0,
        0..1200,
    ));
    let parts: Vec<PartitionId> = (0..PARTITIONS).map(PartitionId).collect();
    let store_a = partition_store(a.clone(), &keys);
    let (mut opened, _) = store_a.take_over(&parts, 7).unwrap();
    let p0 = PartitionId(0);
    for (seq, ids) in [(1, 1200..1300), (2, 1300..1400)] {
        let written = write_container_with(&*a.node_backend(2), &codec, 2, seq, ids);
        for &(fp, location) in &written {
            if partition_of(&fp, PARTITIONS) == p0 {
                insert(&mut opened[0], fp, location);
            }
        }
        all.extend(written);
        let (p, index, covered) = &mut opened[0];
        store_a.checkpoint(*p, index, covered).unwrap();
        assert_eq!(store_a.upload().unwrap(), []);
    }
    let names = [
        "0000000000000007-00000000.full",
        "0000000000000007-00000001.delta",
        "0000000000000007-00000002.delta",
    ];
    assert_eq!(objects(&a, p0), names);
    let SharedStorage::Object { root, .. } = &a else {
        unreachable!()
    };
    let key = |name: &str| format!("partitions/00000/{name}");
    let (first, second) = (
        root.get(&key(names[1])).unwrap(),
        root.get(&key(names[2])).unwrap(),
    );
    match tamper {
        Tamper::FlipBit => {
            let mut flipped = first.clone();
            flipped[first.len() / 2] ^= 0x10;
            root.delete(&key(names[1])).unwrap();
            root.put(&key(names[1]), &flipped, true).unwrap();
        }
        Tamper::Swap => {
            root.delete(&key(names[1])).unwrap();
            root.delete(&key(names[2])).unwrap();
            root.put(&key(names[1]), &second, true).unwrap();
            root.put(&key(names[2]), &first, true).unwrap();
        }
        Tamper::Replay => {
            root.put(&key("0000000000000007-00000003.delta"), &first, true)
                .unwrap();
        }
        Tamper::Withhold => root.delete(&key(names[1])).unwrap(),
    }

    let b = storage(&store, caches[1].path());
    let (mut opened_b, replay) = partition_store(b, &keys).take_over(&parts, 9).unwrap();
    assert_eq!(
        replay.bad_objects.len(),
        1,
        "{tamper:?}: {:?}",
        replay.bad_objects
    );
    let (object, why) = &replay.bad_objects[0];
    assert!(object.ends_with(&key(bad)), "{tamper:?}: {object}");
    assert!(why.contains(reason), "{tamper:?}: {why}");
    assert!(replay.containers_read >= 1, "{tamper:?}");
    assert_exact(&mut opened_b, &all);
}

#[test]
fn a_tampered_sealed_chain_ends_at_the_bad_object_and_the_replay_restores_it() {
    let failed = "failed authentication";
    let missing = "the object before it in the chain is missing";
    for (tamper, bad, reason) in [
        (Tamper::FlipBit, "0000000000000007-00000001.delta", failed),
        (Tamper::Swap, "0000000000000007-00000001.delta", failed),
        (Tamper::Replay, "0000000000000007-00000003.delta", failed),
        (Tamper::Withhold, "0000000000000007-00000002.delta", missing),
    ] {
        tampered_chain(cluster_key(), tamper, bad, reason);
    }
}

#[test]
fn a_damaged_or_incomplete_plaintext_chain_ends_at_the_bad_object() {
    for (tamper, bad, reason) in [
        (
            Tamper::FlipBit,
            "0000000000000007-00000001.delta",
            "checksum mismatch",
        ),
        (
            Tamper::Swap,
            "0000000000000007-00000001.delta",
            "it holds partition 0's object 0000000000000007-00000002.delta",
        ),
        (
            Tamper::Replay,
            "0000000000000007-00000003.delta",
            "it holds partition 0's object 0000000000000007-00000001.delta",
        ),
        (
            Tamper::Withhold,
            "0000000000000007-00000002.delta",
            "the object before it in the chain is missing",
        ),
    ] {
        tampered_chain(None, tamper, bad, reason);
    }
}
