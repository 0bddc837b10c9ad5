//! etcd loses quorum under a running cluster: all three members are killed for 15 s,
//! then started again on their data. Both `larder node` processes stay up (they stop
//! serving when their leases lapse, keep trying etcd, and join again with new leases);
//! a backup in flight when etcd goes finishes or fails naming the outage, a backup
//! asked for during the outage fails with an error that names it, and neither commits
//! anything damaged; once they have joined again a backup and restores through the
//! cluster work, every earlier snapshot is listed and restores byte for byte.

mod support;

#[path = "support/cluster.rs"]
mod cluster_kit;

use std::time::{Duration, Instant};

use cluster_kit::etcd::EtcdCluster;
use cluster_kit::{
    cluster_backup, etcd_tls, free_port, init_plain_cluster, larder_as, settled, NodeConfig,
    NodeProcess,
};
use support::certs::ClusterCerts;
use support::{assert_same_tree, larder_command, pseudo_random, restored, Scratch, TreeBuilder};

/// The lease's TTL: every node's `lost` fires within it once etcd is gone.
const TTL: u64 = 3;
const OUTAGE: Duration = Duration::from_secs(15);
/// How long the cluster may take to settle: at start, and after etcd is back (nodes
/// try to join again at most every 4 s, then take their partitions over).
const SETTLE: Duration = Duration::from_secs(60);

fn tree(root: &std::path::Path, seed: u64) -> std::path::PathBuf {
    let mut tree = TreeBuilder::new(root);
    tree.file("big.bin", pseudo_random(seed, 3 << 20))
        .file("docs/small.txt", pseudo_random(seed + 1, 900));
    for i in 0..4u64 {
        tree.file(
            format!("file-{i}"),
            pseudo_random(seed + 10 + i, 5000 + 9000 * i as usize),
        );
    }
    tree.finish()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_ride_out_an_etcd_outage_and_join_again() {
    let scratch = Scratch::new();
    let certs = ClusterCerts::issue(&scratch.dir("certs"), &[1, 2]);
    let mut etcd = EtcdCluster::start_tls(3, etcd_tls(&certs)).await;
    let endpoints = etcd.endpoints().join(",");
    let xdg = scratch.dir("xdg");
    let storage = scratch.path().join("shared");
    // Sources and restore targets are in the scratch directory, which the nodes serve
    // and the client's certificate grants.
    let client = certs.client_flags("tester", &[scratch.path()]);
    init_plain_cluster(&xdg, &certs, &endpoints, &storage, 64);
    let config = NodeConfig {
        etcd: endpoints.clone(),
        storage: storage.clone(),
        ttl: TTL,
        logs: scratch.dir("logs"),
        certs: certs.clone(),
        serve: vec![scratch.path().to_path_buf()],
    };
    let mut nodes: Vec<NodeProcess> = [1, 2]
        .map(|id| NodeProcess::spawn(larder_command(&xdg), id, free_port(), &config, &[]))
        .into();
    settled(&xdg, &certs, &endpoints, 2, SETTLE);
    let (one, two) = (nodes[0].addr(), nodes[1].addr());

    let src_a = tree(&scratch.dir("a"), 1);
    let a = cluster_backup(&xdg, &client, &one, &src_a);

    // A backup of new data through node 2, in flight when etcd goes: the nodes serve
    // until their leases lapse (2 to 3 s), so it finishes (0.4 s on the 2-core
    // machine) unless the machine is slow, when it fails naming the outage; either
    // way what is committed restores below.
    let src_c = TreeBuilder::new(&scratch.dir("c"))
        .file("large.bin", pseudo_random(3, 64 << 20))
        .finish();
    let in_flight = std::thread::spawn({
        let (xdg, client, two, src_c) = (xdg.clone(), client.clone(), two.clone(), src_c.clone());
        move || {
            larder_as(
                &xdg,
                &client,
                &[
                    "--json",
                    "--cluster",
                    &two,
                    "backup",
                    src_c.to_str().unwrap(),
                ],
            )
        }
    });
    std::thread::sleep(Duration::from_millis(100));

    // Quorum lost: every member down.
    for member in 0..3 {
        etcd.kill(member);
    }
    let down = Instant::now();
    let src_b = tree(&scratch.dir("b"), 2);
    // Past the TTL every node has stopped serving: a backup fails, naming why.
    std::thread::sleep(Duration::from_secs(TTL + 3));
    let during = larder_as(
        &xdg,
        &client,
        &["--cluster", &one, "backup", src_b.to_str().unwrap()],
    );
    during
        .expect_code(1)
        .expect_stderr(&["out of the cluster", "lease in etcd was lost"]);
    let in_flight = in_flight.join().unwrap();
    let c = match in_flight.code {
        Some(0) => Some(
            in_flight.json()["snapshot_id"]
                .as_str()
                .unwrap()
                .to_string(),
        ),
        _ => {
            in_flight
                .expect_code(1)
                .expect_stderr(&["out of the cluster", "lease in etcd was lost"]);
            None
        }
    };
    eprintln!(
        "the backup in flight when etcd went {} after {:.1} s",
        if c.is_some() {
            "finished"
        } else {
            "failed naming the outage"
        },
        in_flight.elapsed.as_secs_f64()
    );
    while down.elapsed() < OUTAGE {
        for node in &mut nodes {
            assert!(node.running(), "node {} exited during the outage", node.id);
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    etcd.restart_all(&[0, 1, 2]).await;
    let back = Instant::now();
    // etcd renews the old leases when it elects a leader, so the old member keys show
    // at once: wait for the nodes' new ones (each logs it), then for the partitions.
    for node in &mut nodes {
        while !node.log().contains("joined the cluster again") {
            assert!(node.running(), "node {} exited", node.id);
            assert!(
                back.elapsed() < SETTLE,
                "node {} did not join again",
                node.id
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    settled(&xdg, &certs, &endpoints, 2, SETTLE);
    eprintln!(
        "etcd back: both nodes members again and every partition owned after {:.1} s",
        back.elapsed().as_secs_f64()
    );

    // The cluster works again: a backup through node 2, restores through either.
    let b = cluster_backup(&xdg, &client, &two, &src_b);
    let listed = larder_as(&xdg, &client, &["--json", "--cluster", &one, "snapshots"]);
    let ids: Vec<String> = listed.expect_ok().json()["snapshots"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap().to_string())
        .collect();
    let mut expected = vec![(a, &src_a, &two), (b, &src_b, &one)];
    expected.extend(c.map(|c| (c, &src_c, &one)));
    assert!(
        ids.len() == expected.len() && expected.iter().all(|(id, _, _)| ids.contains(id)),
        "the snapshots before and after, and nothing from a failed backup: {ids:?}"
    );
    for (id, src, via) in &expected {
        let target = scratch.path().join(format!("restored-{}", &id[..8]));
        let args = [
            "--cluster",
            via.as_str(),
            "restore",
            id,
            target.to_str().unwrap(),
        ];
        larder_as(&xdg, &client, &args).expect_ok();
        assert_same_tree(src, &restored(&target, src));
    }
    for node in &mut nodes {
        assert!(node.running(), "node {} exited", node.id);
    }
}
