//! The metadata cache and the local state of S3 repositories against storage that
//! holds other files under the names they cached: a bucket copied object for object
//! and written to on both sides, storage rolled back and written again, damage on
//! storage behind a warm cache, and damage in the cache alone (docs/design/remote.md,
//! "Local state and cache").

mod support;

#[path = "../../larder-store/tests/support/s3s.rs"]
mod s3s;

use std::fs;
use std::path::{Path, PathBuf};

use s3s::S3sServer;
use serde_json::Value;
use support::{assert_same_tree, restored, Repo, TreeBuilder};

const BUCKET: &str = "larder";

/// Both index kinds: the memory index is built from the (cached) segments at every
/// open; the disk index is kept in the cache directory between runs.
const INDEXES: [&[&str]; 2] = [&["--index", "memory"], &["--index", "disk"]];

/// A fixture whose `--repo` is `s3://larder/<prefix>` on `server`.
fn s3_repo(server: &S3sServer, prefix: &str) -> Repo {
    Repo::remote(format!("s3://{BUCKET}/{prefix}"), server.env())
}

fn init(repo: &Repo, extra: &[&str]) {
    let mut args = vec!["init"];
    args.extend_from_slice(&support::CHEAP_KDF);
    args.extend_from_slice(extra);
    repo.run(&args).expect_ok();
}

/// A tree of `files` files of distinct random data, seeded with `seed`.
fn data(repo: &Repo, name: &str, seed: u64, files: u64) -> PathBuf {
    let mut tree = TreeBuilder::new(&repo.dir(name));
    for i in 0..files {
        tree.file(
            format!("f{i}"),
            support::pseudo_random(seed * 100 + i, 300_000),
        );
    }
    tree.finish()
}

/// Copies directory `from` to `to` file for file with the files' times (an object for
/// object copy of a prefix of an s3s bucket, whose listing gives no ETag: the times
/// stand for the ETags S3 would copy with the bytes).
fn copy_dir(from: &Path, to: &Path) {
    fs::create_dir_all(to).unwrap();
    let status = std::process::Command::new("cp")
        .arg("-a")
        .arg(from.join("."))
        .arg(to)
        .status()
        .unwrap();
    assert!(status.success());
}

fn new_chunks(summary: &Value) -> u64 {
    summary["chunks_new"]
        .as_u64()
        .unwrap_or_else(|| panic!("{summary}"))
}

/// Backs `src` up into `repo`, then checks every byte and restores it identical.
fn back_up_and_verify(repo: &Repo, src: &Path, target: &str) -> Value {
    let summary = repo.backup(&[src]);
    let id = summary["snapshot"].as_str().unwrap().to_string();
    let check = repo.check(true);
    check.expect_ok();
    let target = repo.new_path(target);
    repo.restore(&id, &target, &[]).expect_ok();
    assert_same_tree(src, &restored(&target, src));
    summary
}

#[test]
fn copies_of_a_bucket_written_on_both_sides_share_a_cache_without_losing_data() {
    for index in INDEXES {
        let server = S3sServer::start(&[BUCKET]);
        let mut repo = s3_repo(&server, "a");
        init(&repo, index);
        let common = data(&repo, "common", 1, 2);
        repo.backup(&[&common]);
        let bucket = server.bucket_dir(BUCKET);
        copy_dir(&bucket.join("a"), &bucket.join("b"));

        // One client, one cache directory (the repository id is the same): each copy
        // gets different data under the same sequence names.
        let x = data(&repo, "x", 2, 3);
        let y = data(&repo, "y", 3, 3);
        repo.backup(&[&x]);
        repo.url = Some(format!("s3://{BUCKET}/b"));
        back_up_and_verify(&repo, &y, "restore-b");

        // Back to the first copy: y was never stored there.
        repo.url = Some(format!("s3://{BUCKET}/a"));
        let summary = back_up_and_verify(&repo, &y, "restore-a");
        assert!(
            new_chunks(&summary) > 3,
            "{index:?}: y stored in a: {summary}"
        );
        // The first copy's own backup of x is intact.
        let snapshots = repo.snapshots();
        let x_id = snapshots[1]["id"].as_str().unwrap();
        let target = repo.new_path("restore-x");
        repo.restore(x_id, &target, &[]).expect_ok();
        assert_same_tree(&x, &restored(&target, &x));
    }
}

