//! A cluster's certificates for a test, issued by `larder cluster cert` into a
//! directory of the test's own: the authorities, each node's (for 127.0.0.1), an
//! administrator's (a client with an etcd certificate: `cluster init|status`), an
//! etcd member's, and clients' on demand. Each `*_flags` is what a command adds to
//! reach the cluster with that certificate.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::LARDER;

#[derive(Clone)]
pub struct ClusterCerts {
    root: PathBuf,
}

fn cert(args: &[&str]) {
    let out = Command::new(LARDER)
        .args(["cluster", "cert"])
        .args(args)
        .output()
        .expect("run larder cluster cert");
    assert!(
        out.status.success(),
        "larder cluster cert {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

impl ClusterCerts {
    /// Issues the authorities, node certificates for `nodes`, the administrator's and
    /// an etcd member's into `root` (created).
    pub fn issue(root: &Path, nodes: &[u16]) -> Self {
        let certs = Self {
            root: root.to_path_buf(),
        };
        let ca = certs.ca();
        cert(&["ca", "--out", ca.to_str().unwrap()]);
        for &id in nodes {
            let out = certs.node(id);
            cert(&[
                "node",
                "--ca",
                ca.to_str().unwrap(),
                "--id",
                &id.to_string(),
                "--address",
                "127.0.0.1",
                "--out",
                out.to_str().unwrap(),
            ]);
        }
        cert(&[
            "client",
            "--ca",
            ca.to_str().unwrap(),
            "--name",
            "admin",
            "--etcd",
            "--out",
            certs.admin().to_str().unwrap(),
        ]);
        cert(&[
            "etcd",
            "--ca",
            ca.to_str().unwrap(),
            "--name",
            "etcd",
            "--address",
            "127.0.0.1",
            "--out",
            certs.etcd_member().to_str().unwrap(),
        ]);
        certs
    }

    /// The authorities' directory (its keys are what a test attacker must not have).
    pub fn ca(&self) -> PathBuf {
        self.root.join("ca")
    }

    /// Node `id`'s directory (`--tls`).
    pub fn node(&self, id: u16) -> PathBuf {
        self.root.join(format!("node-{id}"))
    }

    pub fn node_flags(&self, id: u16) -> Vec<String> {
        flags(&self.node(id))
    }

    /// The administrator's directory: a client without paths, with etcd's certificate.
    pub fn admin(&self) -> PathBuf {
        self.root.join("admin")
    }

    pub fn admin_flags(&self) -> Vec<String> {
        flags(&self.admin())
    }

    /// The etcd members' directory (`etcd-ca.crt`, `etcd.crt`, `etcd.key`).
    pub fn etcd_member(&self) -> PathBuf {
        self.root.join("etcd")
    }

    /// Issues client `name`'s certificate granting `paths`; its flags.
    pub fn client_flags(&self, name: &str, paths: &[&Path]) -> Vec<String> {
        let out = self.root.join(format!("client-{name}"));
        let ca = self.ca();
        let mut args = vec![
            "client".to_string(),
            "--ca".into(),
            ca.display().to_string(),
            "--name".into(),
            name.into(),
            "--out".into(),
            out.display().to_string(),
        ];
        for path in paths {
            args.extend(["--path".to_string(), path.display().to_string()]);
        }
        cert(&args.iter().map(String::as_str).collect::<Vec<_>>());
        flags(&out)
    }
}

fn flags(dir: &Path) -> Vec<String> {
    vec!["--tls".into(), dir.display().to_string()]
}
