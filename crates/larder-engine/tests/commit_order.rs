//! The commit order of docs/design/format.md ("Commit order (must-list)") as a real
//! backup follows it.
//!
//! Rules 1 to 3 are about the order of writes, renames and fsyncs, which the files
//! left on disk cannot show (a `Repository` always runs over its own `LocalBackend`,
//! so no recording backend can be put under it either). So the backup runs in a child
//! process (this test binary, running [`traced_child_backup`]) traced with `ptrace`,
//! and [`check_commit_order`] reads the order of its system calls. The checker itself
//! is shown to reject each kind of misordering on hand-made traces.
//!
//! Rules 4 and 6 are checked with in-process backups; the store-level parts of rules
//! 1, 5 and 6 are in `crates/larder-store/tests/commit_order.rs`.

#![cfg(target_os = "linux")]

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use larder_chunk::ChunkerConfig;
use larder_engine::{
    backup, check, load_tree, restore, BackupOptions, BackupSummary, ChunkReader, Damage,
};
use larder_hash::{Fingerprint, HashAlgo};
use larder_store::{
    decode_segment, ContainerBuilder, EntryKind, FileKind, LockMode, ParsedContainer, RepoConfig,
    Repository,
};

use syscall_trace::{Call, Event};

#[path = "support/bytes.rs"]
mod seeded;
use seeded::bytes;

#[path = "support/options.rs"]
mod options;
use options::{backup_options, check_options, restore_options};

// ---------------------------------------------------------------------------------
// Shared helpers

struct Fixture {
    _dir: tempfile::TempDir,
    /// Canonical, so that paths seen in system calls compare equal.
    base: PathBuf,
    repo: PathBuf,
    src: PathBuf,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let base = fs::canonicalize(dir.path()).unwrap();
    let repo = base.join("repo");
    Repository::init(
        &repo,
        &RepoConfig::new(ChunkerConfig::default(), HashAlgo::Blake3),
    )
    .unwrap();
    let src = base.join("src");
    fs::create_dir(&src).unwrap();
    Fixture {
        _dir: dir,
        base,
        repo,
        src,
    }
}

/// A tree with large and small files, a duplicated file, repeated data inside a file,
/// a symlink, a subdirectory and varied modes: about `mib` MiB.
fn make_tree(root: &Path, seed: u64, mib: usize) {
    let sub = root.join("sub");
    fs::create_dir_all(&sub).unwrap();
    let big = bytes(seed, mib << 19);
    fs::write(root.join("big.bin"), &big).unwrap();
    fs::write(sub.join("big-copy.bin"), &big).unwrap();
    let block = bytes(seed + 1, 300 << 10);
    fs::write(root.join("repeated.bin"), block.repeat(3)).unwrap();
    for i in 0..40u64 {
        let data = bytes(seed * 1000 + i, 500 + (i as usize * 977) % 20_000);
        let path = sub.join(format!("small-{i:02}.dat"));
        fs::write(&path, data).unwrap();
        fs::set_permissions(
            &path,
            fs::Permissions::from_mode(0o600 + (i as u32 % 3) * 0o40),
        )
        .unwrap();
    }
    std::os::unix::fs::symlink("sub/small-00.dat", root.join("link")).unwrap();
}

fn opts() -> BackupOptions {
    backup_options(2)
}

fn run_backup(repo: &Path, src: &Path) -> BackupSummary {
    let mut repo = Repository::open(repo, LockMode::Exclusive).unwrap();
    let summary = backup(&mut repo, &[src.to_path_buf()], &opts()).unwrap();
    assert!(!summary.is_partial(), "{:?}", summary.warnings);
    summary
}

/// Every fingerprint a snapshot uses: its tree stream's and every file's.
fn chunks_of_snapshot(repo: &Repository, id: &str) -> BTreeSet<Fingerprint> {
    let (_, snap) = repo.find_snapshot(id).unwrap();
    let tree_fps = snap.tree.fingerprints().unwrap();
    let mut reader = ChunkReader::new(repo);
    let entries = load_tree(&mut reader, &tree_fps).unwrap();
    let mut all: BTreeSet<Fingerprint> = tree_fps.into_iter().collect();
    for e in entries.iter().filter(|e| e.kind == EntryKind::File) {
        all.extend(e.chunks.iter().copied());
    }
    all
}

/// Fingerprints of every chunk of every container file, with the container holding it.
fn container_contents(repo_root: &Path) -> Vec<(u64, Fingerprint)> {
    let mut out = Vec::new();
    for entry in fs::read_dir(repo_root.join("containers")).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        let id = u64::from_str_radix(name.strip_suffix(".ctr").unwrap(), 16).unwrap();
        let raw = fs::read(repo_root.join("containers").join(&name)).unwrap();
        if let Ok(c) = ParsedContainer::parse(raw, id, HashAlgo::Blake3) {
            out.extend(c.entries.iter().map(|e| (id, e.fingerprint)));
        }
    }
    out
}

