//! `larder repair` (docs/design/repair.md): damage that spread into every later backup
//! is stopped and healed, what was lost is named file by file, `--dry-run` writes
//! nothing, zero-length and truncated containers go, a killed repair is finished by
//! the next one, and snapshot files that cannot be read are reached by their ids.
//!
//! The acceptance: damage a container; `repair`, then a backup of the same source,
//! then `check --read-data` passes, and the new snapshot, the original and the
//! repaired copy (without the file that lost data) restore identical.

mod support;

#[path = "support/rng.rs"]
#[allow(dead_code)]
mod rng;

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsStr;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use larder_engine::{load_tree, ChunkReader};
use larder_store::{EntryKind, LockMode};
use serde_json::Value;
use support::{
    assert_same_tree, files, open_store, pseudo_random, pseudo_text, restored, Repo, TreeBuilder,
};

/// The name of the file whose chunk is damaged: not UTF-8, so that the report must
/// carry its exact bytes.
const LOST_NAME: &[u8] = b"data/lost-\xff.bin";

/// A repository with one snapshot of `src`, in which four bytes of one chunk of
/// [`LOST_NAME`] were overwritten.
struct Damaged {
    repo: Repo,
    src: PathBuf,
    /// The snapshot taken before the damage.
    original: String,
    /// The damaged container's id.
    container: u64,
}

fn source(repo: &Repo) -> PathBuf {
    let src = repo.dir("src");
    TreeBuilder::new(&src)
        .file("keep/a.bin", pseudo_random(1, 300_000))
        .file(LOST_NAME, pseudo_random(2, 400_000))
        .file("keep/notes.txt", pseudo_text(3, 60_000))
        .dir("keep/empty")
        .symlink("keep/link", "a.bin")
        .finish();
    src
}

/// Where chunk `i` of the file at source path `file` lies in snapshot `id`: the
/// container, the chunk's stored offset and length, and how many chunks the file has.
fn chunk_place(repo: &Path, id: &str, file: &Path, i: usize) -> (u64, u64, u64, usize) {
    let store = open_store(repo, LockMode::Shared);
    let (_, snap) = store.find_snapshot(id).unwrap();
    let fps = snap.tree.fingerprints().unwrap();
    let entries = load_tree(&mut ChunkReader::new(&store), &fps).unwrap();
    let want = file.strip_prefix("/").unwrap().as_os_str().as_bytes();
    let entry = entries
        .iter()
        .find(|e| e.kind == EntryKind::File && e.path == want)
        .expect("the file is in the snapshot");
    let loc = store.index().get(&entry.chunks[i]).unwrap().unwrap();
    let len = u64::from(loc.length);
    (
        loc.container,
        u64::from(loc.offset),
        len,
        entry.chunks.len(),
    )
}

/// The containers holding snapshot `id`'s tree stream.
fn tree_containers(repo: &Path, id: &str) -> BTreeSet<u64> {
    let store = open_store(repo, LockMode::Shared);
    let (_, snap) = store.find_snapshot(id).unwrap();
    let fps = snap.tree.fingerprints().unwrap();
    fps.iter()
        .map(|fp| store.index().get(fp).unwrap().unwrap().container)
        .collect()
}

fn container_path(repo: &Path, id: u64) -> PathBuf {
    repo.join("containers").join(format!("{id:016x}.ctr"))
}

/// Replaces a container by a copy whose bytes `at..at + 4` are inverted (never writes
/// through a hard link).
fn overwrite_four_bytes(repo: &Path, id: u64, at: u64) {
    let path = container_path(repo, id);
    let mut bytes = fs::read(&path).unwrap();
    for b in &mut bytes[at as usize..at as usize + 4] {
        *b ^= 0xff;
    }
    fs::remove_file(&path).unwrap();
    fs::write(&path, bytes).unwrap();
}

