//! Repository files are private whatever the umask (restic's modes): every file
//! larder makes is 0600 and every directory 0700, in a local repository (its config,
//! key slots, containers, segments, snapshots, lock and disk index), in the default
//! repository and its generated password file, in a remote repository's cache, and
//! in this client's security records. Each run here has umask 022, with which they
//! used to be readable by every local user.

mod support;

#[path = "../../larder-store/tests/support/s3s.rs"]
mod s3s;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use support::{pseudo_random, Repo};

/// `c` with umask 022 in the child.
fn with_umask_022(mut c: Command) -> Command {
    // SAFETY: umask is async-signal-safe and touches only the child's own state.
    unsafe {
        c.pre_exec(|| {
            libc::umask(0o022);
            Ok(())
        });
    }
    c
}

#[track_caller]
fn run(repo: &Repo, args: &[&str]) -> support::Output {
    support::run_command(with_umask_022(repo.command(args)), support::RUN_TIMEOUT)
}

/// Every entry under `root` (itself included) whose mode is not 0600 for a file or
/// 0700 for a directory, with its mode.
fn not_private(root: &Path) -> Vec<(PathBuf, u32)> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(p) = stack.pop() {
        let meta = fs::symlink_metadata(&p).unwrap();
        let mode = meta.permissions().mode() & 0o7777;
        let want = if meta.is_dir() { 0o700 } else { 0o600 };
        if mode != want {
            out.push((p.clone(), mode));
        }
        if meta.is_dir() {
            stack.extend(fs::read_dir(&p).unwrap().map(|e| e.unwrap().path()));
        }
    }
    out.sort();
    out
}

#[track_caller]
fn assert_private(root: &Path) {
    let found = not_private(root);
    assert!(
        found.is_empty(),
        "not private (0600 files, 0700 directories) under {}: {:?}",
        root.display(),
        found
            .iter()
            .map(|(p, m)| format!("{} {m:o}", p.display()))
            .collect::<Vec<_>>()
    );
}

fn init(repo: &Repo, extra: &[&str]) {
    let mut args = vec!["init"];
    args.extend_from_slice(&support::CHEAP_KDF);
    args.extend_from_slice(extra);
    run(repo, &args).expect_ok();
}

/// Backs up twice, forgets the first and collects garbage: every kind of file.
fn exercise(repo: &Repo) {
    let src = repo.dir("src");
    fs::write(src.join("a"), pseudo_random(1, 300_000)).unwrap();
    let s = src.to_str().unwrap();
    run(repo, &["backup", s]).expect_ok();
    fs::write(src.join("a"), pseudo_random(2, 300_000)).unwrap();
    run(repo, &["backup", s]).expect_ok();
    let first = repo.snapshots()[0]["id"].as_str().unwrap().to_string();
    run(repo, &["forget", &first, "--prune"]).expect_ok();
}

#[test]
fn a_local_repository_and_this_clients_records_are_private_under_umask_022() {
    for extra in [
        vec![],
        vec!["--index", "disk"],
        vec!["--encryption", "none"],
    ] {
        let repo = Repo::uninit();
        init(&repo, &extra);
        exercise(&repo);
        if extra.is_empty() {
            let mut c = with_umask_022(repo.command(["key", "add"]));
            c.env("LARDER_NEW_PASSWORD", "another password");
            support::run_command(c, support::RUN_TIMEOUT).expect_ok();
            assert!(repo.path.join("keys").is_dir());
            assert_private(&repo.xdg().join("config/larder"));
        }
        assert!(repo.path.join("lock").is_file());
        assert_private(&repo.path);
    }
}

#[test]
fn the_default_repository_and_its_password_file_are_private_under_umask_022() {
    let scratch = support::Scratch::new();
    let xdg = scratch.dir("xdg");
    let mut c = support::larder_command(&xdg);
    c.env_remove("LARDER_PASSWORD").arg("snapshots");
    support::run_command(with_umask_022(c), support::RUN_TIMEOUT).expect_ok();
    assert!(xdg.join("larder/repo/config").is_file());
    assert_private(&xdg.join("larder"));
    assert!(xdg.join("config/larder/default-repo.password").is_file());
    assert_private(&xdg.join("config"));
}

#[test]
fn a_remote_repositorys_cache_is_private_under_umask_022() {
    let server = s3s::S3sServer::start(&["larder"]);
    let repo = Repo::remote("s3://larder/repo".into(), server.env());
    init(&repo, &["--index", "disk"]);
    exercise(&repo);
    let cache = repo.xdg().join("cache");
    assert!(cache.join("larder/CACHEDIR.TAG").is_file());
    assert_private(&cache);
}
