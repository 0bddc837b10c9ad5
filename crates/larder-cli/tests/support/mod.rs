//! Shared helpers for the tests that drive the `larder` binary: a scratch directory, a
//! repository fixture, a runner that captures output and exit codes, a tree builder and
//! a tree comparer.
//!
//! Every run has `LARDER_REPO` and `LARDER_LOG` removed and a private `XDG_DATA_HOME`,
//! so no test ever touches the user's default repository.

// Each test binary uses a different part of this module.
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::{CString, OsStr, OsString};
use std::fmt;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::Value;

pub mod certs;
mod chunks;
#[allow(unused_imports)] // Used by the binaries that compare repositories.
pub use chunks::*;

pub const LARDER: &str = env!("CARGO_BIN_EXE_larder");

/// The password every run gets (`LARDER_PASSWORD`): repositories are encrypted by
/// default.
pub const PASSWORD: &str = "larder test password";

/// Opens the repository at `path` through larder-store, unlocking it with
/// [`PASSWORD`] when it is encrypted: for tests that craft objects larder would not
/// write.
pub fn open_store(path: &Path, mode: larder_store::LockMode) -> larder_store::Repository {
    open_store_waiting(path, mode, Duration::ZERO)
}

/// Like [`open_store`], waiting up to `wait` for the lock.
pub fn open_store_waiting(
    path: &Path,
    mode: larder_store::LockMode,
    wait: Duration,
) -> larder_store::Repository {
    let sealed = std::fs::read(path.join("config"))
        .map(|c| larder_store::config_is_sealed(&c))
        .unwrap_or(false);
    let keys = sealed.then(|| {
        larder_store::keys::unlock(&larder_store::LocalBackend::new(path), PASSWORD.as_bytes())
            .expect("unlock the test repository")
            .0
    });
    let backend = std::sync::Arc::new(larder_store::LocalBackend::new(path));
    larder_store::Repository::open_with(path, mode, wait, backend, keys).expect("open repository")
}

/// `init` options that make the first key slot cheap to unlock: tests run larder
/// hundreds of times.
pub const CHEAP_KDF: [&str; 4] = ["--kdf-memory", "8MiB", "--kdf-iterations", "1"];

/// A run taking longer than this is taken as hung and killed.
pub const RUN_TIMEOUT: Duration = Duration::from_secs(60);

/// The user unprivileged runs switch to when the tests run as root.
pub const NOBODY: u32 = 65534;

// ---------------------------------------------------------------------------------
// Scratch space

/// A temporary directory, removed on drop even if a test left read-only or
/// permission-less directories in it.
pub struct Scratch {
    dir: tempfile::TempDir,
}

impl Scratch {
    pub fn new() -> Self {
        let dir = tempfile::Builder::new()
            .prefix("larder-test-")
            .tempdir()
            .expect("create a temporary directory");
        Self { dir }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// A fresh subdirectory `name` (created).
    pub fn dir(&self, name: &str) -> PathBuf {
        let p = self.dir.path().join(name);
        fs::create_dir_all(&p).expect("create a scratch subdirectory");
        p
    }
}

impl Default for Scratch {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        make_writable(self.dir.path());
    }
}

/// Gives the owner rwx on every directory under `path`, so the tree can be removed.
pub fn make_writable(path: &Path) {
    let Ok(meta) = fs::symlink_metadata(path) else {
        return;
    };
    if !meta.is_dir() {
        return;
    }
    let _ = fs::set_permissions(
        path,
        fs::Permissions::from_mode(meta.mode() & 0o7777 | 0o700),
    );
    if let Ok(rd) = fs::read_dir(path) {
        for e in rd.flatten() {
            make_writable(&e.path());
        }
    }
}

