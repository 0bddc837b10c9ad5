//! Keys of an encrypted repository through the command line: `key list`, `add`,
//! `passwd`, `remove`; a write-only key that backs up and deduplicates but reads,
//! restores and deletes nothing; a wrong password, a damaged key file and a tampered
//! container, each with its exit code and message (docs/design/crypto.md).

mod support;

use std::fs;
use std::path::{Path, PathBuf};

use serde_json::Value;
use support::{files, pseudo_random, restored, Repo, PASSWORD};

/// The slots as `key list --json` gives them: (id, kind, current).
fn slots(repo: &Repo, password: &str) -> Vec<(String, String, bool)> {
    let out = repo.run_with_password(password, &["--json", "key", "list"]);
    out.expect_ok();
    let Value::Array(list) = out.json()["slots"].clone() else {
        panic!("key list --json has no slots\n{out}");
    };
    list.iter()
        .map(|s| {
            (
                s["id"].as_str().unwrap().to_string(),
                s["kind"].as_str().unwrap_or("damaged").to_string(),
                s["current"].as_bool().unwrap(),
            )
        })
        .collect()
}

impl RepoExt for Repo {
    fn run_with_password(&self, password: &str, args: &[&str]) -> support::Output {
        let mut c = self.command(args);
        c.env("LARDER_PASSWORD", password);
        support::run_command(c, support::RUN_TIMEOUT)
    }

    fn add_key(&self, new_password: &str, extra: &[&str]) -> String {
        let mut args = vec!["--json", "key", "add"];
        args.extend_from_slice(extra);
        let mut c = self.command(&args);
        c.env("LARDER_NEW_PASSWORD", new_password);
        let out = support::run_command(c, support::RUN_TIMEOUT);
        out.expect_ok();
        out.json()["id"].as_str().unwrap().to_string()
    }
}

trait RepoExt {
    fn run_with_password(&self, password: &str, args: &[&str]) -> support::Output;
    fn add_key(&self, new_password: &str, extra: &[&str]) -> String;
}

#[test]
fn keys_are_added_changed_and_removed_but_never_the_last() {
    let repo = Repo::init(&[]);
    let first = slots(&repo, PASSWORD);
    assert_eq!(first.len(), 1);
    assert_eq!((first[0].1.as_str(), first[0].2), ("full", true));
    let first_id = first[0].0.clone();

    // add: the second password opens the repository.
    let second = repo.add_key("second password", &[]);
    let listed = slots(&repo, "second password");
    assert_eq!(listed.len(), 2);
    assert!(listed.iter().any(|s| s.0 == second && s.2), "{listed:?}");

    // passwd: the key in use gets the new password; the old one opens nothing.
    let mut c = repo.command(["--json", "key", "passwd"]);
    c.env("LARDER_PASSWORD", "second password")
        .env("LARDER_NEW_PASSWORD", "third password");
    support::run_command(c, support::RUN_TIMEOUT).expect_ok();
    repo.run_with_password("second password", &["snapshots"])
        .expect_code(1)
        .expect_stderr(&["wrong password or no matching key"]);
    assert_eq!(slots(&repo, "third password").len(), 2);

    // remove: the first slot goes; its password then opens nothing.
    repo.run_with_password("third password", &["key", "remove", &first_id])
        .expect_ok();
    repo.run(["snapshots"])
        .expect_code(1)
        .expect_stderr(&["wrong password or no matching key"]);
    // The last key, which is also the one in use, stays.
    let last = slots(&repo, "third password");
    assert_eq!(last.len(), 1);
    let out = repo.run_with_password("third password", &["key", "remove", &last[0].0]);
    out.expect_code(1)
        .expect_stderr(&["refusing to remove key"]);
    assert_eq!(slots(&repo, "third password").len(), 1);
}

