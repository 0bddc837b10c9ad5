//! Acceptance, short form (docs/design/gc.md; `scripts/gc-acceptance` runs the full
//! counts on real data with the release binary):
//!
//! - "20 SIGKILLs at random moments of `gc` each leave a repository that passes
//!   `check --read-data`, and every remaining snapshot restores identical."
//!   `LARDER_GC_KILLS` kills (default 5), each into a fresh copy of a repository where
//!   snapshots were forgotten, at a seeded random moment within the duration of an
//!   uninterrupted gc (every other kill within its sweep: after its plan file
//!   appears). After each kill, before any writer has recovered, `check
//!   --read-data` passes and every remaining snapshot restores identical; then `gc`
//!   runs again (recovering first) and leaves a repository of exactly the size an
//!   uninterrupted gc leaves.
//! - "Two concurrent backups and a `gc` started together, repeated 10 times. Nothing
//!   is corrupted and every committed snapshot restores." `LARDER_GC_ROUNDS` rounds
//!   (default 3): `forget --keep-last 1` (one group per source tree), then two backups
//!   of different trees and a gc started together. Even rounds wait for the lock
//!   (`--retry-lock`) and all three must succeed; odd rounds do not wait, and each
//!   process either succeeds or fails naming the holder. After each round `check
//!   --read-data` passes and every snapshot restores identical.
//!
//! Set `LARDER_KILL_SEED` to try other kill moments.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Instant;

const DEFAULT_SEED: u64 = 0x6763_2d6b_696c_6c73;

#[path = "support/rng.rs"]
mod rng;
use rng::Rng;

fn env_count(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

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

/// `cp -a`: keeps modes, mtimes and symlinks.
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

/// Type, permission bits, mtime, content or symlink target of every entry under
/// `root`, by relative path.
fn image(root: &Path) -> BTreeMap<PathBuf, (u32, i64, i64, Vec<u8>)> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let m = fs::symlink_metadata(&path).unwrap();
            let content = if m.file_type().is_symlink() {
                fs::read_link(&path)
                    .unwrap()
                    .into_os_string()
                    .into_encoded_bytes()
            } else if m.is_dir() {
                stack.push(path.clone());
                Vec::new()
            } else {
                fs::read(&path).unwrap()
            };
            let mtime = if m.is_dir() { 0 } else { m.mtime() };
            let key = path.strip_prefix(root).unwrap().to_path_buf();
            out.insert(
                key,
                (
                    m.mode(),
                    mtime,
                    m.mtime_nsec() * i64::from(!m.is_dir()),
                    content,
                ),
            );
        }
    }
    out
}

/// Restores snapshot `id` of a backup of `tree` and compares it with `state`, the
/// copy of the tree taken when the snapshot was made.
fn assert_restores_identical(repo: &Path, id: &str, tree: &Path, state: &Path, scratch: &Path) {
    let target = scratch.join(format!("restore-{}", &id[..12]));
    run_ok(
        larder(repo).arg("-q").arg("restore").arg(id).arg(&target),
        &format!("restore {id}"),
    );
    let restored = image(&target.join(tree.strip_prefix("/").unwrap()));
    assert!(
        restored == image(state),
        "snapshot {id} does not restore identical"
    );
    fs::remove_dir_all(&target).unwrap();
}

/// Writes generation `g` of a tree: stable files, files replaced each generation, a
/// file present every other generation, small files edited, a symlink.
fn write_generation(root: &Path, rng: &mut Rng, g: usize, scale: usize) {
    fs::create_dir_all(root.join("small")).unwrap();
    if g == 0 {
        fs::write(root.join("stable.bin"), rng.bytes(scale << 20)).unwrap();
    }
    fs::write(root.join("replaced.bin"), rng.bytes(scale << 20)).unwrap();
    if g.is_multiple_of(2) {
        fs::write(
            root.join(format!("sometimes-{g}.bin")),
            rng.bytes(scale << 19),
        )
        .unwrap();
    } else {
        fs::remove_file(root.join(format!("sometimes-{}.bin", g - 1))).unwrap();
    }
    for i in 0..30u64 {
        let path = root.join(format!("small/{i:02}.txt"));
        if g == 0 || rng.below(4) == 0 {
            let len = 200 + rng.below(20_000) as usize;
            fs::write(&path, rng.bytes(len)).unwrap();
            fs::set_permissions(
                &path,
                fs::Permissions::from_mode(0o600 + 0o44 * (i as u32 % 2)),
            )
            .unwrap();
        }
    }
    let link = root.join("link");
    let _ = fs::remove_file(&link);
    std::os::unix::fs::symlink(format!("small/{g:02}.txt"), link).unwrap();
}

