//! Bad input gets the exit code the README promises (0 ok, 1 failure, 2 usage, 3
//! partial) and a message that names the problem; nothing is damaged or created where
//! it should not be.

mod support;

use std::fs;
use std::os::unix::fs::FileTypeExt;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use serde_json::Value;
use support::{
    assert_same_tree, is_root, larder, list_tree, restored, run_command, Repo, TreeBuilder, NOBODY,
};

/// Anything that should fail at once gets this long before it counts as hung.
const QUICK: Duration = Duration::from_secs(20);

fn warnings(summary: &Value) -> Vec<(String, String, bool)> {
    summary["warnings"]
        .as_array()
        .unwrap_or_else(|| panic!("no warnings array in {summary}"))
        .iter()
        .map(|w| {
            (
                w["path"].as_str().expect("warning path").to_string(),
                w["message"].as_str().expect("warning message").to_string(),
                w["is_error"].as_bool().expect("warning is_error"),
            )
        })
        .collect()
}

/// A backup none of whose source paths exists fails; one with some paths left saves
/// them (`backup_sources.rs`).
#[test]
fn backing_up_only_missing_paths_fails_naming_them_and_saves_nothing() {
    let repo = Repo::init(&[]);
    let missing = repo.scratch.path().join("no-such-dir");
    let also_missing = repo.scratch.path().join("no-such-file");

    for paths in [
        vec![missing.as_path()],
        vec![missing.as_path(), also_missing.as_path()],
    ] {
        let out = repo.backup_run(&paths);
        out.expect_code(1)
            .expect_stderr(&[missing.to_str().unwrap(), "No such file"]);
        let err = out.json();
        assert!(
            err["error"]
                .as_str()
                .is_some_and(|e| e.contains(missing.to_str().unwrap())),
            "--json error does not name the path\n{out}"
        );
    }
    assert!(
        repo.snapshots().is_empty(),
        "a failed backup saved a snapshot"
    );
}

#[test]
fn unreadable_file_and_directory_are_named_and_the_rest_is_saved() {
    let mut repo = Repo::init(&[]);
    let src = repo.dir("src");
    TreeBuilder::new(&src)
        .file("readable", b"fine\n")
        .file("locked_file", b"secret\n")
        .mode("locked_file", 0o000)
        .file("locked_dir/inner", b"hidden\n")
        .mode("locked_dir", 0o000)
        .finish();
    if is_root() {
        // Root reads anything: run larder as an ordinary user instead.
        repo.run_as(NOBODY);
    }
    let out = repo.backup_run(&[&src]);
    let locked_file = src.join("locked_file");
    let locked_dir = src.join("locked_dir");
    out.expect_code(3).expect_stderr(&[
        locked_file.to_str().unwrap(),
        locked_dir.to_str().unwrap(),
        "Permission denied",
    ]);
    let summary = out.json();
    let mut ws = warnings(&summary);
    ws.sort();
    assert_eq!(ws.len(), 2, "{summary}");
    assert_eq!(ws[0].0, locked_dir.to_str().unwrap());
    assert!(ws[0].1.contains("cannot read directory"), "{ws:?}");
    assert_eq!(ws[1].0, locked_file.to_str().unwrap());
    assert!(ws[1].1.contains("cannot read file"), "{ws:?}");
    assert!(
        ws.iter().all(|w| w.2),
        "unreadable paths must be errors: {ws:?}"
    );
    assert_eq!(summary["files"], 1, "{summary}");
    // Counts are of the files saved: the unreadable one is in none of them.
    assert_eq!(summary["files_new"], 1, "{summary}");

    // The snapshot was saved and holds what could be read.
    let snaps = repo.snapshots();
    assert_eq!(snaps.len(), 1);
    assert_eq!(snaps[0]["snapshot"]["summary"]["errors"], 2);
    let target = repo.new_path("target");
    repo.restore("latest", &target, &[]).expect_ok();
    let back = restored(&target, &src);
    assert_eq!(fs::read(back.join("readable")).unwrap(), b"fine\n");
    assert!(
        !back.join("locked_file").exists(),
        "an unread file was restored"
    );
    let dir = back.join("locked_dir");
    assert!(fs::symlink_metadata(&dir).unwrap().is_dir());
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o700)).unwrap();
    assert_eq!(fs::read_dir(&dir).unwrap().count(), 0);
}

