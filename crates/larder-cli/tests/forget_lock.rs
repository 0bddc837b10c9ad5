//! `forget`, `gc` and the lock from the command line (docs/design/gc.md): policies
//! refused or applied, what is listed, a second writer refused with the holder's
//! name, `--retry-lock` waiting, stale lock notes harmless and removable.

mod support;

#[path = "../../larder-store/tests/support/s3s.rs"]
mod s3s;

use std::fs;
use std::time::Duration;

use larder_store::{LockHolder, LockMode, Repository};
use serde_json::Value;
use support::{pseudo_random, Repo};

/// Opens the repository in this process, waiting a little: a lock this test process
/// released may still be held for a moment by a child another test thread is
/// starting (fork copies the descriptor until exec closes it).
fn hold(repo: &Repo, mode: LockMode) -> Repository {
    support::open_store_waiting(&repo.path, mode, Duration::from_secs(10))
}

fn repo_with_snapshots(n: u64) -> (Repo, Vec<String>) {
    let repo = Repo::init(&[]);
    let src = repo.dir("src");
    let mut ids = Vec::new();
    for i in 0..n {
        fs::write(src.join("file"), pseudo_random(i, 300_000)).unwrap();
        let v = repo.backup(&[&src]);
        ids.push(v["snapshot"].as_str().unwrap().to_owned());
    }
    (repo, ids)
}

fn ids_of(list: &Value) -> Vec<String> {
    list.as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn forget_refuses_a_policy_that_keeps_nothing_and_mixed_arguments() {
    let (repo, ids) = repo_with_snapshots(2);
    repo.run(["forget"])
        .expect_code(2)
        .expect_stderr(&["name the snapshots to forget"]);
    repo.run(["forget", "--keep-last", "0"]).expect_code(2);
    repo.run(["forget", &ids[0][..8], "--keep-last", "1"])
        .expect_code(2)
        .expect_stderr(&["not both"]);
    assert_eq!(
        repo.snapshots().len(),
        2,
        "a refused forget removed something"
    );
}

#[test]
fn forget_by_policy_lists_and_removes_and_dry_run_changes_nothing() {
    let (repo, ids) = repo_with_snapshots(4);
    let dry = repo.run(["--json", "forget", "--keep-last", "2", "--dry-run"]);
    dry.expect_ok();
    let v = dry.json();
    assert_eq!(v["dry_run"], true);
    assert_eq!(ids_of(&v["keep"]), ids[2..]);
    assert_eq!(ids_of(&v["remove"]), ids[..2]);
    assert_eq!(v["keep"][0]["reasons"], serde_json::json!(["last"]));
    assert_eq!(repo.snapshots().len(), 4);

    // With --prune, the dry run previews gc as if the two were gone.
    let preview = repo.run([
        "--json",
        "forget",
        "--keep-last",
        "2",
        "--dry-run",
        "--prune",
    ]);
    preview.expect_ok();
    let preview = preview.json();
    assert_eq!(preview["gc"]["dry_run"], true, "{preview}");
    assert_eq!(repo.snapshots().len(), 4);

    let out = repo.run(["--json", "forget", "--keep-last", "2", "--prune"]);
    out.expect_ok();
    let v = out.json();
    assert_eq!(ids_of(&v["remove"]), ids[..2]);
    assert!(v["gc"]["bytes_reclaimed"].as_i64().unwrap() > 0, "{v}");
    assert_eq!(preview["gc"]["bytes_reclaimed"], v["gc"]["bytes_reclaimed"]);
    assert_eq!(
        preview["gc"]["containers_deleted"],
        v["gc"]["containers_deleted"]
    );
    let left: Vec<String> = repo
        .snapshots()
        .iter()
        .map(|s| s["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(left, ids[2..]);
    repo.check(true).expect_ok();
}

#[test]
fn forget_named_snapshots_then_gc_text_and_json() {
    let (repo, ids) = repo_with_snapshots(3);
    let dry = repo.run(["--json", "forget", "--dry-run", &ids[1][..10]]);
    dry.expect_ok();
    let v = dry.json();
    assert_eq!(ids_of(&v["remove"]), [ids[1].clone()]);
    assert_eq!(v["keep"][1]["reasons"], serde_json::json!(["not named"]));
    assert_eq!(repo.snapshots().len(), 3);
    let out = repo.run(["forget", &ids[1][..10]]);
    out.expect_ok();
    assert!(
        out.stdout
            .contains(&format!("removed 1 snapshot(s):\n  {}", &ids[1][..8])),
        "{out}"
    );
    repo.run(["forget", &ids[1][..10]])
        .expect_code(1)
        .expect_stderr(&["no snapshot matches"]);
    let dry = repo.run(["--json", "gc", "--dry-run"]);
    dry.expect_ok();
    let predicted = dry.json();
    let out = repo.run(["--json", "prune"]);
    out.expect_ok();
    let done = out.json();
    for field in [
        "containers_deleted",
        "containers_repacked",
        "bytes_reclaimed",
        "bytes_after",
    ] {
        assert_eq!(predicted[field], done[field], "{field}");
    }
    assert!(
        done["bytes_reclaimed"].as_i64().unwrap() > 250_000,
        "{done}"
    );
    let text = repo.run(["gc"]);
    text.expect_ok();
    assert!(text.stdout.contains("0 deleted, 0 repacked"), "{text}");
    repo.check(true).expect_ok();
}

#[test]
fn a_second_writer_is_refused_with_the_holders_name() {
    let (repo, _) = repo_with_snapshots(1);
    let held = hold(&repo, LockMode::Exclusive);
    let me = format!("pid {}", std::process::id());
    for args in [&["gc"][..], &["forget", "--keep-last", "1"], &["snapshots"]] {
        repo.run(args)
            .expect_code(1)
            .expect_stderr(&["is locked by", &me, "--retry-lock"]);
    }
    drop(held);

    let reader = hold(&repo, LockMode::Shared);
    repo.run(["gc"])
        .expect_code(1)
        .expect_stderr(&["locked by one or more readers"]);
    repo.run(["snapshots"]).expect_ok();
    drop(reader);
}

#[test]
fn retry_lock_waits_for_the_holder() {
    let (repo, _) = repo_with_snapshots(1);
    let held = hold(&repo, LockMode::Exclusive);
    let release = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(700));
        drop(held);
    });
    let out = repo.run(["--retry-lock", "20s", "gc"]);
    release.join().unwrap();
    out.expect_ok();
    assert!(out.elapsed >= Duration::from_millis(600), "{out}");

    let _held = hold(&repo, LockMode::Exclusive);
    repo.run(["--retry-lock", "300ms", "gc"])
        .expect_code(1)
        .expect_stderr(&["gave up after waiting 0.3 s"]);
}