/// Changes the owner of every entry under `path` (not following symlinks).
pub fn chown_tree(path: &Path, uid: u32, gid: u32) {
    let c = CString::new(path.as_os_str().as_bytes()).expect("path without NUL");
    // SAFETY: `c` is a valid NUL-terminated path; lchown does not retain it.
    let rc = unsafe { libc::lchown(c.as_ptr(), uid, gid) };
    assert_eq!(
        rc,
        0,
        "lchown {}: {}",
        path.display(),
        std::io::Error::last_os_error()
    );
    let meta = fs::symlink_metadata(path).expect("stat");
    if meta.is_dir() {
        for e in fs::read_dir(path).expect("read_dir") {
            chown_tree(&e.expect("dir entry").path(), uid, gid);
        }
    }
}

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

// ---------------------------------------------------------------------------------
// Running the binary

/// What one run of `larder` did.
#[derive(Debug, Clone)]
pub struct Output {
    pub args: Vec<OsString>,
    /// None if a signal ended it.
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    pub elapsed: Duration,
}

impl fmt::Display for Output {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "larder {:?}", self.args)?;
        writeln!(f, "exit code: {:?} after {:?}", self.code, self.elapsed)?;
        writeln!(f, "--- stdout ---\n{}", self.stdout)?;
        write!(f, "--- stderr ---\n{}", self.stderr)
    }
}

impl Output {
    /// Panics, showing the whole run, unless it exited with `code`.
    #[track_caller]
    pub fn expect_code(&self, code: i32) -> &Self {
        assert_eq!(self.code, Some(code), "unexpected exit code\n{self}");
        self
    }

    #[track_caller]
    pub fn expect_ok(&self) -> &Self {
        self.expect_code(0)
    }

    /// Panics unless stderr contains every one of `needles`.
    #[track_caller]
    pub fn expect_stderr(&self, needles: &[&str]) -> &Self {
        for n in needles {
            assert!(self.stderr.contains(n), "stderr lacks {n:?}\n{self}");
        }
        self
    }

    /// The first line of stdout as JSON (what `--json` prints).
    #[track_caller]
    pub fn json(&self) -> Value {
        let line = self.stdout.lines().next().unwrap_or("");
        serde_json::from_str(line).unwrap_or_else(|e| panic!("stdout is not JSON ({e})\n{self}"))
    }
}