/// Root can open anything, but reading `/proc/PID/mem` at offset 0 fails (EIO, or
/// EACCES where ptrace is restricted): an unreadable file whoever runs the test.
#[test]
fn a_file_that_fails_to_read_is_reported_even_as_root() {
    let repo = Repo::init(&[]);
    let mem = Path::new("/proc")
        .join(std::process::id().to_string())
        .join("mem");
    let out = repo.backup_run(&[&mem]);
    out.expect_code(3)
        .expect_stderr(&[mem.to_str().unwrap(), "cannot read file"]);
    let ws = warnings(&out.json());
    assert_eq!(ws.len(), 1, "{ws:?}");
    assert_eq!(ws[0].0, mem.to_str().unwrap());
    assert!(ws[0].2);
    assert_eq!(
        repo.snapshots().len(),
        1,
        "the partial snapshot was not saved"
    );
}

#[test]
fn fifos_are_recorded_unread_and_sockets_skipped_with_a_notice() {
    let repo = Repo::init(&[]);
    let src = repo.dir("src");
    TreeBuilder::new(&src)
        .file("regular", b"regular\n")
        .fifo("pipe")
        .socket("sock")
        .finish();
    // A FIFO opened for reading would block forever: the run's timeout catches that.
    let backup = |path: &Path| {
        run_command(
            repo.command(["--json".as_ref(), "backup".as_ref(), path.as_os_str()]),
            QUICK,
        )
    };
    let out = backup(&src);
    let (pipe, sock) = (src.join("pipe"), src.join("sock"));
    out.expect_ok()
        .expect_stderr(&[sock.to_str().unwrap(), "socket is not backed up"]);
    let summary = out.json();
    let ws = warnings(&summary);
    assert_eq!(
        ws.iter().map(|w| w.0.as_str()).collect::<Vec<_>>(),
        [sock.to_str().unwrap()]
    );
    assert!(
        ws.iter().all(|w| !w.2),
        "a skipped socket is a notice: {ws:?}"
    );
    assert_eq!(
        (&summary["files"], &summary["specials"]),
        (&1.into(), &1.into())
    );

    // The FIFO as the only source: recorded, not read, no hang.
    let out = backup(&pipe);
    out.expect_ok();
    assert_eq!(out.json()["specials"], 1);

    let target = repo.dir("target");
    let first = repo.snapshots()[0]["id"].as_str().unwrap().to_string();
    repo.restore(&first, &target, &[]).expect_ok();
    let back = restored(&target, &src);
    assert_eq!(
        list_tree(&back),
        [Path::new("pipe"), Path::new("regular")],
        "the FIFO comes back, the socket does not"
    );
    assert!(fs::symlink_metadata(back.join("pipe"))
        .unwrap()
        .file_type()
        .is_fifo());
}

