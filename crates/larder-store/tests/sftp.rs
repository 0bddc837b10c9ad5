//! `SftpBackend` against a real OpenSSH server (tests/support/sshd.rs): the backend
//! conformance suite, create-only races, dropped connections and failed logins.

use std::io::ErrorKind;
use std::sync::Arc;
use std::time::{Duration, Instant};

use larder_store::{
    error_chain, Backend, FileKind, RetryBackend, RetryPolicy, SftpBackend, SshCommand, StoreError,
};

#[path = "support/conformance.rs"]
mod conformance;
#[path = "support/sshd.rs"]
mod sshd;

use conformance::{bytes, conformance};
use sshd::Sshd;

fn connect(server: &Sshd, name: &str) -> SftpBackend {
    let command = SshCommand::Ssh {
        args: server.ssh_args(),
    };
    SftpBackend::connect(&server.url(name), command).expect("connect to the test sshd")
}

/// Retries for a test: a dropped connection costs one failed attempt.
const QUICK_RETRIES: RetryPolicy = RetryPolicy {
    attempts: 3,
    first_delay: Duration::from_millis(10),
    max_delay: Duration::from_millis(10),
};

fn io_kind(e: &StoreError) -> Option<ErrorKind> {
    match e {
        StoreError::Io { source, .. } => Some(source.kind()),
        _ => None,
    }
}

#[test]
fn sftp_backend_conforms() {
    let server = Sshd::start();
    let backend = connect(&server, "repo");
    conformance(&backend);
    // The layout: the local one, below the URL's path; no upload left in tmp/.
    let root = server.dir().join("repo");
    let container = root.join("containers/000000000000000b.ctr");
    assert_eq!(std::fs::metadata(container).unwrap().len(), 5 << 20);
    assert_eq!(std::fs::read_dir(root.join("tmp")).unwrap().count(), 0);
    assert_eq!(backend.flock_dir(), None);
    assert_eq!(backend.location(), server.url("repo"));
}

/// A path without a second slash is relative to the login directory, as restic reads
/// sftp URLs; a custom command (`LARDER_SFTP_COMMAND`) replaces ssh, the URL giving the
/// path only.
#[test]
fn a_custom_command_and_a_relative_path() {
    let server = Sshd::start();
    let command = SshCommand::Custom(format!(
        "ssh -F {} -p {} 127.0.0.1 -s sftp",
        server.ssh_config().display(),
        server.port()
    ));
    let home = login_dir();
    let relative = server
        .dir()
        .join("relative")
        .strip_prefix("/")
        .unwrap()
        .display()
        .to_string();
    // Reach the server's scratch directory from the login directory.
    let up = "../".repeat(home.components().count() - 1);
    let url = format!("sftp://unused-host/{up}{relative}");
    let backend = SftpBackend::connect(&url, command).unwrap();
    backend.write(FileKind::Snapshot, "s", b"relative").unwrap();
    let file = server.dir().join("relative/snapshots/s.snap");
    assert_eq!(std::fs::read(file).unwrap(), b"relative");
}

/// The current user's home directory in the password database: where sshd logs in.
fn login_dir() -> std::path::PathBuf {
    // SAFETY: getpwuid returns null or a pointer to a static record, read at once.
    let dir = unsafe {
        let entry = libc::getpwuid(libc::getuid());
        assert!(!entry.is_null(), "the current user has no passwd entry");
        std::ffi::CStr::from_ptr((*entry).pw_dir).to_owned()
    };
    std::path::PathBuf::from(dir.to_str().expect("a UTF-8 home directory"))
}

/// Of writers racing to create one name, on one connection or several, exactly one
/// wins and its bytes stay.
#[test]
fn write_new_has_one_winner() {
    let server = Sshd::start();
    let shared = Arc::new(connect(&server, "race"));
    let others: Vec<Arc<SftpBackend>> =
        (0..3).map(|_| Arc::new(connect(&server, "race"))).collect();
    for round in 0..4 {
        let name = format!("lock-{round}");
        let threads: Vec<_> = (0..8)
            .map(|i| {
                let backend = match i % 2 {
                    0 => shared.clone(),
                    _ => others[i % others.len()].clone(),
                };
                let name = name.clone();
                std::thread::spawn(move || {
                    let data = format!("writer {i}").into_bytes();
                    let won = backend.write_new(FileKind::Lock, &name, &data).unwrap();
                    (won, data)
                })
            })
            .collect();
        let outcomes: Vec<(bool, Vec<u8>)> =
            threads.into_iter().map(|t| t.join().unwrap()).collect();
        let winners: Vec<&Vec<u8>> = outcomes.iter().filter(|o| o.0).map(|o| &o.1).collect();
        assert_eq!(winners.len(), 1, "round {round}: {outcomes:?}");
        assert_eq!(&shared.read(FileKind::Lock, &name).unwrap(), winners[0]);
    }
    let tmp = server.dir().join("race/tmp");
    assert_eq!(
        std::fs::read_dir(tmp).unwrap().count(),
        0,
        "uploads left in tmp/"
    );
}

