//! A cluster whose shared storage is a real S3 server (s3s-fs), end to end: nodes
//! with their own cache directories back up through the cluster's index into their
//! repositories on the server, storing exactly the unique chunks one repository
//! stores; a node dropped without a checkpoint has its partitions taken over from
//! their objects and the replay of its containers, with exact answers after; every
//! snapshot restores byte for byte through any node.

mod support;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use larder_chunk::ChunkerConfig;
use larder_cluster::node::{Node, NodeOptions};
use larder_cluster::rpc::Job;
use larder_cluster::{NodeId, SharedStorage};
use larder_engine::{backup, BackupOptions};
use larder_hash::HashAlgo;
use larder_store::{LockMode, ObjectBackend, RepoConfig, Repository};
use support::certs::Certs;
use support::etcd::EtcdCluster;
use support::s3s::S3sServer;
use support::{bytes, files, job};

const PARTITIONS: u32 = 32;
const TTL: i64 = 3;

fn options(id: NodeId, etcd: &EtcdCluster, storage: SharedStorage, certs: &Certs) -> NodeOptions {
    let mut options = NodeOptions::new(id, etcd.endpoints(), "/larder-s3", storage);
    options.member_ttl_secs = TTL;
    options.checkpoint_every = Duration::from_millis(500);
    certs.secure(options)
}

async fn settled(nodes: &[&Node], live: &[NodeId]) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let served: usize = nodes.iter().map(|n| n.service.owned().len()).sum();
        let views_agree = nodes.iter().all(|n| {
            let view = n.view.read().unwrap();
            view.owners.iter().all(|o| live.contains(o))
        });
        if served == PARTITIONS as usize && views_agree {
            return;
        }
        assert!(Instant::now() < deadline, "not settled: {served} served");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn backup_through(node: &Node, certs: &Certs, src: &Path) -> serde_json::Value {
    let summary = job(
        node,
        certs,
        Job::Backup {
            paths: vec![src.display().to_string()],
        },
    )
    .await;
    assert!(
        summary["warnings"].as_array().unwrap().is_empty(),
        "{summary}"
    );
    summary
}

/// Two sources sharing a large file and parts of others, no zero runs.
fn make_sources(base: &Path) -> [std::path::PathBuf; 2] {
    let (a, b) = (base.join("a"), base.join("b"));
    std::fs::create_dir_all(a.join("sub")).unwrap();
    std::fs::create_dir_all(&b).unwrap();
    let shared = bytes(1, 3 << 20);
    std::fs::write(a.join("shared.bin"), &shared).unwrap();
    std::fs::write(b.join("shared-copy.bin"), &shared).unwrap();
    for i in 0..20u64 {
        std::fs::write(
            a.join(format!("sub/a-{i}")),
            bytes(10 + i, 5000 + 3001 * i as usize),
        )
        .unwrap();
        std::fs::write(
            b.join(format!("b-{i}")),
            bytes(100 + i % 7, 7000 + 1000 * i as usize),
        )
        .unwrap();
    }
    let mut mixed = bytes(2, 1 << 20);
    mixed.extend_from_slice(&shared[..1 << 20]);
    std::fs::write(b.join("mixed.bin"), mixed).unwrap();
    [a, b]
}

/// One repository holding the same backups: the oracle of exactness.
struct OneRepository(Repository);

impl OneRepository {
    fn new(root: &Path) -> Self {
        Repository::init(
            root,
            &RepoConfig::new(ChunkerConfig::default(), HashAlgo::Blake3),
        )
        .unwrap();
        Self(Repository::open(root, LockMode::Exclusive).unwrap())
    }

    /// The new chunks and bytes of a backup of `src`.
    fn backup(&mut self, src: &Path) -> (u64, u64) {
        let options = BackupOptions {
            threads: 2,
            hostname: "oracle".into(),
            username: "test".into(),
            ..BackupOptions::default()
        };
        let summary = backup(&mut self.0, &[src.to_path_buf()], &options).unwrap();
        (summary.chunks_new, summary.bytes_new)
    }
}

