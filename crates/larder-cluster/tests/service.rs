//! The owner service: requests from several nodes at once, one waiting on another's
//! lock until the acknowledgement or the lock's timeout.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use larder_cluster::ids::first_container;
use larder_cluster::partitions::PartitionStore;
use larder_cluster::router::MapView;
use larder_cluster::rpc::GetAnswer;
use larder_cluster::service::{OwnerService, SHARDS};
use larder_cluster::{partition_of, Answer, PartitionId};
use larder_hash::{Fingerprint, HashAlgo};
use larder_index::disk::{DiskIndexConfig, Lookup};
use larder_index::ChunkLocation;

const PARTITIONS: u32 = 4;

fn fp(id: u64) -> Fingerprint {
    HashAlgo::Blake3.fingerprint(&id.to_le_bytes())
}

/// A node's view in which `ids` are the members.
fn members(ids: &[u16]) -> Arc<RwLock<MapView>> {
    let addrs: HashMap<u16, String> = ids
        .iter()
        .map(|&id| (id, format!("127.0.0.1:{}", 7000 + id)))
        .collect();
    Arc::new(RwLock::new(MapView {
        owners: Vec::new(),
        addrs,
    }))
}

fn service(root: &std::path::Path, timeout: Duration) -> OwnerService {
    service_of(root, timeout, PARTITIONS)
}

fn service_of(root: &std::path::Path, timeout: Duration, partitions: u32) -> OwnerService {
    let config = DiskIndexConfig {
        memory_budget: 64 << 10,
        expected_fingerprints: 1000,
        buffered_chunk_bytes: 64,
        ..DiskIndexConfig::default()
    };
    let store = PartitionStore::new(root, partitions, HashAlgo::Blake3, config, Lookup::Lazy);
    let service = OwnerService::new(store, partitions, timeout, members(&[1, 2, 3]));
    let all: Vec<PartitionId> = (0..partitions).map(PartitionId).collect();
    service.take_over(&all, 1).unwrap();
    service
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_waits_for_the_first_writers_acknowledgement() {
    let dir = tempfile::tempdir().unwrap();
    let service = service(dir.path(), Duration::from_secs(60));
    let first = service.lookup(1, vec![fp(1), fp(2)]).await.unwrap();
    assert_eq!(first, vec![Answer::New, Answer::New]);
    let waiter = tokio::spawn({
        let service = service.clone();
        async move { service.lookup(2, vec![fp(3), fp(1)]).await }
    });
    // Another node's unrelated request is answered while that one waits.
    let other = service.lookup(3, vec![fp(4)]).await.unwrap();
    assert_eq!(other, vec![Answer::New]);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!waiter.is_finished(), "fp(1) is locked by node 1");
    let at = ChunkLocation {
        container: first_container(1) + 9,
        offset: 32,
        length: 100,
    };
    service.ack(1, &[(fp(1), at)]).unwrap();
    let answers = waiter.await.unwrap().unwrap();
    assert_eq!(answers, vec![Answer::New, Answer::Known(at)]);
    assert_eq!(
        service.get(&[fp(1), fp(2)]).unwrap(),
        vec![GetAnswer::Known(at), GetAnswer::Absent]
    );
    let metrics = service.metrics();
    assert_eq!((metrics.new, metrics.known, metrics.waited), (4, 1, 1));
}