/// A pid that is certainly not running: a child that has exited and been reaped.
fn dead_pid() -> u32 {
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let pid = child.id();
    child.wait().unwrap();
    pid
}

#[test]
fn a_stale_lock_note_is_harmless_named_as_stale_and_removable() {
    let (repo, _) = repo_with_snapshots(1);
    let stale = LockHolder {
        pid: dead_pid(),
        ..LockHolder::current()
    };
    fs::write(repo.path.join("lock"), serde_json::to_vec(&stale).unwrap()).unwrap();

    // A reader holds the lock: the refusal names the readers and calls the note stale.
    let reader = hold(&repo, LockMode::Shared);
    repo.run(["gc"])
        .expect_code(1)
        .expect_stderr(&["locked by one or more readers", "is stale"]);
    repo.run(["unlock"])
        .expect_code(1)
        .expect_stderr(&["readers"]);
    drop(reader);

    let out = repo.run(["unlock"]);
    out.expect_ok();
    assert!(
        out.stdout
            .contains(&format!("removed the stale lock of pid {}", stale.pid)),
        "{out}"
    );
    assert_eq!(fs::read(repo.path.join("lock")).unwrap(), b"");
    let again = repo.run(["--json", "unlock"]);
    again.expect_ok();
    assert_eq!(again.json()["removed"], serde_json::json!([]));

    // Even left in place, a stale note never blocks a writer.
    fs::write(repo.path.join("lock"), serde_json::to_vec(&stale).unwrap()).unwrap();
    repo.run(["gc"]).expect_ok();
    assert_eq!(
        fs::read(repo.path.join("lock")).unwrap(),
        b"",
        "a finished writer left its note behind"
    );
}

