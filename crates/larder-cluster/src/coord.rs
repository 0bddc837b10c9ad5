//! Coordination through etcd (docs/design/cluster.md, "Coordination (etcd)"): the
//! retrying client, membership through leases, master election, and the
//! partition-to-node map with its epochs. Coordination data only; no chunk data.

pub mod auth;
mod client;
mod election;
mod map;
mod membership;

pub use client::{Etcd, EtcdOptions};
pub use election::{Election, Leadership};
pub use map::{
    Assignment, ClusterConfig, ClusterEncryption, MapCache, PartitionMap, PartitionMapStore,
    COORD_FORMAT_VERSION, MAX_TXN_OPS, MOVES_PER_TXN,
};
pub use membership::{Member, MemberEvent, Membership, MembershipOptions};

/// Errors of the coordination layer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CoordError {
    /// Every attempt failed with a retryable error (etcd down, no quorum, timeouts):
    /// retrying later may succeed.
    #[error(
        "etcd {operation}: no answer after retries from endpoints {endpoints:?}: {last_error}"
    )]
    Unavailable {
        operation: String,
        endpoints: Vec<String>,
        last_error: String,
    },
    /// etcd refused the request for a reason another attempt would not change.
    #[error("etcd {operation} failed (endpoints {endpoints:?}): {source}")]
    Etcd {
        operation: String,
        endpoints: Vec<String>,
        #[source]
        source: etcd_client::Error,
    },
    /// A guarded write found the writer no longer master (its election key is gone).
    #[error("not the master any more: election key {key} no longer exists at revision {revision}")]
    NotMaster { key: String, revision: i64 },
    /// The cluster was initialized with other parameters.
    #[error("cluster already initialized with other parameters: stored {stored}, asked {asked}")]
    ConfigMismatch { stored: String, asked: String },
    /// A value in etcd that this code did not write, or wrote in another format.
    #[error("malformed value at {key}: {detail}")]
    Malformed { key: String, detail: String },
    /// Bad arguments or options.
    #[error("invalid coordination setting: {0}")]
    Config(String),
}

impl CoordError {
    /// Whether the same call may succeed later (etcd unavailable), as opposed to a
    /// refusal that stays (lost mastership, a conflicting config, malformed data).
    pub fn is_retryable(&self) -> bool {
        matches!(self, CoordError::Unavailable { .. })
    }
}

/// Unix time in milliseconds, for `Member::started`.
fn unix_millis() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
