//! The node-to-node lookup protocol over gRPC (tonic): docs/design/cluster.md,
//! "Lookups (gRPC, tonic)". A receiving node sends each owner node one lookup message
//! per request batch over one long-lived bidirectional stream, with many batches in
//! flight; the owner answers each with one message. The owner's logic (partitions,
//! lock on new) sits behind [`LookupHandler`]; this module only moves messages.
//!
//! - [`codec`]: the packed byte layouts (pure).
//! - [`server`]: [`LookupServer`], serving a [`LookupHandler`].
//! - [`client`]: [`NodeClient`], one connection to one node.

pub mod client;
pub mod codec;
pub mod server;
pub mod transport;

use std::future::Future;

use larder_hash::Fingerprint;
use larder_index::ChunkLocation;

pub use client::{ClientStats, JobClient, NodeClient};
pub use server::{LookupServer, NodeService, NodeStats};
pub use transport::{Grants, Peer, Transport};

/// The messages and service generated from `proto/cluster.proto`.
pub mod proto {
    tonic::include_proto!("larder.cluster.v1");
}

/// The largest encoded message either side sends or accepts: 16 MiB, so a lookup
/// carries at most 524,287 fingerprints (a receiving node's batch is far smaller).
pub const MAX_MESSAGE_BYTES: usize = 16 << 20;

/// The most fingerprints one lookup or get message may carry under `MAX_MESSAGE_BYTES`
/// (a few bytes are left for the message's other fields).
pub const MAX_FINGERPRINTS_PER_MESSAGE: usize = MAX_MESSAGE_BYTES / codec::FINGERPRINT_BYTES - 1;

/// The most entries one Ack may carry under `MAX_MESSAGE_BYTES`.
pub const MAX_ENTRIES_PER_ACK: usize = MAX_MESSAGE_BYTES / codec::ENTRY_BYTES - 1;

/// An owner's answer for one fingerprint of a lookup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// Indexed: the chunk is stored at this location.
    Known(ChunkLocation),
    /// Not indexed: the owner locked it for this requester, which stores the chunk and
    /// acknowledges it ([`NodeClient::ack`]); other requesters wait for that.
    New,
    /// This node does not own the fingerprint's partition now: retry after the
    /// partition map catches up.
    Moved,
}

/// An owner's answer for one fingerprint of a get (restore): no locking, so never new.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GetAnswer {
    Known(ChunkLocation),
    /// Not indexed (or locked and not yet acknowledged).
    Absent,
    Moved,
}

/// The partition owner's logic, which the server calls. Every future must be
/// cancel-safe: a server that shuts down drops the futures still running.
pub trait LookupHandler: Send + Sync + 'static {
    /// Answers `fps` for node `from`, in order, one answer per fingerprint. May wait (a
    /// fingerprint locked by another requester waits for its Ack or lock timeout): the
    /// future resolves when every answer is known.
    fn lookup(
        &self,
        from: u16,
        fps: Vec<Fingerprint>,
    ) -> impl Future<Output = Result<Vec<Answer>, RpcError>> + Send;

    /// Records that `from` stored these chunks (fingerprints it was answered `New`
    /// for) at these locations, and unlocks them; resolves once they are durable.
    fn ack(
        &self,
        from: u16,
        entries: Vec<(Fingerprint, ChunkLocation)>,
    ) -> impl Future<Output = Result<(), RpcError>> + Send;

    /// Answers `fps` without locking, in order, one answer per fingerprint.
    fn get(
        &self,
        fps: Vec<Fingerprint>,
    ) -> impl Future<Output = Result<Vec<GetAnswer>, RpcError>> + Send;

    /// Runs a client's job over the paths `grants` allows it and answers its JSON
    /// summary. A handler that serves only lookups refuses every job.
    fn job(
        &self,
        job: Job,
        grants: Grants,
    ) -> impl Future<Output = Result<String, RpcError>> + Send {
        let _ = grants;
        std::future::ready(Err(RpcError::Handler {
            message: format!("this node runs no jobs ({job:?})"),
            retryable: false,
        }))
    }
}

/// A client's job for a node ([`LookupHandler::job`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Job {
    /// Back these paths (on the node's file system) up into the node's repository.
    Backup { paths: Vec<String> },
    /// Restore any node's snapshot (an id prefix, or `latest`) into `target` on the
    /// node's file system.
    Restore { snapshot: String, target: String },
    /// Every node's snapshots.
    Snapshots,
}

