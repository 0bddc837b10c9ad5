//! `EtcdCluster`: a real etcd cluster of 1 or 3 members on 127.0.0.1 for tests, with
//! data directories in a temporary directory (in `/dev/shm` when there is one: etcd
//! 3.4 has no `--unsafe-no-fsync`, and fsyncs on tmpfs cost nothing). Every member
//! process is killed when the cluster is dropped, or by a watchdog shell (which also
//! removes the data) within a second of the test process dying without dropping it.
//!
//! Do not run these tests under `chrt -f` (the timing wrapper of the house rules):
//! etcd's spinning goroutines at real-time priority starve the machine; a run of
//! tests/coord.rs under `flock … chrt -f 10` hung for 12 minutes.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How long a member may take to answer with a leader after (re)starting.
const START_TIMEOUT: Duration = Duration::from_secs(30);

struct EtcdMember {
    name: String,
    /// `https` when the cluster runs with TLS, else `http`.
    scheme: &'static str,
    client_port: u16,
    peer_port: u16,
    child: Option<Child>,
    /// Kills `child` if the test process dies without dropping the cluster (a test
    /// binary killed by a timeout): without it, orphaned etcd processes keep running.
    watchdog: Option<Child>,
}

impl EtcdMember {
    fn client_url(&self) -> String {
        format!("{}://127.0.0.1:{}", self.scheme, self.client_port)
    }

    fn peer_url(&self) -> String {
        format!("{}://127.0.0.1:{}", self.scheme, self.peer_port)
    }
}

pub struct EtcdCluster {
    binary: PathBuf,
    dir: tempfile::TempDir,
    token: String,
    members: Vec<EtcdMember>,
    tls: Option<EtcdTls>,
}

/// An etcd cluster's certificates (`larder cluster cert`): every member's (for
/// 127.0.0.1, as server and peer), and a client's that probes the members.
#[derive(Clone)]
pub struct EtcdTls {
    /// `etcd-ca.crt`, `etcd.crt`, `etcd.key` of the members.
    pub member: PathBuf,
    /// A directory with an etcd client certificate (`etcd.crt`, ...).
    pub client: PathBuf,
}

impl EtcdTls {
    fn files(dir: &Path) -> [PathBuf; 3] {
        ["etcd-ca.crt", "etcd.crt", "etcd.key"].map(|name| dir.join(name))
    }
}

/// `/usr/bin/etcd`, else `etcd` on PATH; panics with the way to install it.
fn etcd_binary() -> PathBuf {
    let standard = PathBuf::from("/usr/bin/etcd");
    if standard.is_file() {
        return standard;
    }
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            let candidate = dir.join("etcd");
            if candidate.is_file() {
                return candidate;
            }
        }
    }
    panic!(
        "etcd not found (neither /usr/bin/etcd nor etcd on PATH): the cluster tests need a \
         real etcd; scripts/test installs it (Debian package etcd-server)"
    );
}

/// `count` distinct free ports: all bound at once, then released for etcd to take.
fn free_ports(count: usize) -> Vec<u16> {
    let listeners: Vec<TcpListener> = (0..count)
        .map(|_| TcpListener::bind("127.0.0.1:0").expect("bind a free port"))
        .collect();
    listeners
        .iter()
        .map(|l| l.local_addr().expect("local address").port())
        .collect()
}

fn scratch_dir() -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        if let Ok(dir) = tempfile::Builder::new()
            .prefix("larder-etcd-")
            .tempdir_in(shm)
        {
            return dir;
        }
    }
    tempfile::Builder::new()
        .prefix("larder-etcd-")
        .tempdir()
        .expect("create a temporary directory")
}

impl EtcdCluster {
    /// Starts `members` (1 or 3) etcd members and waits until each answers with a
    /// leader. Retries with fresh ports if a member exits at start (a port taken
    /// between choosing it and etcd binding it).
    pub async fn start(members: usize) -> Self {
        Self::start_with(members, None).await
    }

    /// As `start`, with every member requiring a client certificate of `tls`'s
    /// authority (`--client-cert-auth`, peers too): a client without one is refused.
    pub async fn start_tls(members: usize, tls: EtcdTls) -> Self {
        Self::start_with(members, Some(tls)).await
    }

