//! The cluster's defence with real processes (docs/design/cluster.md, "Security";
//! docs/design/security.md, "The cluster"): etcd requiring client certificates, two
//! `larder node` processes on mutual TLS serving one directory, and attackers:
//!
//! - a stranger without a certificate, or with one of its own authority, is refused
//!   by every node (Job, Lookup, Ack, Get) and by etcd;
//! - a client's certificate cannot look up, acknowledge or get, and a node's cannot
//!   run jobs;
//! - node 1's certificate cannot acknowledge as node 2 (the index poisoning of a
//!   made-up location);
//! - a client with a certificate reads and writes only beneath the paths both its
//!   certificate grants and the node serves: a root-only file outside them is neither
//!   backed up nor restored over, also through a symlink planted inside them;
//! - backup, restore and snapshots with certificates work as before.
//!
//! And plaintext only by `--insecure-plaintext`, only on loopback.

mod support;

#[path = "support/cluster.rs"]
mod cluster_kit;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use cluster_kit::etcd::EtcdCluster;
use cluster_kit::{etcd_tls, free_port, init_plain_cluster, settled, NodeConfig, NodeProcess};
use larder_cluster::coord::{Etcd, EtcdOptions};
use larder_cluster::rpc::{Job, JobClient, NodeClient, RpcError, Transport};
use larder_cluster::tls::TlsFiles;
use larder_hash::Fingerprint;
use larder_index::ChunkLocation;
use support::certs::ClusterCerts;
use support::{assert_same_tree, larder_command, restored, Scratch, TreeBuilder};

const SECRET: &[u8] = b"root:$6$only-root-reads-this:19000:0:99999:7:::\n";

fn transport(dir: &Path) -> Transport {
    Transport::Tls(Arc::new(TlsFiles::larder(dir).unwrap()))
}

fn fp(byte: u8) -> Fingerprint {
    Fingerprint([byte; 32])
}

