"""The cluster scripts' certificates (docs/design/cluster.md, "Security"): `larder
cluster cert` issues the authorities, each node's certificate (127.0.0.1), one
client's (granted the paths the nodes serve, with an etcd certificate: it also runs
`cluster init` and `cluster status`) and the etcd members', into DIR. Imported by
scripts/cluster-kill and scripts/cluster-scaling (their directory is on sys.path).
"""
import os, subprocess


class Certs:
    def __init__(self, larder, dir, paths):
        self.larder, self.dir, self.paths = larder, dir, [os.path.realpath(p) for p in paths]
        self.cert("ca", "--out", f"{dir}/ca")
        grants = [a for p in self.paths for a in ("--path", p)]
        self.cert("client", "--ca", f"{dir}/ca", "--name", "admin", "--etcd", *grants,
                  "--out", f"{dir}/client")
        self.cert("etcd", "--ca", f"{dir}/ca", "--name", "etcd", "--address", "127.0.0.1",
                  "--out", f"{dir}/etcd")

    def cert(self, *args):
        subprocess.run([self.larder, "-q", "cluster", "cert", *args], check=True)

    def node(self, n):
        """`larder node` flags of node n (its certificate issued on first use), serving
        the client's paths."""
        out = f"{self.dir}/node-{n}"
        if not os.path.exists(out):
            self.cert("node", "--ca", f"{self.dir}/ca", "--id", str(n), "--address", "127.0.0.1",
                      "--out", out)
        return ["--tls", out], [a for p in self.paths for a in ("--serve", p)]

    def client(self):
        """The flags of clients and of `cluster init|status`."""
        return ["--tls", f"{self.dir}/client"]

    def etcd_member(self):
        """An etcd member's flags: client and peer certificates required."""
        d = f"{self.dir}/etcd"
        return [f for prefix in ("", "peer-") for f in (
            f"--{prefix}client-cert-auth", f"--{prefix}trusted-ca-file", f"{d}/etcd-ca.crt",
            f"--{prefix}cert-file", f"{d}/etcd.crt", f"--{prefix}key-file", f"{d}/etcd.key")]

    def etcdctl(self):
        d = f"{self.dir}/client"
        return ["--cacert", f"{d}/etcd-ca.crt", "--cert", f"{d}/etcd.crt", "--key", f"{d}/etcd.key"]
