//! Clusters of real processes for the CLI's tests: etcd from the cluster crate's kit
//! ([`etcd::EtcdCluster`], with TLS: `start_tls` and [`etcd_tls`]), `larder node`
//! command lines made in one place ([`node_command`], which [`NodeProcess::spawn`]
//! runs: each node with its certificate), and waits on `larder cluster status` as the
//! administrator. A test that uses it declares `mod support;` and
//! `#[path = "support/cluster.rs"] mod cluster_kit;`.

#![allow(dead_code)]

#[path = "../../../larder-cluster/tests/support/etcd.rs"]
pub mod etcd;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::certs::ClusterCerts;
use crate::support::{larder, Output};

/// Lines of a node's log printed when the test fails.
const TAIL: usize = 200;

/// A free TCP port on loopback (bound, then released for a node to take).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// What every node of a test's cluster is started with.
#[derive(Clone)]
pub struct NodeConfig {
    /// etcd's endpoints, comma-separated.
    pub etcd: String,
    /// The shared storage (`--storage`).
    pub storage: PathBuf,
    /// The member lease's TTL in seconds (`--ttl`).
    pub ttl: u64,
    /// Where each node's log goes: `node-<id>.log`, appended to across restarts.
    pub logs: PathBuf,
    /// The cluster's certificates: node `id` runs with its own (`--tls`).
    pub certs: ClusterCerts,
    /// The paths every node serves to clients' jobs (`--serve`).
    pub serve: Vec<PathBuf>,
}

/// What `EtcdCluster::start_tls` takes for `certs`: the etcd member's certificate,
/// and the administrator's to check the members' health with.
pub fn etcd_tls(certs: &ClusterCerts) -> etcd::EtcdTls {
    etcd::EtcdTls {
        member: certs.etcd_member(),
        client: certs.admin(),
    }
}

/// A `larder node` process, SIGKILLed when dropped (its log's tail printed if the test
/// failed).
pub struct NodeProcess {
    pub id: u16,
    /// The port it listens on (loopback), 0 when it chose one itself.
    pub port: u16,
    child: Child,
    log: PathBuf,
}

/// `larder node` as node `id` of the cluster `config` describes, listening on
/// `127.0.0.1:port` (0: any free port), with its certificate and serving what
/// `config` says, through `base` (a `larder` command with its environment, e.g.
/// [`crate::support::larder_command`]) plus `extra` arguments (password sources):
/// every test's node command line.
pub fn node_command(
    mut base: Command,
    id: u16,
    port: u16,
    config: &NodeConfig,
    extra: &[&str],
) -> Command {
    base.args(config.certs.node_flags(id))
        .arg("node")
        .args(["--id", &id.to_string()])
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .args(["--etcd", &config.etcd])
        .arg("--storage")
        .arg(&config.storage)
        .args(["--ttl", &config.ttl.to_string()]);
    for path in &config.serve {
        base.arg("--serve").arg(path);
    }
    base.args(extra);
    base
}

impl NodeProcess {
    /// Starts [`node_command`] in the background, its output appended to its log, at
    /// log level `LARDER_LOG` when set, else info.
    pub fn spawn(base: Command, id: u16, port: u16, config: &NodeConfig, extra: &[&str]) -> Self {
        std::fs::create_dir_all(&config.logs).unwrap();
        let log = config.logs.join(format!("node-{id}.log"));
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .unwrap();
        let child = node_command(base, id, port, config, extra)
            .env(
                "LARDER_LOG",
                std::env::var("LARDER_LOG").unwrap_or_else(|_| "info".into()),
            )
            .stdin(Stdio::null())
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .spawn()
            .expect("spawn larder node");
        Self {
            id,
            port,
            child,
            log,
        }
    }

    /// `127.0.0.1:PORT`, for `--cluster` (a node started on a chosen port).
    pub fn addr(&self) -> String {
        assert_ne!(self.port, 0, "node {} chose its own port", self.id);
        format!("127.0.0.1:{}", self.port)
    }

    pub fn running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Its log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for NodeProcess {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            let text = self.log();
            let lines: Vec<&str> = text.lines().collect();
            let tail = &lines[lines.len().saturating_sub(TAIL)..];
            eprintln!("--- node {} log tail:\n{}", self.id, tail.join("\n"));
        }
    }
}

/// Waits until exactly `nodes` nodes are members of the cluster in `etcd` and no
/// partition is unowned (`larder cluster status` as the administrator of `certs`), for
/// up to `within`.
pub fn settled(
    xdg: &Path,
    certs: &ClusterCerts,
    etcd: &str,
    nodes: usize,
    within: Duration,
) -> serde_json::Value {
    let deadline = Instant::now() + within;
    let mut args = certs.admin_flags();
    args.extend(
        [
            "--json",
            "cluster",
            "status",
            "--etcd",
            etcd,
            "--interval",
            "100ms",
        ]
        .map(String::from),
    );
    loop {
        let out = larder(xdg, &args);
        if out.code == Some(0) {
            let status = out.json();
            if status["nodes"].as_array().map(Vec::len) == Some(nodes) && status["unowned"] == 0 {
                return status;
            }
        }
        assert!(Instant::now() < deadline, "not settled: {out}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Runs larder with a certificate holder's `flags` (`admin_flags`, `client_flags`)
/// before `args`.
pub fn larder_as(xdg: &Path, flags: &[String], args: &[&str]) -> Output {
    larder(
        xdg,
        flags.iter().map(String::as_str).chain(args.iter().copied()),
    )
}

/// `larder cluster init` as the administrator of `certs`: a plaintext cluster of
/// `partitions` partitions on `storage`, coordinated by `etcd`.
pub fn init_plain_cluster(
    xdg: &Path,
    certs: &ClusterCerts,
    etcd: &str,
    storage: &Path,
    partitions: u32,
) {
    let partitions = partitions.to_string();
    let storage = storage.to_str().unwrap();
    let args = [
        "cluster",
        "init",
        "--etcd",
        etcd,
        "--storage",
        storage,
        "--partitions",
        &partitions,
        "--encryption",
        "none",
    ];
    larder_as(xdg, &certs.admin_flags(), &args).expect_ok();
}

/// Backs `src` up through node `node` as the client of `client` flags; the
/// snapshot's id.
pub fn cluster_backup(xdg: &Path, client: &[String], node: &str, src: &Path) -> String {
    let args = ["--json", "--cluster", node, "backup", src.to_str().unwrap()];
    larder_as(xdg, client, &args).expect_ok().json()["snapshot_id"]
        .as_str()
        .unwrap()
        .to_string()
}
