//! What larder prints can be trusted by terminals and by scripts: names from trees, the
//! file system and storage never reach a terminal raw (no escape sequence, no forged
//! line), `--json` is always one representable object whatever the names, usage errors
//! are JSON too under `--json`, `-q` hides notices but not errors, and a backup's
//! summary counts chunks consistently.

mod support;

use std::ffi::OsStr;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use larder_store::LockMode;
use support::{
    open_store, restored, run_command, snapshot_path, Output, Repo, TreeBuilder, RUN_TIMEOUT,
};

/// A name that would forge a line starting with `FORGED` if printed raw.
const FORGED: &str = "FORGED";

/// Names that clear the screen, forge lines, move the cursor, set the title, carry a C1
/// control (U+009B, CSI in 8-bit terminals) or are not UTF-8.
const HOSTILE: [&[u8]; 6] = [
    b"nl\nFORGED: larder: error: fake",
    b"clear\x1b[2J",
    b"cr\rFORGED",
    b"bad\xff\xfe",
    b"title\x1b]0;pwned\x07",
    b"c1\xc2\x9b2J",
];

/// Panics unless `out` holds no raw control character but line ends, and no line that
/// a name forged.
#[track_caller]
fn assert_terminal_safe(out: &Output) {
    for (stream, text) in [("stdout", &out.stdout), ("stderr", &out.stderr)] {
        let raw = text.chars().find(|c| c.is_control() && *c != '\n');
        assert!(
            raw.is_none(),
            "{stream} holds a raw control character {raw:?}\n{out:?}"
        );
        assert!(
            !text.lines().any(|l| l.starts_with(FORGED)),
            "{stream}: a name forged a line\n{out}"
        );
    }
}

/// A source tree under a root whose own name is hostile, with a file of each hostile
/// name, a directory with one, and a socket with one (skipped with a notice).
fn hostile_source(repo: &Repo) -> PathBuf {
    let root = repo
        .scratch
        .path()
        .join(OsStr::from_bytes(b"src\x1b[2J\nFORGED\xff"));
    let mut tree = TreeBuilder::new(&root);
    for (i, name) in HOSTILE.iter().enumerate() {
        tree.file(name, format!("content {i}\n"));
    }
    tree.file(b"dir\n\x1b[1mFORGED/inner\r", b"inner\n")
        .socket(b"s\x1b[2J\nFORGED\xff");
    tree.finish()
}

