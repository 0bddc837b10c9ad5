//! The commit order of docs/design/format.md ("Commit order (must-list)" and "Locking"),
//! checked on the files a repository leaves behind.
//!
//! `Repository` always runs over its own `LocalBackend`, so these tests cannot wrap the
//! backend to record the order of writes and fsyncs. Instead they stop after each step
//! of the public API sequence a backup uses (write containers with `Backend::write`,
//! `commit`, `save_snapshot`), which is where a killed process leaves the repository,
//! then check what is on disk and what the next `open` makes of it. The order of the
//! fsyncs themselves (rules 1 to 3) is checked by tracing the system calls of a real
//! backup in `crates/larder-engine/tests/commit_order.rs`.
//!
//! Dropping a `Repository` stands for a killed process: its `Drop` writes no repository
//! data (it only clears the lock's advisory holder note), and dropping it releases the
//! lock exactly as the kernel does when a process dies.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

use larder_chunk::ChunkerConfig;
use larder_hash::{Fingerprint, HashAlgo};
use larder_index::ChunkLocation;
use larder_store::{
    decode_segment, encode_segment, ContainerBuilder, FileKind, LockMode, ParsedContainer,
    RepoConfig, Repository, SegmentContainer, StoreError,
};
use tempfile::TempDir;

const ALGO: HashAlgo = HashAlgo::Blake3;

fn new_repo() -> (TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("repo");
    Repository::init(&root, &RepoConfig::new(ChunkerConfig::default(), ALGO)).unwrap();
    (dir, root)
}

fn open(root: &Path, mode: LockMode) -> Repository {
    Repository::open(root, mode).unwrap()
}

/// Deterministic pseudo-random bytes.
fn bytes(seed: u64, len: usize) -> Vec<u8> {
    larder_gen::seeded_bytes(seed, len)
}

/// Writes one sealed container of chunks `seeds` (1000 to 3000 bytes each) the way a
/// backup's syncer does, and does not commit it.
fn write_container(repo: &Repository, seeds: std::ops::Range<u64>) -> SegmentContainer {
    let id = repo.allocate_container_id();
    let mut b = ContainerBuilder::new(id, repo.algo(), 1 << 20);
    for s in seeds {
        let data = bytes(s, 1000 + (s as usize * 7919) % 2000);
        b.push(repo.algo().fingerprint(&data), &data);
    }
    let (file, entries) = b.seal();
    repo.backend()
        .write(FileKind::Container, &format!("{id:016x}"), &file)
        .unwrap();
    SegmentContainer { id, entries }
}

fn index_map(repo: &Repository) -> BTreeMap<Fingerprint, ChunkLocation> {
    match repo.index() {
        larder_store::RepoIndex::Memory(index) => index.iter().collect(),
        larder_store::RepoIndex::Disk(_) => panic!("these tests use memory repositories"),
    }
}

fn names_in(root: &Path, dir: &str) -> BTreeSet<String> {
    fs::read_dir(root.join(dir))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect()
}

fn segment_path(root: &Path, name: &str) -> PathBuf {
    root.join("index").join(format!("{name}.idx"))
}

fn container_path(root: &Path, id: u64) -> PathBuf {
    root.join("containers").join(format!("{id:016x}.ctr"))
}

/// Every container any segment on disk names, with the table the segment gives it.
fn named_by_segments(root: &Path) -> BTreeMap<u64, SegmentContainer> {
    let mut named = BTreeMap::new();
    for file in names_in(root, "index") {
        let name = file.strip_suffix(".idx").unwrap();
        let raw = fs::read(segment_path(root, name)).unwrap();
        for c in decode_segment(&raw, name, ALGO).unwrap() {
            named.insert(c.id, c);
        }
    }
    named
}

