//! Helpers shared by the cluster's integration tests.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::Path;

use larder_cluster::coord::{ClusterConfig, COORD_FORMAT_VERSION};
use larder_cluster::node::{init_cluster, EtcdTarget, Node};
use larder_cluster::rpc::{Job, JobClient};
use larder_index::disk::DiskIndexConfig;

pub mod certs;
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

/// Deterministic pseudo-random bytes, different per seed.
pub fn bytes(seed: u64, len: usize) -> Vec<u8> {
    larder_gen::seeded_bytes(seed, len)
}

/// Makes a plaintext cluster of `partitions` partitions (fastcdc2020, blake3) under
/// `prefix` in `etcd`, as the administrator of `certs`.
pub async fn init_plain_cluster(
    etcd: &etcd::EtcdCluster,
    prefix: &str,
    certs: &certs::Certs,
    partitions: u32,
) {
    let config = ClusterConfig {
        format_version: COORD_FORMAT_VERSION,
        partitions,
        chunking: "fastcdc2020".into(),
        hash: "blake3".into(),
        encryption: None,
    };
    let target = EtcdTarget {
        endpoints: etcd.endpoints(),
        prefix: prefix.into(),
        options: certs.etcd_options(),
    };
    init_cluster(&target, &config).await.unwrap();
}

/// Runs `job` on `node` as the client of `certs` and returns its JSON answer.
pub async fn job(node: &Node, certs: &certs::Certs, job: Job) -> serde_json::Value {
    let client = JobClient::connect(&node.addr.to_string(), &certs.client())
        .await
        .unwrap();
    serde_json::from_str(&client.job(&job).await.unwrap()).unwrap()
}

/// Every regular file under `root`, by relative path, with its content.
pub fn files(root: &Path) -> BTreeMap<String, Vec<u8>> {
    plaintext::stored_files(root)
        .into_iter()
        .map(|path| {
            let rel = path.strip_prefix(root).unwrap().display().to_string();
            (rel, std::fs::read(&path).unwrap())
        })
        .collect()
}
