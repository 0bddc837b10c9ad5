//! Helpers shared by the cluster's integration tests.

#![allow(dead_code)]

pub mod containers;
pub mod etcd;