/// Rule 1 as a property of the files: every container a segment names is in
/// `containers/`, complete, and has exactly the table the segment copied.
fn assert_segments_name_only_durable_containers(root: &Path, step: &str) {
    for (id, c) in named_by_segments(root) {
        let raw = fs::read(container_path(root, id))
            .unwrap_or_else(|e| panic!("{step}: a segment names container {id:016x}: {e}"));
        let parsed = ParsedContainer::parse(raw, id, ALGO)
            .unwrap_or_else(|e| panic!("{step}: named container {id:016x} is damaged: {e}"));
        assert_eq!(parsed.entries, c.entries, "{step}: table of {id:016x}");
        assert!(
            parsed
                .verify_chunks(&larder_store::ChunkCodec::new(
                    larder_store::Compression::None,
                    ALGO
                ))
                .is_empty(),
            "{step}: {id:016x}"
        );
    }
}

fn expected_locations(c: &SegmentContainer) -> Vec<(Fingerprint, ChunkLocation)> {
    c.entries
        .iter()
        .map(|e| {
            let loc = ChunkLocation {
                container: c.id,
                offset: e.offset,
                length: e.stored_len,
            };
            (e.fingerprint, loc)
        })
        .collect()
}

fn assert_indexed(repo: &Repository, c: &SegmentContainer) {
    assert!(repo.indexed_containers().contains(&c.id));
    for (fp, loc) in expected_locations(c) {
        assert_eq!(
            repo.index().get(&fp).unwrap(),
            Some(loc),
            "container {:016x}",
            c.id
        );
    }
}

fn assert_not_indexed(repo: &Repository, c: &SegmentContainer) {
    assert!(!repo.indexed_containers().contains(&c.id));
    for e in &c.entries {
        assert_eq!(repo.index().get(&e.fingerprint).unwrap(), None);
    }
}

/// Rule 1, one step at a time: a process killed after any step of the backup sequence
/// (write containers, commit, save the snapshot) leaves no segment naming a container
/// that is missing, incomplete or different. Catches a `commit` that names containers
/// it was not given, or that forgets the adopted ones, and a killed sequence that
/// loses a committed container from the index.
#[test]
fn rule1_no_step_leaves_a_segment_naming_a_missing_container() {
    let (_dir, root) = new_repo();
    let mut repo = open(&root, LockMode::Exclusive);
    let a = write_container(&repo, 0..40);
    assert_segments_name_only_durable_containers(&root, "after writing A");
    assert!(named_by_segments(&root).is_empty(), "nothing committed yet");
    let b = write_container(&repo, 40..80);
    repo.commit(vec![a.clone(), b.clone()]).unwrap();
    assert_segments_name_only_durable_containers(&root, "after commit");
    let named = named_by_segments(&root);
    assert_eq!(named.keys().copied().collect::<Vec<_>>(), vec![a.id, b.id]);
    assert_eq!(named[&a.id], a);

    // Killed after sealing C, before its commit.
    let c = write_container(&repo, 80..120);
    drop(repo);
    assert_segments_name_only_durable_containers(&root, "killed before commit");
    assert!(!named_by_segments(&root).contains_key(&c.id));

    // The next open finds A and B through the segment and adopts C.
    let mut repo = open(&root, LockMode::Exclusive);
    assert_eq!(repo.report().adopted_containers, vec![c.id]);
    for x in [&a, &b, &c] {
        assert_indexed(&repo, x);
    }
    // Killed again, after sealing D, before committing it with the adopted C.
    let d = write_container(&repo, 120..160);
    repo.commit(vec![d.clone()]).unwrap();
    assert_segments_name_only_durable_containers(&root, "after commit of D");
    let named = named_by_segments(&root);
    assert!(named.contains_key(&c.id), "the adopted container is named");
    assert_eq!(named[&d.id], d);
    drop(repo);

    let repo = open(&root, LockMode::Shared);
    assert!(repo.report().adopted_containers.is_empty());
    for x in [&a, &b, &c, &d] {
        assert_indexed(&repo, x);
    }
}

