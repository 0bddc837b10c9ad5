//! The transport under [`super::SftpBackend`]: the `sftp://` URL, the `ssh` command that
//! reaches the server (docs/design/sftp.md, "Transport"), and how a failed `ssh` reads
//! as an I/O error.

use std::io;
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};

use tokio::io::AsyncReadExt;
use tokio::process::{Child, ChildStderr, Command};

use crate::error::{Result, StoreError};

/// A whole command line that replaces `ssh` (run by `sh -c`; it must speak SFTP on its
/// standard input and output), as restic's `-o sftp.command`.
pub const COMMAND_VAR: &str = "LARDER_SFTP_COMMAND";
/// Arguments put before larder's own on the `ssh` command line (split at whitespace).
pub const ARGS_VAR: &str = "LARDER_SFTP_ARGS";

/// The parts of `sftp://[USER@]HOST[:PORT]/PATH`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SftpUrl {
    pub user: Option<String>,
    /// Without the brackets of an IPv6 address.
    pub host: String,
    pub port: Option<u16>,
    /// The repository's directory on the server: relative to the login directory, or
    /// absolute when the URL has two slashes after the host (`sftp://host//srv/repo`),
    /// as restic reads its sftp URLs. Never empty, no trailing slash (but `/`).
    pub path: String,
}

/// Parses `sftp://[USER@]HOST[:PORT]/PATH`.
pub fn parse_sftp_url(url: &str) -> Result<SftpUrl> {
    let invalid = |why: &str| StoreError::Config(format!("storage URL {url:?}: {why}"));
    let rest = url
        .get(..7)
        .filter(|s| s.eq_ignore_ascii_case("sftp://"))
        .map(|_| &url[7..])
        .ok_or_else(|| invalid("expected sftp://[USER@]HOST[:PORT]/PATH"))?;
    let (authority, path) = rest
        .split_once('/')
        .ok_or_else(|| invalid("no path after the host"))?;
    let (user, host_port) = match authority.rsplit_once('@') {
        Some((user, host_port)) => (Some(user.to_string()), host_port),
        None => (None, authority),
    };
    let (host, port) = split_port(host_port).ok_or_else(|| invalid("bad host or port"))?;
    // Never an option to ssh: `-oProxyCommand=...` as a host would run a command.
    if host.is_empty() || host.starts_with('-') {
        return Err(invalid("bad host"));
    }
    if user
        .as_deref()
        .is_some_and(|u| u.is_empty() || u.starts_with('-'))
    {
        return Err(invalid("bad user name"));
    }
    let path = match path.strip_prefix('/') {
        Some(absolute) => format!("/{}", absolute.trim_end_matches('/')),
        None => path.trim_end_matches('/').to_string(),
    };
    if path.is_empty() {
        return Err(invalid("no path after the host"));
    }
    Ok(SftpUrl {
        user,
        host: host.to_string(),
        port,
        path,
    })
}

/// `HOST[:PORT]` or `[V6ADDR][:PORT]`, split; `None` if malformed.
fn split_port(host_port: &str) -> Option<(&str, Option<u16>)> {
    let (host, port) = match host_port.strip_prefix('[') {
        Some(bracketed) => {
            let (host, after) = bracketed.split_once(']')?;
            match after {
                "" => (host, None),
                _ => (host, Some(after.strip_prefix(':')?)),
            }
        }
        None => match host_port.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (host_port, None),
        },
    };
    let port = match port {
        Some(p) => Some(p.parse::<u16>().ok().filter(|&p| p != 0)?),
        None => None,
    };
    Some((host, port))
}

/// How the backend starts its SFTP session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SshCommand {
    /// `ssh ARGS -o BatchMode=yes ... [-p PORT] [-l USER] -s -- HOST sftp`: the user's
    /// ssh configuration, agent, known hosts and jump hosts apply. `ARGS` come first, so
    /// that an option they set wins over larder's defaults (ssh keeps the first value of
    /// each option).
    Ssh { args: Vec<String> },
    /// A command line run by `sh -c` that speaks SFTP on its standard input and output;
    /// the URL's user, host and port are not used.
    Custom(String),
}

