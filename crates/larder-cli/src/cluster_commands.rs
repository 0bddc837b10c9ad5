//! `larder node` and `larder cluster init|status` (docs/design/cluster.md): a dedup
//! node of a cluster coordinated through etcd, the cluster's creation, and what it
//! looks like now.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use larder_cluster::coord::{
    ClusterConfig, Election, Etcd, EtcdOptions, Membership, PartitionMapStore, COORD_FORMAT_VERSION,
};
use larder_cluster::node::{init_cluster, Node, NodeOptions};
use larder_cluster::rpc::{Job, NodeClient, NodeStats};
use larder_cluster::SharedStorage;
use larder_index::disk::Lookup;
use serde_json::json;

use crate::output::Output;
use crate::size;

/// Where a cluster's coordination lives.
#[derive(Args, Clone)]
pub struct EtcdArgs {
    /// etcd endpoints, comma-separated (http://host:port)
    #[arg(long, value_delimiter = ',', required = true, env = "LARDER_ETCD")]
    etcd: Vec<String>,
    /// The cluster's key prefix in etcd: several clusters can share one etcd
    #[arg(long, default_value = "/larder")]
    prefix: String,
}

#[derive(Args)]
pub struct NodeArgs {
    /// This node's id, 1 to 65535, unique in the cluster
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..))]
    id: u16,
    /// Address the lookup service listens on
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    #[command(flatten)]
    etcd: EtcdArgs,
    /// The shared storage: a directory every node mounts (file://PATH or PATH), or
    /// s3://BUCKET/PREFIX (endpoint and credentials from the AWS_* environment
    /// variables: AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, ...)
    #[arg(long)]
    storage: String,
    /// With s3:// storage: this node's local directory for its partitions' disk
    /// indexes and its repository's config, lock and temporary files
    #[arg(long)]
    cache: Option<PathBuf>,
    /// A new chunk's lock passes to the next requester when its writer does not
    /// acknowledge it within this (e.g. 30s)
    #[arg(long, default_value = "30s", value_parser = crate::gc_commands::parse_duration)]
    lock_timeout: Duration,
    /// Seconds without a keepalive after which the node is taken for dead
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(i64).range(2..))]
    ttl: i64,
    /// Memory budget of each partition's disk index: the node holds about this times
    /// the partitions it owns (256 of the default 1024 in a 4-node cluster: 256 MiB)
    #[arg(long, default_value = "1MiB", value_parser = size::parse)]
    partition_memory: usize,
    /// Fingerprints each partition's index is sized for (it grows past that by chaining)
    #[arg(long, default_value_t = 1 << 16)]
    partition_fingerprints: u64,
}

#[derive(Subcommand)]
pub enum ClusterCommand {
    /// Create a cluster: its parameters in etcd, its directories in the shared storage
    Init {
        #[command(flatten)]
        etcd: EtcdArgs,
        /// The shared storage (file://PATH, PATH or s3://BUCKET/PREFIX)
        #[arg(long)]
        storage: String,
        /// Fingerprint partitions: fixed for the cluster's life, far more than nodes
        #[arg(long, default_value_t = larder_cluster::DEFAULT_PARTITIONS, value_parser = clap::value_parser!(u32).range(1..=65536))]
        partitions: u32,
        /// Fingerprint: blake3, sha256 or sha1
        #[arg(long, default_value = "blake3")]
        hash: String,
    },
    /// Nodes, the master, partitions per node, and messages per second
    Status {
        #[command(flatten)]
        etcd: EtcdArgs,
        /// Seconds between the two samples of every node's counters
        #[arg(long, default_value = "1s", value_parser = crate::gc_commands::parse_duration)]
        interval: Duration,
    },
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")
}

/// Runs a node until SIGINT or SIGTERM, then leaves the cluster in good order.
pub fn node(args: NodeArgs, out: &Output) -> Result<ExitCode> {
    if args.storage.starts_with("s3://") && args.cache.is_none() {
        return Ok(out.usage(&format!(
            "--storage {} needs --cache DIR: the node's local directory for its partitions' indexes and its repository's config and lock",
            args.storage
        )));
    }
    let storage = SharedStorage::parse(&args.storage, args.cache.as_deref())?;
    if let SharedStorage::Dir(dir) = &storage {
        if !dir.join("partitions").is_dir() {
            bail!(
                "{} is not a cluster's shared storage (no partitions/ in it): run `larder cluster init` first",
                dir.display()
            );
        }
    }
    let mut options = NodeOptions::new(args.id, args.etcd.etcd, &args.etcd.prefix, storage);
    options.listen = args.listen;
    options.lock_timeout = args.lock_timeout;
    options.member_ttl_secs = args.ttl;
    options.index.memory_budget = args.partition_memory as u64;
    options.index.expected_fingerprints = args.partition_fingerprints;
    options.lookup = Lookup::Eager;
    runtime()?.block_on(async {
        let node = Node::start(options).await?;
        out.node_started(node.id, node.addr);
        node.run(shutdown_signal()).await?;
        anyhow::Ok(ExitCode::SUCCESS)
    })
}

