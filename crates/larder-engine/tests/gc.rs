//! Garbage collection (docs/design/gc.md): after `forget`, `gc` keeps every remaining
//! snapshot restorable byte for byte and `check --read-data` clean, reclaims exactly
//! the bytes it reports, repacks by the threshold, and a collection stopped after any
//! of its file operations (as a killed process would be) loses nothing: the next
//! exclusive `open` finishes or rolls it back and leaves no container unindexed.
//!
//! Repositories here use 256 KiB containers, so that a few MiB of data spread over
//! enough containers for every fate (deleted, repacked, kept) to occur.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use larder_chunk::ChunkerConfig;
use larder_engine::{backup, check, forget, gc, mark, restore, DEFAULT_RESTORE_CACHE};
use larder_hash::HashAlgo;
use larder_index::ChunkLocation;
use larder_store::{
    decode_segment, stored_shares, GcOptions, GcReport, LockMode, RepoConfig, Repository,
};

#[path = "support/bytes.rs"]
mod seeded;
use seeded::bytes;

#[path = "support/dirs.rs"]
mod dirs;
use dirs::copy_dir;

#[path = "support/options.rs"]
mod options;
use options::{backup_options, check_options, restore_options};

const CONTAINER_SIZE: usize = 256 << 10;

/// A file's content (or a symlink's target) and permission bits, by relative path.
type TreeImage = BTreeMap<PathBuf, (Vec<u8>, u32)>;

fn image(root: &Path) -> TreeImage {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let meta = fs::symlink_metadata(&path).unwrap();
            let rel = path.strip_prefix(root).unwrap().to_path_buf();
            let mode = meta.permissions().mode() & 0o7777;
            if meta.is_dir() {
                stack.push(path);
                out.insert(rel, (b"<dir>".to_vec(), mode));
            } else if meta.file_type().is_symlink() {
                let target = fs::read_link(&path).unwrap();
                out.insert(rel, (target.into_os_string().into_encoded_bytes(), 0));
            } else {
                out.insert(rel, (fs::read(&path).unwrap(), mode));
            }
        }
    }
    out
}

struct Fixture {
    _dir: tempfile::TempDir,
    base: PathBuf,
    repo: PathBuf,
    src: PathBuf,
    /// Snapshot id and the image of the tree it was taken from, oldest first.
    snapshots: Vec<(String, TreeImage)>,
}

fn init(repo: &Path) {
    let mut config = RepoConfig::new(ChunkerConfig::default(), HashAlgo::Blake3);
    config.container_size = CONTAINER_SIZE;
    Repository::init(repo, &config).unwrap();
}

fn backup_now(f: &mut Fixture) {
    let mut repo = Repository::open(&f.repo, LockMode::Exclusive).unwrap();
    let opts = backup_options(2);
    let summary = backup(&mut repo, std::slice::from_ref(&f.src), &opts).unwrap();
    assert!(!summary.is_partial(), "{:?}", summary.warnings);
    f.snapshots.push((summary.snapshot_id, image(&f.src)));
}

/// Five snapshots of a changing tree: large files replaced, added and removed, small
/// files edited, a symlink; each generation leaves some chunks of the last one dead.
fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let base = fs::canonicalize(dir.path()).unwrap();
    let repo = base.join("repo");
    init(&repo);
    let src = base.join("src");
    fs::create_dir_all(src.join("small")).unwrap();
    let mut f = Fixture {
        _dir: dir,
        base,
        repo,
        src,
        snapshots: Vec::new(),
    };
    for generation in 0..5u64 {
        let src = f.src.clone();
        fs::write(src.join("stable.bin"), bytes(1, 700 << 10)).unwrap();
        fs::write(src.join("replaced.bin"), bytes(100 + generation, 900 << 10)).unwrap();
        if generation % 2 == 0 {
            fs::write(
                src.join("sometimes.bin"),
                bytes(200 + generation, 500 << 10),
            )
            .unwrap();
        } else {
            let _ = fs::remove_file(src.join("sometimes.bin"));
        }
        for i in 0..20u64 {
            let path = src.join("small").join(format!("{i:02}.dat"));
            let seed = if i % 4 == generation % 4 {
                1000 * generation + i
            } else {
                i
            };
            fs::write(&path, bytes(seed, 3000 + i as usize * 1500)).unwrap();
            fs::set_permissions(&path, fs::Permissions::from_mode(0o640)).unwrap();
        }
        let _ = fs::remove_file(src.join("link"));
        std::os::unix::fs::symlink(format!("small/{generation:02}.dat"), src.join("link")).unwrap();
        backup_now(&mut f);
    }
    f
}

fn forget_ids(f: &Fixture, which: &[usize]) {
    let repo = Repository::open(&f.repo, LockMode::Exclusive).unwrap();
    let ids: Vec<String> = which.iter().map(|&i| f.snapshots[i].0.clone()).collect();
    forget(&repo, &ids).unwrap();
}

