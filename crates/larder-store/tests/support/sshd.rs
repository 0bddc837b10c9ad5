//! `Sshd`: a private OpenSSH server on a free 127.0.0.1 port, logging in the current
//! user (root, or any login account: sshd refuses locked ones such as `nobody`) with a
//! key generated for it, for the SFTP tests of every crate
//! (included with `#[path]`). Its host key, the user's key, `authorized_keys`, its
//! `sshd_config` and a client `ssh_config` live in a temporary directory. The server is
//! killed when dropped, or by a watchdog shell within a second of the test process
//! dying without dropping it. A missing `sshd` fails the test with the way to install
//! it: these tests are never skipped.

#![allow(dead_code)]

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Sshd {
    dir: tempfile::TempDir,
    port: u16,
    child: Child,
    watchdog: Child,
}

/// `sshd` on PATH or in the usual sbin directories; panics with the way to install it.
pub fn sshd_binary() -> PathBuf {
    let mut dirs: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    dirs.extend(["/usr/sbin", "/usr/local/sbin", "/sbin"].map(PathBuf::from));
    dirs.into_iter()
        .map(|d| d.join("sshd"))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "sshd not found (neither on PATH nor in /usr/sbin): the SFTP tests need a \
                 real OpenSSH server; `scripts/install-deps --tests` installs it (Debian's \
                 openssh-server)"
            )
        })
}

/// Runs `ssh-keygen` to make an ed25519 key without passphrase at `path`.
fn keygen(path: &Path) {
    let status = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-C", "larder-test", "-f"])
        .arg(path)
        .stdin(Stdio::null())
        .status()
        .expect("run ssh-keygen (Debian's openssh-client)");
    assert!(status.success(), "ssh-keygen failed: {status}");
}

impl Sshd {
    /// Starts sshd and waits until it accepts connections.
    pub fn start() -> Self {
        Self::start_with_sftp_flags("")
    }

    /// Starts sshd whose SFTP server runs with `flags` (`-P remove,rmdir`: an
    /// append-only account, docs/design/remote.md "Append-only storage").
    pub fn start_with_sftp_flags(flags: &str) -> Self {
        Self::start_with_sftp("", flags)
    }

    /// Starts sshd whose SFTP server runs as user and group `id` (dropped with
    /// `setpriv` before it starts: a backup account without root's power over file
    /// modes, with no login account needed), with `flags`.
    pub fn start_with_sftp_as(id: u32, flags: &str) -> Self {
        assert!(
            Path::new("/usr/bin/setpriv").is_file(),
            "/usr/bin/setpriv not found: these tests run the SFTP server as another user \
             with it (Debian's util-linux)"
        );
        let prefix = format!("/usr/bin/setpriv --reuid={id} --regid={id} --clear-groups");
        Self::start_with_sftp(&prefix, flags)
    }