async fn shutdown_signal() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(term) => term,
        Err(_) => return std::future::pending().await,
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

pub fn cluster(command: ClusterCommand, out: &Output) -> Result<ExitCode> {
    match command {
        ClusterCommand::Init {
            etcd,
            storage,
            partitions,
            hash,
        } => {
            if larder_hash::HashAlgo::from_name(&hash).is_none() {
                return Ok(out.usage(&format!("unknown hash {hash}: blake3, sha256 or sha1")));
            }
            let dir = if storage.starts_with("s3://") {
                // Nothing to create in a bucket: only check that it answers.
                let root = larder_store::ObjectBackend::from_url(&storage)?;
                root.list_dirs("partitions")
                    .with_context(|| format!("listing {storage}"))?;
                PathBuf::from(&storage)
            } else {
                let dir = larder_cluster::storage::parse_dir(&storage)?;
                for sub in ["partitions", "nodes"] {
                    std::fs::create_dir_all(dir.join(sub))
                        .with_context(|| format!("creating {}", dir.join(sub).display()))?;
                }
                dir
            };
            let config = ClusterConfig {
                format_version: COORD_FORMAT_VERSION,
                partitions,
                chunking: "fastcdc2020".into(),
                hash,
            };
            runtime()?.block_on(init_cluster(&etcd.etcd, &etcd.prefix, &config))?;
            out.cluster_init_done(&dir, &config);
            Ok(ExitCode::SUCCESS)
        }
        ClusterCommand::Status { etcd, interval } => {
            let status = runtime()?.block_on(status(&etcd, interval))?;
            out.cluster_status(&status);
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// Runs `job` on the first of `nodes` that answers; its JSON summary.
fn job(nodes: &[String], job: Job) -> Result<serde_json::Value> {
    runtime()?.block_on(async {
        let mut last = None;
        for addr in nodes {
            // Node id 1 as the asker: a job does not look anything up under it.
            let client = match NodeClient::connect(addr, 1).await {
                Ok(client) => client,
                Err(e) => {
                    last = Some(anyhow::Error::new(e));
                    continue;
                }
            };
            let json = client
                .job(&job)
                .await
                .with_context(|| format!("node {addr}"))?;
            return serde_json::from_str(&json).context("the node's summary");
        }
        Err(last.unwrap_or_else(|| anyhow::anyhow!("no cluster node given")))
    })
}

/// `larder backup --cluster`: the node backs `paths` of its file system up.
pub fn backup(nodes: &[String], paths: &[PathBuf], out: &Output) -> Result<ExitCode> {
    let paths = paths
        .iter()
        .map(|p| {
            std::path::absolute(p)
                .map(|p| p.display().to_string())
                .with_context(|| format!("{}", p.display()))
        })
        .collect::<Result<Vec<_>>>()?;
    let summary = job(nodes, Job::Backup { paths })?;
    out.cluster_job_done("backup", &summary);
    let partial = summary["warnings"]
        .as_array()
        .is_some_and(|w| !w.is_empty());
    Ok(if partial {
        ExitCode::from(3)
    } else {
        ExitCode::SUCCESS
    })
}

/// `larder restore --cluster`: the node restores any node's snapshot into `target`
/// on its file system.
pub fn restore(
    nodes: &[String],
    snapshot: &str,
    target: &std::path::Path,
    out: &Output,
) -> Result<ExitCode> {
    let target = std::path::absolute(target)?.display().to_string();
    let summary = job(
        nodes,
        Job::Restore {
            snapshot: snapshot.to_string(),
            target,
        },
    )?;
    out.cluster_job_done("restore", &summary);
    Ok(ExitCode::SUCCESS)
}

/// `larder snapshots --cluster`: every node's snapshots.
pub fn snapshots(nodes: &[String], out: &Output) -> Result<ExitCode> {
    let list = job(nodes, Job::Snapshots)?;
    out.cluster_job_done("snapshots", &list);
    Ok(ExitCode::SUCCESS)
}

/// What `larder cluster status` shows.
pub struct Status {
    pub config: Option<ClusterConfig>,
    pub master: Option<String>,
    pub nodes: Vec<NodeStatus>,
    /// Partitions without an owner.
    pub unowned: u32,
}

pub struct NodeStatus {
    pub id: u16,
    pub address: String,
    pub partitions: usize,
    /// The node's counters, and their rates over the interval; `None` when the node
    /// did not answer.
    pub stats: Option<(NodeStats, f64, f64)>,
}

async fn status(etcd: &EtcdArgs, interval: Duration) -> Result<Status> {
    let client = Etcd::connect(&etcd.etcd, &etcd.prefix, EtcdOptions::default()).await?;
    let maps = PartitionMapStore::new(&client);
    let config = maps.config().await?;
    let master = Election::new(&client).leader().await?;
    let members = Membership::members(&client).await?;
    let map = maps.load().await?;
    let mut per_node: BTreeMap<u16, usize> = BTreeMap::new();
    for a in map.partitions.values() {
        *per_node.entry(a.owner).or_default() += 1;
    }
    let total = config.as_ref().map_or(0, |c| c.partitions);
    let owned: usize = members
        .iter()
        .map(|m| per_node.get(&m.id).copied().unwrap_or(0))
        .sum();
    let mut nodes = Vec::new();
    for m in &members {
        let stats = sample(&m.address, interval).await;
        nodes.push(NodeStatus {
            id: m.id,
            address: m.address.clone(),
            partitions: per_node.get(&m.id).copied().unwrap_or(0),
            stats,
        });
    }
    Ok(Status {
        config,
        master,
        nodes,
        unowned: total.saturating_sub(owned as u32),
    })
}

/// A node's counters now, and its lookup messages and fingerprints per second over
/// `interval`.
async fn sample(address: &str, interval: Duration) -> Option<(NodeStats, f64, f64)> {
    // Node id 1 as the asker: `Stats` does not act on it.
    let client = NodeClient::connect(address, 1).await.ok()?;
    let before = client.node_stats().await.ok()?;
    let started = Instant::now();
    tokio::time::sleep(interval).await;
    let after = client.node_stats().await.ok()?;
    let secs = started.elapsed().as_secs_f64();
    let messages = (after.lookup_messages_in - before.lookup_messages_in) as f64 / secs;
    let fps = (after.lookup_fingerprints_in - before.lookup_fingerprints_in) as f64 / secs;
    Some((after, messages, fps))
}

impl Output {
    fn node_started(&self, id: u16, addr: SocketAddr) {
        if self.is_json() {
            println!("{}", json!({ "node": id, "listen": addr.to_string() }));
        } else {
            self.note(&format!("node {id} serving lookups on {addr}"));
        }
    }

    fn cluster_init_done(&self, dir: &std::path::Path, config: &ClusterConfig) {
        if self.is_json() {
            println!(
                "{}",
                json!({ "storage": dir.display().to_string(), "partitions": config.partitions, "hash": config.hash })
            );
        } else {
            self.note(&format!(
                "created a cluster of {} partitions ({}) in {}",
                config.partitions,
                config.hash,
                dir.display()
            ));
        }
    }

    fn cluster_job_done(&self, what: &str, summary: &serde_json::Value) {
        if self.is_json() {
            println!("{summary}");
            return;
        }
        match what {
            "snapshots" => {
                for s in summary.as_array().into_iter().flatten() {
                    println!(
                        "{}  {}  {}  {}",
                        s["id"].as_str().unwrap_or("?").get(..16).unwrap_or("?"),
                        s["time"].as_str().unwrap_or("?"),
                        s["hostname"].as_str().unwrap_or("?"),
                        s["paths"].as_array().map_or(String::new(), |p| p
                            .iter()
                            .filter_map(|v| v.as_str())
                            .collect::<Vec<_>>()
                            .join(" "))
                    );
                }
            }
            "backup" => self.note(&format!(
                "snapshot {} saved: {} files, {} chunks ({} new), {} bytes new",
                summary["snapshot_id"].as_str().unwrap_or("?"),
                summary["files"],
                summary["chunks"],
                summary["chunks_new"],
                summary["bytes_new"],
            )),
            _ => self.note(&format!(
                "restored snapshot {}: {} files, {} bytes",
                summary["snapshot_id"].as_str().unwrap_or("?"),
                summary["files"],
                summary["bytes"],
            )),
        }
    }

    fn cluster_status(&self, s: &Status) {
        if self.is_json() {
            let nodes: Vec<_> = s
                .nodes
                .iter()
                .map(|n| {
                    let stats = n.stats.as_ref().map(|(st, m, f)| {
                        json!({
                            "lookup_messages_in": st.lookup_messages_in,
                            "lookup_fingerprints_in": st.lookup_fingerprints_in,
                            "ack_messages_in": st.ack_messages_in,
                            "messages_out": st.stream_messages_out,
                            "lookup_messages_per_sec": m,
                            "fingerprints_per_sec": f,
                        })
                    });
                    json!({ "id": n.id, "address": n.address, "partitions": n.partitions, "stats": stats })
                })
                .collect();
            println!(
                "{}",
                json!({
                    "partitions": s.config.as_ref().map(|c| c.partitions),
                    "master": s.master,
                    "unowned": s.unowned,
                    "nodes": nodes,
                })
            );
            return;
        }
        let Some(config) = &s.config else {
            println!("no cluster under this prefix: run `larder cluster init`");
            return;
        };
        println!(
            "{} partitions, {} nodes, master: node {}, unowned partitions: {}",
            config.partitions,
            s.nodes.len(),
            s.master.as_deref().unwrap_or("none"),
            s.unowned
        );
        println!(
            "{:>6} {:<22} {:>10} {:>14} {:>14} {:>12}",
            "node", "address", "partitions", "lookups in", "msgs/s", "fps/s"
        );
        for n in &s.nodes {
            match &n.stats {
                Some((st, m, f)) => println!(
                    "{:>6} {:<22} {:>10} {:>14} {:>14.0} {:>12.0}",
                    n.id, n.address, n.partitions, st.lookup_messages_in, m, f
                ),
                None => println!(
                    "{:>6} {:<22} {:>10} {:>14}",
                    n.id, n.address, n.partitions, "no answer"
                ),
            }
        }
    }
}
