//! `larder node`: run a dedup node of a cluster coordinated through etcd until SIGINT
//! or SIGTERM (docs/design/cluster.md); in an encrypted cluster with the cluster's key,
//! unlocked with its password first (docs/design/crypto.md, "Cluster").

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;
use larder_cluster::node::{cluster_config, EtcdTarget, Node, NodeOptions};
use larder_cluster::SharedStorage;
use larder_index::disk::Lookup;
use serde::Serialize;

use super::cluster::{runtime, EtcdArgs};
use super::cluster_tls::TlsArgs;
use crate::output::{Output, Render};
use crate::password::PasswordArgs;
use crate::{duration, size};
use larder_cluster::served::Served;

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
    #[arg(long, default_value = "30s", value_parser = duration::parse)]
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
    /// An absolute path clients' backups may read and restores may write, beneath
    /// what each client's certificate grants (repeat for several; none: the node runs
    /// no backups or restores)
    #[arg(long = "serve", value_name = "PATH")]
    serve: Vec<PathBuf>,
}

/// Runs a node until SIGINT or SIGTERM, then leaves the cluster in good order. An
/// encrypted cluster's node unlocks the cluster's key with `password` before it joins.
pub fn run(
    args: NodeArgs,
    password: &PasswordArgs,
    tls: &TlsArgs,
    out: &Output,
) -> Result<ExitCode> {
    let served = match Served::new(args.serve.clone()) {
        Ok(served) => served,
        Err(message) => return Ok(out.usage(&message)),
    };
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
    options.transport = tls.transport()?;
    // Before anything is joined: a plaintext port only on loopback.
    options.transport.check_addr(&args.listen.to_string())?;
    options.etcd_options = tls.etcd_options()?;
    options.served = served;
    runtime()?.block_on(async {
        let config = cluster_config(&EtcdTarget {
            endpoints: options.etcd.clone(),
            prefix: options.prefix.clone(),
            options: options.etcd_options.clone(),
        })
        .await?;
        if let Some(encryption) = config.as_ref().and_then(|c| c.encryption.as_ref()) {
            let password = password
                .get(None)
                .context("the cluster is encrypted: its nodes need its password")?;
            let keys = options
                .storage
                .key_slots()
                .unlock(password.as_bytes(), encryption)?;
            options.keys = Some(Arc::new(keys));
        }
        let node = Node::start(options).await?;
        out.print(&Serving {
            node: node.id,
            listen: node.addr.to_string(),
        })?;
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

/// The node has joined and serves lookups (its address, with the port a `:0` listen
/// address was given).
#[derive(Serialize)]
struct Serving {
    node: u16,
    listen: String,
}

impl Render for Serving {
    fn notes(&self) -> Vec<String> {
        vec![format!(
            "node {} serving lookups on {}",
            self.node, self.listen
        )]
    }
}
