//! Helpers shared by the cluster's integration tests.

#![allow(dead_code)]

use larder_index::disk::DiskIndexConfig;

pub mod containers;
pub mod etcd;
pub mod plaintext;
#[path = "../../../larder-store/tests/support/s3s.rs"]
pub mod s3s;

/// A partition index small enough for tests of a few thousand fingerprints.
pub fn small_index() -> DiskIndexConfig {
    DiskIndexConfig {
        memory_budget: 64 << 10,
        expected_fingerprints: 2000,
        buffered_chunk_bytes: 64,
        ..DiskIndexConfig::default()
    }
}