fn run_gc(root: &Path, opts: &GcOptions) -> GcReport {
    let mut repo = Repository::open(root, LockMode::Exclusive).unwrap();
    gc(&mut repo, opts).unwrap().sweep
}

/// Bytes of the files in `containers/` and `index/`.
fn stored_bytes(root: &Path) -> u64 {
    ["containers", "index"]
        .iter()
        .flat_map(|d| fs::read_dir(root.join(d)).unwrap())
        .map(|e| e.unwrap().metadata().unwrap().len())
        .sum()
}

fn container_ids(root: &Path) -> BTreeSet<u64> {
    fs::read_dir(root.join("containers"))
        .unwrap()
        .map(|e| {
            let name = e.unwrap().file_name().into_string().unwrap();
            u64::from_str_radix(name.strip_suffix(".ctr").unwrap(), 16).unwrap()
        })
        .collect()
}

/// `check --read-data` is clean, and each of `kept` (indexes into `f.snapshots`)
/// restores identical to the tree it was taken from.
fn assert_intact(f: &Fixture, root: &Path, kept: &[usize]) {
    let repo = Repository::open(root, LockMode::Shared).unwrap();
    let report = check(&repo, &check_options(true)).unwrap();
    assert!(report.is_ok(), "{:?}", report.damage);
    assert_eq!(report.snapshots, kept.len());
    for &i in kept {
        let (id, expected) = &f.snapshots[i];
        let target = tempfile::tempdir_in(&f.base).unwrap();
        let opts = restore_options(DEFAULT_RESTORE_CACHE);
        restore(&repo, id, target.path(), &opts).unwrap();
        let restored = target.path().join(f.src.strip_prefix("/").unwrap());
        assert!(
            image(&restored) == *expected,
            "snapshot {i} restores different"
        );
    }
}

#[test]
fn gc_after_forget_keeps_the_rest_restorable_and_reclaims_exactly_what_it_reports() {
    let f = fixture();
    forget_ids(&f, &[0, 2, 3]);
    let predicted = run_gc(
        &f.repo,
        &GcOptions {
            dry_run: true,
            ..GcOptions::default()
        },
    );
    let before = stored_bytes(&f.repo);
    let report = run_gc(&f.repo, &GcOptions::default());
    let after = stored_bytes(&f.repo);
    assert!(report.containers_deleted > 0, "{report:?}");
    assert!(report.containers_repacked > 0, "{report:?}");
    assert_eq!(report.bytes_before, before);
    assert_eq!(report.bytes_after, after);
    assert_eq!(report.bytes_reclaimed, before as i64 - after as i64);
    assert!(report.bytes_reclaimed > 0);
    // The dry run predicted exactly what happened.
    assert_eq!(
        GcReport {
            dry_run: false,
            ..predicted
        },
        report
    );
    assert_intact(&f, &f.repo, &[1, 4]);

    // Nothing is left to collect, and every container on disk is indexed.
    let again = run_gc(&f.repo, &GcOptions::default());
    assert_eq!(
        (
            again.containers_deleted,
            again.containers_repacked,
            again.bytes_reclaimed
        ),
        (0, 0, 0)
    );
    let repo = Repository::open(&f.repo, LockMode::Exclusive).unwrap();
    assert!(repo.report().adopted_containers.is_empty());
    assert_eq!(repo.indexed_containers(), &container_ids(&f.repo));
    assert!(repo.pending_gc_plans().unwrap().is_empty());
}

/// The live fraction of every indexed container, computed here from the segments,
/// the index and the mark, independently of the sweep.
fn live_fractions(root: &Path) -> BTreeMap<u64, (u64, u64)> {
    let repo = Repository::open(root, LockMode::Exclusive).unwrap();
    let (_, live) = mark(&repo).unwrap();
    let mut out = BTreeMap::new();
    for entry in fs::read_dir(root.join("index")).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_stem().unwrap().to_str().unwrap().to_owned();
        for c in decode_segment(&fs::read(&path).unwrap(), &name, repo.algo()).unwrap() {
            // A compression unit's members share its stored bytes by raw length.
            let (mut live_bytes, mut total) = (0, 0);
            for (e, share) in c.entries.iter().zip(stored_shares(&c.entries)) {
                total += share;
                let here = ChunkLocation {
                    container: c.id,
                    offset: e.offset,
                    length: e.stored_len,
                };
                if live.contains(&e.fingerprint)
                    && repo.index().get(&e.fingerprint).unwrap() == Some(here)
                {
                    live_bytes += share;
                }
            }
            out.insert(c.id, (live_bytes, total));
        }
    }
    out
}

