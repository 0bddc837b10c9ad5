//! A stranger that reaches a node's lookup port tries to poison the index: it asks for
//! the fingerprint of a victim's file and acknowledges it at a location of its own
//! making (in its own containers), so that the victim's backup would find the chunk
//! "stored" and store nothing, and the restore would lose the file. The stranger holds
//! a node certificate the cluster's authority issued (the TLS handshake and the
//! certificate's node id let it through) but is no member of the cluster: its node id
//! is in no `members/` key. Every owner refuses both messages; the victim's backup
//! stores the file and it restores byte for byte. (A stranger without such a
//! certificate is refused at the handshake: `rpc_tls.rs`, the CLI's
//! `cluster_security.rs`.)

mod support;

use std::time::{Duration, Instant};

use larder_cluster::ids::first_container;
use larder_cluster::node::{Node, NodeOptions};
use larder_cluster::rpc::{Job, NodeClient, RpcError};
use larder_cluster::NodeId;
use larder_hash::HashAlgo;
use larder_index::ChunkLocation;
use support::certs::Certs;
use support::etcd::EtcdCluster;
use support::{bytes, files, job};

const PARTITIONS: u32 = 16;
const PREFIX: &str = "/larder-strangers";
/// A node id no member has, whose certificate the cluster's authority issued.
const STRANGER: NodeId = 3;

fn options(
    id: NodeId,
    etcd: &EtcdCluster,
    storage: &std::path::Path,
    certs: &Certs,
) -> NodeOptions {
    let mut options = NodeOptions::new(id, etcd.endpoints(), PREFIX, storage.to_path_buf());
    options.member_ttl_secs = 3;
    options.checkpoint_every = Duration::from_millis(300);
    certs.secure(options)
}

/// Waits until every partition is served and both nodes see both members.
async fn settled(nodes: &[&Node]) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let served: usize = nodes.iter().map(|n| n.service.owned().len()).sum();
        let known = nodes
            .iter()
            .all(|n| n.view.read().unwrap().addrs.len() == nodes.len());
        if served == PARTITIONS as usize && known {
            return;
        }
        assert!(Instant::now() < deadline, "not settled: {served} served");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn refused(e: RpcError, what: &str) {
    let text = e.to_string();
    assert!(
        text.contains(&format!("refused node {STRANGER}'s {what}"))
            && text.contains("not a member"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_strangers_lookups_and_acknowledgements_poison_nothing() {
    // Nodes 1 and 2 run; node 3's certificate is the stranger's.
    let certs = Certs::issue(3);
    let etcd = EtcdCluster::start_tls(1, certs.etcd()).await;
    let dir = tempfile::tempdir().unwrap();
    let storage = dir.path().join("shared");
    support::init_plain_cluster(&etcd, PREFIX, &certs, PARTITIONS).await;
    let one = Node::start(options(1, &etcd, &storage, &certs))
        .await
        .unwrap();
    let two = Node::start(options(2, &etcd, &storage, &certs))
        .await
        .unwrap();
    settled(&[&one, &two]).await;

    // The victim's file (in the temporary directory the nodes serve and the client's
    // certificate grants): one chunk (smaller than the least chunk), whose fingerprint
    // in a plaintext cluster is the BLAKE3 of its bytes.
    let src = dir.path().join("victim");
    std::fs::create_dir_all(&src).unwrap();
    let content = bytes(7, 3000);
    std::fs::write(src.join("payroll.csv"), &content).unwrap();
    let fp = HashAlgo::Blake3.fingerprint(&content);
    let forged = ChunkLocation {
        container: first_container(STRANGER) + 5,
        offset: 0,
        length: content.len() as u32,
    };
    // At both nodes: one of them owns the fingerprint's partition.
    let mut answers = Vec::new();
    for node in [&one, &two] {
        let addr = node.addr.to_string();
        let stranger = NodeClient::connect_with(&addr, STRANGER, &certs.node(STRANGER))
            .await
            .unwrap();
        answers.push((
            stranger.lookup(&[fp]).await.map(|_| ()),
            stranger.ack(&[(fp, forged)]).await,
        ));
    }

    let run = job(
        &one,
        &certs,
        Job::Backup {
            paths: vec![src.display().to_string()],
        },
    )
    .await;
    // The file's chunk and the tree's: the file was not taken for stored.
    assert_eq!(run["chunks_new"], 2, "{run}");
    assert_eq!(run["warnings"], serde_json::json!([]), "{run}");
    let target = dir.path().join("restored");
    let restored = job(
        &two,
        &certs,
        Job::Restore {
            snapshot: run["snapshot_id"].as_str().unwrap().to_string(),
            target: target.display().to_string(),
        },
    )
    .await;
    assert_eq!(restored["warnings"], serde_json::json!([]), "{restored}");
    let back = target.join(src.strip_prefix("/").unwrap());
    assert!(files(&back) == files(&src), "restored byte for byte");
    for (lookup, ack) in answers {
        refused(lookup.unwrap_err(), "lookup");
        refused(ack.unwrap_err(), "acknowledgement");
    }
}