/// A `larder` command with a clean environment: no `LARDER_REPO`, no `LARDER_LOG`, the
/// given `XDG_DATA_HOME`, stdin closed.
pub fn larder_command(xdg_data_home: &Path) -> Command {
    let mut c = Command::new(LARDER);
    c.env_remove("LARDER_REPO")
        .env_remove("LARDER_LOG")
        .env_remove("LARDER_NEW_PASSWORD")
        .env("LARDER_PASSWORD", PASSWORD)
        .env("XDG_DATA_HOME", xdg_data_home)
        .env("XDG_CONFIG_HOME", xdg_data_home.join("config"))
        .env("XDG_CACHE_HOME", xdg_data_home.join("cache"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

/// Runs `cmd` to completion, killing it (and failing the test) after `timeout`.
#[track_caller]
pub fn run_command(mut cmd: Command, timeout: Duration) -> Output {
    let args: Vec<OsString> = cmd.get_args().map(|a| a.to_os_string()).collect();
    let started = Instant::now();
    let child = cmd.spawn().expect("start larder");
    let pid = child.id() as libc::pid_t;
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let watchdog = std::thread::spawn(move || {
        let hung = matches!(
            done_rx.recv_timeout(timeout),
            Err(mpsc::RecvTimeoutError::Timeout)
        );
        if hung {
            // SAFETY: kill has no memory-safety preconditions; the child is not yet
            // reaped (wait_with_output is still blocked on it), so `pid` is still ours.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        hung
    });
    let out = child.wait_with_output().expect("wait for larder");
    drop(done_tx);
    let hung = watchdog.join().expect("watchdog thread");
    let output = Output {
        args,
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        elapsed: started.elapsed(),
    };
    assert!(
        !hung,
        "larder hung for {timeout:?} and was killed\n{output}"
    );
    output
}

/// Runs `larder ARGS` with a clean environment and a private `XDG_DATA_HOME`; without
/// `LARDER_PASSWORD` when `--repo` names a local plaintext repository (larder refuses
/// a plaintext repository given a password).
#[track_caller]
pub fn larder<I, S>(xdg_data_home: &Path, args: I) -> Output
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let args: Vec<OsString> = args.into_iter().map(|a| a.as_ref().to_owned()).collect();
    let mut c = larder_command(xdg_data_home);
    let repo = args
        .windows(2)
        .find(|w| w[0] == "--repo")
        .map(|w| PathBuf::from(&w[1]));
    if repo.is_some_and(|r| is_plaintext_dir(&r)) {
        c.env_remove("LARDER_PASSWORD");
    }
    c.args(args);
    run_command(c, RUN_TIMEOUT)
}

/// Whether `dir` holds a repository whose config is plaintext.
pub fn is_plaintext_dir(dir: &Path) -> bool {
    fs::read(dir.join("config")).is_ok_and(|c| !larder_store::config_is_sealed(&c))
}

// ---------------------------------------------------------------------------------
// Repository fixture

/// A scratch directory holding a repository at `path` (`SCRATCH/repo`) and a private
/// `XDG_DATA_HOME`; other subdirectories are for sources and restore targets.
pub struct Repo {
    pub path: PathBuf,
    /// `--repo` when it is not `path`: a remote repository's URL.
    pub url: Option<String>,
    /// Extra environment of every run (a remote repository's credentials).
    pub env: Vec<(&'static str, String)>,
    xdg: PathBuf,
    /// Run larder as this uid/gid (needs root).
    user: Option<u32>,
    /// Whether the remote repository at `url` is plaintext ([`Repo::mark_plaintext`]).
    remote_plaintext: std::cell::Cell<bool>,
    pub scratch: Scratch,
}

impl Repo {
    /// A fixture without a repository (`path` does not exist yet).
    pub fn uninit() -> Self {
        let scratch = Scratch::new();
        let xdg = scratch.dir("xdg");
        Self {
            path: scratch.path().join("repo"),
            url: None,
            env: Vec::new(),
            xdg,
            user: None,
            remote_plaintext: std::cell::Cell::new(false),
            scratch,
        }
    }

    /// A fixture for the remote repository at `url` (not created yet), every run with
    /// `env` (its server's credentials).
    pub fn remote(url: String, env: Vec<(&'static str, String)>) -> Self {
        Self {
            url: Some(url),
            env,
            ..Self::uninit()
        }
    }

    /// `larder --repo SCRATCH/repo init ARGS`, which must succeed.
    #[track_caller]
    pub fn init(args: &[&str]) -> Self {
        let (repo, out) = Self::init_with(args);
        out.expect_ok();
        repo
    }

    /// `init --encryption none ARGS`, which must succeed: for tests that read or damage
    /// the plaintext formats of docs/design/format.md.
    #[track_caller]
    pub fn init_plain(args: &[&str]) -> Self {
        let (repo, out) = Self::init_plain_with(args);
        out.expect_ok();
        repo
    }

    /// Runs `init --encryption none ARGS`, whatever its outcome.
    #[track_caller]
    pub fn init_plain_with(args: &[&str]) -> (Self, Output) {
        let mut full = vec!["--encryption", "none"];
        full.extend_from_slice(args);
        Self::init_with(&full)
    }

    /// Runs `init ARGS` and returns the fixture and the run, whatever its outcome.
    #[track_caller]
    pub fn init_with(args: &[&str]) -> (Self, Output) {
        let repo = Self::uninit();
        let mut full = vec!["init"];
        full.extend_from_slice(&CHEAP_KDF);
        full.extend_from_slice(args);
        let out = repo.run(&full);
        (repo, out)
    }

    /// A fresh subdirectory of the scratch space.
    pub fn dir(&self, name: &str) -> PathBuf {
        self.scratch.dir(name)
    }

    /// A path in the scratch space that does not exist yet.
    pub fn new_path(&self, name: &str) -> PathBuf {
        let p = self.scratch.path().join(name);
        assert!(!p.exists(), "{} already exists", p.display());
        p
    }

    pub fn xdg(&self) -> &Path {
        &self.xdg
    }

    /// From now on, runs larder as `uid` (group `uid`), after handing the whole scratch
    /// space to it. Needs root.
    pub fn run_as(&mut self, uid: u32) {
        chown_tree(self.scratch.path(), uid, uid);
        self.user = Some(uid);
    }

    /// Marks the remote repository at `url` as plaintext: its runs get no
    /// `LARDER_PASSWORD`, as those of a local plaintext repository do.
    pub fn mark_plaintext(&self) {
        self.remote_plaintext.set(true);
    }

    /// Whether the repository is plaintext: runs then get no `LARDER_PASSWORD`, with
    /// which larder refuses a plaintext repository (it may be an encrypted one whose
    /// config the storage replaced).
    pub fn is_plaintext(&self) -> bool {
        match &self.url {
            Some(_) => self.remote_plaintext.get(),
            None => is_plaintext_dir(&self.path),
        }
    }

    /// `larder --repo REPO ARGS...`, not yet run; without `LARDER_PASSWORD` when the
    /// repository is plaintext.
    pub fn command<I, S>(&self, args: I) -> Command
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut c = larder_command(&self.xdg);
        if self.is_plaintext() {
            c.env_remove("LARDER_PASSWORD");
        }
        match &self.url {
            Some(url) => c.arg("--repo").arg(url),
            None => c.arg("--repo").arg(&self.path),
        };
        c.envs(self.env.iter().map(|(k, v)| (k, v))).args(args);
        if let Some(uid) = self.user {
            c.uid(uid).gid(uid);
        }
        c
    }

    /// Runs `larder --repo REPO ARGS...`.
    #[track_caller]
    pub fn run<I, S>(&self, args: I) -> Output
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        run_command(self.command(args), RUN_TIMEOUT)
    }

    /// `backup --json PATHS`, which must exit 0; returns its JSON summary.
    #[track_caller]
    pub fn backup(&self, paths: &[&Path]) -> Value {
        let out = self.backup_run(paths);
        out.expect_ok();
        out.json()
    }

    /// `backup --json PATHS`, whatever its outcome.
    #[track_caller]
    pub fn backup_run(&self, paths: &[&Path]) -> Output {
        let mut args: Vec<&OsStr> = vec![OsStr::new("--json"), OsStr::new("backup")];
        args.extend(paths.iter().map(|p| p.as_os_str()));
        self.run(args)
    }

    /// `restore --json SNAPSHOT TARGET [EXTRA...]`.
    #[track_caller]
    pub fn restore(&self, snapshot: &str, target: &Path, extra: &[&str]) -> Output {
        let mut args: Vec<&OsStr> = vec![
            OsStr::new("--json"),
            OsStr::new("restore"),
            OsStr::new(snapshot),
            target.as_os_str(),
        ];
        args.extend(extra.iter().map(OsStr::new));
        self.run(args)
    }

    /// `snapshots --json`, oldest first.
    #[track_caller]
    pub fn snapshots(&self) -> Vec<Value> {
        let out = self.run(["--json", "snapshots"]);
        out.expect_ok();
        snapshot_list(&out)
    }

    /// `check --json [--read-data]`, whatever its outcome.
    #[track_caller]
    pub fn check(&self, read_data: bool) -> Output {
        let mut args = vec!["--json", "check"];
        if read_data {
            args.push("--read-data");
        }
        self.run(args)
    }
}

/// The list a successful `snapshots --json` printed (`{"snapshots": [...]}`), oldest
/// first.
#[track_caller]
pub fn snapshot_list(listed: &Output) -> Vec<Value> {
    match listed.json() {
        Value::Object(mut object) => match object.remove("snapshots") {
            Some(Value::Array(list)) => list,
            _ => panic!("snapshots --json has no snapshots array\n{listed}"),
        },
        _ => panic!("snapshots --json is not one object\n{listed}"),
    }
}

/// Where `source` (an absolute path that was backed up) lands under a restore target.
pub fn restored(target: &Path, source: &Path) -> PathBuf {
    let rel = source
        .strip_prefix("/")
        .expect("sources are absolute paths");
    target.join(rel)
}

/// The path a snapshot stores for an absolute `source`: without the leading `/`.
pub fn snapshot_path(source: &Path) -> String {
    source
        .strip_prefix("/")
        .expect("sources are absolute paths")
        .to_string_lossy()
        .into_owned()
}

// ---------------------------------------------------------------------------------
// Data

/// Deterministic pseudo-random bytes (SplitMix64).
pub fn pseudo_random(seed: u64, len: usize) -> Vec<u8> {
    larder_gen::seeded_bytes(seed, len)
}

/// Deterministic compressible text: words of a small vocabulary picked by SplitMix64,
/// so zstd shrinks it about threefold while no two long stretches repeat (it
/// deduplicates no more than random bytes do).
pub fn pseudo_text(seed: u64, len: usize) -> Vec<u8> {
    const WORDS: [&str; 32] = [
        "alpha",
        "beta",
        "gamma",
        "delta",
        "backup",
        "chunk",
        "container",
        "index",
        "restore",
        "snapshot",
        "larder",
        "pantry",
        "shelf",
        "jar",
        "barley",
        "rye",
        "oats",
        "salt",
        "honey",
        "vinegar",
        "pickle",
        "cellar",
        "cold",
        "store",
        "keep",
        "fresh",
        "dry",
        "seal",
        "lid",
        "label",
        "date",
        "winter",
    ];
    let noise = pseudo_random(seed, len / 2 + 8);
    let mut out = Vec::with_capacity(len + 16);
    for (i, b) in noise.iter().enumerate() {
        if out.len() >= len {
            break;
        }
        out.extend_from_slice(WORDS[usize::from(b % 32)].as_bytes());
        out.push(if i % 13 == 12 { b'\n' } else { b' ' });
    }
    out.truncate(len);
    out
}

// ---------------------------------------------------------------------------------
// Tree builder

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BuiltKind {
    File,
    Dir,
    Symlink,
    Special,
}

#[derive(Debug, Clone)]
struct Built {
    kind: BuiltKind,
    mode: Option<u32>,
    mtime: (i64, u32),
}

/// Builds a directory tree with exact contents, modes and mtimes. Paths are relative
/// to the root and given as bytes, so names need not be UTF-8. Every file, directory
/// and symlink gets a distinct fixed mtime (nanoseconds included) unless one is given;
/// modes and mtimes are applied by [`TreeBuilder::finish`], directories last and
/// deepest first, so creating entries does not disturb them.
pub struct TreeBuilder {
    root: PathBuf,
    entries: BTreeMap<PathBuf, Built>,
    counter: i64,
}

fn rel_path(rel: &[u8]) -> PathBuf {
    PathBuf::from(OsStr::from_bytes(rel))
}

impl TreeBuilder {
    /// Starts a tree at `root` (created if missing; mode 0755 unless changed).
    pub fn new(root: &Path) -> Self {
        fs::create_dir_all(root).expect("create tree root");
        let mut b = Self {
            root: root.to_path_buf(),
            entries: BTreeMap::new(),
            counter: 0,
        };
        b.register(PathBuf::new(), BuiltKind::Dir, Some(0o755));
        b
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    fn register(&mut self, rel: PathBuf, kind: BuiltKind, mode: Option<u32>) {
        self.counter += 1;
        let n = self.counter;
        // Distinct seconds and nanoseconds, so a swapped or truncated time shows.
        let mtime = (
            1_600_000_000 + n * 86_413,
            ((n * 7_919_113) % 999_999_999) as u32 + 1,
        );
        self.entries.insert(rel, Built { kind, mode, mtime });
    }

    fn ensure_parents(&mut self, rel: &Path) {
        if let Some(parent) = rel.parent().filter(|p| !p.as_os_str().is_empty()) {
            if !self.entries.contains_key(parent) {
                let parent = parent.to_path_buf();
                self.dir(parent.as_os_str().as_bytes());
            }
        }
    }

    /// A regular file with `data`, mode 0644.
    pub fn file(&mut self, rel: impl AsRef<[u8]>, data: impl AsRef<[u8]>) -> &mut Self {
        let rel = rel_path(rel.as_ref());
        self.ensure_parents(&rel);
        fs::write(self.root.join(&rel), data.as_ref()).expect("write file");
        self.register(rel, BuiltKind::File, Some(0o644));
        self
    }

    /// A directory (and its parents), mode 0755.
    pub fn dir(&mut self, rel: impl AsRef<[u8]>) -> &mut Self {
        let rel = rel_path(rel.as_ref());
        if self.entries.contains_key(&rel) {
            return self;
        }
        self.ensure_parents(&rel);
        fs::create_dir(self.root.join(&rel)).expect("create directory");
        self.register(rel, BuiltKind::Dir, Some(0o755));
        self
    }

    /// A symlink to `target` (which may be relative, absolute or dangling).
    pub fn symlink(&mut self, rel: impl AsRef<[u8]>, target: impl AsRef<[u8]>) -> &mut Self {
        let rel = rel_path(rel.as_ref());
        self.ensure_parents(&rel);
        std::os::unix::fs::symlink(OsStr::from_bytes(target.as_ref()), self.root.join(&rel))
            .expect("create symlink");
        self.register(rel, BuiltKind::Symlink, None);
        self
    }

    /// A FIFO (named pipe).
    pub fn fifo(&mut self, rel: impl AsRef<[u8]>) -> &mut Self {
        let rel = rel_path(rel.as_ref());
        self.ensure_parents(&rel);
        let c = CString::new(self.root.join(&rel).as_os_str().as_bytes()).expect("no NUL");
        // SAFETY: `c` is a valid NUL-terminated path; mkfifo does not retain it.
        let rc = unsafe { libc::mkfifo(c.as_ptr(), 0o644) };
        assert_eq!(rc, 0, "mkfifo: {}", std::io::Error::last_os_error());
        self.entries.insert(
            rel,
            Built {
                kind: BuiltKind::Special,
                mode: None,
                mtime: (0, 0),
            },
        );
        self
    }

    /// A unix socket (bound, then the listener is closed; the socket file stays).
    pub fn socket(&mut self, rel: impl AsRef<[u8]>) -> &mut Self {
        let rel = rel_path(rel.as_ref());
        self.ensure_parents(&rel);
        drop(std::os::unix::net::UnixListener::bind(self.root.join(&rel)).expect("bind socket"));
        self.entries.insert(
            rel,
            Built {
                kind: BuiltKind::Special,
                mode: None,
                mtime: (0, 0),
            },
        );
        self
    }

    /// Sets the permission bits `finish` gives `rel` (a file or directory).
    pub fn mode(&mut self, rel: impl AsRef<[u8]>, mode: u32) -> &mut Self {
        let rel = rel_path(rel.as_ref());
        self.entries
            .get_mut(&rel)
            .expect("mode of a built entry")
            .mode = Some(mode);
        self
    }

    /// Sets the mtime `finish` gives `rel` (empty: the root).
    pub fn mtime(&mut self, rel: impl AsRef<[u8]>, sec: i64, nsec: u32) -> &mut Self {
        let rel = rel_path(rel.as_ref());
        self.entries
            .get_mut(&rel)
            .expect("mtime of a built entry")
            .mtime = (sec, nsec);
        self
    }

    /// Applies modes and mtimes; returns the root.
    pub fn finish(&mut self) -> PathBuf {
        for (rel, b) in &self.entries {
            let path = self.root.join(rel);
            match b.kind {
                BuiltKind::File => {
                    if let Some(m) = b.mode {
                        fs::set_permissions(&path, fs::Permissions::from_mode(m)).expect("chmod");
                    }
                    set_mtime(&path, b.mtime, false);
                }
                BuiltKind::Symlink => set_mtime(&path, b.mtime, true),
                BuiltKind::Dir | BuiltKind::Special => {}
            }
        }
        let mut dirs: Vec<(&PathBuf, &Built)> = self
            .entries
            .iter()
            .filter(|(_, b)| b.kind == BuiltKind::Dir)
            .collect();
        dirs.sort_by_key(|(rel, _)| std::cmp::Reverse(rel.components().count()));
        for (rel, b) in dirs {
            let path = self.root.join(rel);
            set_mtime(&path, b.mtime, false);
            if let Some(m) = b.mode {
                fs::set_permissions(&path, fs::Permissions::from_mode(m)).expect("chmod dir");
            }
        }
        self.root.clone()
    }
}

/// Sets atime and mtime of `path`; `nofollow` sets a symlink's own.
pub fn set_mtime(path: &Path, (sec, nsec): (i64, u32), nofollow: bool) {
    let c = CString::new(path.as_os_str().as_bytes()).expect("no NUL");
    let ts = libc::timespec {
        tv_sec: sec as libc::time_t,
        tv_nsec: nsec as libc::c_long,
    };
    let times = [ts, ts];
    let flags = if nofollow {
        libc::AT_SYMLINK_NOFOLLOW
    } else {
        0
    };
    // SAFETY: `c` is a valid NUL-terminated path and `times` two timespecs; neither is
    // retained after the call.
    let rc = unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), times.as_ptr(), flags) };
    assert_eq!(
        rc,
        0,
        "utimensat {}: {}",
        path.display(),
        std::io::Error::last_os_error()
    );
}

// ---------------------------------------------------------------------------------
// Tree comparer

fn kind_of(m: &fs::Metadata) -> &'static str {
    let ft = m.file_type();
    if ft.is_symlink() {
        "symlink"
    } else if ft.is_dir() {
        "directory"
    } else if ft.is_file() {
        "file"
    } else {
        "special file"
    }
}