fn damaged(encrypted: bool) -> Damaged {
    let repo = match encrypted {
        true => Repo::init(&[]),
        false => Repo::init_plain(&[]),
    };
    let src = source(&repo);
    let original = snapshot_id(&repo.backup(&[&src]));
    let lost = src.join(OsStr::from_bytes(LOST_NAME));
    let (_, _, _, count) = chunk_place(&repo.path, &original, &lost, 0);
    let (container, offset, len, _) = chunk_place(&repo.path, &original, &lost, count / 2);
    overwrite_four_bytes(&repo.path, container, offset + len / 2);
    Damaged {
        repo,
        src,
        original,
        container,
    }
}

fn snapshot_id(summary: &Value) -> String {
    summary["snapshot"].as_str().unwrap().to_string()
}

/// Every file of `dir` but [`LOST_NAME`]'s, by path relative to `dir`.
fn files_without_lost(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut all = files(dir);
    all.remove(Path::new(OsStr::from_bytes(LOST_NAME)));
    all
}

fn restore_files(repo: &Repo, id: &str, src: &Path, tag: &str) -> PathBuf {
    let target = repo.new_path(tag);
    repo.restore(id, &target, &[]).expect_ok();
    restored(&target, src)
}

/// The acceptance, for a plaintext repository healed by `backup --force` (the backup
/// that spread the damage before) and an encrypted one healed by a plain backup
/// (whose skip logic must read the file again: its chunk left the index).
#[test]
fn repair_then_backup_heals_damage_that_backups_spread_before() {
    for (encrypted, force) in [(false, true), (true, false)] {
        let d = damaged(encrypted);
        d.repo.check(true).expect_code(1);

        let out = d.repo.run(["--json", "repair"]);
        out.expect_code(3);
        let report = out.json();
        let repaired = assert_reports_the_lost_file(&d, &report);
        let listed = d.repo.run(["snapshots"]);
        listed.expect_ok();
        let copy_of = format!("(repaired copy of {})", &d.original[..8]);
        assert!(listed.stdout.contains(&copy_of), "{listed}");

        // The damaged chunk left the index: the next backup stores it again.
        let mut args = vec!["--json", "backup"];
        if force {
            args.push("--force");
        }
        let src = d.src.to_str().unwrap();
        args.push(src);
        let out = d.repo.run(&args);
        out.expect_ok();
        let new = snapshot_id(&out.json());
        let check = d.repo.check(true);
        check.expect_ok();
        assert_eq!(check.json()["ok"], true, "{check}");

        assert_same_tree(&d.src, &restore_files(&d.repo, &new, &d.src, "new"));
        assert_same_tree(&d.src, &restore_files(&d.repo, &d.original, &d.src, "orig"));
        let copy = restore_files(&d.repo, &repaired, &d.src, "repaired");
        assert_eq!(files(&copy), files_without_lost(&d.src));
        assert!(!copy.join(OsStr::from_bytes(LOST_NAME)).exists());
        assert_same_tree(&d.src.join("keep"), &copy.join("keep"));
    }
}

/// Checks the report of a repair of `d`: the damaged container, and the one file that
/// lost data, with its exact name; returns the repaired copy's id.
fn assert_reports_the_lost_file(d: &Damaged, report: &Value) -> String {
    assert_eq!(report["dry_run"], false);
    let containers = report["containers"].as_array().unwrap();
    assert_eq!(containers.len(), 1, "{report:#}");
    let c = &containers[0];
    assert_eq!(c["id"], format!("{:016x}", d.container));
    assert!(c["lost"].as_u64().unwrap() >= 1, "{report:#}");
    assert!(c["salvaged"].as_u64().unwrap() >= 1, "{report:#}");
    let snaps = report["snapshots"].as_array().unwrap();
    assert_eq!(snaps.len(), 1, "{report:#}");
    let s = &snaps[0];
    assert_eq!(s["id"], d.original.as_str());
    let lost = s["files"].as_array().unwrap();
    assert_eq!(lost.len(), 1, "{report:#}");
    let f = &lost[0];
    let mut raw = d.src.as_os_str().as_bytes().to_vec();
    raw.push(b'/');
    raw.extend_from_slice(LOST_NAME);
    let hex: String = raw.iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(f["path_hex"], hex.as_str(), "{report:#}");
    assert_eq!(f["size"], 400_000);
    let lost_bytes = f["lost_bytes"].as_u64().unwrap();
    assert!(lost_bytes > 0 && lost_bytes < 400_000, "{report:#}");
    let ranges = f["lost_ranges"].as_array().unwrap();
    let ranged: u64 = ranges
        .iter()
        .map(|r| r[1].as_u64().unwrap() - r[0].as_u64().unwrap())
        .sum();
    assert_eq!(ranged, lost_bytes, "{report:#}");
    s["repaired"].as_str().expect("a repaired copy").to_string()
}

