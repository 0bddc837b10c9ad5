//! Nodes in process over a real 3-member etcd: the master spreads the partitions over
//! the live nodes, routers on any node answer like one node, and when a node dies
//! (its lease expires) its partitions move to the survivors, which replay the
//! containers written since their checkpoints, so nothing acknowledged is forgotten.

mod support;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use larder_cluster::node::{Node, NodeOptions};
use larder_cluster::router::Router;
use larder_cluster::{partition_of, Answer, NodeId, PartitionId};
use larder_hash::Fingerprint;
use larder_index::ChunkLocation;
use support::certs::Certs;
use support::containers::{chunk_fp, write_container};
use support::etcd::EtcdCluster;

const PARTITIONS: u32 = 64;
const TTL: i64 = 3;

fn options(
    id: NodeId,
    etcd: &EtcdCluster,
    storage: &std::path::Path,
    certs: &Certs,
) -> NodeOptions {
    let mut options = NodeOptions::new(id, etcd.endpoints(), "/larder-test", storage.to_path_buf());
    options.member_ttl_secs = TTL;
    options.checkpoint_every = Duration::from_millis(500);
    certs.secure(options)
}

/// Waits until every partition is served by a live node and every node's view agrees.
async fn settled(nodes: &[&Node], live: &[NodeId]) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let served: usize = nodes.iter().map(|n| n.service.owned().len()).sum();
        let views_agree = nodes.iter().all(|n| {
            let view = n.view.read().unwrap();
            view.owners.iter().all(|o| live.contains(o))
                && nodes.iter().all(|m| {
                    view.owners.iter().filter(|&&o| o == m.id).count() == m.service.owned().len()
                })
        });
        if served == PARTITIONS as usize && views_agree {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "partitions not settled: {served} served"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitions_fail_over_and_nothing_acknowledged_is_forgotten() {
    let certs = Certs::issue(3);
    let etcd = EtcdCluster::start_tls(3, certs.etcd()).await;
    let dir = tempfile::tempdir().unwrap();
    let storage = dir.path();
    support::init_plain_cluster(&etcd, "/larder-test", &certs, PARTITIONS).await;
    let one = Node::start(options(1, &etcd, storage, &certs))
        .await
        .unwrap();
    // Node 2 never checkpoints: after it dies, its partitions' entries can only come
    // back from the replay of the containers.
    let mut lazy = options(2, &etcd, storage, &certs);
    lazy.checkpoint_every = Duration::from_secs(3600);
    let two = Node::start(lazy).await.unwrap();
    let three = Node::start(options(3, &etcd, storage, &certs))
        .await
        .unwrap();
    settled(&[&one, &two, &three], &[1, 2, 3]).await;
    for node in [&one, &two, &three] {
        let load = node.service.owned().len();
        assert!((21..=22).contains(&load), "node {}: {load}", node.id);
    }

    // Node 1 stores chunks 0..600 in three containers and acknowledges them; node 3
    // then finds every one of them.
    let router1 = Router::new(1, PARTITIONS, one.view.clone(), 0)
        .with_local(one.service.clone())
        .with_transport(certs.node(1));
    let router3 = Router::new(3, PARTITIONS, three.view.clone(), 0)
        .with_local(three.service.clone())
        .with_transport(certs.node(3));
    let mut stored: HashMap<Fingerprint, ChunkLocation> = HashMap::new();
    for seq in 0..3u64 {
        let ids = seq * 200..(seq + 1) * 200;
        let fps: Vec<Fingerprint> = ids.clone().map(chunk_fp).collect();
        let answers = router1.lookup(&fps).await.unwrap();
        assert!(answers.iter().all(|a| *a == Answer::New));
        let written = write_container(storage, 1, seq, ids);
        router1.ack(&written).await.unwrap();
        stored.extend(written);
    }
    let all: Vec<Fingerprint> = (0..600).map(chunk_fp).collect();
    let answers = router3.lookup(&all).await.unwrap();
    for (fp, a) in all.iter().zip(&answers) {
        assert_eq!(*a, Answer::Known(stored[fp]));
    }

    // Node 2 dies without leaving: its lease expires, the master moves its partitions,
    // and lookups of them are answered again, exactly, from the survivors.
    let owned_by_two: Vec<PartitionId> = two.service.owned().into_iter().map(|(p, _)| p).collect();
    let died = Instant::now();
    drop(two);
    settled(&[&one, &three], &[1, 3]).await;
    let moved_after = died.elapsed();
    let answers = router3.lookup(&all).await.unwrap();
    for (fp, a) in all.iter().zip(&answers) {
        assert_eq!(*a, Answer::Known(stored[fp]));
    }
    // Node 2's entries came back from its containers, not from a checkpoint.
    let replayed: u64 = [&one, &three]
        .iter()
        .map(|n| n.service.replayed().inserted)
        .sum();
    let of_two = stored
        .keys()
        .filter(|fp| owned_by_two.contains(&partition_of(fp, PARTITIONS)))
        .count();
    assert!(of_two > 0);
    assert_eq!(replayed, of_two as u64);
    // Within the lease's TTL plus 10 s (the acceptance's bound counts from the expiry).
    assert!(
        moved_after < Duration::from_secs(TTL as u64 + 10),
        "{moved_after:?}"
    );
    let mut one = one;
    let mut three = three;
    one.stop().await.unwrap();
    three.stop().await.unwrap();
}

/// Waits until `condition` holds, for up to `within`.
async fn until(what: &str, within: Duration, condition: impl Fn() -> bool) {
    let deadline = Instant::now() + within;
    while !condition() {
        assert!(Instant::now() < deadline, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// etcd (its one member) goes away for longer than the lease: the node stops serving
/// without a write and keeps running; its lookups fail at once, naming why, and a
/// stranger's too; when etcd is back the node joins with a new lease, serves every
/// partition again and finds what was acknowledged before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_out_of_the_cluster_stops_serving_and_joins_again() {
    let certs = Certs::issue(1);
    let mut etcd = EtcdCluster::start_tls(1, certs.etcd()).await;
    let dir = tempfile::tempdir().unwrap();
    let storage = dir.path();
    support::init_plain_cluster(&etcd, "/larder-test", &certs, PARTITIONS).await;
    let mut node = Node::start(options(1, &etcd, storage, &certs))
        .await
        .unwrap();
    settled(&[&node], &[1]).await;
    let fps: Vec<Fingerprint> = (0..100).map(chunk_fp).collect();
    assert!(node
        .router
        .lookup(&fps)
        .await
        .unwrap()
        .iter()
        .all(|a| *a == Answer::New));
    let written = write_container(storage, 1, 0, 0..100);
    node.router.ack(&written).await.unwrap();
    let known: Vec<Answer> = written.iter().map(|&(_, at)| Answer::Known(at)).collect();

    etcd.kill(0);
    let ttl = Duration::from_secs(TTL as u64);
    until("the node left", ttl * 3, || !node.is_member()).await;
    assert!(node.service.owned().is_empty(), "it serves nothing");
    // Fingerprints its router's cache does not hold (a cached one is still stored).
    let fresh: Vec<Fingerprint> = (100..200).map(chunk_fp).collect();
    let err = node.router.lookup(&fresh).await.unwrap_err();
    assert!(
        err.to_string().contains("node 1 is out of the cluster") && !err.is_retryable(),
        "{err}"
    );
    // Its owner takes nobody's lookups meanwhile, its own node id's included.
    let asked = node.service.lookup(1, fps.clone()).await.unwrap_err();
    assert!(asked.to_string().contains("not a member"), "{asked}");

    etcd.restart(0).await;
    until("the node joined again", Duration::from_secs(30), || {
        node.is_member() && node.service.owned().len() == PARTITIONS as usize
    })
    .await;
    // Through a router without a cache: the owner's index has them.
    let router = Router::new(1, PARTITIONS, node.view.clone(), 0).with_local(node.service.clone());
    assert_eq!(router.lookup(&fps).await.unwrap(), known);
    node.stop().await.unwrap();
}