    fn start_with_sftp(prefix: &str, flags: &str) -> Self {
        let binary = sshd_binary();
        let dir = tempfile::Builder::new()
            .prefix("larder-sshd-")
            .tempdir()
            .expect("create a temporary directory");
        keygen(&dir.path().join("host_key"));
        keygen(&dir.path().join("user_key"));
        keygen(&dir.path().join("stranger_key"));
        std::fs::copy(
            dir.path().join("user_key.pub"),
            dir.path().join("authorized_keys"),
        )
        .expect("write authorized_keys");
        // As root, sshd insists on its privilege separation directory.
        // SAFETY: geteuid(2) has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            std::fs::create_dir_all("/run/sshd").expect("create /run/sshd");
        }
        let mut last = String::new();
        for _ in 0..3 {
            let port = TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .expect("a free port")
                .port();
            write_configs(dir.path(), port, prefix, flags);
            let log = std::fs::File::create(dir.path().join("sshd.log")).expect("create the log");
            let mut child = Command::new(&binary)
                .args(["-D", "-e", "-f"])
                .arg(dir.path().join("sshd_config"))
                .stdin(Stdio::null())
                .stdout(log.try_clone().expect("clone the log handle"))
                .stderr(log)
                .spawn()
                .expect("spawn sshd");
            let started = Instant::now();
            while started.elapsed() < Duration::from_secs(20) {
                if let Ok(Some(status)) = child.try_wait() {
                    last = format!("sshd exited with {status}: {}", read_log(dir.path()));
                    break;
                }
                if TcpStream::connect(("127.0.0.1", port)).is_ok() {
                    let watchdog = watchdog(child.id(), dir.path());
                    return Self {
                        dir,
                        port,
                        child,
                        watchdog,
                    };
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
            let _ = child.wait();
            if last.is_empty() {
                last = format!("sshd did not listen: {}", read_log(dir.path()));
            }
        }
        panic!("sshd did not start: {last}");
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// A scratch directory on the "server" (the same machine), for repositories.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// `sftp://127.0.0.1:PORT//ABSOLUTE` for a directory `name` in [`Sshd::dir`].
    pub fn url(&self, name: &str) -> String {
        format!(
            "sftp://127.0.0.1:{}/{}",
            self.port,
            self.dir.path().join(name).display()
        )
    }

    /// The client configuration that logs in with the authorized key and accepts the
    /// server's host key: `ssh -F` this.
    pub fn ssh_config(&self) -> PathBuf {
        self.dir.path().join("ssh_config")
    }

    /// A client configuration whose key the server does not know.
    pub fn stranger_config(&self) -> PathBuf {
        self.dir.path().join("stranger_config")
    }

    /// The ssh arguments that reach this server (`LARDER_SFTP_ARGS`).
    pub fn ssh_args(&self) -> Vec<String> {
        vec!["-F".into(), self.ssh_config().display().to_string()]
    }

    /// Kills the per-connection processes sshd forked (its children), leaving the
    /// listener (and their children: the session and its sftp-server): every client's
    /// connection drops. Returns how many processes were killed.
    pub fn drop_connections(&self) -> usize {
        let mut pids = children_of(self.child.id());
        let mut next = 0;
        while next < pids.len() {
            let below = children_of(pids[next]);
            pids.extend(below);
            next += 1;
        }
        for &pid in &pids {
            // SAFETY: kill(2) on a pid of this server's process tree.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        }
        pids.len()
    }
}

/// The pids whose parent is `parent` (from /proc).
fn children_of(parent: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            // "PID (COMM) STATE PPID ...": COMM may hold spaces, so count from its end.
            let after = stat.rsplit_once(')').map(|(_, rest)| rest).unwrap_or("");
            after.split_whitespace().nth(1) == Some(parent.to_string().as_str())
        })
        .collect()
}

/// The server's and the clients' configuration files for `port`, the SFTP server
/// run through `prefix` (a command that runs the rest) and given `sftp_flags`.
fn write_configs(dir: &Path, port: u16, prefix: &str, sftp_flags: &str) {
    let d = dir.display();
    let sftp_server = [
        "/usr/lib/openssh/sftp-server",
        "/usr/libexec/openssh/sftp-server",
    ]
    .into_iter()
    .find(|p| Path::new(p).is_file())
    .unwrap_or("internal-sftp");
    let server = format!(
        "Port {port}\nListenAddress 127.0.0.1\nHostKey {d}/host_key\nPidFile none\n\
         AuthorizedKeysFile {d}/authorized_keys\nStrictModes no\nUsePAM no\n\
         PubkeyAuthentication yes\nPasswordAuthentication no\n\
         KbdInteractiveAuthentication no\nPermitRootLogin prohibit-password\n\
         Subsystem sftp {prefix} {sftp_server} {sftp_flags}\nLogLevel ERROR\n"
    );
    std::fs::write(dir.join("sshd_config"), server).expect("write sshd_config");
    for (file, key) in [
        ("ssh_config", "user_key"),
        ("stranger_config", "stranger_key"),
    ] {
        let client = format!(
            "Host *\n  IdentityFile {d}/{key}\n  IdentitiesOnly yes\n  IdentityAgent none\n  \
             UserKnownHostsFile /dev/null\n  GlobalKnownHostsFile /dev/null\n  \
             StrictHostKeyChecking no\n  LogLevel ERROR\n"
        );
        std::fs::write(dir.join(file), client).expect("write an ssh_config");
    }
}

fn read_log(dir: &Path) -> String {
    let text = std::fs::read_to_string(dir.join("sshd.log")).unwrap_or_default();
    let tail: Vec<&str> = text.lines().rev().take(10).collect();
    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
}

/// Kills `child` and removes `dir` if this test process dies first.
fn watchdog(child: u32, dir: &Path) -> Child {
    Command::new("sh")
        .arg("-c")
        .arg(
            "while kill -0 \"$1\" && kill -0 \"$2\"; do sleep 1; done 2>/dev/null; \
             if ! kill -0 \"$1\" 2>/dev/null; then kill -9 \"$2\"; rm -rf \"$3\"; fi 2>/dev/null",
        )
        .arg("sshd-watchdog")
        .arg(std::process::id().to_string())
        .arg(child.to_string())
        .arg(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn the sshd watchdog")
}

impl Drop for Sshd {
    fn drop(&mut self) {
        self.drop_connections();
        for process in [&mut self.watchdog, &mut self.child] {
            let _ = process.kill();
            let _ = process.wait();
        }
    }
}
