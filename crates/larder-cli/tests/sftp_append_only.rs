//! larder on the documented append-only SFTP account (an SFTP server that refuses
//! `remove` and `rmdir`: docs/design/remote.md, "Append-only storage"): `init` and
//! backups work there, every write whose temporary name cannot be removed included, and
//! what the account does not protect against is detected.

mod support;

#[path = "../../larder-store/tests/support/sshd.rs"]
mod sshd;

use std::ffi::OsStr;
use std::path::Path;

use support::{
    assert_same_tree, larder_command, restored, run_command, snapshot_list, Output, Scratch,
    TreeBuilder, CHEAP_KDF, RUN_TIMEOUT,
};

/// The SFTP server's flags on the append-only account.
const APPEND_ONLY: &str = "-P remove,rmdir";

/// Runs `larder --repo URL ARGS` reaching `server`, with a private cache directory.
fn larder(server: &sshd::Sshd, scratch: &Scratch, url: &str, args: &[&str]) -> Output {
    let mut command = larder_command(&scratch.path().join("xdg"));
    command
        .env("LARDER_SFTP_ARGS", server.ssh_args().join(" "))
        .env_remove("LARDER_SFTP_COMMAND")
        .arg("--repo")
        .arg(url)
        .args(args.iter().map(OsStr::new));
    run_command(command, RUN_TIMEOUT)
}

fn count(dir: &Path) -> usize {
    std::fs::read_dir(dir).map_or(0, |d| d.count())
}

/// `init` makes a whole repository (one key slot, a config) on an account that may not
/// remove files, and backups, checks and restores work there; `forget` refuses before
/// deleting anything.
#[test]
fn init_and_backups_work_on_an_append_only_account() {
    let server = sshd::Sshd::start_with_sftp_flags(APPEND_ONLY);
    let scratch = Scratch::new();
    let url = server.url("repo");
    let run = |args: &[&str]| larder(&server, &scratch, &url, args);
    let repo = server.dir().join("repo");

    let mut init = vec!["init"];
    init.extend_from_slice(&CHEAP_KDF);
    run(&init).expect_ok();
    assert!(repo.join("config").is_file());
    assert_eq!(count(&repo.join("keys")), 1, "one key slot");

    let source = TreeBuilder::new(&scratch.dir("source"))
        .file("big.bin", support::pseudo_random(1, 3 << 20))
        .file("text/a.txt", support::pseudo_text(2, 200_000))
        .finish();
    run(&["--json", "backup", source.to_str().unwrap()]).expect_ok();
    std::fs::write(source.join("text/b.txt"), b"second").unwrap();
    run(&["--json", "backup", source.to_str().unwrap()]).expect_ok();
    let snapshots = snapshot_list(&run(&["--json", "snapshots"]));
    assert_eq!(snapshots.len(), 2);
    run(&["--json", "check", "--read-data"]).expect_ok();
    let latest = snapshots[1]["id"].as_str().unwrap().to_string();
    let target = scratch.path().join("restore");
    run(&["restore", &latest, target.to_str().unwrap()]).expect_ok();
    assert_same_tree(&source, &restored(&target, &source));

    run(&["forget", "--keep-last", "1"])
        .expect_code(1)
        .expect_stderr(&["refuses deletes"]);
    assert_eq!(snapshot_list(&run(&["--json", "snapshots"])).len(), 2);
}
