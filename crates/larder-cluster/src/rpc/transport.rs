//! How a node's port is reached and served (docs/design/cluster.md, "Security"):
//! mutual TLS under the cluster's authority, or plaintext on loopback addresses only.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;

use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity, ServerTlsConfig};

use super::RpcError;
use crate::tls::{peer_role, Role, TlsFiles};

/// How a port is reached and served.
#[derive(Debug, Clone)]
pub enum Transport {
    /// No TLS and no identities (`--insecure-plaintext`): refused on any address that
    /// is not loopback, on either side.
    Plaintext,
    /// Mutual TLS: each side presents a certificate of the cluster's authority and
    /// trusts only that authority.
    Tls(Arc<TlsFiles>),
}

/// Whether `host` (an IP address or a name, with or without a port) is loopback:
/// `127.0.0.0/8`, `::1` or `localhost`.
pub fn is_loopback(addr: &str) -> bool {
    if let Ok(socket) = addr.parse::<SocketAddr>() {
        return socket.ip().is_loopback();
    }
    if let Ok(ip) = addr.trim_matches(['[', ']']).parse::<IpAddr>() {
        return ip.is_loopback();
    }
    let host = addr.rsplit_once(':').map_or(addr, |(host, _)| host);
    host.eq_ignore_ascii_case("localhost")
}

impl Transport {
    /// Refuses plaintext to or on `addr` unless it is loopback.
    pub fn check_addr(&self, addr: &str) -> Result<(), RpcError> {
        match self {
            Transport::Plaintext if !is_loopback(addr) => Err(RpcError::Insecure {
                addr: addr.to_string(),
            }),
            _ => Ok(()),
        }
    }

    /// The endpoint for the node at `addr` (`host:port`): `https` with this side's
    /// certificate, the server's checked against the authority and, when `node` is
    /// given, its name `node-<id>` (a node dialling an owner the map names), else
    /// `addr` (a client dialling an address it was given).
    pub(crate) fn endpoint(&self, addr: &str, node: Option<u16>) -> Result<Endpoint, RpcError> {
        self.check_addr(addr)?;
        let connect_err = |source| RpcError::Connect {
            addr: addr.to_string(),
            source,
        };
        match self {
            Transport::Plaintext => {
                Endpoint::from_shared(format!("http://{addr}")).map_err(connect_err)
            }
            Transport::Tls(files) => {
                let mut tls = ClientTlsConfig::new()
                    .ca_certificate(Certificate::from_pem(&files.ca))
                    .identity(Identity::from_pem(&files.cert, &files.key));
                if let Some(id) = node {
                    tls = tls.domain_name(format!("node-{id}"));
                }
                Endpoint::from_shared(format!("https://{addr}"))
                    .and_then(|e| e.tls_config(tls))
                    .map_err(connect_err)
            }
        }
    }

    /// The server's TLS: its certificate, and a client certificate of the authority
    /// required of every peer. `None` for plaintext.
    pub(crate) fn server_tls(&self) -> Option<ServerTlsConfig> {
        match self {
            Transport::Plaintext => None,
            Transport::Tls(files) => Some(
                ServerTlsConfig::new()
                    .identity(Identity::from_pem(&files.cert, &files.key))
                    .client_ca_root(Certificate::from_pem(&files.ca)),
            ),
        }
    }
}

/// Who sent a request, as the server knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Peer {
    /// Anyone who reaches a plaintext (loopback) port: trusted as a node and as a
    /// client with every path the node serves.
    Plaintext,
    /// A node's certificate.
    Node(u16),
    /// A client's certificate and the paths it grants.
    Client { name: String, paths: Vec<PathBuf> },
}

/// What a job's client may touch ([`super::LookupHandler::job`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Grants {
    /// Every path the node serves (a plaintext, loopback port).
    Served,
    /// Only beneath these (and beneath a path the node serves).
    Paths(Vec<PathBuf>),
}

impl Peer {
    /// The peer of a request on a port served with `transport`; a TLS request whose
    /// certificate names no larder node or client is refused.
    pub(crate) fn of<T>(
        transport: &Transport,
        request: &tonic::Request<T>,
    ) -> Result<Peer, tonic::Status> {
        if let Transport::Plaintext = transport {
            return Ok(Peer::Plaintext);
        }
        let certs = request.peer_certs();
        let role = certs
            .as_ref()
            .and_then(|certs| certs.first())
            .and_then(|leaf| peer_role(leaf));
        match role {
            Some(Role::Node(id)) => Ok(Peer::Node(id)),
            Some(Role::Client { name, paths }) => Ok(Peer::Client { name, paths }),
            None => Err(tonic::Status::permission_denied(
                "the peer's certificate names no larder node or client",
            )),
        }
    }

    /// Refuses a peer that is not a node: only nodes look up, acknowledge and get.
    pub(crate) fn require_node(&self, call: &str) -> Result<Option<u16>, tonic::Status> {
        match self {
            Peer::Plaintext => Ok(None),
            Peer::Node(id) => Ok(Some(*id)),
            Peer::Client { name, .. } => Err(tonic::Status::permission_denied(format!(
                "{call} is for nodes; client {name} may only run jobs"
            ))),
        }
    }

    /// A job's grants; refuses a peer that is not a client.
    pub(crate) fn require_client(&self) -> Result<Grants, tonic::Status> {
        match self {
            Peer::Plaintext => Ok(Grants::Served),
            Peer::Client { paths, .. } => Ok(Grants::Paths(paths.clone())),
            Peer::Node(id) => Err(tonic::Status::permission_denied(format!(
                "jobs are for clients; node {id}'s certificate runs none"
            ))),
        }
    }
}

/// Refuses a message claiming to come from node `from` on a stream whose certificate
/// names node `peer` (`None`: a plaintext port, where no one is named).
pub(crate) fn check_from(peer: Option<u16>, from: u16) -> Result<(), RpcError> {
    match peer {
        Some(peer) if peer != from => Err(RpcError::PermissionDenied(format!(
            "a message from node {from} on the connection of node {peer}'s certificate"
        ))),
        _ => Ok(()),
    }
}