/// Rule 1: container ids are never reused, even when the process that allocated them
/// was killed with nothing committed. A reused id would let a later container replace
/// (rename over) one a segment already describes.
#[test]
fn rule1_container_ids_are_never_reused_after_a_kill() {
    let (_dir, root) = new_repo();
    let mut repo = open(&root, LockMode::Exclusive);
    let a = write_container(&repo, 0..10);
    repo.commit(vec![a.clone()]).unwrap();
    let b = write_container(&repo, 10..20);
    drop(repo);
    let repo = open(&root, LockMode::Exclusive);
    let next = repo.allocate_container_id();
    assert!(next > a.id && next > b.id, "id {next} reused");
    drop(repo);
    // Even when the unnamed container is damaged and not adopted.
    let mut raw = fs::read(container_path(&root, b.id)).unwrap();
    raw.truncate(raw.len() / 2);
    fs::write(container_path(&root, b.id), raw).unwrap();
    let repo = open(&root, LockMode::Exclusive);
    assert_eq!(repo.report().bad_containers.len(), 1);
    let next = repo.allocate_container_id();
    assert!(next > b.id, "id {next} of a damaged container reused");
}

/// Rule 2, the part the files show: after `commit` returns, a fresh open finds every
/// committed chunk through segments alone (nothing needs adopting), so a snapshot saved
/// after `commit` never depends on adoption. Catches a `commit` that returns before
/// its segment is in `index/`.
#[test]
fn rule2_committed_chunks_are_found_through_segments_before_the_snapshot() {
    let (_dir, root) = new_repo();
    let mut repo = open(&root, LockMode::Exclusive);
    let a = write_container(&repo, 0..30);
    repo.commit(vec![a.clone()]).unwrap();
    // Killed here, between commit and save_snapshot.
    drop(repo);
    let repo = open(&root, LockMode::Shared);
    assert!(repo.report().adopted_containers.is_empty());
    assert_indexed(&repo, &a);
    assert_eq!(repo.segment_count(), 1);
}

/// Rule 5: leftovers in `tmp/` are removed by an exclusive open and left alone by a
/// shared one; and nothing in `tmp/` is ever read as part of the repository, even a
/// complete container or segment. Catches a reader that deletes a live writer's files,
/// and an `open` that lists `tmp/`.
#[test]
fn rule5_tmp_is_cleaned_by_the_exclusive_open_only_and_never_read() {
    let (_dir, root) = new_repo();
    let mut repo = open(&root, LockMode::Exclusive);
    let a = write_container(&repo, 0..20);
    repo.commit(vec![a.clone()]).unwrap();
    let stray = write_container(&repo, 20..40);
    drop(repo);
    // A killed backup's leftovers: a complete container and a complete segment that
    // were never renamed into place, and a half-written file.
    let tmp = root.join("tmp");
    fs::rename(
        container_path(&root, stray.id),
        tmp.join(format!("{:016x}.ctr", stray.id)),
    )
    .unwrap();
    fs::write(
        tmp.join("0000000000000009.idx"),
        encode_segment(ALGO, std::slice::from_ref(&stray)),
    )
    .unwrap();
    fs::write(tmp.join("4242-0.tmp"), b"half a contai").unwrap();
    let leftovers = names_in(&root, "tmp");
    assert_eq!(leftovers.len(), 3);

    let reader = open(&root, LockMode::Shared);
    assert_eq!(reader.report().removed_tmp, 0);
    assert_eq!(
        names_in(&root, "tmp"),
        leftovers,
        "a shared open touched tmp/"
    );
    assert_indexed(&reader, &a);
    assert_not_indexed(&reader, &stray);
    assert!(reader.report().adopted_containers.is_empty());
    assert_eq!(reader.segment_count(), 1);
    drop(reader);

    let writer = open(&root, LockMode::Exclusive);
    assert_eq!(writer.report().removed_tmp, 3);
    assert!(names_in(&root, "tmp").is_empty());
    assert_indexed(&writer, &a);
    assert_not_indexed(&writer, &stray);
}