#[test]
fn a_directory_that_is_not_a_repository_is_refused_and_left_alone() {
    let fixture = Repo::uninit();
    let src = fixture.dir("src");
    TreeBuilder::new(&src).file("f", b"data").finish();
    let not_repo = fixture.dir("not-a-repo");
    fs::write(not_repo.join("keep.txt"), b"mine").unwrap();
    let missing = fixture.scratch.path().join("missing-repo");
    let target = fixture.scratch.path().join("target");

    for repo in [&not_repo, &missing] {
        let runs: [Vec<&std::ffi::OsStr>; 5] = [
            vec!["backup".as_ref(), src.as_os_str()],
            vec!["snapshots".as_ref()],
            vec!["check".as_ref(), "--read-data".as_ref()],
            vec!["stats".as_ref()],
            vec!["restore".as_ref(), "latest".as_ref(), target.as_os_str()],
        ];
        for args in runs {
            let mut full: Vec<&std::ffi::OsStr> = vec!["--repo".as_ref(), repo.as_os_str()];
            full.extend(args);
            larder(fixture.xdg(), &full)
                .expect_code(1)
                .expect_stderr(&[repo.to_str().unwrap(), "is not a larder repository"]);
        }
    }
    assert_eq!(list_tree(&not_repo), [Path::new("keep.txt")]);
    assert_eq!(fs::read(not_repo.join("keep.txt")).unwrap(), b"mine");
    assert!(!missing.exists(), "a missing repository path was created");
    assert!(!target.exists(), "restore created its target");
    assert_eq!(
        list_tree(fixture.xdg()),
        Vec::<&Path>::new(),
        "the default repository was created although --repo was given"
    );
}