/// Rules 2 and 3 as the files show them after a backup returned: a fresh open finds
/// every chunk of every snapshot through segments alone (nothing needs adopting), and
/// `check` passes.
fn assert_snapshots_need_no_adoption(repo_root: &Path) {
    let repo = Repository::open(repo_root, LockMode::Shared).unwrap();
    assert!(repo.report().adopted_containers.is_empty());
    let (snapshots, bad) = repo.snapshots().unwrap();
    assert!(bad.is_empty());
    for (id, _) in &snapshots {
        for fp in chunks_of_snapshot(&repo, id) {
            assert!(
                repo.index().get(&fp).unwrap().is_some(),
                "snapshot {id} uses {fp:?}"
            );
        }
    }
    let report = check(&repo, &check_options(true)).unwrap();
    assert!(report.is_ok(), "{:?}", report.damage);
}

/// Restores snapshot `id` and compares it with `src` entry by entry: type, permission
/// bits, mtime to the nanosecond, content, symlink target.
fn assert_restores_identical(repo_root: &Path, id: &str, src: &Path, target: &Path) {
    let repo = Repository::open(repo_root, LockMode::Shared).unwrap();
    let summary = restore(
        &repo,
        id,
        target,
        &restore_options(larder_engine::DEFAULT_RESTORE_CACHE),
    )
    .unwrap();
    assert!(summary.warnings.is_empty(), "{:?}", summary.warnings);
    let restored = target.join(src.strip_prefix("/").unwrap());
    compare_trees(src, &restored);
}

fn compare_trees(a: &Path, b: &Path) {
    let (ma, mb) = (
        fs::symlink_metadata(a).unwrap(),
        fs::symlink_metadata(b).unwrap_or_else(|e| panic!("{}: {e}", b.display())),
    );
    let what = a.display();
    assert_eq!(ma.file_type(), mb.file_type(), "{what}: type");
    assert_eq!(ma.mode() & 0o7777, mb.mode() & 0o7777, "{what}: mode");
    assert_eq!(
        (ma.mtime(), ma.mtime_nsec()),
        (mb.mtime(), mb.mtime_nsec()),
        "{what}: mtime"
    );
    if ma.file_type().is_symlink() {
        assert_eq!(
            fs::read_link(a).unwrap(),
            fs::read_link(b).unwrap(),
            "{what}"
        );
    } else if ma.is_file() {
        assert!(
            fs::read(a).unwrap() == fs::read(b).unwrap(),
            "{what}: content"
        );
    } else if ma.is_dir() {
        let names = |d: &Path| -> BTreeSet<_> {
            fs::read_dir(d)
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect()
        };
        let (na, nb) = (names(a), names(b));
        assert_eq!(na, nb, "{what}: entries");
        for n in na {
            compare_trees(&a.join(&n), &b.join(&n));
        }
    }
}

/// Writes the chunks of `data`, cut as a backup cuts a file under 1 MiB, into one
/// sealed container that no segment names: what a backup killed after sealing the
/// container and before its commit leaves behind. Returns the container's id.
fn leave_unnamed_container(repo_root: &Path, data: &[u8]) -> (u64, Vec<Fingerprint>) {
    let repo = Repository::open(repo_root, LockMode::Exclusive).unwrap();
    let algo = repo.algo();
    let chunker = repo.config().chunker.build();
    let id = repo.allocate_container_id();
    let mut builder = ContainerBuilder::new(id, algo, data.len() + 4096);
    let mut fps = Vec::new();
    let mut pos = 0;
    for len in chunker.chunk_lengths(data) {
        let fp = algo.fingerprint(&data[pos..pos + len]);
        builder.push(fp, &data[pos..pos + len]);
        fps.push(fp);
        pos += len;
    }
    let (file, _) = builder.seal();
    repo.backend()
        .write(FileKind::Container, &format!("{id:016x}"), &file)
        .unwrap();
    (id, fps)
}

// ---------------------------------------------------------------------------------
// Rules 1, 2 and 3: the order of a real backup's system calls

/// Names the child process reads its scenario from.
const CHILD_ENV: &str = "LARDER_COMMIT_ORDER_CHILD";
/// Opening a path whose name starts with this marks a point of the child's program in
/// the trace (the open fails; nothing is created).
const MARKER: &str = "larder-trace-marker-";

/// The traced child: one backup, then a marker once `backup` has returned success.
#[test]
#[ignore = "the child process of traced_backup_follows_rules_1_to_3, which runs it"]
fn traced_child_backup() {
    let Some(spec) = std::env::var_os(CHILD_ENV) else {
        return;
    };
    let spec = spec.into_string().unwrap();
    let [repo, src, marker] = <[&str; 3]>::try_from(spec.split('\n').collect::<Vec<_>>())
        .expect("repo, src and marker paths");
    let mut repo = Repository::open(Path::new(repo), LockMode::Exclusive).unwrap();
    backup(&mut repo, &[PathBuf::from(src)], &opts()).unwrap();
    let _ = fs::File::open(marker);
}

