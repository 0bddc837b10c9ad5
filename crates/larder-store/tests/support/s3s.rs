//! `S3sServer`: a real S3-compatible server (s3s-fs, Apache-2.0) on a free 127.0.0.1
//! port, storing its buckets in a temporary directory, for the object-storage tests of
//! every crate (included with `#[path]`). The process is killed when the server is
//! dropped, or by a watchdog shell within a second of the test process dying without
//! dropping it. A missing binary fails the test with the way to install it: these
//! tests are never skipped.

#![allow(dead_code)]

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use object_store::aws::AmazonS3Builder;
use object_store::ObjectStore;

pub const ACCESS_KEY: &str = "larder-test";
pub const SECRET_KEY: &str = "larder-test-secret";
pub const REGION: &str = "us-east-1";

pub struct S3sServer {
    dir: tempfile::TempDir,
    port: u16,
    child: Child,
    watchdog: Child,
}

/// `s3s-fs` on PATH or in cargo's bin directory; panics with the way to install it.
pub fn s3s_binary() -> PathBuf {
    let mut dirs: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    if let Some(cargo) = std::env::var_os("CARGO_HOME") {
        dirs.push(Path::new(&cargo).join("bin"));
    }
    if let Some(home) = std::env::var_os("HOME") {
        dirs.push(Path::new(&home).join(".cargo/bin"));
    }
    dirs.into_iter()
        .map(|d| d.join("s3s-fs"))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "s3s-fs not found (neither on PATH nor in cargo's bin directory): the \
                 object-storage tests need a real S3 server; `scripts/install-deps --tests` \
                 installs it (cargo install s3s-fs --version 0.14.1 --features binary --locked)"
            )
        })
}

impl S3sServer {
    /// Starts s3s-fs with the buckets `buckets` and waits until it accepts connections.
    pub fn start(buckets: &[&str]) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("larder-s3s-")
            .tempdir()
            .expect("create a temporary directory");
        let root = dir.path().join("data");
        for bucket in buckets {
            std::fs::create_dir_all(root.join(bucket)).expect("create a bucket directory");
        }
        let mut last = String::new();
        for _ in 0..3 {
            let port = TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .expect("a free port")
                .port();
            match spawn(dir.path(), port) {
                Ok(child) => {
                    let watchdog = watchdog(child.id(), dir.path());
                    return Self {
                        dir,
                        port,
                        child,
                        watchdog,
                    };
                }
                Err(why) => last = why,
            }
        }
        panic!("s3s-fs did not start: {last}");
    }

    /// Stops the server, as a dropped connection or a crashed server would.
    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Starts the server again on the same port and buckets, after [`Self::stop`].
    pub fn restart(&mut self) {
        self.stop();
        let _ = self.watchdog.kill();
        let _ = self.watchdog.wait();
        self.child = spawn(self.dir.path(), self.port)
            .unwrap_or_else(|why| panic!("s3s-fs did not start again: {why}"));
        self.watchdog = watchdog(self.child.id(), self.dir.path());
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The directory holding bucket `bucket`'s objects as files.
    pub fn bucket_dir(&self, bucket: &str) -> PathBuf {
        self.dir.path().join("data").join(bucket)
    }

    /// A client of bucket `bucket`.
    pub fn store(&self, bucket: &str) -> Arc<dyn ObjectStore> {
        Arc::new(
            AmazonS3Builder::new()
                .with_endpoint(self.endpoint())
                .with_allow_http(true)
                .with_region(REGION)
                .with_access_key_id(ACCESS_KEY)
                .with_secret_access_key(SECRET_KEY)
                .with_bucket_name(bucket)
                .build()
                .expect("an S3 client"),
        )
    }

    /// The AWS environment variables under which `ObjectBackend::from_url` (and a
    /// `larder` process) reach this server.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("AWS_ENDPOINT_URL", self.endpoint()),
            ("AWS_ALLOW_HTTP", "true".into()),
            ("AWS_REGION", REGION.into()),
            ("AWS_ACCESS_KEY_ID", ACCESS_KEY.into()),
            ("AWS_SECRET_ACCESS_KEY", SECRET_KEY.into()),
        ]
    }
}

/// Starts s3s-fs on `port` serving `dir/data` and waits until it accepts connections;
/// the reason if it does not.
fn spawn(dir: &Path, port: u16) -> Result<Child, String> {
    let log = std::fs::File::create(dir.join("s3s.log")).expect("create the log");
    let mut child = Command::new(s3s_binary())
        .args(["--host", "127.0.0.1", "--port", &port.to_string()])
        .args(["--access-key", ACCESS_KEY, "--secret-key", SECRET_KEY])
        .arg(dir.join("data"))
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("clone the log handle"))
        .stderr(log)
        .spawn()
        .expect("spawn s3s-fs");
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(20) {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!("s3s-fs exited with {status}: {}", read_log(dir)));
        }
        if TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return Ok(child);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
    Err(format!("s3s-fs did not listen: {}", read_log(dir)))
}

fn read_log(dir: &Path) -> String {
    let text = std::fs::read_to_string(dir.join("s3s.log")).unwrap_or_default();
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
        .arg("s3s-watchdog")
        .arg(std::process::id().to_string())
        .arg(child.to_string())
        .arg(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn the s3s-fs watchdog")
}

impl Drop for S3sServer {
    fn drop(&mut self) {
        for process in [&mut self.watchdog, &mut self.child] {
            let _ = process.kill();
            let _ = process.wait();
        }
    }
}