#[test]
fn text_report_names_each_lost_file_with_its_bytes() {
    let d = damaged(false);
    let out = d.repo.run(["repair"]);
    out.expect_code(3);
    let escaped = format!("{}/data/lost-\\xff.bin", d.src.to_str().unwrap());
    for needle in [
        format!("container {:016x}", d.container),
        format!("snapshot {}", &d.original[..8]),
        escaped,
        "of 400000 bytes".to_string(),
    ] {
        assert!(out.stdout.contains(&needle), "no {needle:?} in\n{out}");
    }
    // Repairing again writes nothing new and reports the same loss.
    let again = d.repo.run(["--json", "repair"]);
    again.expect_code(3);
    let report = again.json();
    assert_eq!(report["containers"].as_array().unwrap().len(), 0, "{again}");
    assert_eq!(report["snapshots"][0]["existing"], true, "{again}");
    assert_eq!(
        d.repo.snapshots().len(),
        2,
        "one original, one repaired copy"
    );
}

/// Every file of the repository but the lock, by path, with its bytes.
fn repository_files(root: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut all = files(root);
    all.remove(Path::new("lock"));
    all
}

#[test]
fn dry_run_reports_the_same_and_writes_nothing() {
    let d = damaged(true);
    let before = repository_files(&d.repo.path);
    let out = d.repo.run(["--json", "repair", "--dry-run"]);
    out.expect_ok();
    let dry = out.json();
    assert_eq!(dry["dry_run"], true);
    assert!(
        repository_files(&d.repo.path) == before,
        "a dry run changed the repository"
    );
    let out = d.repo.run(["--json", "repair"]);
    out.expect_code(3);
    let real = out.json();
    for key in ["containers", "unindexed_deleted"] {
        assert_eq!(dry[key], real[key], "{key}");
    }
    assert_eq!(dry["snapshots"][0]["files"], real["snapshots"][0]["files"]);
    assert!(dry["snapshots"][0]["repaired"].is_null());
}