/// Backs up `tree` and records a copy of it as the snapshot's expected content.
fn backup(repo: &Path, tree: &Path, states: &Path) -> (String, PathBuf) {
    let out = run_ok(larder(repo).arg("--json").arg("backup").arg(tree), "backup");
    backup_result(&out, tree, states)
}

fn backup_result(out: &Output, tree: &Path, states: &Path) -> (String, PathBuf) {
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let id = v["snapshot"].as_str().unwrap().to_owned();
    let state = states.join(&id);
    copy_tree(tree, &state);
    (id, state)
}

/// Bytes of the files in `containers/` and `index/`.
fn stored_bytes(root: &Path) -> u64 {
    ["containers", "index"]
        .iter()
        .flat_map(|d| fs::read_dir(root.join(d)).unwrap())
        .map(|e| e.unwrap().metadata().unwrap().len())
        .sum()
}

#[test]
fn gc_killed_at_random_moments_loses_nothing() {
    let kills = env_count("LARDER_GC_KILLS", 5);
    let seed = env_count("LARDER_KILL_SEED", DEFAULT_SEED as usize) as u64;
    let started = Instant::now();
    let mut rng = Rng::new(seed);
    let dir = tempfile::tempdir().unwrap();
    let base = fs::canonicalize(dir.path()).unwrap();
    let (origin, tree, states) = (base.join("origin"), base.join("tree"), base.join("states"));
    fs::create_dir(&states).unwrap();
    run_ok(
        larder(&origin).args([
            "-q",
            "init",
            "--kdf-memory",
            "8MiB",
            "--kdf-iterations",
            "1",
        ]),
        "init",
    );
    let mut snapshots = Vec::new();
    for g in 0..5 {
        write_generation(&tree, &mut rng, g, 3);
        snapshots.push(backup(&origin, &tree, &states));
    }
    let forgotten: Vec<String> = [0, 2, 3].iter().map(|&i| snapshots[i].0.clone()).collect();
    run_ok(
        larder(&origin).arg("-q").arg("forget").args(&forgotten),
        "forget",
    );
    let remaining: Vec<(String, PathBuf)> = snapshots
        .into_iter()
        .filter(|(id, _)| !forgotten.contains(id))
        .collect();

    // The window: an uninterrupted gc on a copy, and the size it leaves. Its plan
    // file's appearance marks the start of the sweep (before it, gc only reads).
    let reference = base.join("reference");
    copy_tree(&origin, &reference);
    let t0 = Instant::now();
    let mut child = larder(&reference).args(["-q", "gc"]).spawn().unwrap();
    let mut sweep_start = None;
    while child.try_wait().unwrap().is_none() {
        if sweep_start.is_none() && fs::read_dir(reference.join("gc")).unwrap().next().is_some() {
            sweep_start = Some(t0.elapsed());
        }
        std::thread::sleep(std::time::Duration::from_micros(500));
    }
    let window = t0.elapsed();
    assert!(child.wait().unwrap().success(), "uninterrupted gc");
    let sweep_start = sweep_start.unwrap_or_default();
    let reference_size = stored_bytes(&reference);

    let mut killed = 0;
    for round in 0..kills {
        let repo = base.join(format!("repo-{round}"));
        copy_tree(&origin, &repo);
        let mut child = larder(&repo)
            .args(["-q", "gc"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // Even kills fall anywhere in the run; odd ones wait for the plan file (the
        // sweep's start), then fall anywhere in the rest of the run.
        let t0 = Instant::now();
        let delay = if round % 2 == 0 {
            window.mul_f64(rng.unit())
        } else {
            while child.try_wait().unwrap().is_none()
                && fs::read_dir(repo.join("gc")).unwrap().next().is_none()
            {
                std::thread::sleep(std::time::Duration::from_micros(200));
            }
            t0.elapsed() + (window.saturating_sub(sweep_start)).mul_f64(rng.unit())
        };
        // The deliberate random kill moment, not a synchronization.
        std::thread::sleep(delay.saturating_sub(t0.elapsed()));
        child.kill().unwrap();
        let out = child.wait_with_output().unwrap();
        let was_killed = out.status.signal() == Some(libc::SIGKILL);
        assert!(
            was_killed || out.status.success(),
            "round {round}: gc failed on its own: {}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        killed += usize::from(was_killed);
        let plans = fs::read_dir(repo.join("gc")).unwrap().count();
        // Readers first: nothing has recovered the repository yet.
        run_ok(
            larder(&repo).args(["check", "--read-data"]),
            &format!("check --read-data after kill {round}"),
        );
        for (id, state) in &remaining {
            assert_restores_identical(&repo, id, &tree, state, &base);
        }
        let out = run_ok(larder(&repo).arg("gc"), "gc after the kill");
        run_ok(larder(&repo).args(["check"]), "check after the second gc");
        assert_eq!(stored_bytes(&repo), reference_size, "round {round}");
        eprintln!(
            "kill {round}: after {:.3} s of {:.3} s (sweep from {:.3} s): {}; {plans} plan(s) left; then: {}",
            delay.as_secs_f64(),
            window.as_secs_f64(),
            sweep_start.as_secs_f64(),
            if was_killed {
                "killed"
            } else {
                "finished first"
            },
            String::from_utf8_lossy(&out.stderr).trim()
        );
        fs::remove_dir_all(&repo).unwrap();
    }
    assert!(
        killed > 0 || kills == 0,
        "no gc was interrupted: the window is too short"
    );
    eprintln!(
        "gc kill test: {kills} kills in {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

fn spawn(cmd: &mut Command) -> Child {
    cmd.stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

#[test]
fn two_backups_and_a_gc_started_together_corrupt_nothing() {
    let rounds = env_count("LARDER_GC_ROUNDS", 3);
    let mut rng = Rng::new(DEFAULT_SEED ^ 0xc0c0);
    let dir = tempfile::tempdir().unwrap();
    let base = fs::canonicalize(dir.path()).unwrap();
    let (repo, states) = (base.join("repo"), base.join("states"));
    let trees = [base.join("tree-a"), base.join("tree-b")];
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
    let mut committed: BTreeMap<String, (PathBuf, PathBuf)> = BTreeMap::new();
    for tree in &trees {
        write_generation(tree, &mut rng, 0, 1);
        let (id, state) = backup(&repo, tree, &states);
        committed.insert(id, (tree.clone(), state));
    }
    let mut refused = 0;
    for round in 0..rounds {
        for tree in &trees {
            write_generation(tree, &mut rng, round + 1, 1);
        }
        run_ok(
            larder(&repo).args(["-q", "forget", "--keep-last", "1"]),
            "forget",
        );
        let wait = round.is_multiple_of(2);
        let with_wait = |mut cmd: Command| {
            if wait {
                cmd.args(["--retry-lock", "60s"]);
            }
            cmd
        };
        let mut children = Vec::new();
        for tree in &trees {
            let mut cmd = with_wait(larder(&repo));
            children.push((Some(tree), spawn(cmd.arg("--json").arg("backup").arg(tree))));
        }
        let mut cmd = with_wait(larder(&repo));
        children.push((None, spawn(cmd.args(["-q", "gc"]))));
        for (tree, child) in children {
            let out = child.wait_with_output().unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr);
            if !out.status.success() {
                assert!(!wait, "round {round}: failed although waiting: {stderr}");
                assert_eq!(out.status.code(), Some(1), "round {round}: {stderr}");
                assert!(stderr.contains("is locked by"), "round {round}: {stderr}");
                refused += 1;
                continue;
            }
            if let Some(tree) = tree {
                let (id, state) = backup_result(&out, tree, &states);
                committed.insert(id, (tree.clone(), state));
            }
        }
        run_ok(
            larder(&repo).args(["check", "--read-data"]),
            "check --read-data",
        );
        let ids = snapshot_ids(&repo);
        committed.retain(|id, _| ids.contains(id));
        assert_eq!(
            committed.len(),
            ids.len(),
            "round {round}: unknown snapshots"
        );
        for (id, (tree, state)) in &committed {
            assert_restores_identical(&repo, id, tree, state, &base);
        }
        assert!(fs::read_dir(repo.join("gc")).unwrap().next().is_none());
    }
    eprintln!("{rounds} rounds; {refused} process(es) refused the lock without waiting");
}