/// Rules 1, 2 and 3 on a real backup that writes several containers, adopts one left
/// by a killed backup, and deduplicates against an earlier snapshot: every container
/// is fsynced, renamed or linked into place and its directory fsynced before the
/// segment naming it is linked into `index/`; that segment is fsynced and `index/` fsynced before
/// the snapshot is renamed into `snapshots/`; and `snapshots/` is fsynced before
/// `backup` returns. Also: every file outside `tmp/` is created by a rename from
/// `tmp/`, never opened for writing where it lies.
#[test]
fn traced_backup_follows_rules_1_to_3() {
    let f = fixture();
    make_tree(&f.src, 1, 3);
    run_backup(&f.repo, &f.src);
    // A killed backup's container, which this backup adopts and must name durably.
    let (orphan, _) = leave_unnamed_container(&f.repo, &bytes(77, 100_000));
    fs::write(f.src.join("new.bin"), bytes(2, 9 << 20)).unwrap();
    fs::write(f.src.join("sub/small-07.dat"), b"changed").unwrap();

    let marker = f.base.join(format!("{MARKER}backup-returned"));
    let spec = format!(
        "{}\n{}\n{}",
        f.repo.display(),
        f.src.display(),
        marker.display()
    );
    let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "--exact",
        "traced_child_backup",
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ])
    .env(CHILD_ENV, spec);
    let (status, events) = syscall_trace::trace(cmd).unwrap_or_else(|e| {
        panic!("cannot trace a child process with ptrace ({e}); this test needs ptrace")
    });
    assert_eq!(status, Some(0), "the traced backup failed");

    let repo = Repository::open(&f.repo, LockMode::Shared).unwrap();
    assert!(repo.report().adopted_containers.is_empty());
    let (snapshots, _) = repo.snapshots().unwrap();
    assert_eq!(snapshots.len(), 2);
    let used: BTreeSet<u64> = chunks_of_snapshot(&repo, &snapshots[1].0)
        .iter()
        .map(|fp| repo.index().get(fp).unwrap().unwrap().container)
        .collect();
    let named = segments_on_disk(&f.repo);
    if std::env::var_os("LARDER_SHOW_TRACE").is_some() {
        eprintln!("{}", describe(&events, &f.base));
    }
    let stats = check_commit_order(&events, &f.repo, &named, &used, "backup-returned")
        .unwrap_or_else(|e| panic!("{e}\n\ntrace:\n{}", describe(&events, &f.base)));
    assert!(
        stats.containers >= 3,
        "expected several new containers: {stats:?}"
    );
    assert!(named.values().any(|ids| ids.contains(&orphan)));
    assert!(stats.segments >= 1 && stats.snapshots == 1, "{stats:?}");
    drop(repo);
    assert_restores_identical(&f.repo, "latest", &f.src, &f.base.join("restore"));
}

/// The containers each segment file on disk names, by the segment's path.
fn segments_on_disk(repo_root: &Path) -> BTreeMap<PathBuf, Vec<u64>> {
    let mut out = BTreeMap::new();
    for e in fs::read_dir(repo_root.join("index")).unwrap() {
        let path = e.unwrap().path();
        let name = path.file_stem().unwrap().to_str().unwrap().to_owned();
        let ids = decode_segment(&fs::read(&path).unwrap(), &name, HashAlgo::Blake3)
            .unwrap()
            .iter()
            .map(|c| c.id)
            .collect();
        out.insert(path, ids);
    }
    out
}

fn describe(events: &[Event], base: &Path) -> String {
    events
        .iter()
        .filter(|e| {
            matches!(e.call, Call::Marker(_)) || e.call.paths().iter().any(|p| p.starts_with(base))
        })
        .map(|e| format!("{:>6} {:>6}  {:?}", e.entered, e.returned, e.call))
        .collect::<Vec<_>>()
        .join("\n")
}

#[derive(Debug, Default)]
struct TraceStats {
    containers: usize,
    segments: usize,
    snapshots: usize,
}

