//! Two backups into one repository on an SSH server while their clocks disagree: a
//! second backup whose clock runs an hour ahead (a clock shim loaded with
//! `LD_PRELOAD`) starts while the first, on the same host, holds the lock. The first
//! is alive, so the second must not take its lock for stale; whatever the locking
//! scheme, no committed snapshot may be damaged: `check --read-data` passes and every
//! backup that succeeded restores byte-identical (docs/design/remote.md, "Lock
//! objects").

mod support;

#[path = "../../larder-store/tests/support/sshd.rs"]
mod sshd;

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use support::{
    assert_same_tree, larder_command, restored, run_command, Output, Scratch, TreeBuilder,
    RUN_TIMEOUT,
};

/// The shim: `clock_gettime`, `gettimeofday` and `time` of the wall clock, moved by
/// `LARDER_TEST_CLOCK_OFFSET` seconds. It asks the kernel itself (no vDSO, no
/// `dlsym`), and leaves the monotonic clocks alone.
const CLOCK_SHIM: &str = r#"
#define _GNU_SOURCE
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#include <sys/syscall.h>

struct shim_timeval { long sec; long usec; };

static long offset(void) {
    const char *s = getenv("LARDER_TEST_CLOCK_OFFSET");
    return s ? atol(s) : 0;
}

int clock_gettime(clockid_t id, struct timespec *ts) {
    int r = (int)syscall(SYS_clock_gettime, id, ts);
    if (r == 0 && (id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE))
        ts->tv_sec += offset();
    return r;
}

int gettimeofday(struct shim_timeval *tv, void *tz) {
    (void)tz;
    struct timespec ts;
    int r = clock_gettime(CLOCK_REALTIME, &ts);
    if (r == 0 && tv) { tv->sec = ts.tv_sec; tv->usec = ts.tv_nsec / 1000; }
    return r;
}

time_t time(time_t *t) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (t) *t = ts.tv_sec;
    return ts.tv_sec;
}
"#;

