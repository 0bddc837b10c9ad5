//! `larder copy` through the binary (docs/design/copy.md): snapshots copied between
//! two encrypted repositories with different passwords (the source's from
//! `--from-password-file`, `--from-password-command` or `LARDER_FROM_PASSWORD`)
//! restore byte for byte; copying again copies nothing; a plaintext copy with the
//! same chunking takes the fast path; a missing or wrong source password fails with
//! exit code 1 and writes nothing; a copy killed at any moment leaves the destination
//! checking clean with every snapshot it committed restorable, and the next copy
//! finishes the job.

mod support;

use std::fs;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;
use support::{
    assert_same_tree, pseudo_random, restored, run_command, snapshot_list, Repo, TreeBuilder,
};

const DST_PASSWORD: &str = "destination password";

/// A small tree: a file streamed in blocks when cut again, a copy of it, small files.
fn source_tree(repo: &Repo) -> std::path::PathBuf {
    let mut t = TreeBuilder::new(&repo.dir("data"));
    let big = pseudo_random(1, 2 << 20);
    t.file("big.bin", &big)
        .file("again.bin", &big)
        .file("small/a.txt", b"a small file\n")
        .file("small/b.bin", pseudo_random(2, 30_000))
        .file("empty", b"")
        .symlink("link", "big.bin")
        .mode("small/a.txt", 0o600);
    t.finish()
}

/// A repository `name` beside `repo`'s (in its scratch space), encrypted under
/// [`DST_PASSWORD`], or plaintext.
fn second_repo(repo: &Repo, name: &str, encrypted: bool) -> std::path::PathBuf {
    let path = repo.new_path(name);
    let mut args = vec!["--repo", path.to_str().unwrap(), "init"];
    args.extend_from_slice(&support::CHEAP_KDF);
    if !encrypted {
        args.extend_from_slice(&["--encryption", "none"]);
    }
    let mut c = support::larder_command(repo.xdg());
    c.args(&args).env("LARDER_NEW_PASSWORD", DST_PASSWORD);
    run_command(c, support::RUN_TIMEOUT).expect_ok();
    path
}

/// `larder --repo DST ARGS` with the destination's password, or none when it is
/// plaintext (larder refuses a plaintext repository given a password).
fn run_in(repo: &Repo, dst: &Path, args: &[&str], env: &[(&str, &str)]) -> support::Output {
    let mut c = support::larder_command(repo.xdg());
    c.arg("--repo").arg(dst).args(args);
    let sealed = fs::read(dst.join("config")).is_ok_and(|c| larder_store::config_is_sealed(&c));
    if sealed {
        c.env("LARDER_PASSWORD", DST_PASSWORD);
    } else {
        c.env_remove("LARDER_PASSWORD");
    }
    for (k, v) in env {
        c.env(k, v);
    }
    run_command(c, support::RUN_TIMEOUT)
}

#[test]
fn copies_between_encrypted_repositories_and_copying_again_copies_nothing() {
    let src = Repo::init(&[]);
    let data = source_tree(&src);
    src.backup(&[&data]);
    fs::write(data.join("small/c.txt"), b"the second snapshot's file\n").unwrap();
    src.backup(&[&data]);
    let dst = second_repo(&src, "dst", true);
    let password_file = src.dir("secrets").join("source-password");
    fs::write(&password_file, format!("{}\n", support::PASSWORD)).unwrap();
    let from = src.path.to_str().unwrap();

    let out = run_in(
        &src,
        &dst,
        &[
            "--json",
            "copy",
            "--from-repo",
            from,
            "--from-password-file",
            password_file.to_str().unwrap(),
        ],
        &[],
    );
    out.expect_ok();
    let copied = out.json();
    assert_eq!(copied["snapshots_copied"], 2, "{out}");
    assert_eq!(copied["snapshots_skipped"], 0, "{out}");
    // Two keys cut differently: the files were cut again.
    assert_eq!(copied["rechunked"], true, "{out}");
    assert!(copied["chunks_sent"].as_u64().unwrap() > 0, "{out}");

    // Again, the source's password from the environment: nothing is copied.
    let again = run_in(
        &src,
        &dst,
        &["copy", "--from-repo", from],
        &[("LARDER_FROM_PASSWORD", support::PASSWORD)],
    );
    again.expect_ok();
    assert!(
        again.stdout.contains("copied 0 snapshots, 0 chunks"),
        "{again}"
    );

    // And through a password command, naming the newest snapshot: skipped too.
    let cmd = format!("cat {}", password_file.display());
    let named = run_in(
        &src,
        &dst,
        &[
            "--json",
            "copy",
            "--from-repo",
            from,
            "--from-password-command",
            &cmd,
            "latest",
        ],
        &[],
    );
    named.expect_ok();
    assert_eq!(named.json()["snapshots_skipped"], 1, "{named}");

    // The copies restore as the source does, and the destination checks clean.
    let target = src.new_path("restored");
    run_in(
        &src,
        &dst,
        &["restore", "latest", target.to_str().unwrap()],
        &[],
    )
    .expect_ok();
    assert_same_tree(&data, &restored(&target, &data));
    run_in(&src, &dst, &["check", "--read-data"], &[]).expect_ok();
    let listed = run_in(&src, &dst, &["--json", "snapshots"], &[]);
    assert_eq!(snapshot_list(&listed).len(), 2, "{listed}");
}

