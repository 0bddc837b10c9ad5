//! Repositories in S3-compatible object storage (`--repo s3://BUCKET/PREFIX`), against
//! a real S3 server (s3s-fs) on loopback: every command, the metadata cache, lock
//! objects, killed processes, and the errors of bad locations and credentials.

mod support;

#[path = "../../larder-store/tests/support/s3s.rs"]
mod s3s;

use std::fs;
use std::path::{Path, PathBuf};

use s3s::S3sServer;
use support::{assert_same_tree, restored, Repo, TreeBuilder};

const BUCKET: &str = "larder";

/// A repository fixture whose `--repo` is `s3://larder/<prefix>` on `server`.
fn s3_repo(server: &S3sServer, prefix: &str) -> Repo {
    Repo::remote(format!("s3://{BUCKET}/{prefix}"), server.env())
}

fn init(repo: &Repo, extra: &[&str]) {
    let mut args = vec!["init"];
    args.extend_from_slice(&support::CHEAP_KDF);
    args.extend_from_slice(extra);
    repo.run(&args).expect_ok();
    if extra.windows(2).any(|w| w == ["--encryption", "none"]) {
        repo.mark_plaintext();
    }
}

fn source(repo: &Repo) -> PathBuf {
    let mut tree = TreeBuilder::new(&repo.dir("src"));
    tree.file("big", support::pseudo_random(1, 3 << 20))
        .file("text/a.txt", support::pseudo_text(2, 200_000))
        .file("text/empty", b"")
        .symlink("link", "text/a.txt");
    tree.finish()
}

/// The cache directory of the one repository the fixture's runs cached.
fn cache_of(repo: &Repo) -> PathBuf {
    let root = repo.xdg().join("cache/larder");
    let mut dirs: Vec<PathBuf> = fs::read_dir(&root)
        .unwrap_or_else(|e| panic!("{}: {e}", root.display()))
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect();
    assert_eq!(dirs.len(), 1, "{dirs:?}");
    dirs.pop().unwrap()
}

fn cached_files(dir: &Path) -> Vec<PathBuf> {
    fs::read_dir(dir)
        .map(|rd| rd.flatten().map(|e| e.path()).collect())
        .unwrap_or_default()
}

#[test]
fn every_command_works_on_an_encrypted_s3_repository() {
    let server = S3sServer::start(&[BUCKET]);
    let repo = s3_repo(&server, "repo");
    init(&repo, &[]);
    assert!(
        server.bucket_dir(BUCKET).join("repo/config").is_file(),
        "the config is an object"
    );
    assert!(!repo.path.exists(), "no local directory is made");
    let src = source(&repo);
    let first = repo.backup(&[&src]);
    let id = first["snapshot"].as_str().unwrap().to_string();

    let target = repo.new_path("restore");
    repo.restore(&id, &target, &[]).expect_ok();
    assert_same_tree(&src, &restored(&target, &src));
    repo.check(true).expect_ok();
    assert_eq!(repo.snapshots().len(), 1);
    for args in [
        vec!["ls", "latest"],
        vec!["stats"],
        vec!["key", "list"],
        vec!["index", "rebuild"],
    ] {
        repo.run(&args).expect_ok();
    }
    let text = src.join("text/a.txt");
    let cat = repo.run(["cat", "latest", text.to_str().unwrap()]);
    cat.expect_ok();
    assert_eq!(cat.stdout.as_bytes(), fs::read(&text).unwrap());

    // A second backup of changed data; diff, forget and gc.
    fs::write(src.join("text/new"), b"new file").unwrap();
    let second = repo.backup(&[&src]);
    let id2 = second["snapshot"].as_str().unwrap().to_string();
    let diff = repo.run(["diff", &id, &id2]);
    diff.expect_ok();
    assert!(diff.stdout.contains("new"), "{diff}");
    repo.run(["forget", &id]).expect_ok();
    repo.run(["gc"]).expect_ok();
    repo.check(true).expect_ok();
    let target = repo.new_path("restore2");
    repo.restore("latest", &target, &[]).expect_ok();
    assert_same_tree(&src, &restored(&target, &src));
    assert!(
        cached_files(&server.bucket_dir(BUCKET).join("repo/locks")).is_empty(),
        "every lock object is removed"
    );
}

