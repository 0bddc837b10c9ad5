//! The disk index wired into the repository (docs/design/format.md, "Disk index"):
//! memory, eager-disk and lazy-disk repositories store the same bytes and restore the
//! same trees; rebuild, convert, catch-up after a lost `held` update, and readers'
//! fallback; an encrypted repository's sealed disk index.

mod support;

use std::fs;
use std::path::{Path, PathBuf};

use serde_json::Value;
use support::*;

/// Small chunks, so that a few MiB make tens of thousands of fingerprints: the lazy
/// index with a 1 MiB budget then holds more than its budget (48 bytes a record).
const CHUNKER: [&str; 6] = ["--min", "256", "--avg", "1KiB", "--max", "8KiB"];

const MODES: [&[&str]; 4] = [
    &["--index", "memory"],
    &["--index", "disk", "--index-lookup", "eager"],
    &["--index", "disk", "--index-lookup", "lazy"],
    &[
        "--index",
        "disk",
        "--index-lookup",
        "lazy",
        "--index-memory",
        "1MiB",
    ],
];

/// A plaintext repository, whose index files these tests compare and damage (an
/// encrypted one's are sealed: see the last test).
fn init(mode: &[&str]) -> Repo {
    let mut args = CHUNKER.to_vec();
    args.extend_from_slice(&["--encryption", "none"]);
    args.extend_from_slice(mode);
    Repo::init(&args)
}

/// Generated generations (larder gen) plus a small tree with exact and partial
/// duplicates, within files and across them, in `dir`.
fn sources(dir: &Path) -> Vec<PathBuf> {
    let gens = dir.join("gens");
    let out = larder(
        dir,
        [
            "gen",
            "--seed",
            "11",
            "--size",
            "3MiB",
            "--generations",
            "3",
            "--clients",
            "2",
            "--out",
            gens.to_str().unwrap(),
        ],
    );
    out.expect_ok();
    let tree = dir.join("tree");
    let block = pseudo_text(5, 96 << 10);
    let mut repeated = Vec::new();
    for i in 0..6 {
        repeated.extend_from_slice(&block);
        repeated.extend_from_slice(&pseudo_random(100 + i, 3000));
    }
    TreeBuilder::new(&tree)
        .file("a/text.txt", pseudo_text(1, 300 << 10))
        .file("a/copy.txt", pseudo_text(1, 300 << 10))
        .file("b/repeated.bin", &repeated)
        .file("b/random.bin", pseudo_random(2, 20 << 20))
        .file("b/empty", b"")
        .file("c/prefix.txt", &pseudo_text(1, 300 << 10)[..123_457])
        .finish();
    let mut out = vec![tree];
    let mut gen_dirs: Vec<PathBuf> = fs::read_dir(&gens)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    gen_dirs.sort();
    out.extend(gen_dirs);
    out
}

/// A backup of data already stored: no new data chunk.
#[track_caller]
fn assert_nothing_new(s: &Value) {
    // Data chunks only: the tree records the sources' parent directories, whose times
    // other tests change (a new tree chunk is not a stored duplicate).
    assert_eq!(s["chunks_new"], s["tree_chunks_new"], "{s}");
}

/// What must be equal across index kinds for one backup: the counts of data, not of
/// trees, which record the sources' ancestors as they were at that moment
/// (`data_chunks`).
fn stored_counts(summary: &Value) -> [u64; 3] {
    let n = |k: &str| {
        summary[k]
            .as_u64()
            .unwrap_or_else(|| panic!("{k}: {summary}"))
    };
    [
        n("chunks") - n("tree_chunks"),
        n("chunks_new") - n("tree_chunks_new"),
        n("bytes_in"),
    ]
}

