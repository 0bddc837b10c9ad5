//! `larder` against an encrypted repository on an SSH server (`--repo sftp://...`), a
//! private sshd on 127.0.0.1 (larder-store's tests/support/sshd.rs): every command
//! that reads or writes the repository, and a byte-identical restore.

mod support;

#[path = "../../larder-store/tests/support/sshd.rs"]
mod sshd;

use std::ffi::OsStr;
use std::path::Path;

use support::{
    assert_same_tree, larder_command, restored, run_command, snapshot_list, Output, Scratch,
    TreeBuilder, CHEAP_KDF, RUN_TIMEOUT,
};

/// Runs `larder --repo URL ARGS` reaching `server` through `LARDER_SFTP_ARGS`, with a
/// private cache directory.
fn larder(server: &sshd::Sshd, scratch: &Scratch, url: &str, args: &[&str]) -> Output {
    let mut command = larder_command(&scratch.path().join("xdg"));
    command
        .env("LARDER_SFTP_ARGS", server.ssh_args().join(" "))
        .env_remove("LARDER_SFTP_COMMAND")
        .env("XDG_CACHE_HOME", scratch.path().join("cache"))
        .arg("--repo")
        .arg(url)
        .args(args.iter().map(OsStr::new));
    run_command(command, RUN_TIMEOUT)
}

#[test]
fn every_command_works_over_sftp() {
    let server = sshd::Sshd::start();
    let scratch = Scratch::new();
    let url = server.url("repo");
    let run = |args: &[&str]| larder(&server, &scratch, &url, args);

    let mut init = vec!["init"];
    init.extend_from_slice(&CHEAP_KDF);
    run(&init).expect_ok();
    assert!(server.dir().join("repo/config").is_file());
    assert!(server.dir().join("repo/keys").read_dir().unwrap().count() > 0);

    let source = TreeBuilder::new(&scratch.dir("source"))
        .file("big.bin", support::pseudo_random(1, 3 << 20))
        .file("text/a.txt", support::pseudo_text(2, 200_000))
        .file("text/empty", b"")
        .finish();
    let first = run(&["--json", "backup", path_str(&source)]);
    first.expect_ok();
    std::fs::write(source.join("text/b.txt"), b"second").unwrap();
    run(&["--json", "backup", path_str(&source)]).expect_ok();

    let listed = run(&["--json", "snapshots"]);
    listed.expect_ok();
    let snapshots = snapshot_list(&listed);
    assert_eq!(snapshots.len(), 2, "{listed}");
    let latest = snapshots[1]["id"].as_str().expect("an id").to_string();

    let target = scratch.path().join("restore");
    run(&["--json", "restore", &latest, path_str(&target)]).expect_ok();
    assert_same_tree(&source, &restored(&target, &source));

    let checked = run(&["--json", "check", "--read-data"]);
    checked.expect_ok();

    run(&["--json", "forget", "--keep-last", "1"]).expect_ok();
    run(&["--json", "gc"]).expect_ok();
    assert_eq!(snapshot_list(&run(&["--json", "snapshots"])).len(), 1);
    run(&["--json", "check", "--read-data"]).expect_ok();
    let again = scratch.path().join("restore-again");
    run(&["--json", "restore", &latest, path_str(&again)]).expect_ok();
    assert_same_tree(&source, &restored(&again, &source));

    // No upload left behind, and locks are objects on the server, all released.
    let leftovers = |dir: &str| match std::fs::read_dir(server.dir().join("repo").join(dir)) {
        Ok(entries) => entries.count(),
        Err(_) => 0,
    };
    assert_eq!(leftovers("tmp"), 0);
    assert_eq!(leftovers("locks"), 0);
}

/// A server that refuses the login fails at once, naming the repository and saying
/// what ssh said, without retrying.
#[test]
fn a_refused_login_is_a_clear_error() {
    let server = sshd::Sshd::start();
    let scratch = Scratch::new();
    let url = server.url("repo");
    let mut command = larder_command(&scratch.path().join("xdg"));
    command
        .env(
            "LARDER_SFTP_ARGS",
            format!("-F {}", server.stranger_config().display()),
        )
        .env("XDG_CACHE_HOME", scratch.path().join("cache"))
        .args(["--repo", &url, "snapshots"]);
    let out = run_command(command, RUN_TIMEOUT);
    assert_ne!(out.code, Some(0), "{out}");
    out.expect_stderr(&[&url, "Permission denied"]);
    assert!(out.elapsed.as_secs() < 20, "{out}");
}

/// Storage rolled back to an earlier copy (its files' times kept, as `cp -a` keeps
/// them) and written again by another client: this client's cache and disk index hold
/// the segments of the lost history under the same names, and must not be used.
#[test]
fn storage_rolled_back_and_written_again_is_not_served_from_the_cache() {
    let server = sshd::Sshd::start();
    let (mine, other) = (Scratch::new(), Scratch::new());
    let url = server.url("repo");
    let run = |scratch: &Scratch, args: &[&str]| larder(&server, scratch, &url, args);
    let tree = |scratch: &Scratch, seed: u64| {
        let mut tree = TreeBuilder::new(&scratch.dir(&format!("src{seed}")));
        for i in 0..3 {
            tree.file(
                format!("f{i}"),
                support::pseudo_random(seed * 10 + i, 300_000),
            );
        }
        tree.finish()
    };
    let mut init = vec!["init", "--index", "disk"];
    init.extend_from_slice(&CHEAP_KDF);
    run(&mine, &init).expect_ok();
    run(&mine, &["--json", "backup", path_str(&tree(&mine, 1))]).expect_ok();
    let storage = server.dir().join("repo");
    let saved = mine.path().join("saved");
    copy_keeping_times(&storage, &saved);

    let second = tree(&mine, 2);
    run(&mine, &["--json", "backup", path_str(&second)]).expect_ok();
    std::fs::remove_dir_all(&storage).unwrap();
    copy_keeping_times(&saved, &storage);
    // SFTP lists modification times in seconds: a rewrite within the same second as
    // the cached file, with the same length, is not told apart (remote.md says so).
    std::thread::sleep(std::time::Duration::from_millis(1100));
    run(&other, &["--json", "backup", path_str(&tree(&other, 3))]).expect_ok();

    let summary = run(&mine, &["--json", "backup", path_str(&second)]);
    summary.expect_ok();
    let new = summary.json()["chunks_new"].as_u64().unwrap();
    assert!(new > 3, "the lost data is stored again: {summary}");
    run(&mine, &["--json", "check", "--read-data"]).expect_ok();
    let target = mine.path().join("restore");
    run(&mine, &["--json", "restore", "latest", path_str(&target)]).expect_ok();
    assert_same_tree(&second, &restored(&target, &second));
}

/// Copies directory `from` to `to` with every file's modification time.
fn copy_keeping_times(from: &Path, to: &Path) {
    let status = std::process::Command::new("cp")
        .arg("-a")
        .arg(from)
        .arg(to)
        .status()
        .unwrap();
    assert!(status.success());
}

fn path_str(path: &Path) -> &str {
    path.to_str().expect("a UTF-8 path")
}