/// Compares two trees entry by entry: type, permission bits, mtime to the nanosecond
/// (files, directories and symlinks), symlink targets, file contents byte for byte.
/// Returns one line per difference, each starting with the relative path (`.` for the
/// roots themselves); empty when the trees are identical.
pub fn compare_trees(expected: &Path, actual: &Path) -> Vec<String> {
    let mut diffs = Vec::new();
    compare_entry(expected, actual, Path::new(""), &mut diffs);
    diffs
}

fn show(rel: &Path) -> String {
    if rel.as_os_str().is_empty() {
        ".".into()
    } else {
        // Debug escapes non-UTF-8 bytes; strip the quotes it adds.
        let s = format!("{:?}", rel.as_os_str());
        s.trim_matches('"').to_string()
    }
}

fn compare_entry(expected: &Path, actual: &Path, rel: &Path, diffs: &mut Vec<String>) {
    let name = show(rel);
    let em = match fs::symlink_metadata(expected) {
        Ok(m) => m,
        Err(e) => {
            diffs.push(format!("{name}: cannot stat expected entry: {e}"));
            return;
        }
    };
    let am = match fs::symlink_metadata(actual) {
        Ok(m) => m,
        Err(e) => {
            diffs.push(format!("{name}: missing ({e})"));
            return;
        }
    };
    let (ek, ak) = (kind_of(&em), kind_of(&am));
    if ek != ak {
        diffs.push(format!("{name}: expected a {ek}, found a {ak}"));
        return;
    }
    if ek != "symlink" && em.mode() & 0o7777 != am.mode() & 0o7777 {
        diffs.push(format!(
            "{name}: mode {:04o}, expected {:04o}",
            am.mode() & 0o7777,
            em.mode() & 0o7777
        ));
    }
    if (em.mtime(), em.mtime_nsec()) != (am.mtime(), am.mtime_nsec()) {
        diffs.push(format!(
            "{name}: mtime {}.{:09}, expected {}.{:09}",
            am.mtime(),
            am.mtime_nsec(),
            em.mtime(),
            em.mtime_nsec()
        ));
    }
    match ek {
        "file" => {
            let (e, a) = (fs::read(expected), fs::read(actual));
            match (e, a) {
                (Ok(e), Ok(a)) if e == a => {}
                (Ok(e), Ok(a)) => {
                    let first = e.iter().zip(&a).position(|(x, y)| x != y);
                    diffs.push(format!(
                        "{name}: contents differ ({} bytes, expected {}; first difference at {:?})",
                        a.len(),
                        e.len(),
                        first
                    ));
                }
                (e, a) => diffs.push(format!(
                    "{name}: cannot read: expected {:?}, actual {:?}",
                    e.err(),
                    a.err()
                )),
            }
        }
        "symlink" => {
            let (e, a) = (fs::read_link(expected), fs::read_link(actual));
            match (e, a) {
                (Ok(e), Ok(a)) if e == a => {}
                (e, a) => diffs.push(format!("{name}: link target {a:?}, expected {e:?}")),
            }
        }
        "directory" => {
            let names = |dir: &Path| -> BTreeSet<OsString> {
                fs::read_dir(dir)
                    .map(|rd| rd.flatten().map(|e| e.file_name()).collect())
                    .unwrap_or_default()
            };
            let (en, an) = (names(expected), names(actual));
            for n in en.union(&an) {
                let child = rel.join(n);
                match (en.contains(n), an.contains(n)) {
                    (true, true) => {
                        compare_entry(&expected.join(n), &actual.join(n), &child, diffs)
                    }
                    (true, false) => diffs.push(format!("{}: missing", show(&child))),
                    (false, _) => diffs.push(format!("{}: unexpected entry", show(&child))),
                }
            }
        }
        _ => {}
    }
}

