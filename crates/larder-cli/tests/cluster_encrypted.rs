//! An encrypted cluster through the `larder` binary (docs/design/crypto.md,
//! "Cluster"), with real processes: `larder cluster init` (encrypted by default) makes
//! one key slot in the shared directory and repeating it keeps that one; a `larder
//! node` without the password or with a wrong one exits 1 with a clear message and
//! makes no repository; two nodes with it (one from `LARDER_PASSWORD`, one from
//! `--password-file`) back a tree up through `--cluster`, the second storing nothing
//! again, and restore it byte for byte through the other node; the shared directory
//! then shows no file name, no file content and no plain digest of a chunk, which a
//! plaintext repository of the same tree shows.

mod support;

#[path = "support/cluster.rs"]
mod cluster_kit;
#[allow(dead_code)]
#[path = "../../larder-cluster/tests/support/plaintext.rs"]
mod plaintext;

use std::path::{Path, PathBuf};
use std::time::Duration;

use cluster_kit::etcd::EtcdCluster;
use cluster_kit::{etcd_tls, free_port, node_command, settled, NodeConfig, NodeProcess};
use plaintext::{digests, files_containing, stored_files};
use support::certs::ClusterCerts;
use support::{
    assert_same_tree, larder, larder_command, pseudo_random, restored, run_command, Scratch,
    TreeBuilder, CHEAP_KDF, PASSWORD, RUN_TIMEOUT,
};