/// A zero-length container and a truncated one: `check` fails until `repair` removes
/// them, and a backup of the same source makes the repository whole again.
#[test]
fn zero_length_and_truncated_containers_are_removed() {
    let repo = Repo::init_plain(&[]);
    let src = source(&repo);
    // Random bytes are stored raw: more than two 4 MiB containers.
    fs::write(src.join("big.bin"), pseudo_random(4, 9_000_000)).unwrap();
    let original = snapshot_id(&repo.backup(&[&src]));
    let lost = src.join("big.bin");
    let (first, _, _, count) = chunk_place(&repo.path, &original, &lost, 0);
    let (last, ..) = chunk_place(&repo.path, &original, &lost, count / 2);
    assert_ne!(first, last, "the file spans several containers");
    // The tree stays whole: a backup of the same files then makes the original whole.
    let tree = tree_containers(&repo.path, &original);
    assert!(!tree.contains(&first) && !tree.contains(&last), "{tree:?}");
    fs::write(container_path(&repo.path, first), b"").unwrap();
    let bytes = fs::read(container_path(&repo.path, last)).unwrap();
    fs::write(container_path(&repo.path, last), &bytes[..bytes.len() / 2]).unwrap();
    repo.check(false).expect_code(1);

    let out = repo.run(["--json", "repair"]);
    out.expect_code(3);
    let report = out.json();
    let ids: Vec<&str> = report["containers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["id"].as_str().unwrap())
        .collect();
    assert_eq!(
        ids,
        [format!("{first:016x}"), format!("{last:016x}")],
        "{out}"
    );
    assert!(!container_path(&repo.path, first).exists());
    assert!(!container_path(&repo.path, last).exists());
    repo.backup(&[&src]);
    repo.check(true).expect_ok();
    let target = repo.new_path("target");
    repo.restore(&original, &target, &[]).expect_ok();
    assert_same_tree(&src, &restored(&target, &src));
}

/// A snapshot file that cannot be read: every command that names snapshots reaches
/// it by its id (the file's name), says that it is unreadable, and `forget` removes it,
/// after which `gc` runs again.
#[test]
fn unreadable_snapshots_are_reached_by_id() {
    let repo = Repo::init_plain(&[]);
    let src = source(&repo);
    let bad = snapshot_id(&repo.backup(&[&src]));
    fs::write(src.join("keep/new.txt"), b"new").unwrap();
    repo.backup(&[&src]);
    let file = repo.path.join("snapshots").join(format!("{bad}.snap"));
    let mut bytes = fs::read(&file).unwrap();
    bytes[5] ^= 0x20;
    fs::write(&file, bytes).unwrap();
    let short = &bad[..10];

    repo.run(["gc"])
        .expect_code(1)
        .expect_stderr(&[&bad[..8], "larder forget"]);
    let target = repo.new_path("target");
    let cat_path = format!("{}/keep/notes.txt", src.to_str().unwrap());
    for args in [
        vec!["ls", short],
        vec!["restore", short, target.to_str().unwrap()],
        vec!["cat", short, &cat_path],
    ] {
        let out = repo.run(&args);
        out.expect_code(1).expect_stderr(&["unreadable", &bad[..8]]);
        assert!(!out.stderr.contains("no snapshot matches"), "{out}");
    }
    let dst = Repo::init_plain(&[]);
    let out = dst.run(["copy", "--from-repo", repo.path.to_str().unwrap(), short]);
    out.expect_code(1).expect_stderr(&["unreadable", &bad[..8]]);

    let out = repo.run(["--json", "repair", short]);
    out.expect_ok();
    assert_eq!(out.json()["unreadable_snapshots"][0]["id"], bad.as_str());

    let out = repo.run(["--json", "forget", short]);
    out.expect_ok();
    assert_eq!(out.json()["remove"][0]["id"], bad.as_str(), "{out}");
    assert_eq!(out.json()["remove"][0]["unreadable"], true, "{out}");
    assert!(!file.exists());
    repo.run(["gc"]).expect_ok();
    repo.check(true).expect_ok();
}

fn kill_count() -> usize {
    std::env::var("LARDER_REPAIR_KILLS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(4)
}

/// Copies a repository directory (containers hard-linked: damage replaces files).
fn copy_repo(from: &Path, to: &Path) {
    fs::create_dir_all(to).unwrap();
    for e in fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let (src, dst) = (e.path(), to.join(e.file_name()));
        if e.file_type().unwrap().is_dir() {
            copy_repo(&src, &dst);
        } else {
            fs::copy(&src, &dst).unwrap();
        }
    }
}

/// SIGKILLs `repair` at random moments (`LARDER_REPAIR_KILLS`, default 4; every other
/// one after its plan file appears): whatever it left, the next `repair`
/// finishes, no snapshot is repaired twice, and after a backup of the same source
/// `check --read-data` passes and the original restores identical.
#[test]
fn a_killed_repair_is_finished_by_the_next() {
    let d = damaged(true);
    let pristine = d.repo.scratch.path().join("pristine");
    copy_repo(&d.repo.path, &pristine);
    let start = Instant::now();
    d.repo.run(["repair"]).expect_code(3);
    let took = start.elapsed();
    let mut rng = rng::Rng::new(0x7265_7061_6972);
    for round in 0..kill_count() {
        fs::remove_dir_all(&d.repo.path).unwrap();
        copy_repo(&pristine, &d.repo.path);
        let mut child = d.repo.command(["repair"]).spawn().unwrap();
        // Every other kill lands after the plan file appears: within the writes.
        if round % 2 == 1 {
            let plans = d.repo.path.join("gc");
            let deadline = Instant::now() + took * 4;
            while Instant::now() < deadline && fs::read_dir(&plans).unwrap().next().is_none() {
                std::thread::sleep(Duration::from_micros(200));
            }
            std::thread::sleep(took.mul_f64(rng.unit() / 8.0));
        } else {
            std::thread::sleep(took.mul_f64(rng.unit()));
        }
        let _ = child.kill();
        let status = child.wait().unwrap();
        let killed = status.signal().is_some();
        let out = d.repo.run(["--json", "repair"]);
        out.expect_code(3);
        let copies = d.repo.snapshots().len() - 1;
        assert_eq!(copies, 1, "round {round} (killed: {killed}): {out}");
        d.repo.backup(&[&d.src]);
        d.repo.check(true).expect_ok();
        let tag = format!("round-{round}");
        assert_same_tree(&d.src, &restore_files(&d.repo, &d.original, &d.src, &tag));
    }
}

/// `--container` reads the data of the named containers only (the ids `check`
/// names), and decides as a repair that reads everything; an id the repository does
/// not hold is refused before anything is written.
#[test]
fn container_option_reads_only_the_named_containers() {
    let repo = Repo::init_plain(&[]);
    let src = source(&repo);
    fs::write(src.join("big.bin"), pseudo_random(5, 9_000_000)).unwrap();
    let original = snapshot_id(&repo.backup(&[&src]));
    let big = src.join("big.bin");
    let (_, _, _, count) = chunk_place(&repo.path, &original, &big, 0);
    let (container, offset, len, _) = chunk_place(&repo.path, &original, &big, count / 3);
    overwrite_four_bytes(&repo.path, container, offset + len / 2);
    let id = format!("{container:016x}");

    let everything = repo.run(["--json", "repair", "--dry-run"]);
    everything.expect_ok();
    let everything = everything.json();
    repo.run(["repair", "--container", "ffffff"])
        .expect_code(1)
        .expect_stderr(&["container 0000000000ffffff is not in the repository"]);
    repo.run(["repair", "--container", "not-hex"])
        .expect_code(2);
    let named = repo.run(["--json", "repair", "--container", &format!("{id}.ctr")]);
    named.expect_code(3);
    let named = named.json();
    assert!(
        named["bytes_read"].as_u64() < everything["bytes_read"].as_u64(),
        "{named:#}"
    );
    assert_eq!(named["containers"], everything["containers"]);
    assert_eq!(
        named["snapshots"][0]["files"],
        everything["snapshots"][0]["files"]
    );
    repo.backup(&[&src]);
    repo.check(true).expect_ok();
}

/// A container of a format version this larder does not know (a newer larder's, or a
/// forgery) is not damage to delete: repair stops before writing anything, and the
/// file stays as it was.
#[test]
fn a_container_of_an_unknown_version_is_never_deleted() {
    let repo = Repo::init_plain(&[]);
    let src = source(&repo);
    let id = snapshot_id(&repo.backup(&[&src]));
    let lost = src.join(OsStr::from_bytes(LOST_NAME));
    let (container, ..) = chunk_place(&repo.path, &id, &lost, 0);
    let path = container_path(&repo.path, container);
    let mut bytes = fs::read(&path).unwrap();
    // Version 9, with the checksum (header, table, footer) made to match.
    bytes[8..12].copy_from_slice(&9u32.to_le_bytes());
    let len = bytes.len();
    let table = u64::from_le_bytes(bytes[len - 56..len - 48].try_into().unwrap()) as usize;
    let mut hasher = blake3::Hasher::new();
    hasher.update(&bytes[..32]);
    hasher.update(&bytes[table..len - 40]);
    let sum = *hasher.finalize().as_bytes();
    bytes[len - 40..len - 8].copy_from_slice(&sum);
    fs::remove_file(&path).unwrap();
    fs::write(&path, &bytes).unwrap();

    let out = repo.run(["repair"]);
    out.expect_code(1)
        .expect_stderr(&["version 9 is not supported"]);
    assert!(
        fs::read(&path).unwrap() == bytes,
        "the container was changed"
    );
    assert_eq!(fs::read_dir(repo.path.join("gc")).unwrap().count(), 0);
    assert_eq!(repo.snapshots().len(), 1);
}