/// Rule 5 with "Locking": while a writer holds the lock, neither a second writer nor a
/// reader can open the repository, so nobody removes the file the writer is still
/// writing in `tmp/`. Catches cleaning `tmp/` before the lock is taken.
#[test]
fn rule5_a_live_writers_tmp_files_survive_other_opens() {
    let (_dir, root) = new_repo();
    let writer = open(&root, LockMode::Exclusive);
    let in_flight = root.join("tmp").join("1-0.tmp");
    fs::write(&in_flight, b"being written").unwrap();
    for mode in [LockMode::Exclusive, LockMode::Shared] {
        match Repository::open(&root, mode) {
            Err(StoreError::Locked { .. }) => {}
            Err(e) => panic!("{mode:?} open: {e}"),
            Ok(_) => panic!("{mode:?} open succeeded while a writer holds the lock"),
        }
        assert!(
            in_flight.exists(),
            "{mode:?} open removed a live writer's file"
        );
    }
    drop(writer);

    // And a reader keeps a writer out (so the writer cannot clean under it).
    let reader = open(&root, LockMode::Shared);
    let second_reader = open(&root, LockMode::Shared);
    assert!(matches!(
        Repository::open(&root, LockMode::Exclusive),
        Err(StoreError::Locked { .. })
    ));
    assert!(in_flight.exists());
    drop((reader, second_reader));
    let writer = open(&root, LockMode::Exclusive);
    assert_eq!(writer.report().removed_tmp, 1);
    assert!(!in_flight.exists());
}

/// Rule 6: a sealed container no segment names is verified and indexed on the next
/// open, at the locations its table gives; the next commit's segment names it (even
/// a commit with no new containers of its own), after which it is no longer
/// "adopted". A shared open indexes it in memory but writes nothing. Catches an
/// `open` that ignores unnamed containers (their chunks would be written again) and a
/// `commit` that never records them (adopted again on every open, forever).
#[test]
fn rule6_unnamed_container_is_adopted_and_named_by_the_next_commit() {
    let (_dir, root) = new_repo();
    let mut repo = open(&root, LockMode::Exclusive);
    let a = write_container(&repo, 0..25);
    repo.commit(vec![a.clone()]).unwrap();
    let orphan = write_container(&repo, 25..60);
    drop(repo);

    let reader = open(&root, LockMode::Shared);
    assert_eq!(reader.report().adopted_containers, vec![orphan.id]);
    assert!(reader.report().bad_containers.is_empty());
    assert_indexed(&reader, &orphan);
    drop(reader);
    assert_eq!(
        names_in(&root, "index").len(),
        1,
        "a shared open wrote a segment"
    );

    let mut repo = open(&root, LockMode::Exclusive);
    assert_eq!(repo.report().adopted_containers, vec![orphan.id]);
    assert_indexed(&repo, &orphan);
    assert!(repo.allocate_container_id() > orphan.id);
    repo.commit(Vec::new()).unwrap();
    assert_eq!(named_by_segments(&root)[&orphan.id], orphan);
    assert_segments_name_only_durable_containers(&root, "after adopting");
    drop(repo);

    let repo = open(&root, LockMode::Exclusive);
    assert!(repo.report().adopted_containers.is_empty());
    assert_indexed(&repo, &a);
    assert_indexed(&repo, &orphan);
}