/// Checks rules 1 to 3 on a trace of one backup of the repository at `root`.
///
/// `named`: the containers each segment file names; `used`: the containers holding the
/// chunks of the snapshot the backup saved; `marker`: the marker the child opened
/// once `backup` returned. "A before B" means A's system call returned before B's was
/// entered.
fn check_commit_order(
    events: &[Event],
    root: &Path,
    named: &BTreeMap<PathBuf, Vec<u64>>,
    used: &BTreeSet<u64>,
    marker: &str,
) -> Result<TraceStats, String> {
    let (tmp, containers, index, snapshots) = (
        root.join("tmp"),
        root.join("containers"),
        root.join("index"),
        root.join("snapshots"),
    );
    let fsynced = |path: &Path, after: u64, before: u64| {
        events.iter().any(|e| {
            matches!(&e.call, Call::Fsync(p) if p == path)
                && e.entered > after
                && e.returned < before
        })
    };
    let renames_into = |dir: &Path| -> Vec<(&Event, &Path, &Path)> {
        events
            .iter()
            .filter_map(|e| match &e.call {
                Call::Rename { from, to } if to.parent() == Some(dir) => Some((e, &**from, &**to)),
                _ => None,
            })
            .collect()
    };
    let container_id = |p: &Path| {
        p.file_stem()
            .and_then(|s| s.to_str())
            .and_then(|s| u64::from_str_radix(s, 16).ok())
    };

    // Files outside tmp/ are complete when they appear: written and fsynced in tmp/,
    // then renamed; never written where they lie.
    for dir in [&containers, &index, &snapshots] {
        for (e, from, to) in renames_into(dir) {
            if !from.starts_with(&tmp) {
                return Err(format!(
                    "{} was renamed from {}, outside tmp/",
                    to.display(),
                    from.display()
                ));
            }
            if !fsynced(from, 0, e.entered) {
                return Err(format!(
                    "{} was renamed into place before its data was fsynced",
                    to.display()
                ));
            }
        }
    }
    for e in events {
        if let Call::OpenForWrite(p) = &e.call {
            if p.starts_with(root) && !p.starts_with(&tmp) && p != &root.join("lock") {
                return Err(format!("{} was opened for writing in place", p.display()));
            }
        }
    }

    let container_renames: BTreeMap<u64, &Event> = renames_into(&containers)
        .into_iter()
        .filter_map(|(e, _, to)| Some((container_id(to)?, e)))
        .collect();
    let segment_renames = renames_into(&index);
    let snapshot_renames = renames_into(&snapshots);
    if container_renames.is_empty() || segment_renames.is_empty() || snapshot_renames.is_empty() {
        return Err(format!(
            "the trace holds {} container, {} segment and {} snapshot renames; expected each",
            container_renames.len(),
            segment_renames.len(),
            snapshot_renames.len()
        ));
    }

    // Rule 1.
    for &(seg, _, seg_path) in &segment_renames {
        let ids = named.get(seg_path).map(Vec::as_slice).unwrap_or_default();
        for id in ids {
            let visible = container_renames.get(id).map_or(0, |r| r.returned);
            if container_renames
                .get(id)
                .is_some_and(|r| r.entered > seg.entered)
            {
                return Err(format!(
                    "rule 1: segment {} names container {id:016x} before it was renamed into containers/",
                    seg_path.display()
                ));
            }
            if !fsynced(&containers, visible, seg.entered) {
                return Err(format!(
                    "rule 1: containers/ was not fsynced between container {id:016x} appearing and segment {} naming it",
                    seg_path.display()
                ));
            }
        }
    }
    for id in container_renames.keys() {
        if !segment_renames
            .iter()
            .any(|(_, _, p)| named.get(*p).is_some_and(|ids| ids.contains(id)))
        {
            return Err(format!(
                "container {id:016x} was written but no segment names it"
            ));
        }
    }

    // Rules 2 and 3.
    let marker = events
        .iter()
        .find(|e| matches!(&e.call, Call::Marker(m) if m.ends_with(marker)))
        .ok_or("the marker for backup's return is missing from the trace")?;
    for &(snap, _, snap_path) in &snapshot_renames {
        for &id in used {
            let naming: Vec<_> = segment_renames
                .iter()
                .filter(|(_, _, p)| named.get(*p).is_some_and(|ids| ids.contains(&id)))
                .collect();
            if !container_renames.contains_key(&id) && naming.is_empty() {
                continue; // named by a segment of an earlier backup
            }
            let durable = naming
                .iter()
                .any(|(seg, _, _)| fsynced(&index, seg.returned, snap.entered));
            if !durable {
                return Err(format!(
                    "rule 2: snapshot {} uses container {id:016x} before a segment naming it was renamed into index/ and index/ fsynced",
                    snap_path.display()
                ));
            }
        }
        if !fsynced(&snapshots, snap.returned, marker.entered) {
            return Err(format!(
                "rule 3: backup returned before snapshots/ was fsynced after {} appeared",
                snap_path.display()
            ));
        }
    }
    Ok(TraceStats {
        containers: container_renames.len(),
        segments: segment_renames.len(),
        snapshots: snapshot_renames.len(),
    })
}

/// A hand-made trace of a correct backup: container 1 and 2 written, containers/
/// fsynced, segment written, index/ fsynced, snapshot written, snapshots/ fsynced,
/// return. Each test below breaks one step and expects the checker to name the rule.
fn good_trace(root: &Path) -> Vec<Call> {
    let tmp = |n: &str| root.join("tmp").join(n);
    let fsync = |p: PathBuf| Call::Fsync(p);
    let rename = |from: PathBuf, to: PathBuf| Call::Rename { from, to };
    vec![
        Call::OpenForWrite(root.join("lock")),
        Call::OpenForWrite(tmp("9-0.tmp")),
        fsync(tmp("9-0.tmp")),
        rename(tmp("9-0.tmp"), root.join("containers/0000000000000001.ctr")),
        Call::OpenForWrite(tmp("9-1.tmp")),
        fsync(tmp("9-1.tmp")),
        rename(tmp("9-1.tmp"), root.join("containers/0000000000000002.ctr")),
        fsync(root.join("containers")),
        Call::OpenForWrite(tmp("9-2.tmp")),
        fsync(tmp("9-2.tmp")),
        rename(tmp("9-2.tmp"), root.join("index/0000000000000001.idx")),
        fsync(root.join("index")),
        Call::OpenForWrite(tmp("9-3.tmp")),
        fsync(tmp("9-3.tmp")),
        rename(tmp("9-3.tmp"), root.join("snapshots/ab.snap")),
        fsync(root.join("snapshots")),
        Call::Marker(format!("{MARKER}done")),
    ]
}