    async fn start_with(members: usize, tls: Option<EtcdTls>) -> Self {
        assert!(members == 1 || members == 3, "1 or 3 etcd members");
        let binary = etcd_binary();
        let mut last_failure = String::new();
        for _ in 0..3 {
            let mut cluster = Self::spawn(binary.clone(), members, tls.clone());
            let all: Vec<usize> = (0..members).collect();
            match cluster.wait_healthy(&all).await {
                Ok(()) => return cluster,
                Err(failure) => last_failure = failure,
            }
        }
        panic!("etcd cluster did not start: {last_failure}");
    }

    fn spawn(binary: PathBuf, count: usize, tls: Option<EtcdTls>) -> Self {
        static CLUSTERS: AtomicU64 = AtomicU64::new(0);
        let ports = free_ports(2 * count);
        let members: Vec<EtcdMember> = (0..count)
            .map(|i| EtcdMember {
                name: format!("m{i}"),
                scheme: if tls.is_some() { "https" } else { "http" },
                client_port: ports[2 * i],
                peer_port: ports[2 * i + 1],
                child: None,
                watchdog: None,
            })
            .collect();
        let token = format!(
            "larder-test-{}-{}",
            std::process::id(),
            CLUSTERS.fetch_add(1, Ordering::Relaxed)
        );
        let mut cluster = Self {
            binary,
            dir: scratch_dir(),
            token,
            members,
            tls,
        };
        for i in 0..count {
            cluster.launch(i);
        }
        cluster
    }

