//! A restore run by root into a target that another local user can write, while that
//! user swaps what the restore creates for symlinks as fast as they can: nothing
//! outside the target may be created or changed.
//!
//! - Parent swap: once the restore has created the first directory below the target,
//!   the attacker renames it away and puts a symlink to a directory of theirs in its
//!   place; nothing may appear in their directory.
//! - Metadata through a symlink: the attacker swaps an empty directory of mode 0777,
//!   FIFOs and (as root) device nodes of the snapshot for symlinks to a root-owned 0600
//!   file, before the restore sets their metadata; the file must keep its mode, owner
//!   and content.
//!
//! The attacker is a separate process: this test binary again, running only
//! `race_attacker`, as uid 65534 when the tests run as root and as the same user
//! otherwise (the swaps need no privilege, so the races run without root too, minus
//! the device nodes). Each race runs `LARDER_RACE_ITERATIONS` times (default
//! [`CI_ITERATIONS`]); `scripts/restore-races N` runs N of each with a release build.

mod support;

use std::ffi::{CString, OsString};
use std::fs;
use std::io::{BufRead, BufReader};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Instant;

use support::{chown_tree, is_root, list_tree, snapshot_path, Repo, TreeBuilder, NOBODY};

/// Iterations of each race in the test run. On main before descriptor-relative
/// restore, every iteration of either race wrote or changed something outside the
/// target (docs/design/restore.md, "Against another local user").
const CI_ITERATIONS: usize = 10;

/// Set (to the attack's spec) only in the attacker process.
const ATTACK_ENV: &str = "LARDER_RACE_ATTACK";