/// Compiles the shim into `dir` with `cc`; `None` (the reason printed) where there is
/// no C compiler.
fn build_clock_shim(dir: &Path) -> Option<PathBuf> {
    let source = dir.join("clock_shim.c");
    let library = dir.join("clock_shim.so");
    std::fs::write(&source, CLOCK_SHIM).unwrap();
    let built = Command::new("cc")
        .args(["-shared", "-fPIC", "-O2", "-o"])
        .arg(&library)
        .arg(&source)
        .output();
    match built {
        Err(e) => {
            eprintln!("skipped: no C compiler `cc` to build the clock shim ({e})");
            None
        }
        Ok(out) => {
            assert!(
                out.status.success(),
                "cc failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            Some(library)
        }
    }
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// `larder --repo URL ARGS` for a plaintext repository on `server`, with the wall
/// clock moved by `offset` seconds through `shim`.
fn command(
    server: &sshd::Sshd,
    scratch: &Scratch,
    url: &str,
    clock: Option<(&Path, i64)>,
    args: &[&str],
) -> Command {
    let mut command = larder_command(&scratch.path().join("xdg"));
    command
        .env_remove("LARDER_PASSWORD")
        .env("LARDER_SFTP_ARGS", server.ssh_args().join(" "))
        .env_remove("LARDER_SFTP_COMMAND")
        .arg("--repo")
        .arg(url)
        .args(args.iter().map(OsStr::new));
    if let Some((shim, offset)) = clock {
        command
            .env("LD_PRELOAD", shim)
            .env("LARDER_TEST_CLOCK_OFFSET", offset.to_string());
    }
    command
}

/// The pid that the one lock object in `repo` names (a plaintext repository's lock
/// objects are JSON), once there is one and its holder has stored a container: it has
/// opened the repository and numbered its containers.
fn writing_holder_pid(repo: &Path, within: Duration) -> u32 {
    let started = Instant::now();
    while started.elapsed() < within {
        let stored = std::fs::read_dir(repo.join("containers")).map_or(0, |d| d.count());
        for entry in std::fs::read_dir(repo.join("locks")).into_iter().flatten() {
            let Ok(bytes) = std::fs::read(entry.unwrap().path()) else {
                continue;
            };
            match serde_json::from_slice::<serde_json::Value>(&bytes) {
                Ok(object) if stored > 0 => return object["pid"].as_u64().expect("a pid") as u32,
                _ => {}
            }
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    panic!(
        "no writing lock holder in {} within {within:?}",
        repo.display()
    );
}

/// Resumes a stopped process when dropped, even when the test fails.
struct Stopped(u32);

impl Stopped {
    fn stop(pid: u32) -> Self {
        // SAFETY: kill(2) on the larder child this test started (checked by the caller).
        assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGSTOP) }, 0);
        Self(pid)
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        // SAFETY: as in `stop`.
        unsafe { libc::kill(self.0 as i32, libc::SIGCONT) };
    }
}

#[test]
fn a_second_backup_with_its_clock_an_hour_ahead_damages_nothing() {
    let scratch = Scratch::new();
    let Some(shim) = build_clock_shim(scratch.path()) else {
        return;
    };
    // The shim moves the clock of what it is loaded into.
    let shifted = Command::new("date")
        .arg("+%s")
        .env("LD_PRELOAD", &shim)
        .env("LARDER_TEST_CLOCK_OFFSET", "3600")
        .output()
        .unwrap();
    let shifted: u64 = String::from_utf8_lossy(&shifted.stdout)
        .trim()
        .parse()
        .unwrap();
    assert!(shifted.abs_diff(unix_now() + 3600) < 60, "{shifted}");

    let server = sshd::Sshd::start();
    let url = server.url("repo");
    let run = |clock, args: &[&str]| {
        run_command(command(&server, &scratch, &url, clock, args), RUN_TIMEOUT)
    };
    run(None, &["init", "--encryption", "none"]).expect_ok();

    let first = TreeBuilder::new(&scratch.dir("first"))
        .file("big.bin", support::pseudo_random(1, 48 << 20))
        .file("a.txt", support::pseudo_text(2, 300_000))
        .finish();
    let second = TreeBuilder::new(&scratch.dir("second"))
        .file("big.bin", support::pseudo_random(3, 8 << 20))
        .file("b.txt", support::pseudo_text(4, 300_000))
        .finish();

    // Backup A starts and is stopped once it holds the lock and has stored a
    // container: alive, not refreshing, its lock object's time an hour behind B's
    // clock, its container numbers and next segment name chosen.
    let a_command = command(
        &server,
        &scratch,
        &url,
        None,
        &["--json", "backup", first.to_str().unwrap()],
    );
    let a = std::thread::spawn(move || run_command(a_command, Duration::from_secs(300)));
    let repo = server.dir().join("repo");
    let pid = writing_holder_pid(&repo, Duration::from_secs(60));
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap();
    assert_eq!(
        exe,
        Path::new(support::LARDER),
        "the lock holder is backup A"
    );
    let stopped = Stopped::stop(pid);
    let snapshots = |repo: &Path| match std::fs::read_dir(repo.join("snapshots")) {
        Ok(entries) => entries.count(),
        Err(_) => 0,
    };
    assert_eq!(
        snapshots(&repo),
        0,
        "backup A finished before it was stopped"
    );

    // Backup B, an hour ahead, while A holds the lock.
    let b = run(
        Some((&shim, 3600)),
        &["--json", "backup", second.to_str().unwrap()],
    );
    drop(stopped);
    let a = a.join().unwrap();

    let succeeded: Vec<(&Output, &Path)> = [(&a, first.as_path()), (&b, second.as_path())]
        .into_iter()
        .filter(|(out, _)| out.code == Some(0))
        .collect();
    assert!(!succeeded.is_empty(), "neither backup succeeded\n{a}\n{b}");
    // Today's lock: B waits for A and gives up, naming it; A goes on undisturbed.
    if b.code != Some(0) {
        b.expect_stderr(&["locked by pid"]);
    }
    let checked = run(None, &["--json", "check", "--read-data"]);
    assert_eq!(checked.code, Some(0), "damaged\n{checked}\nA: {a}\nB: {b}");
    assert_eq!(snapshots(&repo), succeeded.len(), "{a}\n{b}");
    for (i, (out, source)) in succeeded.into_iter().enumerate() {
        let id = out.json()["snapshot"]
            .as_str()
            .unwrap_or_else(|| panic!("no snapshot id\n{out}"))
            .to_string();
        let target = scratch.path().join(format!("restore{i}"));
        run(None, &["restore", &id, target.to_str().unwrap()]).expect_ok();
        assert_same_tree(source, &restored(&target, source));
    }
}

/// A lock object that claims a refresh ten years ahead (a host whose clock is far off,
/// or one forged in a plaintext repository) blocks no backup, and `unlock` removes it
/// as stale; one that claims a refresh 20 minutes ahead is respected.
#[test]
fn a_lock_object_from_the_future_blocks_for_no_longer_than_the_bound() {
    let scratch = Scratch::new();
    let server = sshd::Sshd::start();
    let url = server.url("repo");
    let run =
        |args: &[&str]| run_command(command(&server, &scratch, &url, None, args), RUN_TIMEOUT);
    run(&["init", "--encryption", "none"]).expect_ok();
    let source = TreeBuilder::new(&scratch.dir("source"))
        .file("a.txt", support::pseudo_text(5, 50_000))
        .finish();
    let plant = |name: &str, ahead: u64| {
        let object = serde_json::json!({
            "pid": 4242, "hostname": "clock-ahead", "username": "root",
            "started": unix_now(), "nonce": "00112233445566778899aabbccddeeff",
            "exclusive": true, "refreshed": unix_now() + ahead,
        });
        let locks = server.dir().join("repo/locks");
        std::fs::create_dir_all(&locks).unwrap();
        let path = locks.join(format!("{name}.lock"));
        std::fs::write(path, serde_json::to_vec(&object).unwrap()).unwrap();
    };

    plant("00000000000000f1", 315_000_000);
    run(&["--json", "backup", source.to_str().unwrap()]).expect_ok();
    let unlocked = run(&["unlock"]);
    unlocked.expect_ok();
    assert!(unlocked.stdout.contains("clock-ahead"), "{unlocked}");
    assert!(!server
        .dir()
        .join("repo/locks/00000000000000f1.lock")
        .exists());

    plant("00000000000000f2", 20 * 60);
    run(&["--json", "backup", source.to_str().unwrap()])
        .expect_code(1)
        .expect_stderr(&["clock-ahead"]);
}
