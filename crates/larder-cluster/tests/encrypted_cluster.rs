//! An encrypted cluster (docs/design/crypto.md, "Cluster") whose shared storage is a
//! real S3 server (s3s-fs): `cluster init` makes one key slot and repeating it reuses
//! it; a node without the key, or with another cluster's, refuses to start and writes
//! nothing; two nodes with the key cut and fingerprint alike (the second backup of the
//! same tree stores no chunk again), a snapshot restores byte for byte through the
//! other node, and nothing in the bucket shows a file name, a file's content or a
//! plain digest of a chunk, while the same backup in a plaintext repository shows all
//! three.

mod support;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use larder_chunk::ChunkerConfig;
use larder_cluster::coord::{ClusterConfig, COORD_FORMAT_VERSION};
use larder_cluster::key::{init_encrypted_cluster, KeySlots};
use larder_cluster::node::{EtcdTarget, Node, NodeOptions};
use larder_cluster::rpc::Job;
use larder_cluster::view::ClusterView;
use larder_cluster::{ClusterError, NodeId, SharedStorage};
use larder_crypto::{AeadKind, FingerprintKind, KdfParams, KeyKind, KeySlot, RepoKeys};
use larder_engine::{backup, BackupOptions};
use larder_hash::HashAlgo;
use larder_store::{Compression, LockMode, ObjectBackend, RepoConfig, Repository};
use support::certs::Certs;
use support::etcd::EtcdCluster;
use support::plaintext::{digests, files_containing, stored_files};
use support::s3s::S3sServer;
use support::{bytes, files, job};

const PARTITIONS: u32 = 16;
const PREFIX: &str = "/larder-encrypted";
const PASSWORD: &[u8] = b"correct horse battery staple";
/// In a file's name, and in its content.
const NAME_MARKER: &str = "quarterly-secret-plans";
const CONTENT_MARKER: &[u8] = b"the launch code is 0000";

/// The first key slot, with a generated password's cheap parameters (tests only).
fn first_slot(keys: &RepoKeys) -> Result<KeySlot, String> {
    KeySlot::create(
        keys,
        KeyKind::Full,
        PASSWORD,
        KdfParams::GENERATED,
        "test-host".into(),
        "tester".into(),
        "2026-11-28T00:00:00Z".into(),
    )
    .map_err(|e| e.to_string())
}

fn options(
    id: NodeId,
    etcd: &EtcdCluster,
    storage: SharedStorage,
    keys: Option<Arc<RepoKeys>>,
    certs: &Certs,
) -> NodeOptions {
    let mut options = NodeOptions::new(id, etcd.endpoints(), PREFIX, storage);
    options.member_ttl_secs = 3;
    options.checkpoint_every = Duration::from_millis(300);
    options.keys = keys;
    certs.secure(options)
}