/// Rule 6: an unnamed container that fails verification (any flipped byte of its
/// header, table or footer; truncation) is not adopted: none of its chunks is indexed,
/// it is reported in `OpenReport::bad_containers`, no commit names it, and its id is
/// not reused. Catches adopting a container on its file name alone.
#[test]
fn rule6_damaged_unnamed_container_is_reported_not_adopted() {
    let (_dir, root) = new_repo();
    let mut repo = open(&root, LockMode::Exclusive);
    let good = write_container(&repo, 0..10);
    repo.commit(vec![good.clone()]).unwrap();
    let victim = write_container(&repo, 10..30);
    drop(repo);
    let path = container_path(&root, victim.id);
    let pristine = fs::read(&path).unwrap();
    let len = pristine.len();
    let table = victim
        .entries
        .last()
        .map_or(32, |e| (e.offset + e.stored_len) as usize);
    let damages: Vec<(&str, Vec<u8>)> = vec![
        ("flipped magic", flip(&pristine, 0)),
        ("flipped version", flip(&pristine, 8)),
        ("flipped id", flip(&pristine, 16)),
        ("flipped table fingerprint", flip(&pristine, table + 3)),
        ("flipped table offset", flip(&pristine, table + 48 + 32)),
        ("flipped footer", flip(&pristine, len - 56)),
        ("flipped checksum", flip(&pristine, len - 20)),
        ("flipped end magic", flip(&pristine, len - 1)),
        ("truncated by one byte", pristine[..len - 1].to_vec()),
        ("truncated to half", pristine[..len / 2].to_vec()),
        ("empty", Vec::new()),
    ];
    for (what, damaged) in damages {
        fs::write(&path, &damaged).unwrap();
        let mut repo = open(&root, LockMode::Exclusive);
        let report = repo.report().clone();
        assert!(report.adopted_containers.is_empty(), "{what}: adopted");
        assert_eq!(report.bad_containers.len(), 1, "{what}: not reported");
        assert_eq!(report.bad_containers[0].0, victim.id, "{what}");
        assert!(!report.bad_containers[0].1.is_empty(), "{what}: no reason");
        assert_not_indexed(&repo, &victim);
        assert_indexed(&repo, &good);
        assert!(
            repo.allocate_container_id() > victim.id,
            "{what}: id reused"
        );
        let next = write_container(&repo, 1000..1003);
        repo.commit(vec![next.clone()]).unwrap();
        assert!(
            !named_by_segments(&root).contains_key(&victim.id),
            "{what}: a segment names the damaged container"
        );
        // Leave the repository as it was for the next kind of damage.
        drop(repo);
        fs::remove_file(container_path(&root, next.id)).unwrap();
        let mut repo = open(&root, LockMode::Exclusive);
        repo.rebuild_index().unwrap();
    }
}

fn flip(bytes: &[u8], at: usize) -> Vec<u8> {
    let mut out = bytes.to_vec();
    out[at] ^= 0x20;
    out
}

/// Several commits, as several backups make them; returns the containers.
fn committed_repo(root: &Path, commits: u64) -> Vec<SegmentContainer> {
    let mut repo = open(root, LockMode::Exclusive);
    let mut all = Vec::new();
    for i in 0..commits {
        let c1 = write_container(&repo, i * 100..i * 100 + 20);
        let c2 = write_container(&repo, i * 100 + 50..i * 100 + 61);
        repo.commit(vec![c2.clone(), c1.clone()]).unwrap();
        all.extend([c1, c2]);
    }
    all
}

/// Segments: a segment that fails verification is reported, its containers are read
/// directly so the index is still complete, and `rebuild_index` writes one segment
/// giving exactly the index there was before (every fingerprint at the same
/// location) and removes the damaged one. Catches an `open` that fails or loses
/// chunks on a bad segment, and a rebuild that drops or moves entries.
#[test]
fn corrupt_segment_is_reported_and_rebuild_index_restores_the_same_index() {
    let (_dir, root) = new_repo();
    let containers = committed_repo(&root, 4);
    let before = index_map(&open(&root, LockMode::Shared));
    assert_eq!(before.len(), 4 * 31);
    for c in &containers {
        for (fp, loc) in expected_locations(c) {
            assert_eq!(before.get(&fp), Some(&loc));
        }
    }

    let victim = "0000000000000002";
    let path = segment_path(&root, victim);
    let mut raw = fs::read(&path).unwrap();
    let mid = raw.len() / 2;
    raw[mid] ^= 1;
    fs::write(&path, raw).unwrap();

    let reader = open(&root, LockMode::Shared);
    let report = reader.report();
    assert_eq!(report.bad_segments.len(), 1);
    assert_eq!(report.bad_segments[0].0, victim);
    assert_eq!(
        report.adopted_containers,
        vec![containers[2].id, containers[3].id],
        "the bad segment's containers are read directly"
    );
    assert_eq!(index_map(&reader), before);
    drop(reader);

    let mut repo = open(&root, LockMode::Exclusive);
    let bad = repo.rebuild_index().unwrap();
    assert!(bad.is_empty(), "{bad:?}");
    assert_eq!(index_map(&repo), before);
    assert_eq!(repo.segment_count(), 1);
    drop(repo);
    assert_eq!(
        names_in(&root, "index").len(),
        1,
        "old segments left behind"
    );
    assert_segments_name_only_durable_containers(&root, "after rebuild");

    let repo = open(&root, LockMode::Shared);
    assert!(repo.report().bad_segments.is_empty());
    assert!(repo.report().adopted_containers.is_empty());
    assert_eq!(index_map(&repo), before);
}

