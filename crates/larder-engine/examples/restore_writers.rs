//! Restore of a many-file tree with different numbers of writer threads, against
//! `cp -a` of the same tree, interleaved so that every variant sees the same machine
//! load (docs/performance.md, "Restore of many-file trees").
//!
//! ```text
//! cargo run --release -p larder-engine --example restore_writers -- \
//!     REPO SCRATCH [--rounds N] [--threads 1,2,4] [--cp SRC]
//! ```
//! Each of N rounds (default 3) restores the newest snapshot of REPO once per thread
//! count (default 1 and one per core), and with `--cp` copies SRC with `cp -a`, in an
//! order that rotates from round to round. Every run writes into a fresh directory
//! under SCRATCH, and everything is `sync`ed before it, outside the timing; the timing
//! covers the restore (or copy) and a `sync` after it, so the data is on disk. The
//! targets are removed only at the end: ext4 does not reuse an inode freed in the last
//! 5 minutes (300 s while its inode table block is dirty, `RECENTCY_DIRTY` in
//! `fs/ext4/ialloc.c`; only without a journal), and skipping tens of thousands of them
//! made creating files after removing the previous target 2 to 3 times slower, in
//! kernel time (`perf`: `recently_deleted` under `ext4_create`). Prints every run's
//! seconds (and how much of it the `sync` took, and the CPU time), then each
//! variant's median.

use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

use larder_engine::{restore, RestoreOptions};
use larder_store::{LockMode, Repository};

fn sync() {
    // SAFETY: sync has no preconditions and cannot fail.
    unsafe { libc::sync() };
}

/// User plus system CPU seconds of this process (`RUSAGE_SELF`, all threads) or of
/// its waited-for children (`RUSAGE_CHILDREN`), so far.
fn cpu_seconds(who: libc::c_int) -> f64 {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage writes a whole `rusage` into the pointer it is given.
    let usage = unsafe {
        libc::getrusage(who, usage.as_mut_ptr());
        usage.assume_init()
    };
    let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    seconds(usage.ru_utime) + seconds(usage.ru_stime)
}

enum Variant {
    Restore(usize),
    Copy(PathBuf),
}

impl Variant {
    fn name(&self) -> String {
        match self {
            Self::Restore(t) => format!("larder restore, {t} writer(s)"),
            Self::Copy(_) => "cp -a".into(),
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: restore_writers REPO SCRATCH [--rounds N] [--threads 1,2,4] [--cp SRC]";
    let (repo_path, scratch) = match (args.first(), args.get(1)) {
        (Some(r), Some(s)) => (PathBuf::from(r), PathBuf::from(s)),
        _ => {
            eprintln!("{usage}");
            std::process::exit(2);
        }
    };
    let mut rounds = 3;
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let mut threads = vec![1, cores];
    let mut variants = Vec::new();
    let mut rest = args[2..].iter();
    while let Some(flag) = rest.next() {
        let value = rest
            .next()
            .unwrap_or_else(|| panic!("{flag} needs a value"));
        match flag.as_str() {
            "--rounds" => rounds = value.parse().expect("--rounds N"),
            "--threads" => {
                threads = value
                    .split(',')
                    .map(|t| t.parse().expect("--threads 1,2,4"))
                    .collect()
            }
            "--cp" => variants.push(Variant::Copy(PathBuf::from(value))),
            _ => panic!("{usage}"),
        }
    }
    variants.splice(0..0, threads.iter().map(|&t| Variant::Restore(t)));
    let repo = Repository::open(&repo_path, LockMode::Shared).expect("open the repository");
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); variants.len()];
    for round in 0..rounds {
        for k in 0..variants.len() {
            let i = (k + round) % variants.len();
            let target = scratch.join(format!("run-{round}-{i}"));
            sync();
            let (cpu_self, cpu_children) = (
                cpu_seconds(libc::RUSAGE_SELF),
                cpu_seconds(libc::RUSAGE_CHILDREN),
            );
            let started = Instant::now();
            match &variants[i] {
                Variant::Restore(t) => {
                    let opts = RestoreOptions {
                        threads: *t,
                        ..RestoreOptions::default()
                    };
                    let summary = restore(&repo, "latest", &target, &opts).expect("restore");
                    assert!(summary.warnings.is_empty(), "{:?}", summary.warnings);
                    eprintln!(
                        "  ({} files, {} dirs, {:.1} MB)",
                        summary.files,
                        summary.dirs,
                        summary.bytes as f64 / 1e6
                    );
                }
                Variant::Copy(src) => {
                    let status = Command::new("cp")
                        .arg("-a")
                        .arg(src)
                        .arg(&target)
                        .status()
                        .expect("run cp");
                    assert!(status.success(), "cp -a failed");
                }
            }
            let written = started.elapsed().as_secs_f64();
            sync();
            let seconds = started.elapsed().as_secs_f64();
            let cpu = cpu_seconds(libc::RUSAGE_SELF) - cpu_self
                + cpu_seconds(libc::RUSAGE_CHILDREN)
                - cpu_children;
            println!(
                "round {round}: {}: {seconds:.3} s (sync {:.3} s), CPU {cpu:.3} s",
                variants[i].name(),
                seconds - written
            );
            times[i].push(seconds);
        }
    }
    for entry in std::fs::read_dir(&scratch).expect("read SCRATCH").flatten() {
        if entry.file_name().to_string_lossy().starts_with("run-") {
            std::fs::remove_dir_all(entry.path()).expect("remove a target");
        }
    }
    for (variant, mut t) in variants.iter().zip(times) {
        t.sort_by(f64::total_cmp);
        let runs: Vec<String> = t.iter().map(|s| format!("{s:.3}")).collect();
        println!(
            "{}: median {:.3} s (runs {})",
            variant.name(),
            t[t.len() / 2],
            runs.join(", ")
        );
    }
}