/// The lock note says who holds the lock and nothing more: not the command line, whose
/// `--password-command` may hold a secret; the lock file is 0600; a note left by a
/// killed writer shows no secret either.
#[test]
fn the_lock_note_holds_no_command_line_and_is_private() {
    use std::os::unix::fs::PermissionsExt;
    let repo = Repo::init(&[]);
    let lock = repo.path.join("lock");
    let mut child = writer_holding_the_lock(&repo, || fs::metadata(&lock).unwrap().len() > 0);
    std::thread::sleep(Duration::from_millis(100));
    child.kill();
    let note = fs::read_to_string(&lock).unwrap();
    assert!(!note.is_empty(), "the killed writer's note is gone");
    assert!(
        !note.contains("s3cr3t"),
        "the note shows the password command: {note}"
    );
    assert!(
        !note.contains("backup"),
        "the note shows the command line: {note}"
    );
    let holder: Value = serde_json::from_str(&note).unwrap();
    assert_eq!(holder["pid"], child.id());
    assert_eq!(holder["nonce"].as_str().map(str::len), Some(32), "{note}");
    assert_eq!(
        fs::metadata(&lock).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let out = repo.run(["unlock"]);
    out.expect_ok();
    assert!(!out.stdout.contains("s3cr3t"), "{out}");
}

/// A writer that a test kills; killed on drop too, should the test fail first.
struct Writer(std::process::Child);

impl Writer {
    fn id(&self) -> u32 {
        self.0.id()
    }

    fn kill(&mut self) {
        // SAFETY: kill has no memory-safety preconditions; the child is not yet reaped.
        unsafe { libc::kill(self.0.id() as libc::pid_t, libc::SIGKILL) };
        let _ = self.0.wait();
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Starts `larder backup --stdin` on `repo` with a password command that holds a
/// secret, and waits until `ready` says it holds the lock.
fn writer_holding_the_lock(repo: &Repo, ready: impl Fn() -> bool) -> Writer {
    use std::io::Write;
    let secret = repo.scratch.path().join("password");
    fs::write(&secret, support::PASSWORD).unwrap();
    let command = format!("cat {} # --token=s3cr3t-t0ken", secret.display());
    let mut c = repo.command(["--password-command", &command, "backup", "--stdin"]);
    c.env_remove("LARDER_PASSWORD")
        .stdin(std::process::Stdio::piped());
    let mut child = Writer(c.spawn().unwrap());
    child
        .0
        .stdin
        .as_mut()
        .unwrap()
        .write_all(b"some data")
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !ready() {
        assert!(
            std::time::Instant::now() < deadline,
            "the writer took no lock"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    child
}

/// An encrypted remote repository's lock object shows the storage nothing of its
/// holder (host, pid, user, command line): it is sealed. `unlock` still opens it,
/// keeps it while its holder lives and removes it once the holder is killed.
#[test]
fn an_encrypted_remote_repositorys_lock_object_is_sealed() {
    let server = s3s::S3sServer::start(&["larder"]);
    let repo = Repo::remote("s3://larder/repo".into(), server.env());
    let mut init = vec!["init"];
    init.extend_from_slice(&support::CHEAP_KDF);
    repo.run(&init).expect_ok();
    let locks = server.bucket_dir("larder").join("repo/locks");
    let objects = || -> Vec<std::path::PathBuf> {
        fs::read_dir(&locks)
            .map(|rd| rd.flatten().map(|e| e.path()).collect())
            .unwrap_or_default()
    };
    let mut child = writer_holding_the_lock(&repo, || !objects().is_empty());
    let bytes = fs::read(&objects()[0]).unwrap();
    let text = String::from_utf8_lossy(&bytes);
    let host = LockHolder::current().hostname;
    assert!(
        bytes.starts_with(b"LARDERE1"),
        "the lock object is not sealed: {text}"
    );
    for shown in [host.as_str(), "s3cr3t", "backup", &child.id().to_string()] {
        assert!(
            !text.contains(shown),
            "the lock object shows {shown:?}: {text}"
        );
    }
    let held = repo.run(["unlock"]);
    held.expect_ok();
    let left = format!("left the lock of pid {}", child.id());
    assert!(
        held.stdout.contains(&left) && held.stdout.contains("still locked"),
        "{held}"
    );
    assert_eq!(objects().len(), 1, "unlock removed a live holder's lock");

    child.kill();
    let out = repo.run(["unlock"]);
    out.expect_ok();
    assert!(
        out.stdout
            .contains(&format!("removed the stale lock of pid {}", child.id())),
        "{out}"
    );
    assert!(!out.stdout.contains("s3cr3t"), "{out}");
    assert!(objects().is_empty());
}