/// A dropped connection fails the call in flight or the next one transiently, and a
/// later call reconnects; under `RetryBackend` the drop is not seen at all.
#[test]
fn a_dropped_connection_is_transient_and_reconnects() {
    let server = Sshd::start();
    let backend = connect(&server, "drop");
    backend.write(FileKind::Snapshot, "s", b"before").unwrap();
    assert!(server.drop_connections() > 0);
    std::thread::sleep(Duration::from_millis(300));
    let e = backend.read(FileKind::Snapshot, "s").unwrap_err();
    assert!(e.is_transient(), "{}", error_chain(&e));
    let message = error_chain(&e);
    assert!(
        message.contains(&server.url("drop")),
        "names the repository: {message}"
    );
    assert_eq!(backend.read(FileKind::Snapshot, "s").unwrap(), b"before");

    let retried = RetryBackend::new(backend, QUICK_RETRIES);
    assert!(server.drop_connections() > 0);
    std::thread::sleep(Duration::from_millis(300));
    retried.write(FileKind::Snapshot, "t", b"after").unwrap();
    assert_eq!(retried.read(FileKind::Snapshot, "t").unwrap(), b"after");
}

/// A connection dropped during an upload never leaves a partial file under its name:
/// the write fails transiently and the file is missing, or the write succeeded whole.
#[test]
fn an_upload_cut_short_leaves_no_partial_file() {
    let server = Sshd::start();
    let backend = Arc::new(connect(&server, "cut"));
    let data = Arc::new(bytes(3, 64 << 20));
    let writer = {
        let (backend, data) = (backend.clone(), data.clone());
        std::thread::spawn(move || backend.write(FileKind::Container, "00000000000000c1", &data))
    };
    std::thread::sleep(Duration::from_millis(100));
    server.drop_connections();
    let file = server.dir().join("cut/containers/00000000000000c1.ctr");
    match writer.join().unwrap() {
        Ok(()) => assert_eq!(std::fs::metadata(&file).unwrap().len(), 64 << 20),
        Err(e) => {
            assert!(e.is_transient(), "{}", error_chain(&e));
            assert!(!file.exists(), "a partial file under its name");
        }
    }
    // The next writer's lock holder cleans what was left in tmp/ (if the cut came
    // before tmp/ was made, there is none), reconnecting first.
    RetryBackend::new(backend, QUICK_RETRIES)
        .clean_tmp()
        .unwrap();
    let left = std::fs::read_dir(server.dir().join("cut/tmp")).map_or(0, |d| d.count());
    assert_eq!(left, 0);
}

/// A refused connection, a refused key, an unknown host key and a command that is not
/// an SFTP server fail at once, naming the repository and saying what ssh said; a
/// refused login or host key is not transient.
#[test]
fn failed_logins_are_clear_errors() {
    let server = Sshd::start();
    let closed_port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("sftp://127.0.0.1:{closed_port}//srv/repo");
    let args = server.ssh_args();
    let e = SftpBackend::connect(&url, SshCommand::Ssh { args }).unwrap_err();
    let message = error_chain(&e);
    assert!(message.contains(&url), "{message}");
    assert!(message.contains("Connection refused"), "{message}");
    assert_eq!(io_kind(&e), Some(ErrorKind::ConnectionRefused), "{message}");

    let stranger = vec!["-F".into(), server.stranger_config().display().to_string()];
    let strict = {
        let mut args = vec!["-o".into(), "StrictHostKeyChecking=yes".into()];
        args.extend(server.ssh_args());
        args
    };
    for (args, said) in [
        (stranger, "Permission denied"),
        (strict, "Host key verification failed"),
    ] {
        let started = Instant::now();
        let e = SftpBackend::connect(&server.url("r"), SshCommand::Ssh { args }).unwrap_err();
        let message = error_chain(&e);
        assert!(message.contains(&server.url("r")), "{message}");
        assert!(message.contains(said), "{message}");
        assert!(message.contains("exit status: 255"), "{message}");
        assert_eq!(io_kind(&e), Some(ErrorKind::PermissionDenied), "{message}");
        assert!(!e.is_transient(), "{message}");
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "never waits for a prompt"
        );
    }

    let failing = SshCommand::Custom("echo no route to the server >&2; exit 3".into());
    let e = SftpBackend::connect(&server.url("r"), failing).unwrap_err();
    let message = error_chain(&e);
    assert!(
        message.contains("exit status: 3: no route to the server"),
        "{message}"
    );
    // A shell start-up file that prints breaks SFTP; the session does not hang.
    let chatty = SshCommand::Custom("echo welcome to the server; cat".into());
    let e = SftpBackend::connect(&server.url("r"), chatty).unwrap_err();
    let message = error_chain(&e);
    assert!(message.contains("does not speak SFTP"), "{message}");
    assert!(!e.is_transient(), "{message}");
}