#[test]
fn every_index_kind_stores_the_same_bytes_and_restores_the_same_trees() {
    let scratch = Scratch::new();
    let sources = sources(scratch.path());
    let repos: Vec<Repo> = MODES.iter().map(|m| init(m)).collect();
    for source in &sources {
        let summaries: Vec<Value> = repos.iter().map(|r| r.backup(&[source])).collect();
        for (s, mode) in summaries.iter().zip(MODES) {
            assert_eq!(
                stored_counts(s),
                stored_counts(&summaries[0]),
                "{mode:?} differs from memory on {}",
                source.display()
            );
            let disk = &s["disk_index"];
            assert_eq!(disk.is_null(), mode[1] == "memory", "{s}");
        }
        // The second copy of the tree (and the generations' repeats) are duplicates
        // that the tiny lazy index resolved through its buffer and the disk.
        let tiny = &summaries[3]["disk_index"];
        if source != &sources[0] {
            assert!(tiny["buffered"].as_u64().unwrap() > 0, "{tiny}");
            assert!(tiny["lookup_ios"].as_u64().unwrap() > 0, "{tiny}");
        }
    }
    // The same data chunks, stored the same way, in the same containers in the same
    // order (the segments name the containers in the order the syncer threads
    // finished, which varies from run to run for any index).
    let memory = data_chunks(&repos[0].path);
    assert!(memory.len() > 3);
    for (repo, mode) in repos.iter().zip(MODES).skip(1) {
        assert!(
            data_chunks(&repo.path) == memory,
            "{mode:?}: the stored data differs"
        );
    }
    // The tiny lazy index holds more than its budget.
    let stats = repos[3].run(["--json", "stats", "--index"]);
    stats.expect_ok();
    let shape = &stats.json()["disk_index"]["shape"];
    let fingerprints = shape["fingerprints"].as_u64().unwrap();
    assert!(fingerprints * 48 > 1 << 20, "{shape}");
    assert!(
        shape["memory_estimate"].as_u64().unwrap() <= 1 << 20,
        "{shape}"
    );
    // Every snapshot restores byte-identical from every repository.
    for (repo, mode) in repos.iter().zip(MODES) {
        let snaps = repo.snapshots();
        assert_eq!(snaps.len(), sources.len());
        for (snap, source) in snaps.iter().zip(&sources) {
            let target = repo.new_path(&format!("restore-{}", &snap["id"].as_str().unwrap()[..8]));
            repo.restore(snap["id"].as_str().unwrap(), &target, &[])
                .expect_ok();
            let diffs = compare_trees(source, &restored(&target, source));
            assert!(diffs.is_empty(), "{mode:?}: {diffs:?}");
        }
        repo.check(true).expect_ok();
    }
}

#[test]
fn rebuild_and_conversion_keep_every_chunk_indexed() {
    let scratch = Scratch::new();
    let sources = sources(scratch.path());
    let repo = init(MODES[3]);
    repo.backup(&[&sources[0], &sources[1]]);
    let again = |repo: &Repo| {
        assert_nothing_new(&repo.backup(&[&sources[0], &sources[1]]));
    };
    repo.run(["index", "rebuild"]).expect_ok();
    again(&repo);
    repo.run(["index", "convert", "--to", "memory"]).expect_ok();
    assert!(!repo.path.join("index/disk").exists());
    again(&repo);
    let stats = repo.run(["--json", "stats"]);
    assert_eq!(stats.json()["index"], "memory");
    repo.run([
        "index",
        "convert",
        "--to",
        "disk",
        "--index-lookup",
        "eager",
    ])
    .expect_ok();
    again(&repo);
    let stats = repo.run(["--json", "stats"]);
    assert_eq!(stats.json()["index"], "disk (eager, 256 MiB)");
    // New data after the conversions is still found once.
    let s = repo.backup(&[&sources[2]]);
    assert!(s["chunks_new"].as_u64().unwrap() > 0);
    assert_nothing_new(&repo.backup(&[&sources[2]]));
    repo.check(true).expect_ok();
}