/// Segments: with every segment gone, `open` adopts every container and
/// `rebuild_index` brings back the same index; a damaged container is left out and
/// reported. Catches a rebuild that depends on the segments it replaces.
#[test]
fn rebuild_index_from_containers_alone() {
    let (_dir, root) = new_repo();
    let containers = committed_repo(&root, 3);
    let before = index_map(&open(&root, LockMode::Shared));
    for name in names_in(&root, "index") {
        fs::remove_file(root.join("index").join(name)).unwrap();
    }
    let lost = &containers[5];
    let lost_path = container_path(&root, lost.id);
    let raw = fs::read(&lost_path).unwrap();
    fs::write(&lost_path, &raw[..raw.len() - 9]).unwrap();

    let mut repo = open(&root, LockMode::Exclusive);
    assert_eq!(repo.report().adopted_containers.len(), containers.len() - 1);
    let bad = repo.rebuild_index().unwrap();
    assert_eq!(bad.iter().map(|b| b.0).collect::<Vec<_>>(), vec![lost.id]);
    let mut expected = before.clone();
    expected.retain(|_, loc| loc.container != lost.id);
    assert_eq!(index_map(&repo), expected);
    drop(repo);
    let repo = open(&root, LockMode::Shared);
    assert!(repo.report().adopted_containers.is_empty());
    assert_eq!(index_map(&repo), expected);
}

/// Segments: once there are more than 32, the next commit merges them into one; the
/// index read back afterwards holds every committed chunk at its place, and no
/// container needs adopting. (`commit` does not add chunks to the in-memory index: the
/// backup's index stage does that, so the index is compared after a fresh open.)
#[test]
fn segment_compaction_keeps_the_index() {
    let (_dir, root) = new_repo();
    let mut repo = open(&root, LockMode::Exclusive);
    let mut containers = Vec::new();
    for i in 0..34 {
        let c = write_container(&repo, i * 10..i * 10 + 3);
        repo.commit(vec![c.clone()]).unwrap();
        containers.push(c);
        assert_segments_name_only_durable_containers(&root, &format!("commit {i}"));
    }
    drop(repo);
    assert!(names_in(&root, "index").len() < 33, "never compacted");
    let repo = open(&root, LockMode::Shared);
    let expected: BTreeMap<_, _> = containers.iter().flat_map(expected_locations).collect();
    assert_eq!(index_map(&repo), expected);
    assert!(repo.report().adopted_containers.is_empty());
}

/// Segments: a damaged segment must not stop later backups from committing. Once the
/// repository has more than 32 segments, `commit` compacts them, and compaction
/// decodes every segment with `?`: the damaged one makes every later `commit` fail
/// after its own segment was written, so no backup can save a snapshot again until
/// someone runs `rebuild-index`.
#[test]
#[ignore = "bug: Repository::compact_segments fails on a damaged segment (decode_segment(..)?), so once there are more than 32 segments and one is damaged every commit, hence every backup, fails"]
fn damaged_segment_does_not_break_compaction() {
    let (_dir, root) = new_repo();
    let mut repo = open(&root, LockMode::Exclusive);
    let first = write_container(&repo, 0..5);
    repo.commit(vec![first.clone()]).unwrap();
    drop(repo);
    let path = segment_path(&root, "0000000000000001");
    let mut raw = fs::read(&path).unwrap();
    raw[30] ^= 1;
    fs::write(&path, raw).unwrap();

    let mut repo = open(&root, LockMode::Exclusive);
    assert_eq!(repo.report().bad_segments.len(), 1);
    for i in 1..40 {
        let c = write_container(&repo, i * 10..i * 10 + 3);
        repo.commit(vec![c])
            .unwrap_or_else(|e| panic!("commit {i} failed: {}", larder_store::error_chain(&e)));
    }
    drop(repo);
    let repo = open(&root, LockMode::Shared);
    assert_indexed(&repo, &first);
}