#[test]
fn a_repository_with_a_garbage_config_is_refused() {
    let repo = Repo::init(&[]);
    let src = repo.dir("src");
    TreeBuilder::new(&src).file("f", b"data").finish();
    let cases: [(&[u8], &str); 4] = [
        (b"\x00\x01\x02 garbage", "is not a larder config"),
        (b"", "is not a larder config"),
        (
            br#"{"version": 7, "id": "x"}"#,
            "version 7 is not supported",
        ),
        (br#"{"version": 1, "id": "x"}"#, "invalid repository config"),
    ];
    for (config, needle) in cases {
        fs::write(repo.path.join("config"), config).unwrap();
        repo.backup_run(&[&src])
            .expect_code(1)
            .expect_stderr(&[needle]);
        repo.run(["snapshots"])
            .expect_code(1)
            .expect_stderr(&[needle]);
        repo.run(["check"]).expect_code(1).expect_stderr(&[needle]);
    }
    assert_eq!(
        fs::read_dir(repo.path.join("snapshots")).unwrap().count(),
        0,
        "a backup ran on a garbage config"
    );
}

#[test]
fn init_refuses_an_existing_repository() {
    let repo = Repo::init(&[]);
    let config = fs::read(repo.path.join("config")).unwrap();
    for args in [
        vec!["init"],
        vec!["init", "--chunker", "fixed", "--hash", "sha256"],
    ] {
        repo.run(&args)
            .expect_code(1)
            .expect_stderr(&["already exists", repo.path.to_str().unwrap()]);
    }
    assert_eq!(fs::read(repo.path.join("config")).unwrap(), config);

    // Nor into a directory that holds something else.
    let other = repo.dir("other");
    fs::write(other.join("data"), b"x").unwrap();
    larder(
        repo.xdg(),
        ["--repo".as_ref(), other.as_os_str(), "init".as_ref()],
    )
    .expect_code(1)
    .expect_stderr(&["already exists"]);
    assert_eq!(list_tree(&other), [Path::new("data")]);
}

#[test]
fn restore_never_overwrites_unless_asked() {
    let repo = Repo::init(&[]);
    let src = repo.dir("src");
    TreeBuilder::new(&src)
        .file("a", b"from the snapshot\n")
        .file("sub/b", b"also from the snapshot\n")
        .finish();
    repo.backup(&[&src]);

    let target = repo.dir("target");
    let back = restored(&target, &src);
    fs::create_dir_all(&back).unwrap();
    fs::write(back.join("a"), b"precious\n").unwrap();
    let out = repo.restore("latest", &target, &[]);
    out.expect_code(3)
        .expect_stderr(&[back.join("a").to_str().unwrap(), "already exists"]);
    let ws = warnings(&out.json());
    assert_eq!(ws.len(), 1, "{ws:?}");
    assert_eq!(fs::read(back.join("a")).unwrap(), b"precious\n");
    assert_eq!(
        fs::read(back.join("sub/b")).unwrap(),
        b"also from the snapshot\n"
    );

    repo.restore("latest", &target, &["--overwrite"])
        .expect_ok();
    assert_same_tree(&src, &back);
}

#[test]
fn restoring_an_unknown_snapshot_fails_and_creates_nothing() {
    let repo = Repo::init(&[]);
    let target = repo.scratch.path().join("target");
    repo.restore("latest", &target, &[])
        .expect_code(1)
        .expect_stderr(&["no snapshot matches"]);

    let src = repo.dir("src");
    TreeBuilder::new(&src).file("f", b"data").finish();
    let id = repo.backup(&[&src])["snapshot"]
        .as_str()
        .unwrap()
        .to_string();
    let other_first = if id.starts_with('0') { "1" } else { "0" };
    let wrong = format!("{other_first}{}", &id[1..8]);
    for name in [wrong.as_str(), "not-hex", ""] {
        repo.restore(name, &target, &[])
            .expect_code(1)
            .expect_stderr(&["no snapshot matches"]);
    }
    assert!(!target.exists(), "a failed restore created its target");
}

/// `init` parameters that no chunker or hash accepts.
const INVALID_INIT: [(&[&str], &str); 7] = [
    (&["--min", "16KiB", "--avg", "8KiB"], "min <= avg"),
    (&["--avg", "128KiB", "--max", "64KiB"], "avg <= max"),
    (&["--level", "4"], "level 4"),
    (&["--chunker", "nope"], "unknown chunker"),
    (&["--hash", "md5"], "unknown hash"),
    (&["--min", "8XB"], "unknown size suffix"),
    (&["--level", "-1"], "-1"),
];

#[test]
fn invalid_init_parameters_are_refused_with_a_message() {
    for (args, needle) in INVALID_INIT {
        let (repo, out) = Repo::init_with(args);
        assert!(
            matches!(out.code, Some(1) | Some(2)),
            "init {args:?} was not refused\n{out}"
        );
        out.expect_stderr(&[needle]);
        assert!(!repo.path.exists(), "init {args:?} created the repository");
    }
}

#[test]
fn invalid_init_parameters_exit_with_usage_code_2() {
    for (args, _) in INVALID_INIT {
        let (_, out) = Repo::init_with(args);
        out.expect_code(2);
    }
}

#[test]
fn command_line_usage_errors_exit_2() {
    let fixture = Repo::uninit();
    let repo = fixture.path.as_os_str();
    let cases: [&[&str]; 5] = [
        &[],
        &["backup"],
        &["frobnicate"],
        &["restore", "latest"],
        &["check", "--read-everything"],
    ];
    for args in cases {
        let mut full: Vec<&std::ffi::OsStr> = vec!["--repo".as_ref(), repo];
        full.extend(args.iter().map(std::ffi::OsStr::new));
        let out = larder(fixture.xdg(), &full);
        out.expect_code(2);
        assert!(!out.stderr.is_empty(), "no message\n{out}");
    }
    assert!(!fixture.path.exists());
}

/// Another process holding `flock` on the repository's lock file, as a second larder
/// would; the lock is released when the holder is dropped (killed and reaped).
///
/// A separate process, not a descriptor of this one: the other tests of this binary
/// spawn larder processes, and a child between `fork` and `exec` holds a copy of every
/// descriptor, so a lock taken here could outlive its drop by that window.
struct LockHolder(std::process::Child);

impl LockHolder {
    /// Takes the lock (`mode`: `--exclusive` or `--shared`) and returns once it is held.
    fn take(repo: &Path, mode: &str) -> Self {
        use std::io::BufRead;
        // One process from start to end (`sh` becomes `cat`), so killing and reaping
        // it releases the lock: `flock` exits after locking the descriptor it shares.
        let mut child = std::process::Command::new("sh")
            .args([
                "-c",
                "exec 9<>\"$1\" && flock \"$2\" --nonblock 9 && echo held && exec cat",
                "sh",
            ])
            .arg(repo.join("lock"))
            .arg(mode)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("start flock(1) from util-linux");
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.as_mut().expect("piped stdout"))
            .read_line(&mut line)
            .expect("read from flock");
        assert_eq!(line, "held\n", "flock {mode} did not take the lock");
        Self(child)
    }
}