fn new_of(run: &serde_json::Value) -> (u64, u64) {
    (
        run["chunks_new"].as_u64().unwrap(),
        run["bytes_new"].as_u64().unwrap(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_on_s3_is_exact_survives_a_dead_node_and_restores() {
    let certs = Certs::issue(3);
    let etcd = EtcdCluster::start_tls(1, certs.etcd()).await;
    let server = S3sServer::start(&["larder"]);
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path();
    let [a, b] = make_sources(base);
    support::init_plain_cluster(&etcd, "/larder-s3", &certs, PARTITIONS).await;
    let root =
        Arc::new(ObjectBackend::new(server.store("larder"), "cluster", "s3://larder").unwrap());
    let storage = |id: NodeId| SharedStorage::Object {
        root: root.clone(),
        cache: base.join(format!("cache-{id}")),
    };
    let one = Node::start(options(1, &etcd, storage(1), &certs))
        .await
        .unwrap();
    let two = Node::start(options(2, &etcd, storage(2), &certs))
        .await
        .unwrap();
    // Node 3 never checkpoints after its takeovers: its partitions' later entries can
    // only come back from the replay of the containers.
    let mut lazy = options(3, &etcd, storage(3), &certs);
    lazy.checkpoint_every = Duration::from_secs(3600);
    let three = Node::start(lazy).await.unwrap();
    settled(&[&one, &two, &three], &[1, 2, 3]).await;

    // The same data through different nodes: exactly one repository's new chunks,
    // backup by backup (each oracle backup right after its cluster twin, so that both
    // see the same tree: a snapshot records the directories above its paths, whose
    // mtimes change as the test creates files beside them).
    let mut oracle = OneRepository::new(&base.join("oracle"));
    let mut runs = Vec::new();
    for (node, src) in [(&one, &a), (&two, &b), (&three, &a)] {
        let run = backup_through(node, &certs, src).await;
        assert_eq!(new_of(&run), oracle.backup(src), "{run}");
        runs.push(run);
    }
    assert!(
        new_of(&runs[0]).0 > 100 && new_of(&runs[1]).0 > 100,
        "{runs:?}"
    );
    // The repositories' files are objects; the caches hold only config, lock, tmp and
    // partition indexes.
    assert!(server
        .bucket_dir("larder")
        .join("cluster/nodes/1/config")
        .is_file());
    assert!(std::fs::read_dir(base.join("cache-1/nodes/1/containers"))
        .unwrap()
        .next()
        .is_none());

    // Node 3 dies without leaving or checkpointing: its partitions are taken over
    // from their objects and the replay, and every chunk is still found.
    drop(three);
    settled(&[&one, &two], &[1, 2]).await;
    let replayed: u64 = [&one, &two]
        .iter()
        .map(|n| n.service.replayed().inserted)
        .sum();
    assert!(
        replayed > 0,
        "node 3's acknowledged entries came back from the replay"
    );
    for (node, src) in [(&one, &b), (&two, &a)] {
        let again = backup_through(node, &certs, src).await;
        assert_eq!(new_of(&again), oracle.backup(src), "{again}");
        assert!(
            new_of(&again).0 <= 1,
            "at most the tree stream is new: {again}"
        );
        runs.push(again);
    }

    // Every snapshot restores byte for byte, through either node.
    for (n, run) in runs.iter().enumerate() {
        let node = if n % 2 == 0 { &one } else { &two };
        let src = if n == 1 || n == 3 { &b } else { &a };
        let target = base.join(format!("restored-{n}"));
        let id = run["snapshot_id"].as_str().unwrap().to_string();
        job(
            node,
            &certs,
            Job::Restore {
                snapshot: id,
                target: target.display().to_string(),
            },
        )
        .await;
        let restored = target.join(src.strip_prefix("/").unwrap());
        assert!(
            files(&restored) == files(src),
            "snapshot {n} restores byte for byte"
        );
    }
    let mut one = one;
    let mut two = two;
    one.stop().await.unwrap();
    two.stop().await.unwrap();
}