const NAME_MARKER: &str = "quarterly-secret-plans";
const CONTENT_MARKER: &[u8] = b"the launch code is 0000";
/// A tree with a marked file name, a small file (one chunk: smaller than the least
/// chunk) holding the content marker, and larger files; and the small file's content.
fn make_source(root: &Path) -> (PathBuf, Vec<u8>) {
    let mut small = CONTENT_MARKER.to_vec();
    small.extend_from_slice(&pseudo_random(5, 900));
    let large = pseudo_random(1, 1 << 20);
    let mut tree = TreeBuilder::new(root);
    tree.file(format!("docs/{NAME_MARKER}.txt"), &small)
        .file("large.bin", &large)
        .file("docs/large-copy.bin", &large);
    for i in 0..6u64 {
        tree.file(
            format!("file-{i}"),
            pseudo_random(10 + i, 3000 + 7000 * i as usize),
        );
    }
    (tree.finish(), small)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_encrypted_cluster_backs_up_restores_and_refuses_nodes_without_its_password() {
    let scratch = Scratch::new();
    let certs = ClusterCerts::issue(&scratch.dir("certs"), &[1, 2]);
    let etcd = EtcdCluster::start_tls(1, etcd_tls(&certs)).await;
    let endpoints = etcd.endpoints().join(",");
    let xdg = scratch.dir("xdg");
    let storage = scratch.path().join("shared");
    let logs = scratch.dir("logs");
    // Sources and restore targets are in the scratch directory, which the nodes serve
    // and the client's certificate grants.
    let served = scratch.path();
    let admin = certs.admin_flags();
    let client = certs.client_flags("tester", &[served]);
    let init: Vec<&str> = [
        admin[0].as_str(),
        &admin[1],
        "--json",
        "cluster",
        "init",
        "--etcd",
        &endpoints,
        "--storage",
        storage.to_str().unwrap(),
        "--partitions",
        "32",
    ]
    .into_iter()
    .chain(CHEAP_KDF)
    .collect();
    let created = larder(&xdg, &init).expect_ok().json();
    assert_eq!(created["encryption"], "aes-256-gcm", "{created}");
    let slots = || stored_files(&storage.join("keys"));
    assert_eq!(slots().len(), 1);
    // Again: the same cluster, its slot unlocked, no new one.
    larder(&xdg, &init).expect_ok();
    assert_eq!(slots().len(), 1);

    // A node that cannot unlock the key exits 1 before it makes anything.
    let config = NodeConfig {
        etcd: endpoints.clone(),
        storage: storage.clone(),
        ttl: 3,
        logs: logs.clone(),
        certs: certs.clone(),
        serve: vec![served.to_path_buf()],
    };
    let port = free_port();
    let mut without = larder_command(&xdg);
    without.env_remove("LARDER_PASSWORD");
    run_command(node_command(without, 1, port, &config, &[]), RUN_TIMEOUT)
        .expect_code(1)
        .expect_stderr(&["the cluster is encrypted", "LARDER_PASSWORD"]);
    let mut wrong = larder_command(&xdg);
    wrong.env("LARDER_PASSWORD", "not the password");
    run_command(node_command(wrong, 1, port, &config, &[]), RUN_TIMEOUT)
        .expect_code(1)
        .expect_stderr(&["wrong password or no matching key"]);
    assert!(!storage.join("nodes/1").exists());

    // Node 1's password from LARDER_PASSWORD, node 2's from a file.
    let password_file = scratch.path().join("password");
    std::fs::write(&password_file, format!("{PASSWORD}\n")).unwrap();
    let ports = [free_port(), free_port()];
    let one = NodeProcess::spawn(larder_command(&xdg), 1, ports[0], &config, &[]);
    let mut base = larder_command(&xdg);
    base.env_remove("LARDER_PASSWORD");
    let file_arg = password_file.to_str().unwrap();
    let two = NodeProcess::spawn(base, 2, ports[1], &config, &["--password-file", file_arg]);
    let nodes = [one, two];
    settled(&xdg, &certs, &endpoints, 2, Duration::from_secs(60));
    let [one, two] = ports.map(|p| format!("127.0.0.1:{p}"));

    let (src, small) = make_source(&scratch.path().join("src"));
    let src_arg = src.to_str().unwrap();
    let (tls, dir) = (client[0].as_str(), client[1].as_str());
    let first = larder(
        &xdg,
        [tls, dir, "--json", "--cluster", &one, "backup", src_arg],
    )
    .expect_ok()
    .json();
    assert!(first["chunks_new"].as_u64().unwrap() > 5, "{first}");
    let id = first["snapshot_id"].as_str().unwrap().to_string();
    // Node 2 cuts and fingerprints as node 1 does: nothing but the tree is new.
    let second = larder(
        &xdg,
        [tls, dir, "--json", "--cluster", &two, "backup", src_arg],
    )
    .expect_ok()
    .json();
    assert!(second["chunks_new"].as_u64().unwrap() <= 1, "{second}");
    let listed = larder(&xdg, [tls, dir, "--json", "--cluster", &two, "snapshots"]);
    assert!(listed.expect_ok().stdout.contains(&id), "{listed}");
    let target = scratch.path().join("target");
    larder(
        &xdg,
        [
            tls,
            dir,
            "--cluster",
            &two,
            "restore",
            &id,
            target.to_str().unwrap(),
        ],
    )
    .expect_ok();
    assert_same_tree(&src, &restored(&target, &src));
    drop(nodes);

    // What the shared directory shows: sealed node configs, and nothing of the tree.
    for node in ["1", "2"] {
        let config = std::fs::read(storage.join("nodes").join(node).join("config")).unwrap();
        assert!(config.starts_with(b"LARDERE1"), "node {node}'s config");
    }
    let mut needles: Vec<Vec<u8>> = vec![NAME_MARKER.as_bytes().to_vec(), CONTENT_MARKER.to_vec()];
    needles.extend(digests(&small));
    for needle in &needles {
        let found = files_containing(&storage, needle);
        assert!(found.is_empty(), "{needle:?} is in {found:?}");
    }
    // The partitions' disk indexes are sealed: none of the plain files' magics (whose
    // pages would hold keyed fingerprints and chunk locations in the clear).
    let tables = stored_files(&storage.join("partitions"))
        .into_iter()
        .filter(|p| p.ends_with("table"))
        .count();
    assert!(tables > 0, "no partition index was written");
    for magic in [&b"LDXTABLE"[..], b"LDXMETA1", b"LDXBLOOM"] {
        let found = files_containing(&storage.join("partitions"), magic);
        assert!(found.is_empty(), "a plain disk index file: {found:?}");
    }
    // A plaintext repository of the same tree shows them: the search would find them.
    let plain = scratch.path().join("plain");
    let repo = plain.to_str().unwrap();
    larder(
        &xdg,
        [
            "--repo",
            repo,
            "init",
            "--encryption",
            "none",
            "--compression",
            "none",
        ],
    )
    .expect_ok();
    larder(&xdg, ["--repo", repo, "backup", src_arg]).expect_ok();
    for needle in &needles[..3] {
        assert!(
            !files_containing(&plain, needle).is_empty(),
            "{needle:?} is not in the plaintext repository"
        );
    }
}