/// Regression: names were printed raw in warnings, errors, `snapshots` and `check`'s
/// report, so a file name could clear the screen or forge a line of larder's output.
#[test]
fn hostile_names_never_reach_a_terminal_raw() {
    let repo = Repo::init(&[]);
    let src = hostile_source(&repo);
    let run = |args: &[&OsStr]| {
        let out = repo.run(args);
        assert_terminal_safe(&out);
        out
    };
    let backup = run(&["backup".as_ref(), src.as_os_str()]);
    backup.expect_ok();
    assert!(
        backup.stderr.contains("s\\x1b[2J\\x0aFORGED\\xff"),
        "the socket's notice does not name it, escaped and exact\n{backup}"
    );
    run(&["snapshots".as_ref()]).expect_ok();
    run(&["ls".as_ref(), "-l".as_ref(), "latest".as_ref()]).expect_ok();

    let target = repo.dir("target");
    run(&["restore".as_ref(), "latest".as_ref(), target.as_os_str()]).expect_ok();
    let back = restored(&target, &src);
    for name in HOSTILE
        .iter()
        .chain([&b"dir\n\x1b[1mFORGED/inner\r"[..]].iter())
    {
        let name = OsStr::from_bytes(name);
        assert_eq!(
            fs::read(back.join(name)).unwrap(),
            fs::read(src.join(name)).unwrap()
        );
    }
    // Again, without --overwrite: a warning names every file.
    let again = run(&["restore".as_ref(), "latest".as_ref(), target.as_os_str()]);
    again.expect_code(3);
    assert!(again.stderr.contains("clear\\x1b[2J"), "{again}");

    // Errors naming a path.
    let missing = OsStr::from_bytes(b"/nothing\x1b[2J\nFORGED here");
    run(&["ls".as_ref(), "latest".as_ref(), missing]).expect_code(1);
    let gone = repo
        .scratch
        .path()
        .join(OsStr::from_bytes(b"gone\x1b[2J\nFORGED"));
    run(&["backup".as_ref(), gone.as_os_str()]);

    // A second backup whose new file and tree land in a container of their own; with
    // the first backup's containers gone, `check` names each file that lost data.
    let containers = |repo: &Repo| -> Vec<PathBuf> {
        let mut names: Vec<PathBuf> = fs::read_dir(repo.path.join("containers"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        names.sort();
        names
    };
    let first = containers(&repo);
    fs::write(src.join("later"), b"later\n").unwrap();
    run(&["backup".as_ref(), src.as_os_str()]).expect_ok();
    for c in &first {
        fs::remove_file(c).unwrap();
    }
    let check = run(&["check".as_ref()]);
    check.expect_code(1);
    assert!(check.stderr.contains("clear\\x1b[2J"), "{check}");
}

/// Crafted snapshots: a host, user and paths with escapes; `snapshots` shows them
/// escaped.
#[test]
fn hostile_snapshot_fields_are_escaped_in_listings() {
    let repo = Repo::init(&[]);
    let src = repo.dir("src");
    TreeBuilder::new(&src).file("a", b"a\n").finish();
    repo.backup(&[&src]);
    {
        let store = open_store(&repo.path, LockMode::Exclusive);
        let (snapshots, _) = store.snapshots().unwrap();
        let mut s = snapshots[0].1.clone();
        s.hostname = "host\x1b[2J\nFORGED".into();
        s.username = "user\x1b]0;t\x07".into();
        s.paths = vec!["/p\r\nFORGED \u{9b}".into()];
        store.save_snapshot(&s).unwrap();
    }
    let out = repo.run(["snapshots"]);
    out.expect_ok();
    assert_terminal_safe(&out);
    assert!(out.stdout.contains("host\\x1b[2J\\x0aFORGED"), "{out}");
    let out = repo.run(["forget", "--keep-last", "5", "--dry-run"]);
    out.expect_ok();
    assert_terminal_safe(&out);
}

/// Regression: a notice naming a path that is not UTF-8 made `backup --json` print
/// `{"error": ...}` and exit 1 though the snapshot was saved; `restore --json` too.
/// Every path in JSON is a string, with its exact bytes in hex where it is not UTF-8.
#[test]
fn json_names_non_utf8_paths_exactly() {
    let repo = Repo::init(&[]);
    let src = repo.dir("src");
    TreeBuilder::new(&src)
        .file(b"f\xff", b"data\n")
        .socket(b"s\xff")
        .finish();
    let out = repo.backup_run(&[&src]);
    out.expect_ok();
    let summary = out.json();
    let w = &summary["warnings"][0];
    let sock = [src.as_os_str().as_bytes(), b"/s\xff"].concat();
    assert_eq!(w["path"], String::from_utf8_lossy(&sock).as_ref(), "{out}");
    assert_eq!(w["path_hex"], hex(&sock), "{out}");
    assert_eq!(w["is_error"], false);
    assert_eq!(repo.snapshots().len(), 1);
    let first_containers: Vec<PathBuf> = fs::read_dir(repo.path.join("containers"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();

    let target = repo.dir("target");
    repo.restore("latest", &target, &[]).expect_ok();
    // Again, without --overwrite: the file that is there is a warning.
    let out = repo.restore("latest", &target, &[]);
    out.expect_code(3);
    let file = [
        restored(&target, &src).as_os_str().as_bytes(),
        b"/f\xff".as_slice(),
    ]
    .concat();
    let warnings = out.json()["warnings"].as_array().unwrap().clone();
    assert!(
        warnings.iter().any(|w| w["path_hex"] == hex(&file)),
        "{out}"
    );
    assert!(warnings.iter().all(|w| w["path"].is_string()), "{out}");

    // `check` names a file that lost data exactly too: a second backup's tree survives
    // the loss of the first backup's containers.
    fs::write(src.join("later"), b"later\n").unwrap();
    repo.backup(&[&src]);
    for c in first_containers {
        fs::remove_file(c).unwrap();
    }
    let out = repo.check(false);
    out.expect_code(1);
    let report = out.json();
    let name = [snapshot_path(&src).as_bytes(), b"/f\xff"].concat();
    let damaged = report["report"]["damage"].as_array().unwrap();
    assert!(
        damaged
            .iter()
            .any(|d| d["kind"] == "file" && d["path_hex"] == hex(&name)),
        "{report}"
    );
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Regression: usage errors (clap's among them) were plain text under `--json`. Each
/// is now one JSON object on stdout, `{"error": ..., "exit_code": 2}`, and exit code 2;
/// other errors say `"exit_code": 1`.
#[test]
fn usage_errors_under_json_are_one_json_object() {
    let repo = Repo::init(&[]);
    let cases: [&[&str]; 7] = [
        &["--json"],
        &["--json", "frobnicate"],
        &["--json", "backup"],
        &["restore", "--json", "latest"],
        &["--json", "check", "--read-everything"],
        &["--json", "ls", "latest", "a/../../b"],
        &["--json", "backup", "--stdin", "--stdin-filename", "../../x"],
    ];
    for args in cases {
        let out = repo.run(args);
        out.expect_code(2);
        let v = out.json();
        assert!(v["error"].as_str().is_some_and(|e| !e.is_empty()), "{out}");
        assert_eq!(v["exit_code"], 2, "{out}");
        assert_eq!(out.stdout.lines().count(), 1, "{out}");
        assert!(!out.stderr.is_empty(), "no message for people\n{out}");
    }
    // An argument clap echoes back is escaped too.
    for json in [true, false] {
        let mut args = vec![OsStr::new("frob\x1b[2J\nFORGED")];
        if json {
            args.insert(0, OsStr::new("--json"));
        }
        let out = repo.run(&args);
        out.expect_code(2);
        assert_terminal_safe(&out);
        assert!(out.stderr.contains("frob\\x1b[2J\\x0aFORGED"), "{out}");
        if json {
            assert!(out.json()["error"]
                .as_str()
                .unwrap()
                .contains("\\x0aFORGED"));
        }
    }
    // Help is not an error, and `--json` after `--` is not larder's option.
    repo.run(["--json", "--help"]).expect_ok();
    let out = repo.run(["frobnicate", "--", "--json"]);
    out.expect_code(2);
    assert!(out.stdout.is_empty(), "{out}");
    // A failure that is not about usage.
    let out = repo.run(["--json", "restore", "nosuchsnapshot", "/nonexistent"]);
    out.expect_code(1);
    assert_eq!(out.json()["exit_code"], 1, "{out}");
}

/// Regression: `--stdin-filename ../../x` failed with exit code 1 after opening the
/// repository; it is a usage error: only normal components are allowed.
#[test]
fn a_stdin_filename_leaving_the_snapshot_is_a_usage_error() {
    let repo = Repo::init(&[]);
    for name in ["../../x", "a/../b", "./a", "a//b", ""] {
        let out = repo.run(["backup", "--stdin", "--stdin-filename", name]);
        out.expect_code(2).expect_stderr(&["--stdin-filename"]);
    }
    let out = repo.run(["backup", "--stdin", "--stdin-filename", "/dumps/db.sql"]);
    out.expect_ok();
    assert!(repo.snapshots().len() == 1);
}

/// `snapshots --json` is one object, as every `--json` output: `{"snapshots": [...]}`.
#[test]
fn snapshots_json_is_one_object() {
    let repo = Repo::init(&[]);
    let out = repo.run(["--json", "snapshots"]);
    out.expect_ok();
    assert_eq!(out.json(), serde_json::json!({ "snapshots": [] }), "{out}");
    let src = repo.dir("src");
    TreeBuilder::new(&src).file("a", b"a\n").finish();
    repo.backup(&[&src]);
    let out = repo.run(["--json", "snapshots"]);
    let v = out.json();
    let list = v["snapshots"].as_array().expect("a snapshots array");
    assert_eq!(list.len(), 1);
    assert_eq!(list[0]["id"].as_str().unwrap().len(), 64);
    assert_eq!(list[0]["snapshot"]["paths"][0], src.to_str().unwrap());
}

/// Regression: `-q` still printed the notice of a skipped socket. Under `-q` notices
/// are not printed; errors are.
#[test]
fn quiet_hides_notices_but_not_errors() {
    let repo = Repo::init(&[]);
    let src = repo.dir("src");
    TreeBuilder::new(&src)
        .file("a", b"a\n")
        .socket("sock")
        .finish();
    let out = repo.run(["-q".as_ref(), "backup".as_ref(), src.as_os_str()]);
    out.expect_ok();
    assert_eq!(out.stderr, "", "{out}");
    assert_eq!(out.stdout, "", "{out}");
    let out = repo.run([
        "--quiet".as_ref(),
        "--json".as_ref(),
        "backup".as_ref(),
        src.as_os_str(),
    ]);
    out.expect_ok();
    assert_eq!(out.stderr, "", "{out}");
    assert_eq!(out.json()["warnings"][0]["is_error"], false);

    // Without -q the notice shows.
    let out = repo.run(["backup".as_ref(), "--force".as_ref(), src.as_os_str()]);
    out.expect_ok().expect_stderr(&["socket is not backed up"]);

    // An error shows under -q: /proc/PID/mem fails to read at offset 0.
    let mem = Path::new("/proc")
        .join(std::process::id().to_string())
        .join("mem");
    let out = repo.run(["-q".as_ref(), "backup".as_ref(), mem.as_os_str()]);
    out.expect_code(3).expect_stderr(&[mem.to_str().unwrap()]);
}

/// Regression: with `USER` unset the snapshot's user name was empty. It comes from the
/// password database (the effective user's entry).
#[test]
fn the_user_name_comes_from_the_password_database() {
    let repo = Repo::init(&[]);
    let src = repo.dir("src");
    TreeBuilder::new(&src).file("a", b"a\n").finish();
    let mut cmd = repo.command(["backup".as_ref(), src.as_os_str()]);
    cmd.env_remove("USER").env_remove("LOGNAME");
    run_command(cmd, RUN_TIMEOUT).expect_ok();
    let id = std::process::Command::new("id")
        .arg("-un")
        .output()
        .unwrap();
    let expected = String::from_utf8(id.stdout).unwrap().trim().to_string();
    assert!(!expected.is_empty());
    assert_eq!(repo.snapshots()[0]["snapshot"]["username"], expected);
}

/// Regression: a backup whose parent's tree could not be read printed its warning
/// twice.
#[test]
fn an_unreadable_parent_tree_is_named_once() {
    let repo = Repo::init(&[]);
    let src = repo.dir("src");
    TreeBuilder::new(&src).file("a", b"a\n").finish();
    repo.backup(&[&src]);
    let parent = {
        let store = open_store(&repo.path, LockMode::Exclusive);
        let (snapshots, _) = store.snapshots().unwrap();
        let mut s = snapshots[0].1.clone();
        // A tree chunk no container holds.
        s.tree.chunks = vec!["ab".repeat(32)];
        s.time = "2000-01-01T00:00:00.000000000Z".into();
        store.save_snapshot(&s).unwrap()
    };
    let out = repo.run([
        "backup".as_ref(),
        "--parent".as_ref(),
        parent.as_ref(),
        src.as_os_str(),
    ]);
    out.expect_ok();
    assert_eq!(
        out.stderr.matches("cannot read snapshot").count(),
        1,
        "{out}"
    );
}

/// Regression: `chunks_new` counted every checkpoint's tree and `chunks` only the last
/// tree, so `chunks_new` could exceed `chunks`. Both count the chunks of the snapshot
/// now; `chunks_unused` what was stored for checkpoints (and failed files) alone.
#[test]
fn chunk_counts_describe_the_snapshot() {
    let repo = Repo::init(&[]);
    let src = repo.dir("src");
    let mut tree = TreeBuilder::new(&src);
    for i in 0..12 {
        tree.file(format!("f{i:02}"), format!("distinct small file {i}\n"));
    }
    tree.finish();
    // A checkpoint after every file.
    let out = repo.run([
        "--json".as_ref(),
        "backup".as_ref(),
        "--checkpoint-interval".as_ref(),
        "0.001ms".as_ref(),
        src.as_os_str(),
    ]);
    out.expect_ok();
    let s = out.json();
    let n = |k: &str| s[k].as_u64().unwrap_or_else(|| panic!("no {k} in {s}"));
    assert!(n("checkpoints") > 0, "{s}");
    assert!(n("chunks_new") <= n("chunks"), "{s}");
    assert!(n("tree_chunks_new") <= n("tree_chunks"), "{s}");
    // A first backup of distinct one-chunk files: every chunk of the snapshot is new.
    assert_eq!(n("chunks"), 12 + n("tree_chunks"), "{s}");
    assert_eq!(n("chunks_new"), n("chunks"), "{s}");
    assert!(n("chunks_unused") >= n("checkpoints"), "{s}");
    let snap = &repo.snapshots()[0]["snapshot"]["summary"];
    assert_eq!(snap["chunks_new"], s["chunks_new"], "{snap}");

    // No file is new (the tree may be: its ancestors' times change).
    let out = repo.run([
        "--json".as_ref(),
        "backup".as_ref(),
        "--force".as_ref(),
        src.as_os_str(),
    ]);
    let s = out.json();
    assert_eq!(s["chunks_new"], s["tree_chunks_new"], "{s}");
    assert_eq!(s["chunks_unused"], 0, "{s}");
}