fn run_checker(calls: Vec<Call>, root: &Path) -> Result<TraceStats, String> {
    let events: Vec<Event> = calls
        .into_iter()
        .enumerate()
        .map(|(i, call)| Event {
            call,
            entered: 2 * i as u64 + 1,
            returned: 2 * i as u64 + 2,
        })
        .collect();
    let named = BTreeMap::from([(root.join("index/0000000000000001.idx"), vec![1, 2])]);
    check_commit_order(&events, root, &named, &BTreeSet::from([1, 2]), "done")
}

/// The checker accepts the correct order and rejects each misordering, so the traced
/// test fails if the backup breaks any of rules 1 to 3.
#[test]
fn trace_checker_rejects_every_misordering() {
    let root = Path::new("/r");
    let good = good_trace(root);
    run_checker(good.clone(), root).unwrap();
    let without = |pred: &dyn Fn(&Call) -> bool| -> Vec<Call> {
        good.iter().filter(|c| !pred(c)).cloned().collect()
    };
    let is_fsync_of =
        |dir: &'static str| move |c: &Call| matches!(c, Call::Fsync(p) if p == &root.join(dir));
    let position = |pred: &dyn Fn(&Call) -> bool| good.iter().position(pred).unwrap();
    let moved = |from: usize, to: usize| {
        let mut calls = good.clone();
        let c = calls.remove(from);
        calls.insert(to, c);
        calls
    };
    let is_rename_into = |dir: &'static str| move |c: &Call| matches!(c, Call::Rename { to, .. } if to.parent() == Some(&root.join(dir)));
    let cases: Vec<(&str, Vec<Call>, &str)> = vec![
        (
            "containers/ never fsynced",
            without(&is_fsync_of("containers")),
            "rule 1",
        ),
        (
            "containers/ fsynced after the segment was renamed",
            moved(
                position(&is_fsync_of("containers")),
                position(&is_rename_into("index")),
            ),
            "rule 1",
        ),
        (
            "container renamed after the segment",
            moved(2 + 1, position(&is_rename_into("index"))),
            "rule 1",
        ),
        (
            "index/ never fsynced",
            without(&is_fsync_of("index")),
            "rule 2",
        ),
        (
            "index/ fsynced after the snapshot was renamed",
            moved(
                position(&is_fsync_of("index")),
                position(&is_rename_into("snapshots")),
            ),
            "rule 2",
        ),
        (
            "snapshots/ never fsynced",
            without(&is_fsync_of("snapshots")),
            "rule 3",
        ),
        (
            "returned before snapshots/ fsynced",
            moved(good.len() - 1, good.len() - 2),
            "rule 3",
        ),
        (
            "container renamed before its data was fsynced",
            moved(2, 4),
            "before its data was fsynced",
        ),
        (
            "a segment written in place",
            [
                good.clone(),
                vec![Call::OpenForWrite(root.join("index/0000000000000001.idx"))],
            ]
            .concat(),
            "opened for writing in place",
        ),
    ];
    for (what, calls, expected) in cases {
        match run_checker(calls, root) {
            Ok(_) => panic!("{what}: accepted"),
            Err(e) => assert!(e.contains(expected), "{what}: {e}"),
        }
    }
}

// ---------------------------------------------------------------------------------
// Rule 4: a chunk is written only when the index does not know it

/// Rule 4: duplicates inside one backup (a copied file, repeated blocks) and across
/// backups are written once: no fingerprint is in two containers, the containers hold
/// exactly the bytes the summary calls new, and a backup of an unchanged tree writes
/// no file data (at most new tree-stream chunks, since the parent directories'
/// mtimes are part of the tree). Catches a writer that places a chunk the index
/// already knows, which would leave a second copy that no segment-ordered lookup can
/// reach consistently.
#[test]
fn rule4_each_chunk_is_written_once() {
    let f = fixture();
    make_tree(&f.src, 3, 4);
    let first = run_backup(&f.repo, &f.src);
    assert!(first.chunks_new < first.chunks, "the tree has duplicates");
    let stored = container_contents(&f.repo);
    let unique: BTreeSet<_> = stored.iter().map(|(_, fp)| fp).collect();
    assert_eq!(
        unique.len(),
        stored.len(),
        "a fingerprint is in two containers"
    );
    assert_eq!(stored.len() as u64, first.chunks_new);

    let second = run_backup(&f.repo, &f.src);
    let repo = Repository::open(&f.repo, LockMode::Shared).unwrap();
    let (snapshots, _) = repo.snapshots().unwrap();
    let (_, snap) = &snapshots[1];
    let tree: BTreeSet<Fingerprint> = snap.tree.fingerprints().unwrap().into_iter().collect();
    let before: BTreeSet<_> = stored.iter().map(|(_, fp)| *fp).collect();
    let after = container_contents(&f.repo);
    let new: Vec<_> = after
        .iter()
        .filter(|(_, fp)| !before.contains(fp))
        .collect();
    assert_eq!(new.len() as u64, second.chunks_new);
    assert!(
        new.iter().all(|(_, fp)| tree.contains(fp)),
        "an unchanged tree's second backup wrote file data"
    );
    let unique: BTreeSet<_> = after.iter().map(|(_, fp)| fp).collect();
    assert_eq!(
        unique.len(),
        after.len(),
        "a fingerprint is in two containers"
    );
    drop(repo);
    assert_snapshots_need_no_adoption(&f.repo);
}