/// Panics listing every difference between the two trees.
#[track_caller]
pub fn assert_same_tree(expected: &Path, actual: &Path) {
    let diffs = compare_trees(expected, actual);
    assert!(
        diffs.is_empty(),
        "{} differs from {}:\n  {}",
        actual.display(),
        expected.display(),
        diffs.join("\n  ")
    );
}

/// Every file under `dir` (relative path to bytes).
pub fn files(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.insert(
                    p.strip_prefix(dir).unwrap().to_path_buf(),
                    fs::read(&p).unwrap(),
                );
            }
        }
    }
    out
}

/// Every file, directory and symlink under `root`, relative, sorted.
pub fn list_tree(root: &Path) -> Vec<PathBuf> {
    fn walk(root: &Path, rel: &Path, out: &mut Vec<PathBuf>) {
        let Ok(rd) = fs::read_dir(root.join(rel)) else {
            return;
        };
        let mut names: Vec<OsString> = rd.flatten().map(|e| e.file_name()).collect();
        names.sort();
        for n in names {
            let child = rel.join(&n);
            out.push(child.clone());
            if fs::symlink_metadata(root.join(&child)).is_ok_and(|m| m.is_dir()) {
                walk(root, &child, out);
            }
        }
    }
    let mut out = Vec::new();
    walk(root, Path::new(""), &mut out);
    out
}