#[test]
fn a_write_only_key_backs_up_and_deduplicates_but_reads_and_deletes_nothing() {
    let repo = Repo::init(&[]);
    let src = repo.dir("src");
    fs::write(src.join("a.bin"), pseudo_random(1, 3 << 20)).unwrap();
    let full = repo.backup(&[&src]);
    let full_id = full["snapshot"].as_str().unwrap().to_string();
    repo.add_key("writer", &["--write-only"]);
    let listed = slots(&repo, PASSWORD);
    assert!(listed.iter().any(|s| s.1 == "write-only"), "{listed:?}");

    // The same data again plus a little: deduplicated against the full key's backup.
    fs::write(src.join("b.txt"), b"a small new file").unwrap();
    let out = repo.run_with_password("writer", &["--json", "backup", src.to_str().unwrap()]);
    out.expect_ok();
    let summary = out.json();
    assert!(
        summary["bytes_new"].as_u64().unwrap() < 1 << 16,
        "the write-only backup stored the old data again: {summary}"
    );
    let written_id = summary["snapshot"].as_str().unwrap().to_string();

    let target = repo.new_path("target");
    let t = target.to_str().unwrap();
    for args in [
        vec!["restore", written_id.as_str(), t],
        vec!["cat", full_id.as_str(), "a.bin"],
        vec!["ls", full_id.as_str()],
        vec!["diff", full_id.as_str(), written_id.as_str()],
        vec!["forget", full_id.as_str()],
        vec!["gc"],
        vec!["snapshots"],
    ] {
        repo.run_with_password("writer", &args)
            .expect_code(1)
            .expect_stderr(&["write-only"]);
    }
    assert!(!target.exists(), "a refused restore created its target");
    assert_eq!(
        repo.snapshots().len(),
        2,
        "a write-only key deleted a snapshot"
    );

    // The full key reads what the write-only key wrote.
    repo.restore(&written_id, &target, &[]).expect_ok();
    let back = restored(&target, &src);
    assert_eq!(fs::read(back.join("b.txt")).unwrap(), b"a small new file");
    assert_eq!(
        fs::read(back.join("a.bin")).unwrap(),
        pseudo_random(1, 3 << 20)
    );
}

#[test]
fn a_wrong_password_exits_1_and_writes_nothing() {
    let repo = Repo::init(&[]);
    let src = repo.dir("src");
    fs::write(src.join("a.txt"), b"hello").unwrap();
    repo.backup(&[&src]);
    let before = files(&repo.path);
    for args in [
        vec!["backup", src.to_str().unwrap()],
        vec!["snapshots"],
        vec!["forget", "latest"],
        vec!["gc"],
        vec!["key", "list"],
    ] {
        repo.run_with_password("not the password", &args)
            .expect_code(1)
            .expect_stderr(&["wrong password or no matching key"]);
    }
    assert!(
        files(&repo.path) == before,
        "a wrong password changed the repository"
    );
}

#[test]
fn a_damaged_key_file_is_named_and_another_key_still_opens() {
    let repo = Repo::init(&[]);
    let first = slots(&repo, PASSWORD)[0].0.clone();
    repo.add_key("second password", &[]);
    let path = repo.path.join("keys").join(format!("{first}.key"));
    let mut bytes = fs::read(&path).unwrap();
    bytes.truncate(bytes.len() / 2);
    fs::write(&path, &bytes).unwrap();
    // The damaged slot is listed as damaged; the other still opens the repository.
    let listed = slots(&repo, "second password");
    assert!(
        listed.iter().any(|s| s.0 == first && s.1 == "damaged"),
        "{listed:?}"
    );
    // Its own password finds no key it can use.
    repo.run(["snapshots"])
        .expect_code(1)
        .expect_stderr(&[&first]);
}

#[test]
fn a_foreign_slot_under_the_same_password_is_passed_over() {
    let repo = Repo::init(&[]);
    let other = Repo::init(&[]);
    let ours = slots(&repo, PASSWORD)[0].0.clone();
    let theirs = slots(&other, PASSWORD)[0].0.clone();
    // The other repository's slot, opened by the same password, named so that it is
    // tried first.
    fs::copy(
        other.path.join("keys").join(format!("{theirs}.key")),
        repo.path.join("keys").join("0000000000000000.key"),
    )
    .unwrap();
    let src = repo.new_path("src");
    fs::create_dir_all(&src).unwrap();
    fs::write(src.join("f"), b"still ours").unwrap();
    repo.run(["backup", src.to_str().unwrap()]).expect_ok();
    repo.run(["check"]).expect_ok();
    // The slot in use is the repository's own.
    let listed = slots(&repo, PASSWORD);
    let current: Vec<&str> = listed
        .iter()
        .filter(|s| s.2)
        .map(|s| s.0.as_str())
        .collect();
    assert_eq!(current, [ours.as_str()], "{listed:?}");
}

