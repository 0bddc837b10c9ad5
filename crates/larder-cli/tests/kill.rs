//! Acceptance: "Killing `larder backup` with SIGKILL at random moments, 20 times: after
//! each kill, `check` passes and every earlier snapshot restores identical."
//!
//! This is the short form for `cargo test` (3 kills, a generated tree of about 40 MiB,
//! the debug binary); `scripts/kill-test` runs the full 20 kills on a real tree with
//! the release binary.
//!
//! Two good snapshots are taken (everything new, then a changed tree); then, 3 times,
//! the tree is changed (with new data first in walk order, so that the backup writes
//! containers early), a copy of it is kept, the backup is timed running uninterrupted
//! into a copy of the repository, and `larder backup` is started for real and
//! SIGKILLed after a seeded random delay within that duration. After each kill
//! `larder check` must pass and every snapshot committed so far must restore identical
//! (content, permission bits, mtime, symlink targets) to the copy of the tree it was
//! taken from. Last, an uninterrupted backup must succeed and `check --read-data` pass.
//!
//! Set `LARDER_KILL_SEED` to try other kill moments.

use std::collections::BTreeSet;
use std::fs;
use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant, SystemTime};

const KILLS: usize = 3;
const DEFAULT_SEED: u64 = 0x6b69_6c6c_2074_6573;

#[path = "support/rng.rs"]
mod rng;
use rng::Rng;

fn larder(repo: &Path) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_larder"));
    cmd.arg("--repo")
        .arg(repo)
        .env("LARDER_PASSWORD", "larder test password");
    cmd
}

