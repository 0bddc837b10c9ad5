//! larder's exact deduplication cluster (docs/design/cluster.md): the chunk index split
//! into fingerprint partitions, each owned by one node at a time, coordinated through
//! etcd; nodes look fingerprints up at their owners in batches over gRPC, and chunk
//! data stays on the node that received it.

pub mod balance;
pub mod coord;
mod error;
pub mod ids;
pub mod jobs;
pub mod key;
pub mod model;
pub mod node;
pub mod owner;
pub mod partitions;
pub mod router;
pub mod rpc;
pub mod served;
pub mod service;
pub mod storage;
pub mod tls;
pub mod view;

pub use error::{ClusterError, Result};
pub use ids::{partition_of, NodeId, PartitionId, DEFAULT_PARTITIONS};
pub use owner::{Owner, OwnerMetrics, Ticket};
pub use rpc::Answer;
pub use storage::SharedStorage;