#[test]
fn the_metadata_cache_serves_reads_and_is_rebuilt_when_damaged() {
    let server = S3sServer::start(&[BUCKET]);
    let repo = s3_repo(&server, "cached");
    init(&repo, &["--encryption", "none"]);
    let src = source(&repo);
    repo.backup(&[&src]);
    let cache = cache_of(&repo);
    let segments = cached_files(&cache.join("index"));
    let snapshots = cached_files(&cache.join("snapshots"));
    assert_eq!(
        snapshots.len(),
        1,
        "the snapshot is cached as it is written"
    );
    assert!(!segments.is_empty(), "index segments are cached");

    // A damaged entry is detected, read again and rewritten.
    let original = fs::read(&snapshots[0]).unwrap();
    let mut damaged = original.clone();
    damaged[3] ^= 1;
    fs::write(&snapshots[0], &damaged).unwrap();
    assert_eq!(repo.snapshots().len(), 1);
    assert_eq!(fs::read(&snapshots[0]).unwrap(), original);

    // Entries the repository no longer lists are dropped (another machine's forget).
    let id = repo.snapshots()[0]["id"].as_str().unwrap().to_string();
    fs::remove_file(
        server
            .bucket_dir(BUCKET)
            .join(format!("cached/snapshots/{id}.snap")),
    )
    .unwrap();
    assert!(repo.snapshots().is_empty());
    assert!(cached_files(&cache.join("snapshots")).is_empty());
}

#[test]
fn a_repository_url_with_another_scheme_is_a_usage_error_and_makes_nothing() {
    let repo = Repo::uninit();
    // Run where a path taken for local would be made: nothing may appear there.
    let cwd = repo.dir("cwd");
    for url in [
        "gs://bucket/repo",
        "sftp:host:/srv/repo",
        "rest:http://host/",
    ] {
        let mut c = support::larder_command(repo.xdg());
        c.current_dir(&cwd).args(["--repo", url, "init"]);
        let out = support::run_command(c, support::RUN_TIMEOUT);
        assert_eq!(out.code, Some(2), "{out}");
        out.expect_stderr(&["--repo"]);
    }
    let made: Vec<_> = fs::read_dir(&cwd).unwrap().collect();
    assert!(made.is_empty(), "nothing is created: {made:?}");
}

#[test]
fn wrong_credentials_a_missing_bucket_and_an_unreachable_server_are_clear_errors() {
    let server = S3sServer::start(&[BUCKET]);
    let repo = s3_repo(&server, "repo");
    init(&repo, &["--encryption", "none"]);

    let mut wrong = s3_repo(&server, "repo");
    wrong.env.retain(|(k, _)| *k != "AWS_SECRET_ACCESS_KEY");
    wrong
        .env
        .push(("AWS_SECRET_ACCESS_KEY", "not the secret".into()));
    let out = wrong.run(["snapshots"]);
    assert_eq!(out.code, Some(1), "{out}");
    out.expect_stderr(&["s3://larder"]);

    let mut missing = s3_repo(&server, "repo");
    missing.url = Some("s3://no-such-bucket/repo".into());
    let out = missing.run(["snapshots"]);
    assert_eq!(out.code, Some(1), "{out}");
    out.expect_stderr(&["s3://no-such-bucket", "the bucket does not exist"]);
    assert!(!out.stderr.contains("not a larder repository"), "{out}");

    let empty = s3_repo(&server, "nothing-here");
    let out = empty.run(["snapshots"]);
    assert_eq!(out.code, Some(1), "{out}");
    out.expect_stderr(&["not a larder repository"]);

    let mut unreachable = s3_repo(&server, "repo");
    drop(server);
    unreachable.env.push(("LARDER_RETRIES", "2".into()));
    let out = unreachable.run(["snapshots"]);
    assert_eq!(out.code, Some(1), "{out}");
    out.expect_stderr(&["s3://larder"]);
}