/// `clean_tmp` removes what a killed writer left in tmp/, and nothing else.
#[test]
fn clean_tmp_removes_leftovers() {
    let server = Sshd::start();
    let backend = connect(&server, "tmp");
    backend.write(FileKind::Snapshot, "s", b"kept").unwrap();
    let tmp = server.dir().join("tmp/tmp");
    std::fs::write(tmp.join("left-1.tmp"), b"half").unwrap();
    std::fs::write(tmp.join("left-2.tmp"), b"half").unwrap();
    assert_eq!(backend.clean_tmp().unwrap(), 2);
    assert_eq!(std::fs::read_dir(&tmp).unwrap().count(), 0);
    assert_eq!(backend.clean_tmp().unwrap(), 0);
    assert_eq!(backend.read(FileKind::Snapshot, "s").unwrap(), b"kept");
}

/// Threads share one connection with their requests in flight together, as the
/// backup's container writers do; prints the upload and download rates over loopback
/// (docs/design/sftp.md, "Measured").
#[test]
fn threads_write_and_read_at_once() {
    const THREADS: usize = 4;
    const FILES: usize = 8;
    const LEN: usize = 4 << 20;
    let server = Sshd::start();
    let backend = Arc::new(connect(&server, "speed"));
    let data = Arc::new(bytes(7, LEN));
    let timed = |read: bool| {
        let started = Instant::now();
        let threads: Vec<_> = (0..THREADS)
            .map(|t| {
                let (backend, data) = (backend.clone(), data.clone());
                std::thread::spawn(move || {
                    for f in 0..FILES {
                        let name = format!("{t:08x}{f:08x}");
                        if read {
                            assert!(backend.read(FileKind::Container, &name).unwrap() == *data);
                        } else {
                            backend.write(FileKind::Container, &name, &data).unwrap();
                        }
                    }
                })
            })
            .collect();
        threads.into_iter().for_each(|t| t.join().unwrap());
        (THREADS * FILES * LEN) as f64 / started.elapsed().as_secs_f64() / 1e6
    };
    let up = timed(false);
    let down = timed(true);
    eprintln!("sftp over loopback: upload {up:.0} MB/s, download {down:.0} MB/s");
    assert_eq!(
        backend.list(FileKind::Container).unwrap().len(),
        THREADS * FILES
    );
}

/// The backend is usable from inside another tokio runtime's task (a cluster node's),
/// and droppable there: it runs its requests on a runtime of its own.
#[test]
fn usable_and_droppable_inside_another_runtime() {
    let server = Sshd::start();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    runtime.block_on(async {
        let backend = connect(&server, "inside");
        backend.write(FileKind::Snapshot, "s", b"inside").unwrap();
        assert_eq!(backend.read(FileKind::Snapshot, "s").unwrap(), b"inside");
        drop(backend);
    });
}

/// What larder makes over SFTP is private whatever the server's umask: directories
/// 0700 (the mkdir request's attributes), files 0600 (set on the open handle before a
/// byte is written).
#[test]
fn files_and_directories_made_over_sftp_are_private() {
    use std::os::unix::fs::PermissionsExt;
    let server = Sshd::start();
    let backend = connect(&server, "private/repo");
    backend
        .write_new(FileKind::Config, "config", b"{}")
        .unwrap();
    backend.write(FileKind::Key, "00aa", b"key").unwrap();
    backend
        .write(FileKind::Container, "000000000000000b", &bytes(1, 4096))
        .unwrap();
    backend.write(FileKind::Snapshot, "s", b"snapshot").unwrap();
    let root = server.dir().join("private");
    let mut stack = vec![root];
    let mut seen = 0;
    while let Some(p) = stack.pop() {
        let meta = std::fs::symlink_metadata(&p).unwrap();
        let mode = meta.permissions().mode() & 0o7777;
        if meta.is_dir() {
            assert_eq!(mode, 0o700, "{}", p.display());
            stack.extend(std::fs::read_dir(&p).unwrap().map(|e| e.unwrap().path()));
        } else {
            assert_eq!(mode, 0o600, "{}", p.display());
            seen += 1;
        }
    }
    assert_eq!(seen, 4);
}
