//! The one error type of the cluster crate.

use larder_index::IndexError;
use larder_store::StoreError;

use crate::coord::CoordError;
use crate::rpc::RpcError;

use crate::ids::PartitionId;

/// What went wrong in a cluster operation.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClusterError {
    /// A partition's disk index failed; `Io` ones may succeed when retried.
    #[error("partition {}: {source}", partition.0)]
    Index {
        partition: PartitionId,
        #[source]
        source: IndexError,
    },
    /// A cluster file failed: a partition's record of what it covers, its writer lock.
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    /// Bytes of a cluster file that do not decode.
    #[error("corrupt {what}: {reason}")]
    Corrupt { what: String, reason: String },
    /// A node repository or the shared storage failed; `Io` ones may succeed when
    /// retried.
    #[error("{what}: {source}")]
    Store {
        what: String,
        #[source]
        source: StoreError,
    },
    /// One of the node's tasks stopped without finishing (it panicked or was
    /// cancelled).
    #[error("{what} stopped: {reason}")]
    Task { what: String, reason: String },
    /// etcd holds no cluster under this prefix.
    #[error("no cluster under {prefix} in etcd: run `larder cluster init` first")]
    Uninitialised { prefix: String },
    /// A watch of etcd ended (its connection dropped): the node leaves the cluster
    /// and joins again (node.rs, `stay_member`).
    #[error("{0} ended")]
    WatchEnded(String),
    /// Coordination through etcd failed.
    #[error(transparent)]
    Coord(#[from] CoordError),
    /// The lookup protocol failed.
    #[error(transparent)]
    Rpc(#[from] RpcError),
    /// This node's member lease may have expired (etcd unreachable, without quorum,
    /// or it expired the lease): it stopped serving its partitions, which the master
    /// may already have given to others, and joins again with a new lease.
    #[error("the node's lease in etcd was lost (etcd unreachable or without quorum)")]
    LeaseLost,
    /// The owner dropped a request without answering it (a bug, or a shutdown).
    #[error("the owner dropped a lookup request unanswered")]
    Dropped,
    /// A newer owner took the partition over: this owner must not write it any more.
    #[error("partition {}: fenced (epoch {epoch}, a newer owner holds epoch {newer})", partition.0)]
    Fenced {
        partition: PartitionId,
        epoch: u64,
        newer: u64,
    },
    /// This node does not own the partition (any more): ask its owner.
    #[error("partition {} is not owned by this node", .0.0)]
    NotOwner(PartitionId),
    /// The cluster's key: missing, not opened by the password, or not this cluster's.
    #[error("{0}")]
    Key(String),
    /// A lookup or an acknowledgement this owner does not take from its sender: the
    /// sender is not a member, acknowledges a lock another member holds, or names a
    /// location outside its own containers. Nothing was changed.
    #[error("refused node {from}'s {what}: {reason}")]
    Refused {
        from: u16,
        what: &'static str,
        reason: String,
        /// Whether it may be taken later: a member the owner's view has not seen
        /// join yet, a lock its holder may still acknowledge (or let expire).
        retryable: bool,
    },
    /// The cluster's certificates: missing, unreadable, or refused (plaintext off
    /// loopback).
    #[error("{0}")]
    Tls(String),
}

impl ClusterError {
    /// Whether the same call may succeed later (or at the partition's next owner).
    pub fn is_retryable(&self) -> bool {
        match self {
            ClusterError::Index { source, .. } => source.is_retryable(),
            ClusterError::Io { .. }
            | ClusterError::Dropped
            | ClusterError::NotOwner(_)
            | ClusterError::WatchEnded(_) => true,
            ClusterError::Store { source, .. } => source.is_retryable(),
            ClusterError::Refused { retryable, .. } => *retryable,
            ClusterError::Coord(e) => e.is_retryable(),
            ClusterError::Rpc(e) => e.is_retryable(),
            ClusterError::Corrupt { .. }
            | ClusterError::Task { .. }
            | ClusterError::Uninitialised { .. }
            | ClusterError::Key(_)
            | ClusterError::Tls(_)
            | ClusterError::LeaseLost
            | ClusterError::Fenced { .. } => false,
        }
    }
}

pub type Result<T, E = ClusterError> = std::result::Result<T, E>;