fn iterations() -> usize {
    std::env::var("LARDER_RACE_ITERATIONS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(CI_ITERATIONS)
}

/// The user the attacker runs as: `nobody` under root, else this user.
fn attacker_uid() -> u32 {
    if is_root() {
        NOBODY
    } else {
        // SAFETY: getuid has no preconditions.
        unsafe { libc::getuid() }
    }
}

/// What the attacker does, in its environment: a file whose appearance stops it, the
/// symlink target it plants, and the paths it watches, one per line.
struct Attack {
    stop: PathBuf,
    link_to: PathBuf,
    watch: Vec<PathBuf>,
}

impl Attack {
    fn encode(&self) -> OsString {
        let mut s = Vec::new();
        for p in [&self.stop, &self.link_to].into_iter().chain(&self.watch) {
            s.extend_from_slice(p.as_os_str().as_bytes());
            s.push(b'\n');
        }
        OsString::from_vec(s)
    }

    fn decode(raw: &[u8]) -> Self {
        let mut lines = raw
            .split(|&b| b == b'\n')
            .filter(|l| !l.is_empty())
            .map(|l| PathBuf::from(OsString::from_vec(l.to_vec())));
        Self {
            stop: lines.next().expect("stop file"),
            link_to: lines.next().expect("link target"),
            watch: lines.collect(),
        }
    }

    /// Starts the attacker process and waits until it runs.
    fn start(&self) -> Attacker {
        let uid = attacker_uid();
        let mut child = Command::new(std::env::current_exe().expect("test binary"))
            .args([
                "--exact",
                "race_attacker",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(ATTACK_ENV, self.encode())
            .uid(uid)
            .gid(uid)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the attacker");
        let mut lines = BufReader::new(child.stdout.take().expect("attacker stdout")).lines();
        // libtest prints "test race_attacker ... " before the test's own output.
        for line in lines.by_ref() {
            if line.expect("attacker output").ends_with("attacker ready") {
                return Attacker {
                    child,
                    lines,
                    stop: self.stop.clone(),
                };
            }
        }
        let status = child.wait();
        panic!("the attacker ended before it was ready: {status:?}");
    }
}

struct Attacker {
    child: Child,
    lines: std::io::Lines<BufReader<std::process::ChildStdout>>,
    stop: PathBuf,
}

impl Attacker {
    /// Stops the attacker; returns how many swaps it made.
    fn stop(mut self) -> u64 {
        fs::write(&self.stop, b"").expect("write the stop file");
        let mut swaps = None;
        for line in self.lines.by_ref() {
            let line = line.expect("attacker output");
            if let Some((_, n)) = line.split_once("attacker swaps ") {
                swaps = n.split_whitespace().next().and_then(|n| n.parse().ok());
            }
        }
        let status = self.child.wait().expect("wait for the attacker");
        assert!(status.success(), "the attacker failed: {status}");
        swaps.expect("the attacker reported no count")
    }
}

/// The attacker process's entry point (a no-op in an ordinary test run): swaps every
/// watched path that is not a symlink for a symlink to the attack's target, renaming
/// what was there beside it, again and again until the stop file appears.
#[test]
fn race_attacker() {
    let Some(raw) = std::env::var_os(ATTACK_ENV) else {
        return;
    };
    let attack = Attack::decode(raw.as_bytes());
    println!("attacker ready");
    let mut swaps = 0u64;
    while fs::symlink_metadata(&attack.stop).is_err() {
        for w in &attack.watch {
            if fs::symlink_metadata(w).is_ok_and(|m| !m.file_type().is_symlink()) {
                let mut moved = w.as_os_str().to_owned();
                moved.push(format!(".moved{swaps}"));
                if fs::rename(w, &moved).is_ok() {
                    swaps += 1;
                    let _ = std::os::unix::fs::symlink(&attack.link_to, w);
                }
            }
        }
    }
    println!("attacker swaps {swaps}");
}

/// A directory `name` in the scratch space owned by the attacker.
fn attacker_dir(repo: &Repo, name: &str) -> PathBuf {
    let dir = repo.dir(name);
    chown_tree(&dir, attacker_uid(), attacker_uid());
    dir
}

/// Opens the scratch space (tempfile makes it 0700) so the attacker reaches its
/// directories; nothing in it but what a test makes writable is writable to them.
fn open_scratch(repo: &Repo) {
    fs::set_permissions(repo.scratch.path(), fs::Permissions::from_mode(0o755)).unwrap();
}

/// The first component of the snapshot path of `src`: the first directory a restore
/// creates below its target.
fn first_level(src: &Path) -> String {
    snapshot_path(src)
        .split('/')
        .next()
        .expect("a snapshot path")
        .to_string()
}

/// Runs `restore latest TARGET` while `attack` runs; returns the swaps made and the
/// restore's output.
fn restore_under_attack(repo: &Repo, target: &Path, attack: &Attack) -> (u64, support::Output) {
    let attacker = attack.start();
    let out = repo.restore("latest", target, &[]);
    (attacker.stop(), out)
}

#[test]
fn parent_swap_never_writes_outside_the_target() {
    let repo = Repo::init_plain(&[]);
    open_scratch(&repo);
    let src = repo.dir("src");
    let mut tree = TreeBuilder::new(&src);
    for i in 0..3000 {
        tree.file(format!("f{i:04}"), format!("{i}\n"));
    }
    tree.finish();
    repo.backup(&[&src]);
    let first = first_level(&src);
    let (mut swapped, mut escaped) = (0, Vec::new());
    let started = Instant::now();
    for i in 0..iterations() {
        let target = repo.dir(&format!("a{i}/target"));
        fs::set_permissions(&target, fs::Permissions::from_mode(0o777)).unwrap();
        // The attacker's directory holds the directories the restore creates below
        // the first level, to receive what goes into them.
        let theirs = repo.dir(&format!("a{i}/theirs"));
        let below_first = snapshot_path(&src)[first.len() + 1..].to_string();
        fs::create_dir_all(theirs.join(&below_first)).unwrap();
        chown_tree(&theirs, attacker_uid(), attacker_uid());
        let prepared = list_tree(&theirs);
        let control = attacker_dir(&repo, &format!("a{i}/control"));
        let attack = Attack {
            stop: control.join("stop"),
            link_to: theirs.clone(),
            watch: vec![target.join(&first)],
        };
        let (swaps, out) = restore_under_attack(&repo, &target, &attack);
        swapped += usize::from(swaps > 0);
        let written: Vec<PathBuf> = list_tree(&theirs)
            .into_iter()
            .filter(|p| !prepared.contains(p))
            .collect();
        if !written.is_empty() {
            escaped.push(format!(
                "iteration {i}: {} entries outside the target, e.g. {:?} (exit {:?})",
                written.len(),
                written[0],
                out.code
            ));
        }
        // 3,000 files an iteration: a run of 1,000 would leave millions.
        fs::remove_dir_all(repo.scratch.path().join(format!("a{i}"))).unwrap();
    }
    eprintln!(
        "parent swap: {} iterations in {:?}, the attacker swapped in {swapped}, \
         something was written outside the target in {}",
        iterations(),
        started.elapsed(),
        escaped.len()
    );
    assert!(escaped.is_empty(), "{}", escaped.join("\n"));
    assert!(
        swapped > 0,
        "the attacker never swapped: the test tested nothing"
    );
}

fn mknod(path: &Path, mode: u32, dev: libc::dev_t) {
    let c = CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path; not retained.
    let rc = unsafe { libc::mknod(c.as_ptr(), mode, dev) };
    assert_eq!(rc, 0, "mknod: {}", std::io::Error::last_os_error());
}

/// Entries of the metadata race: an empty 0777 directory, FIFOs and, as root, device
/// nodes (like /dev/null), all of mode 0666 or 0777.
const FIFOS: usize = 100;
const DEVICES: usize = 100;

#[test]
fn metadata_is_never_set_through_a_swapped_path() {
    let repo = Repo::init_plain(&[]);
    open_scratch(&repo);
    let src = repo.dir("src");
    fs::create_dir(src.join("e")).unwrap();
    fs::set_permissions(src.join("e"), fs::Permissions::from_mode(0o777)).unwrap();
    let mut names = vec!["e".to_string()];
    for i in 0..FIFOS {
        let name = format!("fifo{i:03}");
        mknod(&src.join(&name), libc::S_IFIFO | 0o666, 0);
        names.push(name);
    }
    if is_root() {
        for i in 0..DEVICES {
            let name = format!("dev{i:03}");
            mknod(&src.join(&name), libc::S_IFCHR | 0o666, libc::makedev(1, 3));
            names.push(name);
        }
    } else {
        eprintln!("not root: the metadata race runs without device nodes");
    }
    repo.backup(&[&src]);
    let victim = repo.scratch.path().join("victim");
    fs::write(&victim, b"secret\n").unwrap();
    fs::set_permissions(&victim, fs::Permissions::from_mode(0o600)).unwrap();
    let before = fs::symlink_metadata(&victim).unwrap();
    let (mut swapped, mut changed) = (0, Vec::new());
    let started = Instant::now();
    for i in 0..iterations() {
        let target = repo.dir(&format!("b{i}/target"));
        // The directory the entries go to is the attacker's already, so they may
        // rename what the restore creates in it.
        let inside = target.join(snapshot_path(&src));
        fs::create_dir_all(&inside).unwrap();
        chown_tree(&target, attacker_uid(), attacker_uid());
        let control = attacker_dir(&repo, &format!("b{i}/control"));
        let attack = Attack {
            stop: control.join("stop"),
            link_to: victim.clone(),
            watch: names.iter().map(|n| inside.join(n)).collect(),
        };
        let (swaps, out) = restore_under_attack(&repo, &target, &attack);
        swapped += usize::from(swaps > 0);
        let after = fs::symlink_metadata(&victim).unwrap();
        let what = (
            after.mode(),
            after.uid(),
            after.gid(),
            fs::read(&victim).unwrap(),
        );
        if what
            != (
                before.mode(),
                before.uid(),
                before.gid(),
                b"secret\n".to_vec(),
            )
        {
            changed.push(format!(
                "iteration {i}: the file outside became mode {:o}, owner {}:{} (exit {:?}, {swaps} swaps)",
                after.mode() & 0o7777,
                after.uid(),
                after.gid(),
                out.code
            ));
            // Put it back for the next iteration.
            fs::set_permissions(&victim, fs::Permissions::from_mode(0o600)).unwrap();
            std::os::unix::fs::lchown(&victim, Some(before.uid()), Some(before.gid())).unwrap();
        }
        fs::remove_dir_all(repo.scratch.path().join(format!("b{i}"))).unwrap();
    }
    eprintln!(
        "metadata swap: {} iterations in {:?}, the attacker swapped in {swapped}, \
         the file outside the target changed in {}",
        iterations(),
        started.elapsed(),
        changed.len()
    );
    assert!(changed.is_empty(), "{}", changed.join("\n"));
    assert!(
        swapped > 0,
        "the attacker never swapped: the test tested nothing"
    );
}
