//! `larder cluster init|status` (docs/design/cluster.md): a cluster's creation
//! (encrypted unless `--encryption none`: its key's first slot in the shared storage,
//! docs/design/crypto.md "Cluster"), and what it looks like now; and the etcd options
//! and async runtime of every command that talks to a cluster.

use std::collections::BTreeMap;
use std::io::{self, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use larder_cluster::coord::auth::enable_auth;
use larder_cluster::coord::{
    ClusterConfig, Election, Etcd, Membership, PartitionMapStore, COORD_FORMAT_VERSION,
};
use larder_cluster::key::{init_encrypted_cluster, KeySlots};
use larder_cluster::node::{init_cluster, EtcdTarget};
use larder_cluster::rpc::{JobClient, NodeStats, Transport};
use larder_crypto::{AeadKind, FingerprintKind, KdfParams, KeyKind};
use larder_hash::HashAlgo;
use serde::Serialize;

use super::cluster_tls::TlsArgs;
use crate::duration;
use crate::output::{Output, Render};
use crate::password::{KdfArgs, NewPasswordArgs, PasswordArgs};
use crate::repo_open::new_slot;

/// Where a cluster's coordination lives.
#[derive(Args, Clone)]
pub struct EtcdArgs {
    /// etcd endpoints, comma-separated (http://host:port)
    #[arg(long, value_delimiter = ',', required = true, env = "LARDER_ETCD")]
    pub etcd: Vec<String>,
    /// The cluster's key prefix in etcd: several clusters can share one etcd
    #[arg(long, default_value = "/larder")]
    pub prefix: String,
}

#[derive(Subcommand)]
pub enum ClusterCommand {
    /// Create a cluster: its parameters in etcd, its directories in the shared storage,
    /// and (unless --encryption none) its key, wrapped by the password
    Init(InitArgs),
    /// Nodes, the master, partitions per node, and messages per second
    Status(StatusArgs),
    /// The cluster's certificates: its authorities, and certificates for nodes,
    /// clients and etcd members
    #[command(subcommand)]
    Cert(super::cluster_tls::CertCommand),
}

#[derive(Args)]
pub struct InitArgs {
    #[command(flatten)]
    etcd: EtcdArgs,
    /// The shared storage (file://PATH, PATH or s3://BUCKET/PREFIX)
    #[arg(long)]
    storage: String,
    /// Fingerprint partitions: fixed for the cluster's life, far more than nodes
    #[arg(long, default_value_t = larder_cluster::DEFAULT_PARTITIONS, value_parser = clap::value_parser!(u32).range(1..=65536))]
    partitions: u32,
    /// Fingerprint: blake3, sha256 or sha1 (sha1 only for a plaintext cluster)
    #[arg(long, default_value = "blake3")]
    hash: String,
    /// aes-256-gcm, xchacha20-poly1305, or none for a plaintext cluster (the papers'
    /// experiments)
    #[arg(long, default_value = "aes-256-gcm")]
    encryption: String,
    #[command(flatten)]
    new_password: NewPasswordArgs,
    #[command(flatten)]
    kdf: KdfArgs,
    /// Leave etcd's authentication as it is. Otherwise, with --tls, init makes etcd's
    /// users (root: the administrator's certificate; larder-node: every node's,
    /// confined to --prefix) and turns authentication on
    #[arg(long)]
    no_etcd_auth: bool,
}

#[derive(Args)]
pub struct StatusArgs {
    #[command(flatten)]
    etcd: EtcdArgs,
    /// Seconds between the two samples of every node's counters
    #[arg(long, default_value = "1s", value_parser = duration::parse)]
    interval: Duration,
}

pub fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")
}