#[test]
fn plaintext_repositories_with_the_same_chunking_take_the_fast_path() {
    let src = Repo::init_plain(&[]);
    let data = source_tree(&src);
    src.backup(&[&data]);
    let dst = second_repo(&src, "dst", false);
    let out = run_in(
        &src,
        &dst,
        &["--json", "copy", "--from-repo", src.path.to_str().unwrap()],
        &[],
    );
    out.expect_ok();
    let copied = out.json();
    assert_eq!(copied["snapshots_copied"], 1, "{out}");
    assert_eq!(copied["rechunked"], false, "{out}");
    let target = src.new_path("restored");
    run_in(
        &src,
        &dst,
        &["restore", "latest", target.to_str().unwrap()],
        &[],
    )
    .expect_ok();
    assert_same_tree(&data, &restored(&target, &data));
}

#[test]
fn a_missing_or_wrong_source_password_fails_and_copies_nothing() {
    let src = Repo::init(&[]);
    let data = source_tree(&src);
    src.backup(&[&data]);
    let dst = second_repo(&src, "dst", true);
    let from = src.path.to_str().unwrap();
    let before = support::files(&dst);
    // No source password, and no terminal to ask on: the destination's is not used.
    run_in(&src, &dst, &["copy", "--from-repo", from], &[])
        .expect_code(1)
        .expect_stderr(&[
            "source repository",
            "no password was given for the source repository",
            "LARDER_FROM_PASSWORD",
        ]);
    run_in(
        &src,
        &dst,
        &["copy", "--from-repo", from],
        &[("LARDER_FROM_PASSWORD", "wrong")],
    )
    .expect_code(1)
    .expect_stderr(&["wrong password or no matching key"]);
    assert!(support::files(&dst) == before, "the destination changed");
    // The same repository on both sides is a usage error, not a lock held elsewhere.
    src.run(["copy", "--from-repo", from])
        .expect_code(2)
        .expect_stderr(&["--from-repo names the repository --repo names"]);
}

/// The `snapshots --json` list of the repository at `path`.
fn snapshots(repo: &Repo, path: &Path) -> Vec<Value> {
    let listed = run_in(repo, path, &["--json", "snapshots"], &[]);
    listed.expect_ok();
    snapshot_list(&listed)
}

/// Every snapshot of `dst` restores `data` as the source snapshot it was copied from
/// does.
fn assert_copies_restore(src: &Repo, dst: &Path, data: &Path, round: usize) {
    for (n, snap) in snapshots(src, dst).iter().enumerate() {
        let id = snap["id"].as_str().unwrap();
        let original = snap["snapshot"]["original"].as_str().unwrap();
        let from = src.new_path(&format!("from-{round}-{n}"));
        let to = src.new_path(&format!("to-{round}-{n}"));
        src.restore(original, &from, &[]).expect_ok();
        run_in(src, dst, &["restore", id, to.to_str().unwrap()], &[]).expect_ok();
        assert_same_tree(&restored(&from, data), &restored(&to, data));
    }
}

#[test]
fn a_killed_copy_leaves_the_destination_consistent_and_the_next_one_finishes() {
    let src = Repo::init_plain(&[]);
    let data = src.dir("data");
    for g in 0..3u64 {
        let mut t = TreeBuilder::new(&data);
        for f in 0..3 {
            t.file(
                format!("gen-{g}-{f}.bin"),
                pseudo_random(10 * g + f, 6 << 20),
            );
        }
        t.finish();
        src.backup(&[&data]);
    }
    let from = src.path.to_str().unwrap();
    let copy = ["copy", "--from-repo", from];
    // How long an uninterrupted copy (cut again: the destination is encrypted) takes.
    let timing = second_repo(&src, "timing", true);
    let started = Instant::now();
    run_in(&src, &timing, &copy, &[]).expect_ok();
    let full = started.elapsed();
    let dst = second_repo(&src, "dst", true);
    for (round, fraction) in [0.2, 0.5, 0.8].into_iter().enumerate() {
        let mut c = support::larder_command(src.xdg());
        c.arg("--repo")
            .arg(&dst)
            .args(copy)
            .env("LARDER_PASSWORD", DST_PASSWORD);
        let mut child = c.spawn().unwrap();
        std::thread::sleep(full.mul_f64(fraction).max(Duration::from_millis(20)));
        let _ = child.kill();
        child.wait().unwrap();
        run_in(&src, &dst, &["check"], &[]).expect_ok();
        assert_copies_restore(&src, &dst, &data, round);
    }
    let last = run_in(&src, &dst, &["--json", "copy", "--from-repo", from], &[]);
    last.expect_ok();
    assert_eq!(snapshots(&src, &dst).len(), 3, "{last}");
    run_in(&src, &dst, &["check", "--read-data"], &[]).expect_ok();
    assert_copies_restore(&src, &dst, &data, 3);
    let again = run_in(&src, &dst, &["--json", "copy", "--from-repo", from], &[]);
    assert_eq!(again.json()["chunks_sent"], 0, "{again}");
}