/// larder's options for ssh: never ask for a password or a host key's confirmation
/// (there is no one to answer), give up on a host that does not answer in 30 s, and
/// notice a dead connection within about a minute.
const DEFAULT_OPTIONS: [&str; 4] = [
    "BatchMode=yes",
    "ConnectTimeout=30",
    "ServerAliveInterval=15",
    "ServerAliveCountMax=4",
];

impl SshCommand {
    /// [`COMMAND_VAR`] if set, else `ssh` with the arguments of [`ARGS_VAR`].
    pub fn from_env() -> Self {
        match std::env::var(COMMAND_VAR) {
            Ok(command) if !command.trim().is_empty() => Self::Custom(command),
            _ => Self::Ssh {
                args: std::env::var(ARGS_VAR)
                    .unwrap_or_default()
                    .split_whitespace()
                    .map(str::to_string)
                    .collect(),
            },
        }
    }

    /// The program and its arguments for `url`'s server.
    pub fn argv(&self, url: &SftpUrl) -> Vec<String> {
        let args = match self {
            Self::Custom(command) => {
                return ["sh", "-c", command].map(str::to_string).to_vec();
            }
            Self::Ssh { args } => args,
        };
        let mut argv = vec!["ssh".to_string()];
        argv.extend(args.iter().cloned());
        for option in DEFAULT_OPTIONS {
            argv.extend(["-o".to_string(), option.to_string()]);
        }
        if let Some(port) = url.port {
            argv.extend(["-p".to_string(), port.to_string()]);
        }
        if let Some(user) = &url.user {
            argv.extend(["-l".to_string(), user.clone()]);
        }
        argv.extend(["-s", "--", &url.host, "sftp"].map(str::to_string));
        argv
    }

    /// Starts the command with piped standard streams; it is killed when dropped.
    pub fn spawn(&self, url: &SftpUrl) -> io::Result<Child> {
        let argv = self.argv(url);
        tracing::debug!("starting {argv:?}");
        Command::new(&argv[0])
            .args(&argv[1..])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
    }
}

/// The last [`StderrTail::KEEP`] bytes ssh wrote to its standard error, collected by a
/// task of the backend's runtime (so that ssh never blocks on a full pipe).
#[derive(Debug, Clone, Default)]
pub struct StderrTail {
    text: Arc<Mutex<String>>,
    done: Arc<tokio::sync::Notify>,
    finished: Arc<std::sync::atomic::AtomicBool>,
}

impl StderrTail {
    const KEEP: usize = 4096;

    /// Collects `stderr` until it closes.
    pub fn start(stderr: Option<ChildStderr>) -> Self {
        let tail = Self::default();
        let Some(mut stderr) = stderr else {
            tail.finish();
            return tail;
        };
        let writer = tail.clone();
        tokio::spawn(async move {
            let mut buf = vec![0u8; 1024];
            while let Ok(n @ 1..) = stderr.read(&mut buf).await {
                let piece = String::from_utf8_lossy(&buf[..n]);
                tracing::debug!("ssh: {}", piece.trim_end());
                writer.push(&piece);
            }
            writer.finish();
        });
        tail
    }

    fn push(&self, piece: &str) {
        let mut text = self.text.lock().unwrap_or_else(|e| e.into_inner());
        text.push_str(piece);
        if text.len() > Self::KEEP {
            let mut cut = text.len() - Self::KEEP;
            while !text.is_char_boundary(cut) {
                cut += 1;
            }
            text.drain(..cut);
        }
    }

    fn finish(&self) {
        self.finished
            .store(true, std::sync::atomic::Ordering::Release);
        self.done.notify_waiters();
    }

    /// What ssh wrote so far, trimmed.
    pub fn text(&self) -> String {
        let text = self.text.lock().unwrap_or_else(|e| e.into_inner());
        text.trim().to_string()
    }