    fn launch(&mut self, index: usize) {
        let initial_cluster = self
            .members
            .iter()
            .map(|m| format!("{}={}", m.name, m.peer_url()))
            .collect::<Vec<_>>()
            .join(",");
        let member = &self.members[index];
        let data_dir = self.dir.path().join(&member.name);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join(format!("{}.log", member.name)))
            .expect("open the etcd log");
        let mut command = Command::new(&self.binary);
        if let Some(tls) = &self.tls {
            let [ca, cert, key] = EtcdTls::files(&tls.member);
            for prefix in ["", "peer-"] {
                command
                    .arg(format!("--{prefix}client-cert-auth"))
                    .arg(format!("--{prefix}trusted-ca-file"))
                    .arg(&ca)
                    .arg(format!("--{prefix}cert-file"))
                    .arg(&cert)
                    .arg(format!("--{prefix}key-file"))
                    .arg(&key);
            }
        }
        let child = command
            .arg("--name")
            .arg(&member.name)
            .arg("--data-dir")
            .arg(&data_dir)
            .args(["--listen-client-urls", &member.client_url()])
            .args(["--advertise-client-urls", &member.client_url()])
            .args(["--listen-peer-urls", &member.peer_url()])
            .args(["--initial-advertise-peer-urls", &member.peer_url()])
            .args(["--initial-cluster", &initial_cluster])
            .args(["--initial-cluster-token", &self.token])
            .args(["--initial-cluster-state", "new"])
            // etcd's defaults (100 ms, 1 s): tighter timings make elections flap when
            // the 2 cores of CI are busy.
            .args(["--heartbeat-interval", "100", "--election-timeout", "1000"])
            .args([
                "--logger",
                "zap",
                "--log-outputs",
                "stderr",
                "--log-level",
                "warn",
            ])
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("clone the log handle"))
            .stderr(log)
            .spawn()
            .expect("spawn etcd");
        let watchdog = Command::new("sh")
            .arg("-c")
            .arg(
                "while kill -0 \"$1\" && kill -0 \"$2\"; do sleep 1; done 2>/dev/null; \
                 if ! kill -0 \"$1\" 2>/dev/null; then kill -9 \"$2\"; rm -rf \"$3\"; fi 2>/dev/null",
            )
            .arg("etcd-watchdog")
            .arg(std::process::id().to_string())
            .arg(child.id().to_string())
            .arg(self.dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn the etcd watchdog");
        self.members[index].child = Some(child);
        self.members[index].watchdog = Some(watchdog);
    }

    /// Every member's client URL, in member order.
    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(EtcdMember::client_url).collect()
    }

    /// Kills member `index` with SIGKILL; its data directory stays for `restart`.
    pub fn kill(&mut self, index: usize) {
        let member = &mut self.members[index];
        // The watchdog first: it must not outlive its member's restart.
        for mut process in [member.watchdog.take(), member.child.take()]
            .into_iter()
            .flatten()
        {
            let _ = process.kill();
            let _ = process.wait();
        }
    }

    /// Freezes member `index` (SIGSTOP): its sockets stay open but nothing answers,
    /// the failure a client cannot see from a refused connection.
    pub fn pause(&mut self, index: usize) {
        self.signal(index, "-STOP");
    }

    /// Thaws a member frozen by `pause` (SIGCONT).
    pub fn resume(&mut self, index: usize) {
        self.signal(index, "-CONT");
    }

    fn signal(&self, index: usize, signal: &str) {
        let child = self.members[index]
            .child
            .as_ref()
            .expect("member is running");
        let status = Command::new("kill")
            .arg(signal)
            .arg(child.id().to_string())
            .status()
            .expect("run kill");
        assert!(status.success(), "kill {signal} member {index}");
    }

    /// Starts member `index` again on its data directory and waits until it is healthy.
    pub async fn restart(&mut self, index: usize) {
        self.kill(index);
        self.launch(index);
        if let Err(failure) = self.wait_healthy(&[index]).await {
            panic!("etcd member {index} did not come back: {failure}");
        }
    }

    /// Starts the killed members `indexes` again together on their data directories
    /// (one alone cannot answer with a leader while its peers are down: quorum) and
    /// waits until each is healthy.
    pub async fn restart_all(&mut self, indexes: &[usize]) {
        for &index in indexes {
            self.kill(index);
            self.launch(index);
        }
        if let Err(failure) = self.wait_healthy(indexes).await {
            panic!("etcd members {indexes:?} did not come back: {failure}");
        }
    }

    /// Waits until every member in `indexes` answers `status()` with a leader.
    async fn wait_healthy(&mut self, indexes: &[usize]) -> Result<(), String> {
        let started = Instant::now();
        for &index in indexes {
            let endpoint = self.members[index].client_url();
            loop {
                if let Some(child) = self.members[index].child.as_mut() {
                    if let Ok(Some(status)) = child.try_wait() {
                        let log = self.log(index);
                        return Err(format!("member {index} exited with {status}: {log}"));
                    }
                }
                if has_leader(&endpoint, self.tls.as_ref()).await {
                    break;
                }
                if started.elapsed() > START_TIMEOUT {
                    let log = self.log(index);
                    return Err(format!(
                        "member {index} not healthy after {START_TIMEOUT:?}: {log}"
                    ));
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        Ok(())
    }

    /// The tail of member `index`'s log, for failure messages.
    fn log(&self, index: usize) -> String {
        let path = self
            .dir
            .path()
            .join(format!("{}.log", self.members[index].name));
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let tail: Vec<&str> = text.lines().rev().take(10).collect();
        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
    }
}

async fn has_leader(endpoint: &str, tls: Option<&EtcdTls>) -> bool {
    let probe = async {
        let mut options =
            etcd_client::ConnectOptions::new().with_connect_timeout(Duration::from_millis(500));
        if let Some(tls) = tls {
            let [ca, cert, key] = EtcdTls::files(&tls.client).map(|f| std::fs::read(f).unwrap());
            options = options.with_tls(
                etcd_client::TlsOptions::new()
                    .ca_certificate(etcd_client::Certificate::from_pem(ca))
                    .identity(etcd_client::Identity::from_pem(cert, key)),
            );
        }
        let mut client = etcd_client::Client::connect([endpoint], Some(options)).await?;
        client.status().await
    };
    matches!(
        tokio::time::timeout(Duration::from_secs(1), probe).await,
        Ok(Ok(status)) if status.leader() != 0
    )
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        // SIGKILL ends a paused member too.
        for index in 0..self.members.len() {
            self.kill(index);
        }
    }
}
