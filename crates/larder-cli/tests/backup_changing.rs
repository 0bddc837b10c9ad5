//! A file that changes while a backup reads it (a log being appended to) is stored
//! as read and marked, with a warning and exit code 3, as restic and borg do; never
//! left out of the snapshot.

mod support;

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use support::{pseudo_random, restored, Repo, TreeBuilder};

/// Guards against a log appended to during the backup being left out of every
/// snapshot ("file changed while it was read; not backed up"): it is stored as read,
/// marked in the tree (`ls -l`, `ls --json`), warned about, and the backup exits 3.
/// The summary counts it once. The next backup, with the file at rest, stores it
/// unmarked.
#[test]
fn a_file_appended_to_while_read_is_stored_marked_and_named() {
    let repo = Repo::init(&[]);
    let src = repo.dir("src");
    // Large enough that reading it takes many appends' time.
    let head = pseudo_random(31, 24 << 20);
    TreeBuilder::new(&src)
        .file("app.log", &head)
        .file("quiet", b"still")
        .finish();
    let log = src.join("app.log");
    let stop = Arc::new(AtomicBool::new(false));
    let appender = {
        let (log, stop) = (log.clone(), stop.clone());
        thread::spawn(move || {
            let mut f = OpenOptions::new().append(true).open(&log).unwrap();
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                writeln!(f, "line {n}").unwrap();
                n += 1;
                thread::sleep(Duration::from_millis(1));
            }
        })
    };
    let out = repo.backup_run(&[&src]);
    stop.store(true, Ordering::Relaxed);
    appender.join().unwrap();
    out.expect_code(3)
        .expect_stderr(&[log.to_str().unwrap(), "changed while it was read"]);
    let summary = out.json();
    assert_eq!(summary["files"], 2, "{summary}");
    assert_eq!(summary["files_new"], 2, "{summary}");

    // In the snapshot, marked.
    let id = summary["snapshot"].as_str().unwrap().to_string();
    let ls = repo.run(["--json", "ls", &id]);
    ls.expect_ok();
    let entries = ls.json()["entries"].as_array().unwrap().clone();
    let entry = |name: &str| {
        entries
            .iter()
            .find(|e| e["path"].as_str().unwrap().ends_with(name))
            .unwrap_or_else(|| panic!("{name} is not in the snapshot: {entries:?}"))
            .clone()
    };
    assert_eq!(entry("/app.log")["changed_while_read"], true);
    assert!(entry("/quiet").get("changed_while_read").is_none());
    let long = repo.run(["ls", "-l", &id]);
    long.expect_ok();
    let line = long
        .stdout
        .lines()
        .find(|l| l.contains("/app.log"))
        .expect("app.log in ls -l");
    assert!(line.ends_with(" [changed while read]"), "{line}");

    // What was read restores: the file as it was at some moment of the read.
    let target = repo.new_path("target");
    repo.restore(&id, &target, &[]).expect_ok();
    let back = fs::read(restored(&target, &log)).unwrap();
    let now = fs::read(&log).unwrap();
    assert!(back.len() >= head.len() && now.starts_with(&back));
    assert_eq!(entry("/app.log")["size"], back.len() as u64);

    // At rest now: stored whole and unmarked.
    let again = repo.backup(&[&src]);
    assert_eq!(again["files"], 2, "{again}");
    assert_eq!(again["bytes_in"], now.len() as u64 + 5, "{again}");
    let ls = repo.run(["--json", "ls", again["snapshot"].as_str().unwrap()]);
    assert!(!ls.stdout.contains("changed_while_read"), "{ls}");
}