    /// Waits up to `limit` for the stream to close (ssh exited), then returns the text.
    pub async fn text_at_close(&self, limit: std::time::Duration) -> String {
        let notified = self.done.notified();
        if !self.finished.load(std::sync::atomic::Ordering::Acquire) {
            let _ = tokio::time::timeout(limit, notified).await;
        }
        self.text()
    }
}

/// How a failed ssh reads as an I/O error, from what it wrote to its standard error:
/// a refused, timed-out or dropped connection may pass ([`StoreError::is_transient`]);
/// a refused login or host key, an unknown host or a server without SFTP may not.
pub fn failure_kind(stderr: &str) -> io::ErrorKind {
    use io::ErrorKind as K;
    let text = stderr.to_ascii_lowercase();
    let has = |s: &str| text.contains(s);
    if has("permission denied")
        || has("host key verification failed")
        || has("too many authentication failures")
    {
        K::PermissionDenied
    } else if has("could not resolve hostname")
        || has("subsystem request failed")
        || has("bad configuration option")
    {
        K::Other
    } else if has("connection refused") {
        K::ConnectionRefused
    } else if has("timed out") {
        K::TimedOut
    } else {
        K::ConnectionReset
    }
}

/// "ssh exited with STATUS: STDERR", as far as known.
pub fn describe_exit(status: Option<ExitStatus>, stderr: &str) -> String {
    let status = match status {
        Some(status) => format!("ssh exited with {status}"),
        None => "the ssh connection closed".to_string(),
    };
    match stderr {
        "" => status,
        text => format!("{status}: {text}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse() {
        let url = parse_sftp_url("sftp://ann@backup.example:2222//srv/repo/").unwrap();
        assert_eq!(url.user.as_deref(), Some("ann"));
        assert_eq!(url.host, "backup.example");
        assert_eq!(url.port, Some(2222));
        assert_eq!(url.path, "/srv/repo");
        let url = parse_sftp_url("SFTP://[::1]/backups/larder").unwrap();
        assert_eq!((url.user, url.host.as_str()), (None, "::1"));
        assert_eq!((url.port, url.path.as_str()), (None, "backups/larder"));
        assert_eq!(parse_sftp_url("sftp://h:22//").unwrap().path, "/");
        for bad in [
            "sftp://host",
            "sftp://host/",
            "sftp:///path",
            "sftp://-oProxyCommand=x/p",
            "sftp://-l@host/p",
            "sftp://host:0/p",
            "sftp://host:x/p",
            "sftp://[::1/p",
            "s3://b/p",
        ] {
            assert!(parse_sftp_url(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_host_is_never_an_option() {
        let url = parse_sftp_url("sftp://ann@h:2222/r").unwrap();
        let argv = SshCommand::Ssh {
            args: vec!["-F".into(), "cfg".into()],
        }
        .argv(&url);
        assert_eq!(&argv[..3], ["ssh", "-F", "cfg"]);
        assert_eq!(
            &argv[argv.len() - 8..],
            ["-p", "2222", "-l", "ann", "-s", "--", "h", "sftp"]
        );
    }

    #[test]
    fn ssh_failures_are_classified() {
        use io::ErrorKind as K;
        for (stderr, kind) in [
            ("ann@h: Permission denied (publickey).", K::PermissionDenied),
            ("Host key verification failed.", K::PermissionDenied),
            (
                "ssh: Could not resolve hostname nowhere: Name or service not known",
                K::Other,
            ),
            (
                "ssh: connect to host h port 1: Connection refused",
                K::ConnectionRefused,
            ),
            (
                "ssh: connect to host h port 22: Connection timed out",
                K::TimedOut,
            ),
            ("Connection closed by 127.0.0.1 port 22", K::ConnectionReset),
        ] {
            assert_eq!(failure_kind(stderr), kind, "{stderr}");
        }
    }
}