/// Every call a stranger could make to the node at `addr` over `transport`: each must
/// be refused (at the handshake, or by the node).
async fn assert_refused_everything(addr: &str, transport: &Transport, who: &str) {
    match NodeClient::connect_with(addr, 2, transport).await {
        Err(_) => {}
        Ok(client) => {
            let lookup = client.lookup(&[fp(7)]).await;
            assert!(lookup.is_err(), "{who}: a lookup was answered: {lookup:?}");
            let ack = client
                .ack(&[(
                    fp(7),
                    ChunkLocation {
                        container: 2 << 48,
                        offset: 0,
                        length: 10,
                    },
                )])
                .await;
            assert!(ack.is_err(), "{who}: an Ack was accepted");
            let get = client.get(&[fp(7)]).await;
            assert!(get.is_err(), "{who}: a Get was answered: {get:?}");
        }
    }
    if let Ok(client) = JobClient::connect(addr, transport).await {
        let backup = client
            .job(&Job::Backup {
                paths: vec!["/etc/shadow".into()],
            })
            .await;
        assert!(backup.is_err(), "{who}: a backup job ran: {backup:?}");
        let list = client.job(&Job::Snapshots).await;
        assert!(list.is_err(), "{who}: a snapshot list was answered");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strangers_are_refused_and_clients_act_only_beneath_their_paths() {
    if !support::is_root() {
        eprintln!("skipped: needs root (a root-only file that the node must not read)");
        return;
    }
    let scratch = Scratch::new();
    let xdg = scratch.dir("xdg");
    let certs = ClusterCerts::issue(&scratch.dir("certs"), &[1, 2]);
    let etcd = EtcdCluster::start_tls(1, etcd_tls(&certs)).await;
    let endpoints = etcd.endpoints().join(",");
    assert!(endpoints.starts_with("https://"));
    let storage = scratch.dir("shared");
    let served = scratch.dir("served");
    let logs = scratch.dir("logs");
    std::fs::create_dir_all(&logs).unwrap();

    init_plain_cluster(&xdg, &certs, &endpoints, &storage, 32);

    let config = NodeConfig {
        etcd: endpoints.clone(),
        storage: storage.clone(),
        ttl: 3,
        logs,
        certs: certs.clone(),
        serve: vec![served.clone()],
    };
    let nodes: Vec<NodeProcess> = [1u16, 2]
        .into_iter()
        .map(|id| NodeProcess::spawn(larder_command(&xdg), id, free_port(), &config, &[]))
        .collect();
    let addrs: Vec<String> = nodes.iter().map(NodeProcess::addr).collect();
    let status = settled(&xdg, &certs, &endpoints, 2, Duration::from_secs(60));
    assert!(
        status["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .all(|n| n["stats"].is_object()),
        "the administrator reads every node's counters: {status}"
    );

    // etcd's users (cluster init turned them on): a node's etcd certificate reads and
    // writes the cluster's prefix, and nothing else.
    let node_etcd = TlsFiles::etcd(&certs.node(1)).unwrap().unwrap();
    let as_node = etcd_client::ConnectOptions::new().with_tls(
        etcd_client::TlsOptions::new()
            .ca_certificate(etcd_client::Certificate::from_pem(&node_etcd.ca))
            .identity(etcd_client::Identity::from_pem(
                &node_etcd.cert,
                &node_etcd.key,
            )),
    );
    let mut raw = etcd_client::Client::connect(etcd.endpoints(), Some(as_node))
        .await
        .unwrap();
    let inside = etcd_client::GetOptions::new()
        .with_prefix()
        .with_count_only();
    assert!(raw.get("/larder/", Some(inside)).await.unwrap().count() > 0);
    let outside = raw.put("/elsewhere", "x", None).await.unwrap_err();
    assert!(
        outside.to_string().contains("permission denied"),
        "{outside}"
    );

    // A root-only file outside the served directory, and a symlink to its directory
    // planted inside it.
    let outside = scratch.dir("outside");
    std::fs::create_dir_all(&outside).unwrap();
    let secret = outside.join("shadow");
    std::fs::write(&secret, SECRET).unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    let alice = served.join("alice");
    let src = TreeBuilder::new(&alice.join("data"))
        .file("a.txt", b"alice's file\n")
        .file("sub/b.bin", support::pseudo_random(3, 300_000))
        .finish();
    std::os::unix::fs::symlink(&outside, alice.join("escape")).unwrap();
    let bob = served.join("bob");
    std::fs::create_dir_all(&bob).unwrap();
    std::fs::write(bob.join("private"), b"bob's\n").unwrap();

    // Strangers: no certificate (plaintext, or TLS without one is the same refusal at
    // the handshake), and a certificate of an authority of their own.
    let stranger = ClusterCerts::issue(&scratch.dir("stranger"), &[2]);
    let stranger_client = stranger.client_flags("mallory", &[Path::new("/")]);
    for addr in &addrs {
        assert_refused_everything(addr, &Transport::Plaintext, "no certificate").await;
        assert_refused_everything(addr, &transport(&stranger.node(2)), "a foreign node").await;
        let foreign = PathBuf::from(&stranger_client[1]);
        assert_refused_everything(addr, &transport(&foreign), "a foreign client").await;
    }
    let mut stolen = larder_command(&xdg);
    stolen
        .args(["--insecure-plaintext", "--cluster", &addrs[0], "backup"])
        .arg(&secret);
    let out = support::run_command(stolen, support::RUN_TIMEOUT);
    out.expect_code(1);
    let mut foreign = larder_command(&xdg);
    foreign
        .args(&stranger_client)
        .args(["--cluster", &addrs[0], "backup"])
        .arg(&secret);
    support::run_command(foreign, support::RUN_TIMEOUT).expect_code(1);
    // etcd: without a certificate, and with a foreign one.
    let plain = tokio::time::timeout(
        Duration::from_secs(10),
        Etcd::connect(&etcd.endpoints(), "/larder", EtcdOptions::default()),
    )
    .await;
    assert!(
        !matches!(plain, Ok(Ok(_))),
        "etcd answered without a certificate"
    );
    let foreign_etcd = EtcdOptions {
        tls: Some(Arc::new(
            TlsFiles::etcd(&stranger.node(2)).unwrap().unwrap(),
        )),
        ..EtcdOptions::default()
    };
    let foreign = tokio::time::timeout(
        Duration::from_secs(10),
        Etcd::connect(&etcd.endpoints(), "/larder", foreign_etcd),
    )
    .await;
    assert!(
        !matches!(foreign, Ok(Ok(_))),
        "etcd answered a foreign certificate"
    );

    // Node 1's certificate: it looks up as node 1, but an Ack (or lookup) claiming
    // node 2 is refused; a client's certificate cannot use the lookup stream or Get,
    // and a node's runs no job.
    let node1 = transport(&certs.node(1));
    let honest = NodeClient::connect_with(&addrs[1], 1, &node1)
        .await
        .unwrap();
    honest.lookup(&[fp(9)]).await.unwrap();
    let forger = NodeClient::connect_with(&addrs[1], 2, &node1)
        .await
        .unwrap();
    let forged = forger
        .ack(&[(
            fp(9),
            ChunkLocation {
                container: 2 << 48,
                offset: 0,
                length: 10,
            },
        )])
        .await
        .unwrap_err();
    assert!(
        matches!(&forged, RpcError::Refused { message, .. } if message.contains("permission denied")),
        "{forged}"
    );
    assert!(forger.lookup(&[fp(10)]).await.is_err());
    let client_flags = certs.client_flags("alice", &[&alice]);
    let alice_transport = transport(Path::new(&client_flags[1]));
    let as_node = NodeClient::connect_with(&addrs[0], 1, &alice_transport).await;
    assert!(
        matches!(as_node, Err(RpcError::PermissionDenied(_))),
        "{:?}",
        as_node.err()
    );
    let node_job = JobClient::connect(&addrs[0], &node1).await.unwrap();
    assert!(matches!(
        node_job.job(&Job::Snapshots).await,
        Err(RpcError::PermissionDenied(_))
    ));

    // Alice, with her certificate: beneath her path it works as before.
    let run = |args: &[&str], paths: &[&Path]| {
        let mut command = larder_command(&xdg);
        command.args(&client_flags).args(args);
        command.args(paths);
        support::run_command(command, support::RUN_TIMEOUT)
    };
    let first = run(&["--json", "--cluster", &addrs[0], "backup"], &[&src]);
    let first = first.expect_ok().json();
    assert!(first["chunks_new"].as_u64().unwrap() >= 2, "{first}");
    let second = run(&["--json", "--cluster", &addrs[1], "backup"], &[&src])
        .expect_ok()
        .json();
    assert!(second["chunks_new"].as_u64().unwrap() <= 1, "{second}");
    let id = first["snapshot_id"].as_str().unwrap().to_string();
    let target = alice.join("restored");
    run(&["--cluster", &addrs[1], "restore", &id], &[&target]).expect_ok();
    assert_same_tree(&src, &restored(&target, &src));
    let listed = run(&["--json", "--cluster", &addrs[0], "snapshots"], &[])
        .expect_ok()
        .json();
    assert_eq!(listed["snapshots"].as_array().unwrap().len(), 2, "{listed}");

    // Outside her paths: the root-only file, bob's file, and through the symlink.
    for path in [&secret, &bob.join("private"), &alice.join("escape/shadow")] {
        let out = run(&["--cluster", &addrs[0], "backup"], &[path]);
        out.expect_code(1).expect_stderr(&["permission denied"]);
    }
    // Restores over the root-only file's directory, into bob's, through the symlink.
    for target in [&outside, &bob, &alice.join("escape")] {
        let out = run(&["--cluster", &addrs[0], "restore", &id], &[target]);
        out.expect_code(1).expect_stderr(&["permission denied"]);
    }
    assert_eq!(std::fs::read(&secret).unwrap(), SECRET);
    assert_eq!(
        std::fs::read_dir(&outside).unwrap().count(),
        1,
        "nothing restored outside"
    );
    assert_eq!(
        std::fs::read_dir(&bob).unwrap().count(),
        1,
        "nothing restored into bob's"
    );
    let listed = run(&["--json", "--cluster", &addrs[0], "snapshots"], &[])
        .expect_ok()
        .json();
    assert_eq!(
        listed["snapshots"].as_array().unwrap().len(),
        2,
        "no snapshot of the refused backups"
    );
}

#[test]
fn plaintext_only_by_its_flag_and_only_on_loopback() {
    let scratch = Scratch::new();
    let xdg = scratch.dir("xdg");
    let storage = scratch.dir("shared");
    std::fs::create_dir_all(storage.join("partitions")).unwrap();
    let node = |extra: &[&str], etcd: &str, listen: &str| {
        let mut command = larder_command(&xdg);
        command
            .args(extra)
            .args(["node", "--id", "1", "--etcd", etcd, "--listen", listen])
            .arg("--storage")
            .arg(&storage);
        support::run_command(command, support::RUN_TIMEOUT)
    };
    // No flag: certificates are required.
    node(&[], "http://127.0.0.1:9", "127.0.0.1:0")
        .expect_code(1)
        .expect_stderr(&["--tls DIR"]);
    // Plaintext on an address that is not loopback, for the port or for etcd.
    node(&["--insecure-plaintext"], "http://127.0.0.1:9", "0.0.0.0:0")
        .expect_code(1)
        .expect_stderr(&["plaintext is only for loopback"]);
    node(
        &["--insecure-plaintext"],
        "http://192.0.2.1:2379",
        "127.0.0.1:0",
    )
    .expect_code(1)
    .expect_stderr(&["plaintext is only for loopback"]);
    // A client too.
    let mut client = larder_command(&xdg);
    client.args([
        "--insecure-plaintext",
        "--cluster",
        "192.0.2.1:7001",
        "snapshots",
    ]);
    support::run_command(client, support::RUN_TIMEOUT)
        .expect_code(1)
        .expect_stderr(&["plaintext is only for loopback"]);
    let mut bare = larder_command(&xdg);
    bare.args(["--cluster", "127.0.0.1:7001", "snapshots"]);
    support::run_command(bare, support::RUN_TIMEOUT)
        .expect_code(1)
        .expect_stderr(&["--tls DIR"]);
}
