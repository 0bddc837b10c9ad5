//! A cluster's certificates for the in-process tests (`larder_cluster::tls`, as `larder
//! cluster cert` makes them), in a temporary directory: the authorities, nodes 1 to
//! `nodes` (127.0.0.1), a client granted the system's temporary directory (where the
//! tests' sources and restore targets are), with an etcd certificate, and the etcd
//! members'.

use std::path::PathBuf;
use std::sync::Arc;

use larder_cluster::coord::EtcdOptions;
use larder_cluster::node::NodeOptions;
use larder_cluster::rpc::Transport;
use larder_cluster::served::Served;
use larder_cluster::tls::{self, TlsFiles};

use super::etcd::EtcdTls;

pub struct Certs {
    dir: tempfile::TempDir,
}

impl Certs {
    pub fn issue(nodes: u16) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let ca = dir.path().join("ca");
        tls::create_authority(&ca).unwrap();
        let here = ["127.0.0.1".to_string()];
        for id in 1..=nodes {
            tls::issue_node(&ca, id, &here, &dir.path().join(format!("node-{id}"))).unwrap();
        }
        let granted = [std::env::temp_dir()];
        tls::issue_client(&ca, "tester", &granted, true, &dir.path().join("client")).unwrap();
        tls::issue_etcd(&ca, "etcd", &here, &dir.path().join("etcd")).unwrap();
        Self { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// What `EtcdCluster::start_tls` takes.
    pub fn etcd(&self) -> EtcdTls {
        EtcdTls {
            member: self.path("etcd"),
            client: self.path("client"),
        }
    }

    /// etcd reached with the client's (an administrator's) certificate.
    pub fn etcd_options(&self) -> EtcdOptions {
        EtcdOptions {
            tls: Some(Arc::new(
                TlsFiles::etcd(&self.path("client")).unwrap().unwrap(),
            )),
            ..EtcdOptions::default()
        }
    }

    /// The client's transport: jobs over the temporary directory.
    pub fn client(&self) -> Transport {
        Transport::Tls(Arc::new(TlsFiles::larder(&self.path("client")).unwrap()))
    }

    /// Node `id`'s transport: its certificate (a router acting as that node).
    pub fn node(&self, id: u16) -> Transport {
        let dir = self.path(&format!("node-{id}"));
        Transport::Tls(Arc::new(TlsFiles::larder(&dir).unwrap()))
    }

    /// Node `options.id` with its certificate, for its port and for etcd, serving the
    /// temporary directory.
    pub fn secure(&self, mut options: NodeOptions) -> NodeOptions {
        let dir = self.path(&format!("node-{}", options.id));
        options.transport = self.node(options.id);
        options.etcd_options = EtcdOptions {
            tls: Some(Arc::new(TlsFiles::etcd(&dir).unwrap().unwrap())),
            ..EtcdOptions::default()
        };
        options.served = Served::new(vec![std::env::temp_dir()]).unwrap();
        options
    }
}
