//! larder's exact deduplication cluster (docs/design/cluster.md): the chunk index split
//! into fingerprint partitions, each owned by one node at a time, coordinated through
//! etcd; nodes look fingerprints up at their owners in batches over gRPC, and chunk
//! data stays on the node that received it.

pub mod coord;