#[test]
fn a_held_file_behind_the_index_is_caught_up_and_nothing_is_stored_twice() {
    let scratch = Scratch::new();
    let sources = sources(scratch.path());
    let repo = init(MODES[2]);
    repo.backup(&[&sources[0]]);
    let held = repo.path.join("index/disk/held");
    let old = fs::read(&held).unwrap();
    let first = repo.backup(&[&sources[1]]);
    assert!(first["chunks_new"].as_u64().unwrap() > 0);
    // As if the process had died after the index sync, before `held` named the
    // second backup's containers.
    fs::write(&held, &old).unwrap();
    let out = repo.run(["--json", "backup", sources[1].to_str().unwrap()]);
    out.expect_ok()
        .expect_stderr(&["caught up with", "container(s)"]);
    assert_nothing_new(&out.json());
    assert_ne!(fs::read(&held).unwrap(), old);
    repo.check(true).expect_ok();
}

#[test]
fn readers_fall_back_to_memory_and_writers_rebuild_a_damaged_disk_index() {
    let scratch = Scratch::new();
    let sources = sources(scratch.path());
    let repo = init(MODES[2]);
    repo.backup(&[&sources[0], &sources[1]]);
    let held = repo.path.join("index/disk/held");
    fs::write(&held, b"LDXHELD1 damaged").unwrap();
    repo.check(true)
        .expect_ok()
        .expect_stderr(&["disk index is damaged", "memory index"]);
    let target = repo.new_path("restore");
    repo.restore("latest", &target, &[]).expect_ok();
    assert_same_tree(&sources[0], &restored(&target, &sources[0]));
    let out = repo.run([
        "--json",
        "backup",
        sources[0].to_str().unwrap(),
        sources[1].to_str().unwrap(),
    ]);
    out.expect_ok().expect_stderr(&["rebuilt it"]);
    assert_nothing_new(&out.json());
    // Repaired: readers use it again without a warning.
    let out = repo.check(true);
    out.expect_ok();
    assert!(!out.stderr.contains("disk index"), "{out}");
}

