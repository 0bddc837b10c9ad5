//! The cluster's certificates (docs/design/cluster.md, "Security"): `larder cluster
//! cert ca|node|client|etcd`, and `--tls DIR` / `--insecure-plaintext`, how every
//! command that talks to a cluster (nodes, clients, `cluster init|status`) reaches
//! the nodes' ports and etcd.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{bail, Result};
use clap::{Args, Subcommand};
use larder_cluster::coord::EtcdOptions;
use larder_cluster::rpc::Transport;
use larder_cluster::tls::{self, TlsFiles};
use serde::Serialize;

use crate::output::{Output, Render};

/// How this command reaches a cluster.
#[derive(Args, Clone, Default)]
pub struct TlsArgs {
    /// This side's certificates (`larder cluster cert`): DIR holds ca.crt, cert.crt and
    /// key.pem for the nodes' ports, and for etcd etcd-ca.crt, etcd.crt and etcd.key
    #[arg(long, global = true, env = "LARDER_TLS", value_name = "DIR")]
    pub tls: Option<PathBuf>,
    /// No certificates, no encryption: only to and on loopback addresses (one machine,
    /// tests); every local user is then a client of every path a node serves
    #[arg(long, global = true, conflicts_with = "tls")]
    pub insecure_plaintext: bool,
}

impl TlsArgs {
    /// How the nodes' ports are reached (a node: served).
    pub fn transport(&self) -> Result<Transport> {
        match (&self.tls, self.insecure_plaintext) {
            (Some(dir), _) => Ok(Transport::Tls(Arc::new(TlsFiles::larder(dir)?))),
            (None, true) => Ok(Transport::Plaintext),
            (None, false) => bail!(
                "a cluster is reached with certificates: give --tls DIR (made by `larder \
                 cluster cert`), or on loopback addresses only --insecure-plaintext"
            ),
        }
    }

    /// How etcd is reached: the etcd certificate of `--tls DIR` (which must hold one),
    /// or plaintext (loopback endpoints only).
    pub fn etcd_options(&self) -> Result<EtcdOptions> {
        let mut options = EtcdOptions::default();
        match (&self.tls, self.insecure_plaintext) {
            (Some(dir), _) => match TlsFiles::etcd(dir)? {
                Some(files) => options.tls = Some(Arc::new(files)),
                None => bail!(
                    "{} holds no etcd certificate ({}): issue it with `larder cluster cert \
                     node`, or `cluster cert client --etcd` for an administrator",
                    dir.display(),
                    tls::ETCD_CERT
                ),
            },
            (None, true) => {}
            (None, false) => bail!(
                "etcd is reached with certificates: give --tls DIR (made by `larder cluster \
                 cert`), or on loopback addresses only --insecure-plaintext"
            ),
        }
        Ok(options)
    }
}

#[derive(Subcommand)]
pub enum CertCommand {
    /// Make the cluster's authorities in DIR: ca.crt/ca.key for the nodes' ports and
    /// etcd-ca.crt/etcd-ca.key for etcd (keys 0600; keep DIR offline)
    Ca(CaArgs),
    /// Issue node ID's certificates into --out: for its port at --address (node-ID)
    /// and for etcd
    Node(NodeCertArgs),
    /// Issue a client's certificate into --out, granting jobs beneath each --path
    Client(ClientCertArgs),
    /// Issue an etcd member's certificate (server and peer) into --out
    Etcd(EtcdCertArgs),
}

#[derive(Args)]
pub struct CaArgs {
    /// Where the authorities are made (created 0700; existing files are never replaced)
    #[arg(long)]
    out: PathBuf,
}

#[derive(Args)]
pub struct NodeCertArgs {
    /// The authorities' directory (`cluster cert ca`)
    #[arg(long)]
    ca: PathBuf,
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..))]
    id: u16,
    /// An IP address or host name the node is reached at (repeat for several)
    #[arg(long = "address", required = true)]
    addresses: Vec<String>,
    /// The node's directory: ca.crt, cert.crt, key.pem, etcd-ca.crt, etcd.crt, etcd.key
    #[arg(long)]
    out: PathBuf,
}

#[derive(Args)]
pub struct ClientCertArgs {
    #[arg(long)]
    ca: PathBuf,
    /// The client's name: letters, digits, '.', '_', '-'
    #[arg(long)]
    name: String,
    /// An absolute path the client may back up from and restore into, on any node
    /// that serves it (repeat for several; none: the client lists snapshots only)
    #[arg(long = "path")]
    paths: Vec<PathBuf>,
    /// Also an etcd client certificate: an administrator's (`cluster init`, `status`)
    #[arg(long)]
    etcd: bool,
    /// The client's directory: ca.crt, cert.crt, key.pem (with --etcd also etcd-ca.crt,
    /// etcd.crt, etcd.key)
    #[arg(long)]
    out: PathBuf,
}

#[derive(Args)]
pub struct EtcdCertArgs {
    #[arg(long)]
    ca: PathBuf,
    /// The member's name
    #[arg(long)]
    name: String,
    /// An IP address or host name the member is reached at (repeat for several)
    #[arg(long = "address", required = true)]
    addresses: Vec<String>,
    /// The member's directory: etcd-ca.crt, etcd.crt, etcd.key
    #[arg(long)]
    out: PathBuf,
}

pub fn run(command: CertCommand, out: &Output) -> Result<ExitCode> {
    let (what, dir) = match command {
        CertCommand::Ca(a) => {
            tls::create_authority(&a.out)?;
            ("the cluster's authorities".to_string(), a.out)
        }
        CertCommand::Node(a) => {
            tls::issue_node(&a.ca, a.id, &a.addresses, &a.out)?;
            (format!("node-{}", a.id), a.out)
        }
        CertCommand::Client(a) => {
            for path in &a.paths {
                if !tls::is_plain_absolute(path) {
                    return Ok(out.usage(&format!(
                        "--path {}: give an absolute path without '.' or '..'",
                        path.display()
                    )));
                }
            }
            tls::issue_client(&a.ca, &a.name, &a.paths, a.etcd, &a.out)?;
            (format!("client-{}", a.name), a.out)
        }
        CertCommand::Etcd(a) => {
            tls::issue_etcd(&a.ca, &a.name, &a.addresses, &a.out)?;
            (format!("etcd member {}", a.name), a.out)
        }
    };
    out.print(&Issued::new(what, &dir))?;
    Ok(ExitCode::SUCCESS)
}

/// What `cluster cert` wrote, and where.
#[derive(Serialize)]
struct Issued {
    what: String,
    dir: String,
}

impl Issued {
    fn new(what: String, dir: &Path) -> Self {
        Self {
            what,
            dir: dir.display().to_string(),
        }
    }
}

impl Render for Issued {
    fn notes(&self) -> Vec<String> {
        vec![format!("{} written to {}", self.what, self.dir)]
    }
}
