//! Helpers shared by the cluster's integration tests.

pub mod etcd;