fn run_ok(cmd: &mut Command, what: &str) -> Output {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{what}: {}\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn snapshot_ids(repo: &Path) -> Vec<String> {
    let out = run_ok(larder(repo).args(["--json", "snapshots"]), "snapshots");
    let listed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    listed["snapshots"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap().to_owned())
        .collect()
}

fn set_mtime(path: &Path, secs: u64, nanos: u32) {
    let t = SystemTime::UNIX_EPOCH + Duration::new(secs, nanos);
    fs::File::options()
        .write(true)
        .open(path)
        .unwrap()
        .set_modified(t)
        .unwrap();
}

/// About 40 MiB: large random files (about 28 MiB unique), copies of two of them,
/// a file of one repeated block, 120 small files with varied modes and mtimes, an
/// empty file, symlinks.
fn make_tree(root: &Path, rng: &mut Rng) {
    for d in ["big", "copies", "small/a", "small/b"] {
        fs::create_dir_all(root.join(d)).unwrap();
    }
    let mut bigs = Vec::new();
    for i in 0..6 {
        let len = (2 << 20) + rng.below(4 << 20) as usize;
        let data = rng.bytes(len);
        let path = root.join(format!("big/{i}.bin"));
        fs::write(&path, &data).unwrap();
        bigs.push(data);
    }
    fs::write(root.join("copies/0.bin"), &bigs[0]).unwrap();
    fs::write(root.join("copies/3.bin"), &bigs[3]).unwrap();
    let block = rng.bytes(64 << 10);
    fs::write(root.join("repeated.bin"), block.repeat(24)).unwrap();
    for i in 0..120u64 {
        let sub = if i.is_multiple_of(2) { "a" } else { "b" };
        let path = root.join(format!("small/{sub}/{i:03}.txt"));
        let len = 100 + rng.below(30_000) as usize;
        fs::write(&path, rng.bytes(len)).unwrap();
        fs::set_permissions(
            &path,
            fs::Permissions::from_mode([0o644, 0o600, 0o755][i as usize % 3]),
        )
        .unwrap();
        set_mtime(
            &path,
            1_600_000_000 + rng.below(100_000_000),
            rng.below(1_000_000_000) as u32,
        );
    }
    fs::write(root.join("empty"), b"").unwrap();
    std::os::unix::fs::symlink("big/0.bin", root.join("link-to-big")).unwrap();
    std::os::unix::fs::symlink("no/such/target", root.join("dangling")).unwrap();
}

/// Changes the tree as a day of work would, and adds 8 MiB of new data so that the
/// next backup writes containers while it can be killed.
fn mutate(root: &Path, rng: &mut Rng, round: usize) {
    // First in walk order, so that its containers are written early in the backup.
    fs::write(root.join(format!("0-new-{round}.bin")), rng.bytes(8 << 20)).unwrap();
    let big = root.join(format!("big/{}.bin", rng.below(6)));
    let mut data = fs::read(&big).unwrap();
    let at = rng.below(data.len() as u64 - 5000) as usize;
    let patch = rng.bytes(4000);
    data[at..at + 4000].copy_from_slice(&patch);
    fs::write(&big, data).unwrap();
    for _ in 0..5 {
        let i = rng.below(120);
        let sub = if i.is_multiple_of(2) { "a" } else { "b" };
        let path = root.join(format!("small/{sub}/{i:03}.txt"));
        if path.exists() {
            let mut f = fs::OpenOptions::new().append(true).open(&path).unwrap();
            f.write_all(&rng.bytes(200)).unwrap();
        }
    }
    let chmod = root.join(format!("small/a/{:03}.txt", 2 * rng.below(60)));
    if chmod.exists() {
        fs::set_permissions(&chmod, fs::Permissions::from_mode(0o640)).unwrap();
    }
    let gone = root.join(format!("small/b/{:03}.txt", 2 * rng.below(60) + 1));
    let _ = fs::remove_file(gone);
    std::os::unix::fs::symlink(
        format!("0-new-{round}.bin"),
        root.join(format!("link-{round}")),
    )
    .unwrap();
}

/// `cp -a`: keeps modes, mtimes (of directories and symlinks too) and symlinks.
fn copy_tree(from: &Path, to: &Path) {
    let out = Command::new("cp")
        .arg("-a")
        .arg(from)
        .arg(to)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "cp -a: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Compares two trees entry by entry: type, permission bits, mtime to the nanosecond,
/// content, symlink target. Returns the differences.
fn differences(a: &Path, b: &Path, out: &mut Vec<String>) {
    let (ma, mb) = match (fs::symlink_metadata(a), fs::symlink_metadata(b)) {
        (Ok(ma), Ok(mb)) => (ma, mb),
        (_, Err(e)) => return out.push(format!("{}: {e}", b.display())),
        (Err(e), _) => return out.push(format!("{}: {e}", a.display())),
    };
    let what = a.display();
    if ma.file_type() != mb.file_type() {
        return out.push(format!("{what}: type differs"));
    }
    if ma.mode() & 0o7777 != mb.mode() & 0o7777 {
        out.push(format!("{what}: mode {:o} vs {:o}", ma.mode(), mb.mode()));
    }
    if (ma.mtime(), ma.mtime_nsec()) != (mb.mtime(), mb.mtime_nsec()) {
        out.push(format!("{what}: mtime differs"));
    }
    if ma.file_type().is_symlink() {
        if fs::read_link(a).unwrap() != fs::read_link(b).unwrap() {
            out.push(format!("{what}: symlink target differs"));
        }
    } else if ma.is_file() {
        if fs::read(a).unwrap() != fs::read(b).unwrap() {
            out.push(format!("{what}: content differs"));
        }
    } else if ma.is_dir() {
        let names = |d: &Path| -> BTreeSet<_> {
            fs::read_dir(d)
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect()
        };
        let (na, nb) = (names(a), names(b));
        for n in na.symmetric_difference(&nb) {
            out.push(format!("{what}: {n:?} only on one side"));
        }
        for n in na.intersection(&nb) {
            differences(&a.join(n), &b.join(n), out);
        }
    }
}

/// Restores snapshot `id` and compares it with `state`, the copy of `tree` taken when
/// the snapshot was made.
fn assert_restores_identical(repo: &Path, id: &str, tree: &Path, state: &Path, scratch: &Path) {
    let target = scratch.join(format!("restore-{}", &id[..12]));
    run_ok(
        larder(repo).arg("-q").arg("restore").arg(id).arg(&target),
        &format!("restore {id}"),
    );
    let mut diffs = Vec::new();
    differences(
        state,
        &target.join(tree.strip_prefix("/").unwrap()),
        &mut diffs,
    );
    assert!(
        diffs.is_empty(),
        "snapshot {id} does not restore identical:\n{}",
        diffs[..diffs.len().min(20)].join("\n")
    );
    fs::remove_dir_all(&target).unwrap();
}

fn count(dir: &Path) -> usize {
    fs::read_dir(dir).unwrap().count()
}

#[test]
fn backup_killed_at_random_moments_leaves_every_snapshot_restorable() {
    let started = Instant::now();
    let seed = std::env::var("LARDER_KILL_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(DEFAULT_SEED);
    let mut rng = Rng::new(seed);
    let dir = tempfile::tempdir().unwrap();
    let base = fs::canonicalize(dir.path()).unwrap();
    let (repo, tree, states) = (base.join("repo"), base.join("tree"), base.join("states"));
    fs::create_dir(&states).unwrap();
    run_ok(
        larder(&repo).args([
            "-q",
            "init",
            "--kdf-memory",
            "8MiB",
            "--kdf-iterations",
            "1",
        ]),
        "init",
    );
    make_tree(&tree, &mut rng);

    // Two good snapshots: everything new, then a changed tree.
    let mut committed: Vec<(String, PathBuf)> = Vec::new();
    for round in [0, KILLS + 1] {
        if round > 0 {
            mutate(&tree, &mut rng, round);
        }
        let state = states.join(round.to_string());
        copy_tree(&tree, &state);
        run_ok(
            larder(&repo).arg("-q").arg("backup").arg(&tree),
            "uninterrupted backup",
        );
        let id = snapshot_ids(&repo)
            .into_iter()
            .find(|id| !committed.iter().any(|c| &c.0 == id))
            .unwrap();
        committed.push((id, state));
    }

    let mut interrupted = 0;
    for round in 1..=KILLS {
        mutate(&tree, &mut rng, round);
        let state = states.join(round.to_string());
        copy_tree(&tree, &state);
        // The timed run: this round's backup, uninterrupted, into a copy of the
        // repository. Its duration is the window the kill falls in.
        let timing = base.join("timing-repo");
        copy_tree(&repo, &timing);
        let t0 = Instant::now();
        run_ok(
            larder(&timing).arg("-q").arg("backup").arg(&tree),
            "timed backup",
        );
        let window = t0.elapsed();
        fs::remove_dir_all(&timing).unwrap();
        let before: BTreeSet<String> = snapshot_ids(&repo).into_iter().collect();
        let containers_before = count(&repo.join("containers"));
        let delay = window.mul_f64(0.05 + 0.95 * rng.unit());
        let mut child = larder(&repo)
            .arg("-q")
            .arg("backup")
            .arg(&tree)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // The deliberate random kill moment, not a synchronization.
        std::thread::sleep(delay);
        child.kill().unwrap();
        let out = child.wait_with_output().unwrap();
        let killed = out.status.signal() == Some(libc::SIGKILL);
        assert!(
            killed || out.status.success(),
            "round {round}: backup failed on its own: {}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        interrupted += usize::from(killed);
        let new: Vec<String> = snapshot_ids(&repo)
            .into_iter()
            .filter(|id| !before.contains(id))
            .collect();
        assert!(new.len() <= 1, "round {round}: {new:?}");
        assert!(
            killed || new.len() == 1,
            "round {round}: finished without a snapshot"
        );
        let got_snapshot = !new.is_empty();
        if let Some(id) = new.into_iter().next() {
            committed.push((id, state));
        }
        let check = run_ok(
            larder(&repo).arg("check"),
            &format!("check after kill {round}"),
        );
        for (id, state) in &committed {
            assert_restores_identical(&repo, id, &tree, state, &base);
        }
        eprintln!(
            "round {round}: kill after {:.3} s of {:.3} s: {}; {} new container file(s), {} file(s) in tmp/; check: {}; {} snapshot(s) restored identical",
            delay.as_secs_f64(),
            window.as_secs_f64(),
            match (killed, got_snapshot) {
                (true, false) => "killed before commit",
                (true, true) => "killed after commit",
                (false, _) => "finished before the kill",
            },
            count(&repo.join("containers")) - containers_before,
            count(&repo.join("tmp")),
            String::from_utf8_lossy(&check.stdout).trim(),
            committed.len()
        );
    }
    assert!(
        interrupted > 0,
        "no backup was interrupted: the kill windows are too short"
    );

    mutate(&tree, &mut rng, KILLS + 2);
    let final_state = states.join("final");
    copy_tree(&tree, &final_state);
    run_ok(
        larder(&repo).arg("-q").arg("backup").arg(&tree),
        "final backup",
    );
    run_ok(
        larder(&repo).args(["check", "--read-data"]),
        "check --read-data",
    );
    let ids = snapshot_ids(&repo);
    assert_eq!(ids.len(), committed.len() + 1);
    let last = ids
        .iter()
        .find(|id| !committed.iter().any(|c| &c.0 == *id))
        .unwrap();
    assert_restores_identical(&repo, last, &tree, &final_state, &base);
    eprintln!("kill test took {:.1} s", started.elapsed().as_secs_f64());
}