// ---------------------------------------------------------------------------------
// Rule 6: containers of a killed backup

/// Rule 6: the chunks of a container a killed backup sealed but never committed are
/// reused by the next backup rather than written again; that backup's segment names
/// the container (so the open after it adopts nothing), and the snapshot restores
/// identical. Catches adoption that indexes the chunks but never records the
/// container, and a backup that ignores adopted chunks.
#[test]
fn rule6_backup_reuses_an_adopted_container() {
    let f = fixture();
    make_tree(&f.src, 5, 2);
    run_backup(&f.repo, &f.src);
    let data = bytes(55, 700 << 10);
    let (orphan, fps) = leave_unnamed_container(&f.repo, &data);
    fs::write(f.src.join("interrupted.bin"), &data).unwrap();
    let before: BTreeSet<u64> = container_contents(&f.repo).iter().map(|c| c.0).collect();

    let mut repo = Repository::open(&f.repo, LockMode::Exclusive).unwrap();
    assert_eq!(repo.report().adopted_containers, vec![orphan]);
    let summary = backup(&mut repo, std::slice::from_ref(&f.src), &opts()).unwrap();
    for fp in &fps {
        assert_eq!(repo.index().get(fp).unwrap().unwrap().container, orphan);
    }
    drop(repo);
    let rewritten: Vec<_> = container_contents(&f.repo)
        .into_iter()
        .filter(|(id, fp)| !before.contains(id) && fps.contains(fp))
        .collect();
    assert!(
        rewritten.is_empty(),
        "adopted chunks written again: {rewritten:?}"
    );
    assert!(
        summary.bytes_new < 100_000,
        "{} new bytes for a tree whose only new file was adopted",
        summary.bytes_new
    );
    let named = segments_on_disk(&f.repo);
    assert!(named.values().any(|ids| ids.contains(&orphan)));
    assert_snapshots_need_no_adoption(&f.repo);
    assert_restores_identical(&f.repo, "latest", &f.src, &f.base.join("restore"));
}

/// Rule 6: a killed backup's container that fails verification is ignored by the
/// next backup, which succeeds and writes those chunks anew; `check` reports the
/// damaged container and nothing else; every snapshot restores identical. Catches a
/// backup that fails on a damaged leftover, or that deduplicates against it (its
/// snapshot would then be unrestorable).
#[test]
fn rule6_backup_succeeds_past_a_damaged_unnamed_container() {
    let f = fixture();
    make_tree(&f.src, 6, 2);
    run_backup(&f.repo, &f.src);
    let data = bytes(66, 700 << 10);
    let (orphan, fps) = leave_unnamed_container(&f.repo, &data);
    let path = f.repo.join("containers").join(format!("{orphan:016x}.ctr"));
    let mut raw = fs::read(&path).unwrap();
    let at = raw.len() - 100; // in the table
    raw[at] ^= 0x10;
    fs::write(&path, raw).unwrap();
    fs::write(f.src.join("interrupted.bin"), &data).unwrap();

    let mut repo = Repository::open(&f.repo, LockMode::Exclusive).unwrap();
    assert!(repo.report().adopted_containers.is_empty());
    assert_eq!(repo.report().bad_containers.len(), 1);
    assert_eq!(repo.report().bad_containers[0].0, orphan);
    let summary = backup(&mut repo, std::slice::from_ref(&f.src), &opts()).unwrap();
    assert!(!summary.is_partial());
    for fp in &fps {
        assert_ne!(repo.index().get(fp).unwrap().unwrap().container, orphan);
    }
    drop(repo);

    let repo = Repository::open(&f.repo, LockMode::Shared).unwrap();
    let report = check(&repo, &check_options(true)).unwrap();
    let hex = format!("{orphan:016x}");
    assert!(
        matches!(report.damage.as_slice(), [Damage::Container { id, .. }] if *id == hex),
        "{:?}",
        report.damage
    );
    drop(repo);
    assert_restores_identical(&f.repo, "latest", &f.src, &f.base.join("restore"));
}

// ---------------------------------------------------------------------------------

/// A minimal `strace`: runs a command under `ptrace` and records, in order, the system
/// calls that make files durable or visible.
mod syscall_trace {
    use std::collections::{HashMap, HashSet};
    use std::ffi::OsString;
    use std::fs::File;
    use std::io;
    use std::os::unix::ffi::OsStringExt;
    use std::os::unix::fs::FileExt;
    use std::os::unix::process::CommandExt;
    use std::path::{Path, PathBuf};
    use std::process::Command;