/// A container the disk index holds that no segment it absorbed names (a killed
/// backup's, adopted) is not taken for the container of that id that another copy's
/// newer segment names.
#[test]
fn a_held_container_no_absorbed_segment_names_is_not_trusted() {
    let server = S3sServer::start(&[BUCKET]);
    let mut repo = s3_repo(&server, "a");
    init(&repo, &["--index", "disk"]);
    repo.backup(&[&data(&repo, "common", 1, 2)]);
    let bucket = server.bucket_dir(BUCKET);
    copy_dir(&bucket.join("a"), &bucket.join("b"));
    let x = data(&repo, "x", 2, 3);
    let y = data(&repo, "y", 3, 3);
    repo.backup(&[&x]);

    // In b: y's container stays without its segment (as a killed backup leaves it),
    // and a writer that commits nothing adopts it into the disk index.
    repo.url = Some(format!("s3://{BUCKET}/b"));
    repo.backup(&[&y]);
    let segment = only_file(&bucket.join("b/index"));
    fs::remove_file(segment).unwrap();
    repo.run(["forget", "--keep-last", "100"]).expect_ok();

    // a names its own container of that id in a segment the disk index never absorbed.
    repo.url = Some(format!("s3://{BUCKET}/a"));
    let summary = back_up_and_verify(&repo, &y, "restore");
    assert!(new_chunks(&summary) > 3, "y stored in a: {summary}");
}

#[test]
fn storage_rolled_back_and_written_again_by_another_client_is_not_served_from_the_cache() {
    for index in INDEXES {
        let server = S3sServer::start(&[BUCKET]);
        let repo = s3_repo(&server, "r");
        init(&repo, index);
        repo.backup(&[&data(&repo, "first", 1, 2)]);
        let bucket = server.bucket_dir(BUCKET);
        let saved = repo.dir("saved");
        copy_dir(&bucket.join("r"), &saved);

        // This client backs up `second`; storage is then rolled back to before it.
        let second = data(&repo, "second", 2, 3);
        repo.backup(&[&second]);
        fs::remove_dir_all(bucket.join("r")).unwrap();
        copy_dir(&saved, &bucket.join("r"));

        // Another client (its own cache) writes the same names with other data.
        let other = s3_repo(&server, "r");
        other.backup(&[&data(&other, "third", 3, 3)]);

        // `second` is gone from storage: this client must store it again.
        let summary = back_up_and_verify(&repo, &second, "restore");
        assert!(new_chunks(&summary) > 3, "{index:?}: {summary}");
    }
}

/// The last file in `dir`, by name.
fn only_file(dir: &Path) -> PathBuf {
    let mut files: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    files
        .pop()
        .unwrap_or_else(|| panic!("no file in {}", dir.display()))
}

/// The cache directory of the one repository the fixture's runs cached.
fn cache_of(repo: &Repo) -> PathBuf {
    only_dir(&repo.xdg().join("cache/larder"))
}

fn only_dir(dir: &Path) -> PathBuf {
    let dirs: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect();
    assert_eq!(dirs.len(), 1, "{dirs:?}");
    dirs[0].clone()
}

#[test]
fn check_reads_storage_behind_a_warm_cache() {
    let server = S3sServer::start(&[BUCKET]);
    let repo = s3_repo(&server, "c");
    init(&repo, &[]);
    repo.backup(&[&data(&repo, "src", 1, 2)]);
    repo.check(true).expect_ok();
    let stored = server.bucket_dir(BUCKET).join("c");

    // Damage on storage only; the cache holds the intact files.
    let segment = only_file(&stored.join("index"));
    let mut bytes = fs::read(&segment).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    fs::write(&segment, bytes).unwrap();
    let snapshot = only_file(&stored.join("snapshots"));
    let bytes = fs::read(&snapshot).unwrap();
    fs::write(&snapshot, &bytes[..bytes.len() / 2]).unwrap();

    let out = repo.check(true);
    assert_eq!(out.code, Some(1), "{out}");
    let damage = out.json()["report"]["damage"].to_string();
    let seg_name = segment.file_stem().unwrap().to_str().unwrap();
    let snap_name = snapshot.file_stem().unwrap().to_str().unwrap();
    assert!(damage.contains(seg_name), "the segment: {out}");
    assert!(damage.contains(snap_name), "the snapshot: {out}");
}

#[test]
fn check_repairs_damage_in_the_cache_alone_and_calls_the_repository_fine() {
    let server = S3sServer::start(&[BUCKET]);
    let repo = s3_repo(&server, "c");
    init(&repo, &[]);
    repo.backup(&[&data(&repo, "src", 1, 2)]);
    let cache = cache_of(&repo);
    let entries = [
        only_file(&cache.join("index")),
        only_file(&cache.join("snapshots")),
    ];
    for entry in &entries {
        let mut bytes = fs::read(entry).unwrap();
        bytes[0] ^= 0xff;
        fs::write(entry, bytes).unwrap();
    }

    let out = repo.check(true);
    out.expect_ok();
    let json = out.json();
    assert_eq!(json["ok"], true, "{out}");
    let refreshed = json["cache_refreshed"].to_string();
    for entry in &entries {
        let name = entry.file_name().unwrap().to_str().unwrap();
        assert!(refreshed.contains(name), "{name} named: {out}");
    }
    out.expect_stderr(&["differs from the repository; refreshed"]);
    // Refreshed: the next check finds the cache as the repository is.
    let again = repo.check(false);
    again.expect_ok();
    assert_eq!(
        again.json()["cache_refreshed"],
        Value::Array(vec![]),
        "{again}"
    );
}