pub fn run(
    command: ClusterCommand,
    password: &PasswordArgs,
    tls: &TlsArgs,
    out: &Output,
) -> Result<ExitCode> {
    match command {
        ClusterCommand::Init(args) => init(args, password, tls, out),
        ClusterCommand::Cert(command) => super::cluster_tls::run(command, out),
        ClusterCommand::Status(args) => {
            let status = runtime()?.block_on(status(&args.etcd, tls, args.interval))?;
            out.print(&status)?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn init(args: InitArgs, password: &PasswordArgs, tls: &TlsArgs, out: &Output) -> Result<ExitCode> {
    let etcd_options = tls.etcd_options()?;
    let Some(hash) = HashAlgo::from_name(&args.hash) else {
        return Ok(out.usage(&format!(
            "unknown hash {}: blake3, sha256 or sha1",
            args.hash
        )));
    };
    let aead = match args.encryption.to_ascii_lowercase().as_str() {
        "none" => None,
        name => match AeadKind::from_name(name) {
            Some(aead) => Some(aead),
            None => {
                return Ok(out.usage(&format!(
                    "unknown encryption {:?}: use aes-256-gcm, xchacha20-poly1305 or none",
                    args.encryption
                )))
            }
        },
    };
    if aead.is_some() && hash == HashAlgo::Sha1 {
        return Ok(out.usage("SHA-1 clusters cannot be encrypted: use --encryption none"));
    }
    let params = match args.kdf.apply(KdfParams::DEFAULT) {
        Ok(params) => params,
        Err(msg) => return Ok(out.usage(&msg)),
    };
    let storage = prepare_storage(&args.storage)?;
    let mut config = ClusterConfig {
        format_version: COORD_FORMAT_VERSION,
        partitions: args.partitions,
        chunking: if aead.is_some() {
            "keyed"
        } else {
            "fastcdc2020"
        }
        .into(),
        hash: args.hash,
        encryption: None,
    };
    let etcd = EtcdTarget {
        endpoints: args.etcd.etcd.clone(),
        prefix: args.etcd.prefix.clone(),
        options: etcd_options,
    };
    match aead {
        None => runtime()?.block_on(init_cluster(&etcd, &config))?,
        Some(aead) => {
            let fingerprint = match hash {
                HashAlgo::Sha256 => FingerprintKind::HmacSha256,
                _ => FingerprintKind::KeyedBlake3,
            };
            let password = args.new_password.get_or(password)?;
            let slots = KeySlots::parse(&args.storage)?;
            config = runtime()?.block_on(init_encrypted_cluster(
                &etcd,
                &slots,
                config,
                password.as_bytes(),
                (aead, fingerprint),
                |keys| {
                    new_slot(keys, KeyKind::Full, &password, params).map_err(|e| format!("{e:#}"))
                },
            ))?;
        }
    }
    let etcd_auth = tls.tls.is_some() && !args.no_etcd_auth;
    if etcd_auth {
        runtime()?.block_on(enable_auth(&etcd.endpoints, &etcd.prefix, &etcd.options))?;
    }
    out.print(&Created {
        etcd_auth,
        storage: storage.display().to_string(),
        partitions: config.partitions,
        hash: config.hash,
        encryption: config
            .encryption
            .as_ref()
            .map_or("none", |e| e.aead.name())
            .to_string(),
    })?;
    Ok(ExitCode::SUCCESS)
}

/// Creates the shared storage's directories; in a bucket there is nothing to create,
/// so only checks that it answers. Returns the storage as `Created` names it.
fn prepare_storage(storage: &str) -> Result<PathBuf> {
    if storage.starts_with("s3://") {
        let root = larder_store::ObjectBackend::from_url(storage)?;
        root.list_dirs("partitions")
            .with_context(|| format!("listing {storage}"))?;
        return Ok(PathBuf::from(storage));
    }
    let dir = larder_cluster::storage::parse_dir(storage)?;
    for sub in ["partitions", "nodes"] {
        std::fs::create_dir_all(dir.join(sub))
            .with_context(|| format!("creating {}", dir.join(sub).display()))?;
    }
    Ok(dir)
}

/// The cluster `cluster init` created.
#[derive(Serialize)]
struct Created {
    /// Whether etcd's users and authentication are on (nodes confined to the prefix).
    etcd_auth: bool,
    storage: String,
    partitions: u32,
    hash: String,
    /// The AEAD, or `none`.
    encryption: String,
}

impl Render for Created {
    fn notes(&self) -> Vec<String> {
        let mut notes = vec![format!(
            "created a cluster of {} partitions ({}, encryption {}) in {}",
            self.partitions, self.hash, self.encryption, self.storage
        )];
        if self.etcd_auth {
            notes.push(
                "etcd authentication is on: nodes read and write only the cluster's prefix".into(),
            );
        }
        notes
    }
}

/// What `larder cluster status` shows.
#[derive(Serialize)]
struct Status {
    /// `None` when no cluster was created under the prefix.
    partitions: Option<u32>,
    master: Option<String>,
    /// Partitions without an owner.
    unowned: u32,
    nodes: Vec<NodeStatus>,
}

#[derive(Serialize)]
struct NodeStatus {
    id: u16,
    address: String,
    partitions: usize,
    /// `None` when the node did not answer.
    stats: Option<NodeRates>,
}

/// A node's counters, and their rates over the interval.
#[derive(Serialize)]
struct NodeRates {
    lookup_messages_in: u64,
    lookup_fingerprints_in: u64,
    ack_messages_in: u64,
    messages_out: u64,
    lookup_messages_per_sec: f64,
    fingerprints_per_sec: f64,
}

async fn status(etcd: &EtcdArgs, tls: &TlsArgs, interval: Duration) -> Result<Status> {
    let client = Etcd::connect(&etcd.etcd, &etcd.prefix, tls.etcd_options()?).await?;
    let transport = tls.transport()?;
    let maps = PartitionMapStore::new(&client);
    let config = maps.config().await?;
    let master = Election::new(&client).leader().await?;
    let members = Membership::members(&client).await?;
    let map = maps.load().await?;
    let mut per_node: BTreeMap<u16, usize> = BTreeMap::new();
    for a in map.partitions.values() {
        *per_node.entry(a.owner).or_default() += 1;
    }
    let total = config.as_ref().map_or(0, |c: &ClusterConfig| c.partitions);
    let owned: usize = members
        .iter()
        .map(|m| per_node.get(&m.id).copied().unwrap_or(0))
        .sum();
    let mut nodes = Vec::new();
    for m in &members {
        nodes.push(NodeStatus {
            id: m.id,
            address: m.address.clone(),
            partitions: per_node.get(&m.id).copied().unwrap_or(0),
            stats: sample(&m.address, &transport, interval).await,
        });
    }
    Ok(Status {
        partitions: config.map(|c| c.partitions),
        master,
        unowned: total.saturating_sub(owned as u32),
        nodes,
    })
}

/// A node's counters now, and its lookup messages and fingerprints per second over
/// `interval`.
async fn sample(address: &str, transport: &Transport, interval: Duration) -> Option<NodeRates> {
    let client = JobClient::connect(address, transport).await.ok()?;
    let before = client.node_stats().await.ok()?;
    let started = Instant::now();
    tokio::time::sleep(interval).await;
    let after: NodeStats = client.node_stats().await.ok()?;
    let secs = started.elapsed().as_secs_f64();
    Some(NodeRates {
        lookup_messages_in: after.lookup_messages_in,
        lookup_fingerprints_in: after.lookup_fingerprints_in,
        ack_messages_in: after.ack_messages_in,
        messages_out: after.stream_messages_out,
        lookup_messages_per_sec: (after.lookup_messages_in - before.lookup_messages_in) as f64
            / secs,
        fingerprints_per_sec: (after.lookup_fingerprints_in - before.lookup_fingerprints_in) as f64
            / secs,
    })
}

impl Render for Status {
    /// What the command exists to show: `--quiet` leaves it, as it always has.
    const QUIET_SILENCES_TEXT: bool = false;

    fn write_text(&self, w: &mut dyn Write) -> io::Result<()> {
        let Some(partitions) = self.partitions else {
            return writeln!(w, "no cluster under this prefix: run `larder cluster init`");
        };
        writeln!(
            w,
            "{} partitions, {} nodes, master: node {}, unowned partitions: {}",
            partitions,
            self.nodes.len(),
            self.master.as_deref().unwrap_or("none"),
            self.unowned
        )?;
        writeln!(
            w,
            "{:>6} {:<22} {:>10} {:>14} {:>14} {:>12}",
            "node", "address", "partitions", "lookups in", "msgs/s", "fps/s"
        )?;
        for n in &self.nodes {
            match &n.stats {
                Some(s) => writeln!(
                    w,
                    "{:>6} {:<22} {:>10} {:>14} {:>14.0} {:>12.0}",
                    n.id,
                    n.address,
                    n.partitions,
                    s.lookup_messages_in,
                    s.lookup_messages_per_sec,
                    s.fingerprints_per_sec
                )?,
                None => writeln!(
                    w,
                    "{:>6} {:<22} {:>10} {:>14}",
                    n.id, n.address, n.partitions, "no answer"
                )?,
            }
        }
        Ok(())
    }
}