#[test]
fn a_killed_backup_leaves_a_stale_lock_object_that_blocks_no_one() {
    let server = S3sServer::start(&[BUCKET]);
    let repo = s3_repo(&server, "repo");
    init(&repo, &["--encryption", "none"]);
    let src = source(&repo);
    repo.backup(&[&src]);
    let locks = server.bucket_dir(BUCKET).join("repo/locks");
    for round in 0..3 {
        fs::write(
            src.join(format!("round-{round}")),
            support::pseudo_random(round, 4 << 20),
        )
        .unwrap();
        let mut child = repo
            .command(["backup", src.to_str().unwrap()])
            .spawn()
            .unwrap();
        let started = std::time::Instant::now();
        while cached_files(&locks).is_empty() && started.elapsed().as_secs() < 20 {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        child.kill().unwrap();
        child.wait().unwrap();
        let out = repo.run(["check"]);
        out.expect_ok();
    }
    let before = std::time::Instant::now();
    let last = repo.backup(&[&src]);
    assert!(before.elapsed().as_secs() < 30, "waited for a stale lock");
    let target = repo.new_path("restore");
    repo.restore(last["snapshot"].as_str().unwrap(), &target, &[])
        .expect_ok();
    assert_same_tree(&src, &restored(&target, &src));
    let out = repo.run(["unlock"]);
    out.expect_ok();
}

#[test]
fn a_writer_is_refused_while_another_holds_the_lock_and_waits_with_retry_lock() {
    let server = S3sServer::start(&[BUCKET]);
    let repo = s3_repo(&server, "repo");
    init(&repo, &["--encryption", "none"]);
    let src = source(&repo);
    repo.backup(&[&src]);
    // Two backups at once: with --retry-lock both complete, one after the other.
    let children: Vec<_> = (0..2)
        .map(|i| {
            fs::write(
                src.join(format!("file-{i}")),
                support::pseudo_random(50 + i, 1 << 20),
            )
            .unwrap();
            repo.command([
                "--retry-lock",
                "2m",
                "--json",
                "backup",
                src.to_str().unwrap(),
            ])
            .spawn()
            .unwrap()
        })
        .collect();
    for child in children {
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert_eq!(repo.snapshots().len(), 3);
    repo.check(true).expect_ok();
}

#[test]
fn a_backup_whose_server_goes_away_fails_and_the_next_reuses_its_uploads() {
    let mut server = S3sServer::start(&[BUCKET]);
    let mut repo = s3_repo(&server, "repo");
    init(&repo, &["--encryption", "none"]);
    repo.env.push(("LARDER_RETRIES", "2".into()));
    let src = repo.dir("src");
    for i in 0..6 {
        fs::write(
            src.join(format!("f{i}")),
            support::pseudo_random(i, 6 << 20),
        )
        .unwrap();
    }
    let containers = server.bucket_dir(BUCKET).join("repo/containers");
    let mut child = repo
        .command(["backup", src.to_str().unwrap()])
        .spawn()
        .unwrap();
    // Stop the server once some containers are up, before the snapshot is.
    let started = std::time::Instant::now();
    while cached_files(&containers).len() < 2 && started.elapsed().as_secs() < 30 {
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    server.stop();
    let status = child.wait().unwrap();
    assert_eq!(
        status.code(),
        Some(1),
        "the backup fails once retries run out"
    );
    let uploaded = cached_files(&containers).len();
    assert!(uploaded >= 2, "{uploaded}");
    assert!(cached_files(&server.bucket_dir(BUCKET).join("repo/snapshots")).is_empty());

    server.restart();
    let out = repo.backup_run(&[&src]);
    out.expect_ok();
    out.expect_stderr(&["indexed", "left by an interrupted backup"]);
    let summary = out.json();
    assert!(
        summary["chunks_new"].as_u64().unwrap() < summary["chunks"].as_u64().unwrap(),
        "the uploaded containers' chunks are reused: {summary}"
    );
    let target = repo.new_path("restore");
    repo.restore("latest", &target, &[]).expect_ok();
    assert_same_tree(&src, &restored(&target, &src));
    repo.check(true).expect_ok();
}

#[test]
fn keys_and_the_disk_index_work_on_s3() {
    let server = S3sServer::start(&[BUCKET]);
    let repo = s3_repo(&server, "repo");
    init(&repo, &["--index", "disk", "--index-memory", "1MiB"]);
    let src = source(&repo);
    repo.backup(&[&src]);
    let disk = cache_of(&repo).join("index/disk");
    assert!(disk.is_dir(), "the disk index is in the cache");

    // A second password opens it; the first is changed; the second removed.
    let mut add = repo.command(["--json", "key", "add"]);
    add.env("LARDER_NEW_PASSWORD", "second password");
    let out = support::run_command(add, support::RUN_TIMEOUT);
    out.expect_ok();
    let second = out.json()["id"].as_str().unwrap().to_string();
    let mut list = repo.command(["snapshots"]);
    list.env("LARDER_PASSWORD", "second password");
    support::run_command(list, support::RUN_TIMEOUT).expect_ok();
    repo.run(["key", "remove", &second]).expect_ok();
    let keys = server.bucket_dir(BUCKET).join("repo/keys");
    assert_eq!(cached_files(&keys).len(), 1);

    // The index converts to memory and back; a fresh cache rebuilds the disk index.
    repo.run(["index", "convert", "--to", "memory"]).expect_ok();
    assert!(!disk.exists());
    repo.run(["index", "convert", "--to", "disk", "--index-memory", "1MiB"])
        .expect_ok();
    fs::remove_dir_all(repo.xdg().join("cache")).unwrap();
    fs::write(src.join("more"), support::pseudo_random(9, 1 << 20)).unwrap();
    let out = repo.backup_run(&[&src]);
    out.expect_ok();
    let target = repo.new_path("restore");
    repo.restore("latest", &target, &[]).expect_ok();
    assert_same_tree(&src, &restored(&target, &src));
}

#[test]
fn every_snapshot_of_an_s3_repository_copies_into_a_local_one_once() {
    let server = S3sServer::start(&[BUCKET]);
    let remote = s3_repo(&server, "repo");
    init(&remote, &[]);
    let src = source(&remote);
    remote.backup(&[&src]);
    fs::write(src.join("text/added"), support::pseudo_text(5, 50_000)).unwrap();
    remote.backup(&[&src]);

    let local = Repo::init(&[]);
    let url = remote.url.clone().unwrap();
    let copy = |local: &Repo| {
        let mut c = local.command(["--json", "copy", "--from-repo", &url]);
        c.envs(server.env())
            .env("LARDER_FROM_PASSWORD", support::PASSWORD);
        let out = support::run_command(c, support::RUN_TIMEOUT);
        out.expect_ok();
        out.json()
    };
    let first = copy(&local);
    assert_eq!(first["snapshots_copied"], 2, "{first}");
    assert!(first["chunks_sent"].as_u64().unwrap() > 0, "{first}");
    local.check(true).expect_ok();
    for snap in local.snapshots() {
        let id = snap["id"].as_str().unwrap();
        let target = local.new_path(&format!("restore-{id}"));
        local.restore(id, &target, &[]).expect_ok();
    }
    let target = local.new_path("latest");
    local.restore("latest", &target, &[]).expect_ok();
    assert_same_tree(&src, &restored(&target, &src));

    let again = copy(&local);
    assert_eq!(again["snapshots_copied"], 0, "{again}");
    assert_eq!(again["chunks_sent"], 0, "{again}");
}