async fn settled(nodes: &[&Node]) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let served: usize = nodes.iter().map(|n| n.service.owned().len()).sum();
        if served == PARTITIONS as usize {
            return;
        }
        assert!(Instant::now() < deadline, "not settled: {served} served");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A tree with a marked file name, a small file (one chunk: smaller than the least
/// chunk) holding the content marker, and larger files. Returns the tree and the small
/// file's content.
fn make_source(base: &Path) -> (std::path::PathBuf, Vec<u8>) {
    let src = base.join("src");
    std::fs::create_dir_all(src.join("docs")).unwrap();
    let mut small = CONTENT_MARKER.to_vec();
    small.extend_from_slice(&bytes(5, 900));
    std::fs::write(src.join(format!("docs/{NAME_MARKER}.txt")), &small).unwrap();
    let large = bytes(1, 2 << 20);
    std::fs::write(src.join("large.bin"), &large).unwrap();
    std::fs::write(src.join("docs/large-copy.bin"), &large).unwrap();
    for i in 0..8u64 {
        std::fs::write(
            src.join(format!("file-{i}")),
            bytes(10 + i, 3000 + 5000 * i as usize),
        )
        .unwrap();
    }
    (src, small)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_encrypted_cluster_restores_byte_for_byte_and_stores_no_plaintext() {
    let certs = Certs::issue(2);
    let etcd = EtcdCluster::start_tls(1, certs.etcd()).await;
    let server = S3sServer::start(&["larder"]);
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path();
    let root =
        Arc::new(ObjectBackend::new(server.store("larder"), "cluster", "s3://larder").unwrap());
    let storage = |id: NodeId| SharedStorage::Object {
        root: root.clone(),
        cache: base.join(format!("cache-{id}")),
    };
    let slots = KeySlots::Object(root.clone());
    let asked = ClusterConfig {
        format_version: COORD_FORMAT_VERSION,
        partitions: PARTITIONS,
        chunking: "keyed".into(),
        hash: "blake3".into(),
        encryption: None,
    };
    let algorithms = (AeadKind::Aes256Gcm, FingerprintKind::KeyedBlake3);
    let target = EtcdTarget {
        endpoints: etcd.endpoints(),
        prefix: PREFIX.into(),
        options: certs.etcd_options(),
    };
    let init = || {
        init_encrypted_cluster(
            &target,
            &slots,
            asked.clone(),
            PASSWORD,
            algorithms,
            first_slot,
        )
    };
    let config = init().await.unwrap();
    let encryption = config.encryption.clone().expect("an encrypted cluster");
    // A repeated init unlocks the slot there and writes the same config.
    assert_eq!(init().await.unwrap(), config);
    assert_eq!(slots.list().unwrap().len(), 1);

    let wrong = slots.unlock(b"wrong password", &encryption).unwrap_err();
    assert!(
        wrong
            .to_string()
            .contains("wrong password or no matching key"),
        "{wrong}"
    );
    let keys = Arc::new(slots.unlock(PASSWORD, &encryption).unwrap());

    // Without the key, or with another cluster's, a node refuses to start before it
    // writes anything: no plaintext repository is ever made.
    let other = Arc::new(RepoKeys::generate(
        [9; 16],
        AeadKind::Aes256Gcm,
        FingerprintKind::KeyedBlake3,
    ));
    for (keys, says) in [
        (None, "the cluster is encrypted"),
        (Some(other), "the key is not this cluster's"),
    ] {
        let refused = Node::start(options(1, &etcd, storage(1), keys, &certs)).await;
        let Err(ClusterError::Key(message)) = refused else {
            panic!("a node without the cluster's key started");
        };
        assert!(message.contains(says), "{message}");
    }
    assert!(!base.join("cache-1").exists());
    assert!(!server.bucket_dir("larder").join("cluster/nodes").exists());

    let one = Node::start(options(1, &etcd, storage(1), Some(keys.clone()), &certs))
        .await
        .unwrap();
    let two = Node::start(options(2, &etcd, storage(2), Some(keys.clone()), &certs))
        .await
        .unwrap();
    settled(&[&one, &two]).await;

    let (src, small) = make_source(base);
    let paths = vec![src.display().to_string()];
    let first = job(
        &one,
        &certs,
        Job::Backup {
            paths: paths.clone(),
        },
    )
    .await;
    assert!(first["chunks_new"].as_u64().unwrap() > 10, "{first}");
    // Node 2 cuts and fingerprints as node 1 does (one chunker secret, one id key):
    // the same tree again stores at most its tree chunk.
    let second = job(&two, &certs, Job::Backup { paths }).await;
    assert!(second["chunks_new"].as_u64().unwrap() <= 1, "{second}");

    // Checkpoints put objects of the new entries (after the takeovers' empty full
    // objects, sequence number 0), sealed.
    let partitions = server.bucket_dir("larder").join("cluster/partitions");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !stored_files(&partitions)
        .iter()
        .any(|p| !p.to_string_lossy().ends_with("-00000000.full"))
    {
        assert!(Instant::now() < deadline, "no checkpoint's object was put");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let target = base.join("restored");
    job(
        &two,
        &certs,
        Job::Restore {
            snapshot: first["snapshot_id"].as_str().unwrap().to_string(),
            target: target.display().to_string(),
        },
    )
    .await;
    let restored = target.join(src.strip_prefix("/").unwrap());
    assert!(files(&restored) == files(&src), "restored byte for byte");

    // What the storage sees: sealed objects only.
    let mut one = one;
    let mut two = two;
    one.stop().await.unwrap();
    two.stop().await.unwrap();
    // The view of every node's repository opens every node's segments under the one
    // key (each bound to its name in its writer's repository), and adopts nothing.
    let view = ClusterView::open(&storage(1), 1, Some(&keys)).unwrap();
    assert!(view.segment_count() >= 1);
    assert!(view.report().bad_segments.is_empty(), "{:?}", view.report());
    assert!(view.report().adopted_containers.is_empty());
    drop(view);
    let bucket = server.bucket_dir("larder");
    for path in stored_files(&bucket.join("cluster")) {
        let bytes = std::fs::read(&path).unwrap();
        let rel = path.strip_prefix(&bucket).unwrap().display().to_string();
        if rel.contains("/partitions/") || rel.ends_with("/config") {
            assert!(bytes.starts_with(b"LARDERE1"), "{rel} is not sealed");
        }
    }
    let mut needles: Vec<Vec<u8>> = vec![NAME_MARKER.as_bytes().to_vec(), CONTENT_MARKER.to_vec()];
    needles.extend(digests(&small));
    for needle in &needles {
        let found = files_containing(&bucket, needle);
        assert!(found.is_empty(), "{needle:?} is in {found:?}");
    }

    // The same backup in a plaintext repository shows all of them: the search above
    // would have found them.
    let plain = base.join("plaintext");
    Repository::init(
        &plain,
        &RepoConfig::new(ChunkerConfig::default(), HashAlgo::Blake3)
            .with_compression(Compression::None),
    )
    .unwrap();
    let mut repo = Repository::open(&plain, LockMode::Exclusive).unwrap();
    backup(
        &mut repo,
        std::slice::from_ref(&src),
        &BackupOptions::default(),
    )
    .unwrap();
    for needle in &needles[..3] {
        assert!(
            !files_containing(&plain, needle).is_empty(),
            "{needle:?} is not in the plaintext repository"
        );
    }
}