    #[derive(Debug, Clone, PartialEq, Eq)]
    pub enum Call {
        /// `fsync` or `fdatasync` of the file or directory at this path.
        Fsync(PathBuf),
        /// A rename, or a hard link (create-only writes): either puts a file in place.
        Rename { from: PathBuf, to: PathBuf },
        /// An open with `O_WRONLY`, `O_RDWR`, `O_CREAT` or `O_TRUNC`.
        OpenForWrite(PathBuf),
        /// An open of a path whose file name starts with [`super::MARKER`].
        Marker(String),
    }

    impl Call {
        pub fn paths(&self) -> Vec<&Path> {
            match self {
                Call::Fsync(p) | Call::OpenForWrite(p) => vec![p],
                Call::Rename { from, to } => vec![from, to],
                Call::Marker(_) => Vec::new(),
            }
        }
    }

    /// One completed call. `entered` and `returned` number the moments the call was
    /// entered and returned, in one sequence over all threads.
    #[derive(Debug, Clone)]
    pub struct Event {
        pub call: Call,
        pub entered: u64,
        pub returned: u64,
    }

    /// `struct ptrace_syscall_info` (linux/ptrace.h), with the union as raw words.
    #[repr(C)]
    #[derive(Default)]
    struct SyscallInfo {
        op: u8,
        reserved: u8,
        flags: u16,
        arch: u32,
        instruction_pointer: u64,
        stack_pointer: u64,
        /// entry: nr, args[6]; exit: rval, is_error.
        data: [u64; 8],
    }

    const PTRACE_GET_SYSCALL_INFO: libc::c_uint = 0x420e;
    const OP_ENTRY: u8 = 1;
    const OP_EXIT: u8 = 2;

    fn ptrace(req: libc::c_uint, tid: libc::pid_t, addr: usize, data: usize) -> libc::c_long {
        // SAFETY: every request used here takes an integer or a pointer to memory we
        // own and sized as the kernel expects (`SyscallInfo` for GET_SYSCALL_INFO).
        unsafe {
            libc::ptrace(
                req as _,
                tid,
                addr as *mut libc::c_void,
                data as *mut libc::c_void,
            )
        }
    }

