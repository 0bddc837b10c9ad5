//! A restore through a cluster that could not restore a file says so as a local
//! restore does: the file named on stderr (in text mode too, not only in the JSON
//! summary) and exit code 3, never a quiet exit 0 with the file missing.

mod support;

#[path = "support/cluster.rs"]
mod cluster_kit;

use std::io::{Seek, SeekFrom, Write};
use std::time::Duration;

use cluster_kit::etcd::EtcdCluster;
use cluster_kit::{
    cluster_backup, etcd_tls, free_port, init_plain_cluster, settled, NodeConfig, NodeProcess,
};
use support::certs::ClusterCerts;
use support::{larder, larder_command, pseudo_random, Scratch, TreeBuilder};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_restore_that_loses_a_file_names_it_and_exits_3() {
    let scratch = Scratch::new();
    let certs = ClusterCerts::issue(&scratch.dir("certs"), &[1]);
    let etcd = EtcdCluster::start_tls(1, etcd_tls(&certs)).await;
    let endpoints = etcd.endpoints().join(",");
    let xdg = scratch.dir("xdg");
    let storage = scratch.path().join("shared");
    // Sources and restore targets are in the scratch directory, which the node serves
    // and the client's certificate grants.
    let client = certs.client_flags("tester", &[scratch.path()]);
    init_plain_cluster(&xdg, &certs, &endpoints, &storage, 16);
    let config = NodeConfig {
        etcd: endpoints.clone(),
        storage: storage.clone(),
        ttl: 3,
        logs: scratch.dir("logs"),
        certs: certs.clone(),
        serve: vec![scratch.path().to_path_buf()],
    };
    let node = NodeProcess::spawn(larder_command(&xdg), 1, free_port(), &config, &[]);
    settled(&xdg, &certs, &endpoints, 1, Duration::from_secs(60));
    let cluster = node.addr();
    let src = TreeBuilder::new(&scratch.dir("src"))
        .file("payroll.bin", pseudo_random(3, 200_000))
        .file("note.txt", "kept\n")
        .finish();
    let id = cluster_backup(&xdg, &client, &cluster, &src);
    // The one container holds the large file's chunks first: damage one of them.
    let containers: Vec<_> = std::fs::read_dir(storage.join("nodes/1/containers"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(containers.len(), 1, "{containers:?}");
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .open(&containers[0])
        .unwrap();
    file.seek(SeekFrom::Start(2000)).unwrap();
    file.write_all(b"XXXXXXXX").unwrap();
    drop(file);

    for json in [false, true] {
        let target = scratch.path().join(format!("restored-{json}"));
        let mut args = vec![
            client[0].as_str(),
            &client[1],
            "--cluster",
            &cluster,
            "restore",
            &id,
            target.to_str().unwrap(),
        ];
        if json {
            args.insert(0, "--json");
        }
        let out = larder(&xdg, &args);
        out.expect_code(3)
            .expect_stderr(&["payroll.bin", "not restored"]);
        assert!(!out.stderr.contains("note.txt"), "{out}");
        if json {
            let warnings = out.json()["warnings"].as_array().unwrap().clone();
            assert_eq!(warnings.len(), 1, "{out}");
            assert_eq!(warnings[0]["is_error"], true, "{out}");
        }
    }
}
