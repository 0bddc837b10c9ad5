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

/// The SFTP server's flags on the account that refuses overwrites (sftp.md, "An
/// account that refuses overwrites"): no removals, renames, mode or size changes,
/// symlinks or server-side copies, and umask 277, which makes every new file 0400.
const NO_OVERWRITES: &str =
    "-P remove,rmdir,rename,posix-rename,setstat,fsetstat,lsetstat,symlink,copy-data -u 0277";

/// Runs one command of the `sftp` client in batch mode against `server`, as a hostile
/// client of the backup account would; whether it succeeded.
fn hostile_sftp(server: &sshd::Sshd, command: &str) -> bool {
    let batch = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(batch.path(), format!("{command}\n")).unwrap();
    let out = std::process::Command::new("sftp")
        .arg("-F")
        .arg(server.ssh_config())
        .arg("-P")
        .arg(server.port().to_string())
        .arg("-b")
        .arg(batch.path())
        .arg("127.0.0.1")
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run the sftp client (Debian's openssh-client)");
    out.status.success()
}

/// On the account that refuses overwrites, a hostile client of that account (the
/// `sftp` client) can neither upload over, rename onto, truncate, change the mode of
/// nor remove a snapshot or a container; larder's own backups, checks and restores
/// work there.
#[test]
fn a_hostile_client_cannot_overwrite_snapshots_or_containers_on_the_account_that_refuses_overwrites(
) {
    if !support::is_root() {
        eprintln!("skipped: needs root to give the SFTP server's account its directory");
        return;
    }
    let server = sshd::Sshd::start_with_sftp_as(support::NOBODY, NO_OVERWRITES);
    let scratch = Scratch::new();
    let url = server.url("repo");
    let run = |args: &[&str]| larder(&server, &scratch, &url, args);
    // The account's repository directories, made beforehand (the umask would make
    // those larder makes 0500) and owned by it.
    let repo = server.dir().join("repo");
    for dir in [
        "",
        "keys",
        "locks",
        "containers",
        "index",
        "snapshots",
        "tmp",
    ] {
        std::fs::create_dir_all(repo.join(dir)).unwrap();
        support::chown_tree(&repo.join(dir), support::NOBODY, support::NOBODY);
    }
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(server.dir(), std::fs::Permissions::from_mode(0o711)).unwrap();

    let mut init = vec!["init"];
    init.extend_from_slice(&CHEAP_KDF);
    run(&init).expect_ok();
    let source = TreeBuilder::new(&scratch.dir("source"))
        .file("big.bin", support::pseudo_random(1, 3 << 20))
        .file("a.txt", support::pseudo_text(2, 100_000))
        .finish();
    run(&["--json", "backup", source.to_str().unwrap()]).expect_ok();

    let only = |dir: &str| {
        let entry = std::fs::read_dir(repo.join(dir)).unwrap().next().unwrap();
        entry.unwrap().path()
    };
    let (snapshot, container) = (only("snapshots"), only("containers"));
    let kept = [
        std::fs::read(&snapshot).unwrap(),
        std::fs::read(&container).unwrap(),
    ];
    let evil = scratch.path().join("evil");
    std::fs::write(&evil, b"overwritten by a hostile client").unwrap();
    let (evil, tmp) = (evil.display(), repo.join("tmp").display().to_string());
    assert!(
        hostile_sftp(&server, &format!("put {evil} {tmp}/evil")),
        "new files may be made"
    );
    for target in [&snapshot, &container] {
        let target = target.display();
        for attempt in [
            format!("put {evil} {target}"),
            format!("reput {evil} {target}"),
            format!("rename {tmp}/evil {target}"),
            format!("ln {tmp}/evil {target}"),
            format!("chmod 600 {target}"),
            format!("rm {target}"),
        ] {
            assert!(
                !hostile_sftp(&server, &attempt),
                "the hostile client could {attempt}"
            );
        }
    }
    assert_eq!(std::fs::read(&snapshot).unwrap(), kept[0]);
    assert_eq!(std::fs::read(&container).unwrap(), kept[1]);

    std::fs::write(source.join("b.txt"), b"second").unwrap();
    run(&["--json", "backup", source.to_str().unwrap()]).expect_ok();
    run(&["--json", "check", "--read-data"]).expect_ok();
    let snapshots = snapshot_list(&run(&["--json", "snapshots"]));
    assert_eq!(snapshots.len(), 2);
    let latest = snapshots[1]["id"].as_str().unwrap().to_string();
    let target = scratch.path().join("restore");
    run(&["restore", &latest, target.to_str().unwrap()]).expect_ok();
    assert_same_tree(&source, &restored(&target, &source));
}

/// What denying removals alone does not protect (remote.md, "Append-only storage"): a
/// hostile client of that account overwrites a snapshot by uploading over it and a
/// container by renaming onto it. larder cannot prevent it there, but detects it:
/// `check --read-data` fails and names both.
#[test]
fn denying_removals_alone_lets_a_hostile_client_overwrite_and_check_names_the_damage() {
    let server = sshd::Sshd::start_with_sftp_flags(APPEND_ONLY);
    let scratch = Scratch::new();
    let url = server.url("repo");
    let run = |args: &[&str]| larder(&server, &scratch, &url, args);
    let repo = server.dir().join("repo");
    let mut init = vec!["init"];
    init.extend_from_slice(&CHEAP_KDF);
    run(&init).expect_ok();
    let source = TreeBuilder::new(&scratch.dir("source"))
        .file("a.bin", support::pseudo_random(3, 1 << 20))
        .finish();
    run(&["--json", "backup", source.to_str().unwrap()]).expect_ok();

    let only = |dir: &str| {
        let entry = std::fs::read_dir(repo.join(dir)).unwrap().next().unwrap();
        entry.unwrap().path()
    };
    let (snapshot, container) = (only("snapshots"), only("containers"));
    let evil = scratch.path().join("evil");
    std::fs::write(&evil, b"overwritten by a hostile client").unwrap();
    let tmp = repo.join("tmp").display().to_string();
    let evil = evil.display();
    for attack in [
        format!("put {evil} {}", snapshot.display()),
        format!("put {evil} {tmp}/evil"),
        format!("rename {tmp}/evil {}", container.display()),
    ] {
        assert!(hostile_sftp(&server, &attack), "refused: {attack}");
    }
    let checked = run(&["--json", "check", "--read-data"]);
    assert_ne!(checked.code, Some(0), "{checked}");
    let said = format!("{}{}", checked.stdout, checked.stderr);
    // The container by its full name, the snapshot by its short id.
    let named = |path: &Path, len: usize| {
        let stem = path.file_stem().unwrap().to_str().unwrap();
        said.contains(&stem[..len])
    };
    assert!(named(&container, 16) && named(&snapshot, 8), "{checked}");
}