#[test]
fn repack_threshold_decides_between_keeping_and_repacking() {
    let f = fixture();
    forget_ids(&f, &[0, 1, 3]);
    let fractions = live_fractions(&f.repo);
    let fate = |t: u64| -> (BTreeSet<u64>, BTreeSet<u64>, BTreeSet<u64>) {
        let mut sets = (BTreeSet::new(), BTreeSet::new(), BTreeSet::new());
        for (&id, &(live, total)) in &fractions {
            if live == 0 {
                sets.0.insert(id);
            } else if live * 100 < t * total {
                sets.1.insert(id);
            } else {
                sets.2.insert(id);
            }
        }
        sets
    };
    let mut distinct = HashSet::new();
    for t in [0u8, 10, 25, 50, 75, 90, 100] {
        let (deleted, repacked, kept) = fate(u64::from(t));
        let opts = GcOptions {
            repack_threshold: t,
            dry_run: true,
            crash_after_ops: None,
        };
        let r = run_gc(&f.repo, &opts);
        assert_eq!(
            (
                r.containers_deleted,
                r.containers_repacked,
                r.containers_kept
            ),
            (deleted.len(), repacked.len(), kept.len()),
            "threshold {t}"
        );
        distinct.insert(repacked.len());
    }
    assert!(
        distinct.len() >= 3,
        "the fixture should spread live fractions"
    );

    // For real at 60%: the expected containers go, the kept ones stay untouched.
    let (deleted, repacked, kept) = fate(60);
    let before = container_ids(&f.repo);
    let r = run_gc(
        &f.repo,
        &GcOptions {
            repack_threshold: 60,
            ..GcOptions::default()
        },
    );
    let after = container_ids(&f.repo);
    assert!(after.is_disjoint(&deleted) && after.is_disjoint(&repacked));
    assert!(kept.is_subset(&after));
    let written: BTreeSet<u64> = after.difference(&before).copied().collect();
    assert_eq!(written.len(), r.containers_written);
    assert_eq!(repacked.is_empty(), written.is_empty());
    assert_intact(&f, &f.repo, &[2, 4]);
}

/// Regression guard for the protocol's order: deleting a container before the
/// segment that drops it is durable, or rolling forward an uncommitted collection,
/// loses live chunks here at some stop.
#[test]
fn a_gc_stopped_after_any_file_operation_loses_nothing() {
    let f = fixture();
    forget_ids(&f, &[0, 2]);
    let reference = f.base.join("reference");
    copy_dir(&f.repo, &reference);
    let complete = run_gc(&reference, &GcOptions::default());
    assert!(complete.containers_repacked > 0 && complete.containers_deleted > 0);

    let mut stops = 0;
    for ops in 0.. {
        let root = f.base.join(format!("stopped-{ops}"));
        copy_dir(&f.repo, &root);
        let stopped = run_gc(
            &root,
            &GcOptions {
                crash_after_ops: Some(ops),
                ..GcOptions::default()
            },
        );
        if !stopped.interrupted {
            break;
        }
        stops += 1;
        // Before any recovery a reader already finds every snapshot whole: no
        // segment names a container whose file is gone.
        {
            let repo = Repository::open(&root, LockMode::Shared).unwrap();
            let opts = check_options(false);
            let report = check(&repo, &opts).unwrap();
            assert!(
                report.is_ok(),
                "stop {ops}, before recovery: {:?}",
                report.damage
            );
        }
        // The next writer recovers: finished or rolled back, never both, and only
        // when a plan was written (after the first operation).
        let repo = Repository::open(&root, LockMode::Exclusive).unwrap();
        let open = repo.report();
        let recovered = open.finished_gc.len() + open.rolled_back_gc.len();
        assert_eq!(
            recovered,
            usize::from(ops > 0),
            "stop after {ops} operations"
        );
        assert!(
            open.adopted_containers.is_empty(),
            "stop {ops}: orphans {:?}",
            open.adopted_containers
        );
        assert_eq!(
            repo.indexed_containers(),
            &container_ids(&root),
            "stop {ops}"
        );
        assert!(repo.pending_gc_plans().unwrap().is_empty());
        drop(repo);
        // Every three stops restore too (each restore takes a while in debug builds);
        // check --read-data every time.
        let kept = if ops % 3 == 0 { vec![1, 3, 4] } else { vec![] };
        if kept.is_empty() {
            let repo = Repository::open(&root, LockMode::Shared).unwrap();
            let opts = check_options(true);
            let report = check(&repo, &opts).unwrap();
            assert!(report.is_ok(), "stop {ops}: {:?}", report.damage);
        } else {
            assert_intact(&f, &root, &kept);
        }
        // A later gc completes to the same repository size as an uninterrupted one.
        let finished = run_gc(&root, &GcOptions::default());
        assert_eq!(
            stored_bytes(&root),
            stored_bytes(&reference),
            "stop {ops}: {finished:?}"
        );
        fs::remove_dir_all(&root).unwrap();
    }
    // Plan, new containers, segment, old segments, deleted containers, plan removal.
    let minimum = 2 + complete.containers_written + 1 + complete.containers_deleted;
    assert!(stops >= minimum, "only {stops} stopping points");
}