/// Acceptance 5, short form: `larder backup` into a lazy disk repository (a 1 MiB
/// budget, so fingerprints wait in the buffer and batches in stage 3) SIGKILLed at
/// three moments of its run; after each kill `check --read-data` passes and the first
/// snapshot restores; after `index rebuild` the backup completes, and the repository
/// holds exactly the chunk bytes of one uninterrupted run: nothing was stored twice.
#[test]
fn a_killed_lazy_backup_leaves_a_repository_that_checks_and_stores_nothing_twice() {
    let scratch = Scratch::new();
    let sources = sources(scratch.path());
    fs::write(
        scratch.path().join("tree/new.bin"),
        pseudo_random(9, 24 << 20),
    )
    .unwrap();
    let first = [sources[0].as_path()];
    let all: Vec<&Path> = sources.iter().map(PathBuf::as_path).collect();
    let reference = init(MODES[0]);
    reference.backup(&first);
    let started = std::time::Instant::now();
    reference.backup(&all);
    let duration = started.elapsed();

    let repo = init(MODES[3]);
    repo.backup(&first);
    let mut killed_mid_backup = 0;
    let containers = |r: &Repo| fs::read_dir(r.path.join("containers")).unwrap().count();
    // One kill as soon as the run has written a container (so that one kill surely
    // leaves containers no segment names, however busy the machine is), then two at
    // moments of the run.
    for fraction in [f64::NAN, 0.3, 0.6] {
        let mut args = vec!["backup".to_string()];
        args.extend(all.iter().map(|p| p.display().to_string()));
        let before = containers(&repo);
        let mut child = repo
            .command(&args)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        if fraction.is_nan() {
            while containers(&repo) == before && child.try_wait().unwrap().is_none() {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        } else {
            std::thread::sleep(duration.mul_f64(fraction));
        }
        let _ = child.kill();
        child.wait().unwrap();
        let check = repo.check(true);
        check.expect_ok();
        killed_mid_backup += usize::from(check.stderr.contains("no index segment names"));
        let target = repo.new_path(&format!("restore-{fraction}"));
        let snaps = repo.snapshots();
        repo.restore(snaps[0]["id"].as_str().unwrap(), &target, &[])
            .expect_ok();
        assert_same_tree(&sources[0], &restored(&target, &sources[0]));
    }
    // At least one kill left containers that no segment names.
    assert!(killed_mid_backup > 0);
    repo.run(["index", "rebuild"]).expect_ok();
    repo.backup(&all);
    repo.check(true).expect_ok();
    let unique = |r: &Repo| {
        let out = r.run(["--json", "stats"]);
        out.expect_ok();
        out.json()["unique_bytes"].as_u64().unwrap()
    };
    assert_eq!(unique(&repo), unique(&reference));
    let snaps = repo.snapshots();
    let last = snaps.last().unwrap()["id"].as_str().unwrap();
    let target = repo.new_path("restore-last");
    repo.restore(last, &target, &[]).expect_ok();
    for source in &sources {
        assert_same_tree(source, &restored(&target, source));
    }
}

/// `init --index disk` in an encrypted repository (the default): its disk index is
/// sealed (docs/design/crypto.md, "Disk index pages"); backups deduplicate through
/// it, `stats --index` reads the last backup's sealed counters, conversions both ways
/// keep every chunk indexed, and every snapshot restores.
#[test]
fn an_encrypted_repository_keeps_a_sealed_disk_index() {
    let scratch = Scratch::new();
    let sources = sources(scratch.path());
    let mut args = CHUNKER.to_vec();
    args.extend_from_slice(MODES[3]);
    let repo = Repo::init(&args);
    // A new table is sparse: its holes take no space.
    let shape = |repo: &Repo| {
        let stats = repo.run(["--json", "stats", "--index"]);
        stats.expect_ok();
        stats.json()["disk_index"]["shape"].clone()
    };
    let empty = shape(&repo);
    let bytes = |key: &str| empty[key].as_u64().unwrap();
    assert!(
        bytes("allocated_bytes") * 100 < bytes("disk_bytes"),
        "{empty}"
    );
    let first = repo.backup(&[&sources[0], &sources[1]]);
    assert!(!first["disk_index"].is_null(), "{first}");
    assert_nothing_new(&repo.backup(&[&sources[0], &sources[1]]));
    let disk = repo.path.join("index/disk");
    let table = fs::read(disk.join("table")).unwrap();
    assert!(table.starts_with(b"LARDERE1"), "the table is not sealed");
    assert!(!disk.join("last-backup.json").exists());
    let stats = repo.run(["--json", "stats", "--index"]);
    stats.expect_ok();
    let stats = stats.json();
    assert_eq!(stats["index"], "disk (lazy, 1 MiB)");
    let index = &stats["disk_index"];
    assert!(
        index["last_backup"]["fingerprints"].as_u64().unwrap() > 0,
        "{index}"
    );
    assert!(index["shape"]["fingerprints"].as_u64().unwrap() > 10_000);
    repo.run(["index", "convert", "--to", "memory"]).expect_ok();
    assert_nothing_new(&repo.backup(&[&sources[0]]));
    repo.run(["index", "convert", "--to", "disk"]).expect_ok();
    assert_nothing_new(&repo.backup(&[&sources[1]]));
    let s = repo.backup(&[&sources[2]]);
    assert!(s["chunks_new"].as_u64().unwrap() > 0);
    assert_nothing_new(&repo.backup(&[&sources[2]]));
    repo.check(true).expect_ok();
    let snaps = repo.snapshots();
    let last = snaps.last().unwrap()["id"].as_str().unwrap().to_string();
    let target = repo.new_path("restore");
    repo.restore(&last, &target, &[]).expect_ok();
    assert_same_tree(&sources[2], &restored(&target, &sources[2]));
}