    /// Runs `cmd` to the end under `ptrace`; returns its exit code (`None` if a signal
    /// ended it) and the calls it made, in order. Follows every thread and child.
    pub fn trace(mut cmd: Command) -> io::Result<(Option<i32>, Vec<Event>)> {
        // SAFETY: the closure runs between fork and exec and only makes one system
        // call, which is async-signal-safe.
        unsafe {
            cmd.pre_exec(|| {
                if ptrace(libc::PTRACE_TRACEME as _, 0, 0, 0) == -1 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd.spawn()?;
        let pid = child.id() as libc::pid_t;
        let mut status = 0;
        // The child stops with SIGTRAP once exec has succeeded.
        // SAFETY: waitpid writes one int through a valid pointer.
        if unsafe { libc::waitpid(pid, &mut status, libc::__WALL) } != pid
            || !libc::WIFSTOPPED(status)
        {
            return Err(io::Error::other("the child did not stop at exec"));
        }
        let options = libc::PTRACE_O_TRACESYSGOOD
            | libc::PTRACE_O_TRACECLONE
            | libc::PTRACE_O_TRACEFORK
            | libc::PTRACE_O_TRACEVFORK
            | libc::PTRACE_O_EXITKILL;
        if ptrace(libc::PTRACE_SETOPTIONS as _, pid, 0, options as usize) == -1
            || ptrace(libc::PTRACE_SYSCALL as _, pid, 0, 0) == -1
        {
            return Err(io::Error::last_os_error());
        }

        let mut events = Vec::new();
        let mut known: HashSet<libc::pid_t> = HashSet::from([pid]);
        let mut in_call: HashMap<libc::pid_t, (u64, Option<Call>)> = HashMap::new();
        let mut seq = 0u64;
        let mut exit_code = None;
        loop {
            // SAFETY: as above.
            let tid = unsafe { libc::waitpid(-1, &mut status, libc::__WALL) };
            if tid == -1 {
                let e = io::Error::last_os_error();
                match e.raw_os_error() {
                    Some(libc::ECHILD) => break,
                    Some(libc::EINTR) => continue,
                    _ => return Err(e),
                }
            }
            if libc::WIFEXITED(status) || libc::WIFSIGNALED(status) {
                if tid == pid {
                    exit_code = libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status));
                }
                in_call.remove(&tid);
                continue;
            }
            if !libc::WIFSTOPPED(status) {
                continue;
            }
            let sig = libc::WSTOPSIG(status);
            let mut deliver = 0;
            if sig == libc::SIGTRAP | 0x80 {
                seq += 1;
                let mut info = SyscallInfo::default();
                let size = std::mem::size_of::<SyscallInfo>();
                if ptrace(
                    PTRACE_GET_SYSCALL_INFO,
                    tid,
                    size,
                    &mut info as *mut _ as usize,
                ) > 0
                {
                    match info.op {
                        OP_ENTRY => {
                            let call = decode(tid, info.data[0] as i64, &info.data[1..7]);
                            in_call.insert(tid, (seq, call));
                        }
                        OP_EXIT => {
                            if let Some((entered, Some(call))) = in_call.remove(&tid) {
                                let ok = (info.data[0] as i64) >= 0;
                                if ok || matches!(call, Call::Marker(_)) {
                                    events.push(Event {
                                        call,
                                        entered,
                                        returned: seq,
                                    });
                                }
                            }
                        }
                        _ => {}
                    }
                }
            } else if status >> 16 != 0 {
                // A clone, fork or exec event stop: nothing to deliver.
            } else if sig == libc::SIGSTOP && !known.contains(&tid) {
                // The first stop of a newly traced thread or process.
            } else {
                deliver = sig;
            }
            known.insert(tid);
            // Fails with ESRCH if the thread died meanwhile, which is fine.
            ptrace(libc::PTRACE_SYSCALL as _, tid, 0, deliver as usize);
        }
        drop(child);
        Ok((exit_code, events))
    }

    fn decode(tid: libc::pid_t, nr: i64, a: &[u64]) -> Option<Call> {
        let fd = |x: u64| x as i32;
        let write_flags = libc::O_WRONLY | libc::O_RDWR | libc::O_CREAT | libc::O_TRUNC;
        let open = |dirfd: i32, path: u64, flags: i32| {
            let path = resolve(tid, dirfd, path)?;
            let name = path.file_name()?.to_string_lossy().into_owned();
            if name.starts_with(super::MARKER) {
                Some(Call::Marker(name))
            } else if flags & write_flags != 0 {
                Some(Call::OpenForWrite(path))
            } else {
                None
            }
        };
        match nr {
            libc::SYS_openat => open(fd(a[0]), a[1], a[2] as i32),
            libc::SYS_openat2 => {
                let how = read_memory(tid, a[2], 8)?;
                open(
                    fd(a[0]),
                    a[1],
                    u64::from_le_bytes(how.try_into().ok()?) as i32,
                )
            }
            #[cfg(target_arch = "x86_64")]
            libc::SYS_open => open(libc::AT_FDCWD, a[0], a[1] as i32),
            #[cfg(target_arch = "x86_64")]
            libc::SYS_creat => open(libc::AT_FDCWD, a[0], libc::O_CREAT),
            libc::SYS_fsync | libc::SYS_fdatasync => {
                std::fs::read_link(format!("/proc/{tid}/fd/{}", fd(a[0])))
                    .ok()
                    .map(Call::Fsync)
            }
            libc::SYS_renameat | libc::SYS_renameat2 | libc::SYS_linkat => Some(Call::Rename {
                from: resolve(tid, fd(a[0]), a[1])?,
                to: resolve(tid, fd(a[2]), a[3])?,
            }),
            #[cfg(target_arch = "x86_64")]
            libc::SYS_rename | libc::SYS_link => Some(Call::Rename {
                from: resolve(tid, libc::AT_FDCWD, a[0])?,
                to: resolve(tid, libc::AT_FDCWD, a[1])?,
            }),
            _ => None,
        }
    }

    /// The absolute path a path argument names, relative ones against `dirfd`.
    fn resolve(tid: libc::pid_t, dirfd: i32, addr: u64) -> Option<PathBuf> {
        let path = PathBuf::from(OsString::from_vec(read_c_string(tid, addr)?));
        if path.is_absolute() {
            return Some(path);
        }
        let base = if dirfd == libc::AT_FDCWD {
            std::fs::read_link(format!("/proc/{tid}/cwd"))
        } else {
            std::fs::read_link(format!("/proc/{tid}/fd/{dirfd}"))
        };
        Some(base.ok()?.join(path))
    }

    fn read_memory(tid: libc::pid_t, addr: u64, len: usize) -> Option<Vec<u8>> {
        let mem = File::open(format!("/proc/{tid}/mem")).ok()?;
        let mut buf = vec![0; len];
        mem.read_exact_at(&mut buf, addr).ok()?;
        Some(buf)
    }

    /// A NUL-terminated string of the tracee, read a page at most at a time so that no
    /// read crosses into an unmapped page.
    fn read_c_string(tid: libc::pid_t, mut addr: u64) -> Option<Vec<u8>> {
        let mem = File::open(format!("/proc/{tid}/mem")).ok()?;
        let mut out = Vec::new();
        while out.len() < 1 << 16 {
            let mut buf = vec![0; 4096 - (addr % 4096) as usize];
            let n = mem.read_at(&mut buf, addr).ok()?;
            if n == 0 {
                return None;
            }
            if let Some(end) = buf[..n].iter().position(|&b| b == 0) {
                out.extend_from_slice(&buf[..end]);
                return Some(out);
            }
            out.extend_from_slice(&buf[..n]);
            addr += n as u64;
        }
        None
    }
}