impl Job {
    /// The job as its message carries it.
    pub fn encode(&self) -> (String, Vec<String>) {
        match self {
            Job::Backup { paths } => ("backup".into(), paths.clone()),
            Job::Restore { snapshot, target } => {
                ("restore".into(), vec![snapshot.clone(), target.clone()])
            }
            Job::Snapshots => ("snapshots".into(), Vec::new()),
        }
    }

    /// The job a message names; `None` for an unknown kind or the wrong arguments.
    pub fn decode(kind: &str, mut args: Vec<String>) -> Option<Job> {
        match (kind, args.len()) {
            ("backup", n) if n > 0 => Some(Job::Backup { paths: args }),
            ("restore", 2) => {
                let target = args.pop()?;
                let snapshot = args.pop()?;
                Some(Job::Restore { snapshot, target })
            }
            ("snapshots", 0) => Some(Job::Snapshots),
            _ => None,
        }
    }
}

/// Errors of the lookup protocol, on either side.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RpcError {
    /// The node cannot be reached; retryable (it may be starting, or gone: then the
    /// partition map moves its partitions).
    #[error("cannot connect to node at {addr}: {source}")]
    Connect {
        addr: String,
        #[source]
        source: tonic::transport::Error,
    },
    /// The connection or stream to a node broke; the requests in flight on it were not
    /// answered. Retryable: resend them through the partition map.
    #[error("connection to node at {addr} lost: {reason}; requests in flight were not answered, retry them through the partition map")]
    ConnectionLost { addr: String, reason: String },
    /// Bytes a peer sent do not decode (a length that is not a multiple of the packed
    /// size, a kind byte out of range, a count that does not match); permanent.
    #[error("malformed {what}: {reason}")]
    Malformed { what: &'static str, reason: String },
    /// A node id outside 1..=65535; permanent.
    #[error("invalid node id {0}: node ids are 1..=65535")]
    InvalidNode(u32),
    /// A request with more fingerprints than one message may carry; permanent.
    #[error("{count} entries in one message, at most {max} fit")]
    TooLarge { count: usize, max: usize },
    /// The node answered this request with an error (its handler failed or rejected
    /// it); the stream stays usable.
    #[error("node at {addr} refused the request: {message}")]
    Refused {
        addr: String,
        message: String,
        retryable: bool,
    },
    /// A unary call failed with this gRPC status.
    #[error("gRPC call to node at {addr} failed: {status}")]
    Status {
        addr: String,
        status: Box<tonic::Status>,
    },
    /// The peer may not make this request: a client on a node's call, a node on a
    /// client's, or a message whose `from_node` is not its certificate's node.
    #[error("permission denied: {0}")]
    PermissionDenied(String),
    /// Plaintext to or on an address that is not loopback.
    #[error("plaintext is only for loopback addresses, and {addr} is not one: give the node and its clients the cluster's certificates (--tls DIR)")]
    Insecure { addr: String },
    /// The handler (the partition owner's logic) failed; `retryable` says whether the
    /// same request may succeed later (the owner is busy, or its partition is moving).
    #[error("lookup handler: {message}")]
    Handler { message: String, retryable: bool },
}

impl RpcError {
    /// Whether the same request may succeed if sent again (possibly to another owner).
    pub fn is_retryable(&self) -> bool {
        match self {
            RpcError::Connect { .. } | RpcError::ConnectionLost { .. } => true,
            RpcError::Refused { retryable, .. } | RpcError::Handler { retryable, .. } => *retryable,
            RpcError::Status { status, .. } => matches!(
                status.code(),
                tonic::Code::Unavailable
                    | tonic::Code::ResourceExhausted
                    | tonic::Code::DeadlineExceeded
                    | tonic::Code::Aborted
            ),
            RpcError::Malformed { .. }
            | RpcError::InvalidNode(_)
            | RpcError::TooLarge { .. }
            | RpcError::PermissionDenied(_)
            | RpcError::Insecure { .. } => false,
        }
    }
}

/// `from` as a node id, if it is one (1..=65535).
pub(crate) fn node_id(from: u32) -> Result<u16, RpcError> {
    match u16::try_from(from) {
        Ok(id) if id != 0 => Ok(id),
        _ => Err(RpcError::InvalidNode(from)),
    }
}
