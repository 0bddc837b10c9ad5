//! Receiving nodes' routers over three in-process owner nodes on loopback: every answer
//! exact against a single-node oracle, one message per owner per request, the cache
//! answering repeats, and `Moved` asked again after a partition changes owner.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use larder_cluster::balance::plan_moves;
use larder_cluster::ids::first_container;
use larder_cluster::partitions::PartitionStore;
use larder_cluster::router::{MapView, Router};
use larder_cluster::rpc::LookupServer;
use larder_cluster::service::OwnerService;
use larder_cluster::{partition_of, Answer, NodeId, PartitionId};
use larder_hash::{Fingerprint, HashAlgo};
use larder_index::disk::{DiskIndexConfig, Lookup};
use larder_index::ChunkLocation;

const PARTITIONS: u32 = 16;

fn fp(id: u64) -> Fingerprint {
    HashAlgo::Blake3.fingerprint(&id.to_le_bytes())
}

struct Node {
    service: OwnerService,
    server: LookupServer,
}

/// Three owner nodes sharing one directory, with the partitions spread by the master's
/// plan, and the map the routers read.
async fn cluster(root: &std::path::Path) -> (HashMap<NodeId, Node>, Arc<RwLock<MapView>>) {
    let config = DiskIndexConfig {
        memory_budget: 256 << 10,
        expected_fingerprints: 5000,
        buffered_chunk_bytes: 64,
        ..DiskIndexConfig::default()
    };
    let owners = vec![0; PARTITIONS as usize];
    let moves = plan_moves(&owners, &[1, 2, 3]);
    // Every service reads the members (the nodes whose lookups it takes) from it.
    let map = Arc::new(RwLock::new(MapView {
        owners,
        addrs: HashMap::new(),
    }));
    let mut nodes = HashMap::new();
    for id in [1u16, 2, 3] {
        let store = PartitionStore::new(
            root,
            PARTITIONS,
            HashAlgo::Blake3,
            config.clone(),
            Lookup::Lazy,
        );
        let service = OwnerService::new(store, PARTITIONS, Duration::from_secs(60), map.clone());
        let mine: Vec<PartitionId> = moves
            .iter()
            .filter(|(_, n)| *n == id)
            .map(|(p, _)| *p)
            .collect();
        service.take_over(&mine, 1).unwrap();
        for p in &mine {
            map.write().unwrap().owners[p.0 as usize] = id;
        }
        let any_port = "127.0.0.1:0".parse().unwrap();
        let server = LookupServer::bind(any_port, Arc::new(service.clone()))
            .await
            .unwrap();
        let addr = server.local_addr().to_string();
        map.write().unwrap().addrs.insert(id, addr);
        nodes.insert(id, Node { service, server });
    }
    (nodes, map)
}

/// Where `node` stored chunk `id`: in one of its own containers.
fn at(node: NodeId, id: u64) -> ChunkLocation {
    ChunkLocation {
        container: first_container(node) + id / 100 + 1,
        offset: (id % 100) as u32 * 512,
        length: 512,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routers_answer_like_one_node_and_send_one_message_per_owner() {
    let dir = tempfile::tempdir().unwrap();
    let (nodes, map) = cluster(dir.path()).await;
    // Node 1 answers its own partitions in process; node 2 asks itself over loopback.
    let one = Router::new(1, PARTITIONS, map.clone(), 10_000).with_local(nodes[&1].service.clone());
    let two = Router::new(2, PARTITIONS, map.clone(), 10_000);
    // The oracle: the first to be answered New stores, everyone else finds it.
    let mut stored: HashMap<Fingerprint, ChunkLocation> = HashMap::new();
    for (router, me, ids) in [
        (&one, 1, 0..300u64),
        (&two, 2, 200..500),
        (&one, 1, 100..600),
    ] {
        let fps: Vec<Fingerprint> = ids.clone().map(fp).collect();
        let answers = router.lookup(&fps).await.unwrap();
        let mut acks = Vec::new();
        for (id, (f, answer)) in ids.zip(fps.iter().zip(answers)) {
            match stored.get(f) {
                Some(&location) => assert_eq!(answer, Answer::Known(location), "id {id}"),
                None => {
                    assert_eq!(answer, Answer::New, "id {id}");
                    stored.insert(*f, at(me, id));
                    acks.push((*f, at(me, id)));
                }
            }
        }
        router.ack(&acks).await.unwrap();
    }
    // Two other owners: at most two messages a request (the cache answers repeats).
    let m = one.metrics();
    assert_eq!(m.requests, 2);
    assert!(m.messages <= 4 && m.local > 0, "{m:?}");
    assert_eq!(
        m.cached, 200,
        "ids 100..300 were looked up by node 1 before"
    );
    let owned: u64 = nodes
        .values()
        .map(|n| n.service.metrics().fingerprints)
        .sum();
    let t = two.metrics();
    assert_eq!(
        owned,
        m.fingerprints_sent + m.local + t.fingerprints_sent,
        "{m:?} {t:?}"
    );
    for node in nodes.into_values() {
        node.server.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_moved_partition_is_asked_again_at_its_new_owner() {
    let dir = tempfile::tempdir().unwrap();
    let (nodes, map) = cluster(dir.path()).await;
    let router = Router::new(3, PARTITIONS, map.clone(), 0);
    let fps: Vec<Fingerprint> = (0..400).map(fp).collect();
    let answers = router.lookup(&fps).await.unwrap();
    assert!(answers.iter().all(|a| *a == Answer::New));
    let acks: Vec<_> = (0..400).map(|i| (fps[i as usize], at(3, i))).collect();
    router.ack(&acks).await.unwrap();
    // Node 1 hands one of its partitions to node 2; the map catches up later.
    let p = map
        .read()
        .unwrap()
        .owners
        .iter()
        .position(|&o| o == 1)
        .unwrap() as u32;
    nodes[&1].service.release(PartitionId(p), true).unwrap();
    nodes[&2].service.take_over(&[PartitionId(p)], 2).unwrap();
    let updater = tokio::spawn({
        let map = map.clone();
        async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            map.write().unwrap().owners[p as usize] = 2;
        }
    });
    let again = router.lookup(&fps).await.unwrap();
    updater.await.unwrap();
    for (i, a) in again.iter().enumerate() {
        assert_eq!(*a, Answer::Known(at(3, i as u64)), "fingerprint {i}");
    }
    let moved = fps
        .iter()
        .filter(|f| partition_of(f, PARTITIONS).0 == p)
        .count() as u64;
    assert!(moved > 0);
    assert!(router.metrics().moved >= moved, "{:?}", router.metrics());
    for node in nodes.into_values() {
        node.server.shutdown().await;
    }
}
