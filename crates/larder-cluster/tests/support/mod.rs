//! Helpers shared by the cluster's integration tests.

#![allow(dead_code)]

pub mod containers;
pub mod etcd;
#[path = "../../../larder-store/tests/support/s3s.rs"]
pub mod s3s;