impl Drop for LockHolder {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_second_writer_fails_at_once_while_the_lock_is_held() {
    let repo = Repo::init(&[]);
    let src = repo.dir("src");
    TreeBuilder::new(&src).file("f", b"data").finish();
    let backup = || run_command(repo.command(["backup".as_ref(), src.as_os_str()]), QUICK);
    let run = |args: &[&str]| run_command(repo.command(args), QUICK);

    // A writer holds the lock: another writer and readers fail, at once.
    let lock = LockHolder::take(&repo.path, "--exclusive");
    backup().expect_code(1).expect_stderr(&["locked"]);
    run(&["snapshots"])
        .expect_code(1)
        .expect_stderr(&["locked"]);
    run(&["restore", "latest", "/nonexistent/target"])
        .expect_code(1)
        .expect_stderr(&["locked"]);
    drop(lock);
    assert!(repo.snapshots().is_empty());

    // A reader holds it: readers go on, a writer fails.
    let lock = LockHolder::take(&repo.path, "--shared");
    run(&["snapshots"]).expect_ok();
    run(&["check"]).expect_ok();
    backup().expect_code(1).expect_stderr(&["locked"]);
    drop(lock);

    backup().expect_ok();
    assert_eq!(repo.snapshots().len(), 1);
}

/// Regression: `larder snapshots | head` panicked with "failed printing to stdout:
/// Broken pipe" and a backtrace. A closed stdout now ends larder quietly, by SIGPIPE
/// (raised once the write failed: SIGPIPE is otherwise ignored, so that a broken
/// connection to a remote repository is an error, not a death).
#[test]
fn a_closed_stdout_ends_larder_quietly_without_a_panic() {
    let repo = Repo::init(&[]);
    let src = repo.dir("src");
    TreeBuilder::new(&src).file("a", b"some data\n").finish();
    for _ in 0..3 {
        repo.backup(&[&src]);
    }
    let mut cmd = repo.command(["--json", "snapshots"]);
    let (reader, writer) = std::io::pipe().expect("create a pipe");
    drop(reader);
    cmd.stdout(writer);
    let out = run_command(cmd, QUICK);
    assert!(!out.stderr.contains("panicked"), "{out}");
    assert_eq!(out.code, None, "expected death by SIGPIPE\n{out}");
}

/// `--cluster` (or `LARDER_CLUSTER`) on a command that has no cluster form is a usage
/// error, not ignored: ignored, `forget` removed a snapshot of the local repository.
#[test]
fn cluster_on_a_repository_only_command_is_a_usage_error_that_changes_nothing() {
    let repo = Repo::init(&[]);
    let src = repo.new_path("src");
    fs::create_dir_all(&src).unwrap();
    fs::write(src.join("f"), b"kept").unwrap();
    repo.backup(&[&src]);
    let before = list_tree(&repo.path);
    for args in [
        &["--cluster", "127.0.0.1:1", "forget", "latest"][..],
        &["--cluster", "127.0.0.1:1", "gc"],
        &["--cluster", "127.0.0.1:1", "ls", "latest"],
        &["--cluster", "127.0.0.1:1", "key", "list"],
    ] {
        repo.run(args)
            .expect_code(2)
            .expect_stderr(&["works on a repository, not through a cluster"]);
    }
    let mut c = repo.command(["forget", "latest"]);
    c.env("LARDER_CLUSTER", "127.0.0.1:1");
    run_command(c, QUICK).expect_code(2);
    assert_eq!(list_tree(&repo.path), before, "a refused command wrote");
    repo.run(["snapshots"]).expect_ok();
}