/// The service splits a request by group of partitions ([`SHARDS`]) and puts the
/// answers back: each in its fingerprint's place, whatever group answered it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_over_every_group_is_answered_in_request_order() {
    let partitions = 4 * SHARDS as u32;
    let dir = tempfile::tempdir().unwrap();
    let service = service_of(dir.path(), Duration::from_secs(60), partitions);
    let gone = PartitionId(5);
    service.release(gone, false).unwrap();
    let at = |id: u64| ChunkLocation {
        container: first_container(1) + 1,
        offset: id as u32 * 64,
        length: 64,
    };
    let moved = |id: u64| partition_of(&fp(id), partitions) == gone;
    let stored: Vec<u64> = (0..300).collect();
    let first = service
        .lookup(1, stored.iter().map(|&id| fp(id)).collect())
        .await
        .unwrap();
    for (&id, answer) in stored.iter().zip(&first) {
        let expected = if moved(id) {
            Answer::Moved
        } else {
            Answer::New
        };
        assert_eq!(*answer, expected, "fingerprint {id}");
    }
    let acks: Vec<_> = stored.iter().map(|&id| (fp(id), at(id))).collect();
    service.ack(1, &acks).unwrap();

    // Stored ones backwards, a new one after every third.
    let mut asked = Vec::new();
    for (k, &id) in stored.iter().rev().enumerate() {
        asked.push(id);
        if k % 3 == 0 {
            asked.push(1000 + id);
        }
    }
    let answers = service
        .lookup(2, asked.iter().map(|&id| fp(id)).collect())
        .await
        .unwrap();
    for (&id, answer) in asked.iter().zip(&answers) {
        let expected = match id {
            _ if moved(id) => Answer::Moved,
            1000.. => Answer::New,
            _ => Answer::Known(at(id)),
        };
        assert_eq!(*answer, expected, "fingerprint {id}");
    }
    assert_eq!(
        service.metrics().requests,
        2,
        "whole requests, not their parts"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_never_acknowledged_passes_to_the_next_requester() {
    let dir = tempfile::tempdir().unwrap();
    let service = service(dir.path(), Duration::from_secs(2));
    assert_eq!(
        service.lookup(1, vec![fp(7)]).await.unwrap(),
        vec![Answer::New]
    );
    let waiter = tokio::spawn({
        let service = service.clone();
        async move { service.lookup(2, vec![fp(7)]).await }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let next = service.expire().unwrap().expect("a lock is held");
    assert!(!waiter.is_finished());
    tokio::time::sleep_until(next.into()).await;
    service.expire().unwrap();
    assert_eq!(waiter.await.unwrap().unwrap(), vec![Answer::New]);
    // The new holder's lock may expire too on a slow machine.
    assert!(service.metrics().expired >= 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn released_partitions_answer_moved() {
    let dir = tempfile::tempdir().unwrap();
    let service = service(dir.path(), Duration::from_secs(60));
    let fps: Vec<Fingerprint> = (0..64).map(fp).collect();
    service.lookup(1, fps.clone()).await.unwrap();
    let at = |i: usize| ChunkLocation {
        container: first_container(1) + 1,
        offset: i as u32 * 64,
        length: 64,
    };
    // Half acknowledged, half still locked when the partition goes.
    let acked: Vec<_> = fps
        .iter()
        .step_by(2)
        .enumerate()
        .map(|(i, f)| (*f, at(i)))
        .collect();
    service.ack(1, &acked).unwrap();
    let p = PartitionId(1);
    service.release(p, true).unwrap();
    assert!(service.owned().iter().all(|&(q, _)| q != p));
    let waiting = tokio::spawn({
        let service = service.clone();
        let fps = fps.clone();
        async move { service.lookup(2, fps).await }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let late: Vec<_> = fps
        .iter()
        .skip(1)
        .step_by(2)
        .enumerate()
        .map(|(i, f)| (*f, at(100 + i)))
        .collect();
    service.ack(1, &late).unwrap();
    let answers = waiting.await.unwrap().unwrap();
    for (i, (f, answer)) in fps.iter().zip(answers).enumerate() {
        let expected = if larder_cluster::partition_of(f, PARTITIONS) == p {
            Answer::Moved
        } else if i % 2 == 0 {
            Answer::Known(at(i / 2))
        } else {
            Answer::Known(at(100 + i / 2))
        };
        assert_eq!(answer, expected, "fingerprint {i}");
    }
    // The released partition's index was checkpointed with its acknowledged entries.
    let reopened = service.take_over(&[p], 2).unwrap();
    assert_eq!(reopened.rebuilt, 0);
    let known = service.get(&fps).unwrap();
    for (i, (f, answer)) in fps.iter().zip(known).enumerate() {
        if larder_cluster::partition_of(f, PARTITIONS) == p {
            let expected = if i % 2 == 0 {
                GetAnswer::Known(at(i / 2))
            } else {
                GetAnswer::Absent
            };
            assert_eq!(answer, expected, "fingerprint {i}");
        }
    }
}

/// The service behind the real protocol: two nodes' clients over loopback, one waiting
/// on the other's lock until its acknowledgement arrives on its own stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_look_up_through_the_protocol() {
    use larder_cluster::rpc::{LookupServer, NodeClient};
    let dir = tempfile::tempdir().unwrap();
    let service = service(dir.path(), Duration::from_secs(60));
    let any_port: std::net::SocketAddr = "127.0.0.1:0".parse().unwrap();
    let server = LookupServer::bind(any_port, std::sync::Arc::new(service.clone()))
        .await
        .unwrap();
    let addr = server.local_addr().to_string();
    let one = NodeClient::connect(&addr, 1).await.unwrap();
    let two = NodeClient::connect(&addr, 2).await.unwrap();
    let fps: Vec<Fingerprint> = (0..200).map(fp).collect();
    assert!(one
        .lookup(&fps)
        .await
        .unwrap()
        .iter()
        .all(|a| *a == Answer::New));
    let waiting =
        tokio::spawn(async move { two.lookup(&(100..300).map(fp).collect::<Vec<_>>()).await });
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!waiting.is_finished());
    let at = |i: u64| ChunkLocation {
        container: first_container(1) + 5,
        offset: i as u32 * 100,
        length: 100,
    };
    let acked: Vec<_> = fps
        .iter()
        .enumerate()
        .map(|(i, f)| (*f, at(i as u64)))
        .collect();
    one.ack(&acked).await.unwrap();
    let answers = waiting.await.unwrap().unwrap();
    for (i, answer) in (100..300u64).zip(answers) {
        let expected = if i < 200 {
            Answer::Known(at(i))
        } else {
            Answer::New
        };
        assert_eq!(answer, expected, "fingerprint {i}");
    }
    server.shutdown().await;
}

/// An old owner that still believes it owns a partition (it missed the map change)
/// checkpoints nothing once a newer owner has taken the partition over: the epoch on
/// disk is newer than its own, so it drops the partition without a write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_owner_is_fenced_at_its_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let old = service(dir.path(), Duration::from_secs(60));
    let fps: Vec<Fingerprint> = (0..64).map(fp).collect();
    old.lookup(1, fps.clone()).await.unwrap();
    let at = ChunkLocation {
        container: first_container(1) + 3,
        offset: 0,
        length: 10,
    };
    let acked: Vec<_> = fps.iter().map(|f| (*f, at)).collect();
    old.ack(1, &acked).unwrap();
    // Another node takes every partition over at a newer epoch.
    let new = service(dir.path(), Duration::from_secs(60));
    new.take_over(&(0..PARTITIONS).map(PartitionId).collect::<Vec<_>>(), 5)
        .unwrap();
    let files = |p: u32| -> Vec<(String, Vec<u8>)> {
        let mut files: Vec<_> = std::fs::read_dir(dir.path().join(format!("partitions/{p:05}")))
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                (
                    e.file_name().into_string().unwrap(),
                    std::fs::read(e.path()).unwrap(),
                )
            })
            .collect();
        files.sort();
        files
    };
    let before: Vec<_> = (0..PARTITIONS).map(files).collect();
    assert_eq!(old.checkpoint().unwrap(), 0, "nothing checkpointed");
    assert!(old.owned().is_empty(), "every fenced partition dropped");
    let after: Vec<_> = (0..PARTITIONS).map(files).collect();
    assert!(before == after, "a fenced owner wrote a partition");
}

/// Node 9 is not a member: its lookups and acknowledgements are refused (retryable: a
/// node that just joined may not be in the view yet), and change nothing; once it is
/// in the view it is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_is_not_a_member_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let config = DiskIndexConfig {
        memory_budget: 64 << 10,
        expected_fingerprints: 1000,
        buffered_chunk_bytes: 64,
        ..DiskIndexConfig::default()
    };
    let store = PartitionStore::new(
        dir.path(),
        PARTITIONS,
        HashAlgo::Blake3,
        config,
        Lookup::Lazy,
    );
    let view = members(&[1, 2]);
    let service = OwnerService::new(store, PARTITIONS, Duration::from_secs(60), view.clone());
    let all: Vec<PartitionId> = (0..PARTITIONS).map(PartitionId).collect();
    service.take_over(&all, 1).unwrap();
    let forged = ChunkLocation {
        container: first_container(9) + 1,
        offset: 0,
        length: 100,
    };
    let refused = |e: larder_cluster::ClusterError| {
        let text = e.to_string();
        assert!(
            e.is_retryable() && text.contains("node 9") && text.contains("not a member"),
            "{text}"
        );
    };
    refused(service.lookup(9, vec![fp(1)]).await.unwrap_err());
    refused(service.ack(9, &[(fp(1), forged)]).unwrap_err());
    assert_eq!(service.get(&[fp(1)]).unwrap(), vec![GetAnswer::Absent]);
    assert_eq!(service.metrics().fingerprints, 0);
    // A member's lookup finds nothing the stranger sent.
    assert_eq!(
        service.lookup(1, vec![fp(1)]).await.unwrap(),
        vec![Answer::New]
    );
    view.write()
        .unwrap()
        .addrs
        .insert(9, "127.0.0.1:7009".into());
    assert_eq!(
        service.lookup(9, vec![fp(2)]).await.unwrap(),
        vec![Answer::New]
    );
}