#[test]
fn a_tampered_container_fails_check_and_restore_of_its_files_only_with_exit_3() {
    let repo = Repo::init(&[]);
    let src = repo.dir("src");
    fs::write(src.join("old.bin"), pseudo_random(2, 1 << 20)).unwrap();
    repo.backup(&[&src]);
    let containers = repo.path.join("containers");
    let names = |dir: &Path| -> Vec<PathBuf> {
        let mut v: Vec<PathBuf> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        v.sort();
        v
    };
    let before = names(&containers);
    fs::write(src.join("new.bin"), pseudo_random(3, 1 << 20)).unwrap();
    repo.backup(&[&src]);
    let added: Vec<PathBuf> = names(&containers)
        .into_iter()
        .filter(|p| !before.contains(p))
        .collect();
    assert_eq!(added.len(), 1, "{added:?}");
    // A byte inside the first chunk of the new container (after its 144-byte header):
    // new.bin's data, sealed.
    let mut bytes = fs::read(&added[0]).unwrap();
    bytes[144 + 1000] ^= 0x10;
    fs::write(&added[0], &bytes).unwrap();

    let out = repo.check(true);
    out.expect_code(1);
    let name = added[0].file_stem().unwrap().to_str().unwrap();
    assert!(
        out.stdout.contains(name),
        "check does not name {name}\n{out}"
    );

    let target = repo.new_path("target");
    let out = repo.restore("latest", &target, &[]);
    out.expect_code(3).expect_stderr(&["new.bin"]);
    let back = restored(&target, &src);
    assert_eq!(
        fs::read(back.join("old.bin")).unwrap(),
        pseudo_random(2, 1 << 20)
    );
}

/// An empty password, from any source, is refused with one message by every command
/// that sets one (`init`, the default repository's creation, `key add`, `key
/// passwd`), and nothing is created.
#[test]
fn an_empty_password_is_refused_by_init_and_every_key_command() {
    const EMPTY: &str = "refusing an empty password";
    let repo = Repo::uninit();
    let init = |env: &[(&str, &str)], extra: &[&str]| {
        let mut args = vec!["init"];
        args.extend_from_slice(&support::CHEAP_KDF);
        args.extend_from_slice(extra);
        let mut c = repo.command(&args);
        c.env_remove("LARDER_PASSWORD");
        for (k, v) in env {
            c.env(k, v);
        }
        support::run_command(c, support::RUN_TIMEOUT)
    };
    for (env, extra) in [
        (vec![("LARDER_PASSWORD", "")], vec![]),
        (vec![], vec!["--password-command", "true"]),
        (vec![("LARDER_NEW_PASSWORD", "")], vec![]),
    ] {
        init(&env, &extra).expect_code(1).expect_stderr(&[EMPTY]);
        assert!(
            !repo.path.join("config").exists(),
            "a refused init made a repository"
        );
    }
    // The default repository, made on first use with the password given.
    let mut c = support::larder_command(repo.xdg());
    c.env("LARDER_PASSWORD", "").arg("snapshots");
    support::run_command(c, support::RUN_TIMEOUT)
        .expect_code(1)
        .expect_stderr(&[EMPTY]);
    assert!(!repo.xdg().join("larder/repo/config").exists());

    init(&[("LARDER_PASSWORD", PASSWORD)], &[]).expect_ok();
    for command in [vec!["key", "add"], vec!["key", "passwd"]] {
        let mut c = repo.command(&command);
        c.env("LARDER_NEW_PASSWORD", "");
        support::run_command(c, support::RUN_TIMEOUT)
            .expect_code(1)
            .expect_stderr(&[EMPTY]);
    }
    assert_eq!(slots(&repo, PASSWORD).len(), 1);
}

/// A password command's text may hold a secret (a token): no error shows it.
#[test]
fn a_failing_password_command_is_not_echoed() {
    let repo = Repo::init(&[]);
    for command in [
        "exit 3 # --token=s3cr3t-t0ken",
        "printf '\\377\\n' # --token=s3cr3t-t0ken",
    ] {
        let mut c = repo.command(["--password-command", command, "snapshots"]);
        c.env_remove("LARDER_PASSWORD");
        let out = support::run_command(c, support::RUN_TIMEOUT);
        out.expect_code(1).expect_stderr(&["password command"]);
        assert!(
            !out.stderr.contains("s3cr3t"),
            "the command was echoed\n{out}"
        );
    }
}
