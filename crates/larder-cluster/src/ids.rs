//! Node and partition ids: which partition a fingerprint falls in, and which node a
//! container id names (docs/design/cluster.md, "Partitions").

use larder_hash::Fingerprint;

/// A cluster node's identity, 1 to 65535 (0 is reserved: "no node").
pub type NodeId = u16;

/// One of the cluster's fingerprint partitions, `0..count`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PartitionId(pub u32);

/// The partitions a cluster has unless `larder cluster init` says otherwise: far more
/// than nodes, so that a node's share moves in small steps.
pub const DEFAULT_PARTITIONS: u32 = 1024;

/// The partition of `fp` among `count`: its bytes 8..16 as a little-endian `u64`, modulo
/// `count`. Independent of the bytes the disk index uses for its buckets (0..8) and
/// Bloom filter, so that a partition's fingerprints still spread over its buckets.
pub fn partition_of(fp: &Fingerprint, count: u32) -> PartitionId {
    debug_assert!(count > 0);
    let w1 = u64::from_le_bytes(fp.as_bytes()[8..16].try_into().expect("8 bytes"));
    PartitionId((w1 % u64::from(count)) as u32)
}

/// Bits of a container id below the writer node's id: a node numbers its containers
/// `node << CONTAINER_NODE_SHIFT | sequence`, so that containers written by different
/// nodes into shared storage never collide, and a location names its writer.
pub const CONTAINER_NODE_SHIFT: u32 = 48;

/// The first container id of `node`'s range.
pub fn first_container(node: NodeId) -> u64 {
    u64::from(node) << CONTAINER_NODE_SHIFT
}

/// The node that wrote container `id`.
pub fn container_writer(id: u64) -> NodeId {
    (id >> CONTAINER_NODE_SHIFT) as NodeId
}

#[cfg(test)]
mod tests {
    use larder_hash::HashAlgo;

    use super::*;

    #[test]
    fn partitions_spread_evenly_and_containers_name_their_writer() {
        let count = 64;
        let mut per = vec![0u32; count as usize];
        for i in 0..64_000u64 {
            let fp = HashAlgo::Blake3.fingerprint(&i.to_le_bytes());
            per[partition_of(&fp, count).0 as usize] += 1;
        }
        // 1000 expected each; 6 standard deviations is ~190.
        assert!(per.iter().all(|&n| (810..1190).contains(&n)), "{per:?}");
        assert_eq!(container_writer(first_container(7) + 12345), 7);
        assert_eq!(container_writer(first_container(65535) + 1), 65535);
    }
}
