//! Repositories that can be read but not written (docs/design/format.md, "Locking"):
//! on a read-only mount, or with files a user may only read, every reading command
//! works (the shared lock opens `lock` read-only); `--no-lock` reads where no lock can
//! be taken at all; commands that write refuse `--no-lock`. The mounts need root.

mod support;

use std::fs;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use support::{is_root, pseudo_random, Repo, NOBODY};

/// A repository with two snapshots of `src`, whose file `a` it returns.
fn repo_with_two_snapshots() -> (Repo, PathBuf) {
    let repo = Repo::init(&[]);
    let src = repo.dir("src");
    fs::write(src.join("a"), pseudo_random(1, 200_000)).unwrap();
    repo.backup(&[&src]);
    fs::write(src.join("b"), b"second").unwrap();
    repo.backup(&[&src]);
    (repo, src)
}

/// Runs `larder --repo REPO ARGS` through `adjust`, which may change its user or
/// environment.
fn run_on(
    repo: &Repo,
    path: &Path,
    args: &[&str],
    adjust: &dyn Fn(&mut Command),
) -> support::Output {
    let mut c = support::larder_command(repo.xdg());
    c.arg("--repo").arg(path).args(args);
    adjust(&mut c);
    support::run_command(c, support::RUN_TIMEOUT)
}

/// Every reading command, each of which must exit 0 on `path`; restores go under
/// `targets`.
fn every_reader_works(
    repo: &Repo,
    path: &Path,
    src: &Path,
    targets: &Path,
    extra: &[&str],
    adjust: &dyn Fn(&mut Command),
) {
    let snapshots = {
        let mut args = extra.to_vec();
        args.extend(["--json", "snapshots"]);
        let out = run_on(repo, path, &args, adjust);
        out.expect_ok();
        support::snapshot_list(&out)
            .iter()
            .map(|s| s["id"].as_str().unwrap().to_string())
            .collect::<Vec<_>>()
    };
    assert_eq!(snapshots.len(), 2);
    let a = src.join("a");
    let target = targets.join(format!("restore{}", extra.len()));
    let a = a.to_str().unwrap();
    let t = target.to_str().unwrap();
    for command in [
        vec!["ls", "latest"],
        vec!["cat", "latest", a],
        vec!["restore", "latest", t],
        vec!["check"],
        vec!["check", "--read-data"],
        vec!["diff", &snapshots[0], &snapshots[1]],
        vec!["stats"],
    ] {
        let mut args = extra.to_vec();
        args.extend(command);
        run_on(repo, path, &args, adjust).expect_ok();
    }
    assert_eq!(
        fs::read(support::restored(&target, src).join("a")).unwrap(),
        pseudo_random(1, 200_000)
    );
}

/// A read-only bind mount of a directory, unmounted on drop.
struct ReadOnlyMount(PathBuf);

impl ReadOnlyMount {
    /// Mounts `dir` read-only at `at`; `None` (with the reason printed) where this
    /// machine allows no mount.
    fn new(dir: &Path, at: &Path) -> Option<Self> {
        fs::create_dir_all(at).unwrap();
        let bind = Command::new("mount")
            .arg("--bind")
            .arg(dir)
            .arg(at)
            .status();
        if !bind.is_ok_and(|s| s.success()) {
            eprintln!("skipping: cannot bind-mount here");
            return None;
        }
        let mount = Self(at.to_path_buf());
        let ro = Command::new("mount")
            .args(["-o", "remount,bind,ro"])
            .arg(at)
            .status()
            .unwrap();
        assert!(ro.success(), "remount read-only");
        Some(mount)
    }
}

impl Drop for ReadOnlyMount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

#[test]
fn every_reading_command_works_on_a_read_only_mount() {
    if !is_root() {
        eprintln!("skipping: mounting needs root");
        return;
    }
    let (repo, src) = repo_with_two_snapshots();
    let at = repo.scratch.path().join("ro");
    let Some(_mount) = ReadOnlyMount::new(&repo.path, &at) else {
        return;
    };
    let targets = repo.dir("targets");
    every_reader_works(&repo, &at, &src, &targets, &[], &|_| {});
    every_reader_works(&repo, &at, &src, &targets, &["--no-lock"], &|_| {});
    // A writer fails, saying why; with --no-lock it is refused before it starts.
    let s = src.to_str().unwrap();
    run_on(&repo, &at, &["backup", s], &|_| {})
        .expect_code(1)
        .expect_stderr(&["Read-only file system"]);
    run_on(&repo, &at, &["--no-lock", "backup", s], &|_| {})
        .expect_code(1)
        .expect_stderr(&["--no-lock is only for commands that read"]);
}

#[test]
fn every_reading_command_works_for_a_user_who_may_only_read() {
    if !is_root() {
        eprintln!("skipping: switching users needs root");
        return;
    }
    let (repo, src) = repo_with_two_snapshots();
    // Readable by everyone, writable by its owner (root) only; the scratch space
    // reachable.
    for p in [repo.scratch.path(), &src] {
        fs::set_permissions(p, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    }
    assert!(Command::new("chmod")
        .args(["-R", "go+rX"])
        .arg(&repo.path)
        .status()
        .unwrap()
        .success());
    let home = repo.dir("nobody");
    support::chown_tree(&home, NOBODY, NOBODY);
    let as_nobody = |c: &mut Command| {
        c.uid(NOBODY)
            .gid(NOBODY)
            .env("XDG_CONFIG_HOME", home.join("config"))
            .env("XDG_CACHE_HOME", home.join("cache"));
    };
    let targets = home.join("targets");
    fs::create_dir(&targets).unwrap();
    support::chown_tree(&targets, NOBODY, NOBODY);
    every_reader_works(&repo, &repo.path, &src, &targets, &[], &as_nobody);

    // A lock file it may not even read: a clear error that names --no-lock, which
    // then reads.
    fs::set_permissions(
        repo.path.join("lock"),
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
    run_on(&repo, &repo.path, &["snapshots"], &as_nobody)
        .expect_code(1)
        .expect_stderr(&["lock"]);
    every_reader_works(
        &repo,
        &repo.path,
        &src,
        &targets,
        &["--no-lock"],
        &as_nobody,
    );
}

#[test]
fn writers_refuse_no_lock() {
    let (repo, src) = repo_with_two_snapshots();
    let before = support::files(&repo.path);
    let s = src.to_str().unwrap();
    for command in [
        vec!["backup", s],
        vec!["forget", "latest"],
        vec!["gc"],
        vec!["index", "rebuild"],
        vec!["key", "add"],
        vec!["unlock"],
    ] {
        let mut args = vec!["--no-lock"];
        args.extend(command);
        repo.run(&args)
            .expect_code(1)
            .expect_stderr(&["--no-lock is only for commands that read"]);
    }
    assert!(
        support::files(&repo.path) == before,
        "a refused writer wrote"
    );
    repo.run(["--no-lock", "snapshots"]).expect_ok();
}
