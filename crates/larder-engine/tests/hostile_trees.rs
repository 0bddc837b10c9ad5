//! `ls`, `cat` and `diff` handle any tree the decoder accepts: repeated paths, any
//! order, files below files or symlinks, missing parents, sizes and times at their
//! extremes. Nothing panics, and the answers keep their promises.

use std::collections::BTreeSet;

use larder_engine::{
    diff_trees, display_path, escape_name, utc_rfc3339, ChangeKind, EngineError, SnapshotPath,
    SnapshotTree,
};
use larder_hash::Fingerprint;
use larder_index::ChunkLocation;
use larder_store::{EntryKind, Snapshot, SnapshotSummary, TreeEntry, TreeRef};
use proptest::prelude::*;

/// Paths from a tiny alphabet, so that generated trees repeat paths and nest them.
fn tree_path() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(
        prop::sample::select(vec!["a", "b", "c\u{1b}", "d\\e"]),
        1..4,
    )
    .prop_map(|c| c.join("/").into_bytes())
}

fn entry() -> impl Strategy<Value = TreeEntry> {
    (
        prop::sample::select(vec![
            EntryKind::File,
            EntryKind::Dir,
            EntryKind::Symlink,
            EntryKind::Fifo,
            EntryKind::CharDevice,
        ]),
        tree_path(),
        any::<u32>(),
        prop_oneof![Just(i64::MIN), Just(i64::MAX), any::<i64>(), 0..3i64],
        prop_oneof![Just(u32::MAX), 0..3u32],
        prop_oneof![Just(u64::MAX), 0..30u64],
        prop::collection::vec(0..4u8, 0..4),
        prop::collection::vec(any::<u8>(), 0..6),
    )
        .prop_map(
            |(kind, path, mode, mtime_sec, mtime_nsec, size, chunks, target)| TreeEntry {
                mode,
                mtime_sec,
                mtime_nsec,
                uid: mode % 3,
                size,
                chunks: chunks.into_iter().map(|c| Fingerprint([c; 32])).collect(),
                target,
                ..TreeEntry::new(kind, path)
            },
        )
}

fn tree(entries: Vec<TreeEntry>) -> SnapshotTree {
    SnapshotTree {
        id: "f".repeat(64),
        snapshot: Snapshot {
            version: 1,
            time: "2030-01-01T00:00:00Z".into(),
            hostname: "hostile".into(),
            username: "mallory".into(),
            paths: vec!["/".into()],
            tree: TreeRef {
                size: 0,
                chunks: Vec::new(),
            },
            summary: SnapshotSummary::default(),
            partial: false,
            parents: Vec::new(),
            original: None,
            repaired_from: None,
        },
        entries,
    }
}

fn is_tree_ordered(paths: &[&[u8]]) -> bool {
    paths.windows(2).all(|w| {
        let split =
            |p: &[u8]| -> Vec<Vec<u8>> { p.split(|&b| b == b'/').map(<[u8]>::to_vec).collect() };
        split(w[0]) < split(w[1])
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    #[test]
    fn listing_and_naming_keep_their_promises(
        entries in prop::collection::vec(entry(), 0..12),
        query in prop_oneof![tree_path(), Just(Vec::new())],
    ) {
        let tree = tree(entries);
        let path = SnapshotPath::parse(&query).unwrap();
        match tree.list(&path) {
            Ok(found) => {
                for e in &found {
                    prop_assert!(
                        query.is_empty()
                            || e.path == query
                            || e.path.starts_with(&[query.as_slice(), b"/"].concat())
                    );
                }
                prop_assert!(query.is_empty() || !found.is_empty());
            }
            Err(e) => prop_assert!(matches!(e, EngineError::PathNotInSnapshot { .. }), "{e}"),
        }
        let exact = tree.entries.iter().filter(|e| e.path == query).count();
        match tree.entry(&path) {
            Ok(e) => prop_assert!(exact == 1 && e.path == query),
            Err(EngineError::AmbiguousPath { count, .. }) => prop_assert_eq!(count, exact),
            Err(EngineError::PathNotInSnapshot { .. }) => prop_assert_eq!(exact, 0),
            Err(EngineError::NotAFile { .. }) => prop_assert!(query.is_empty()),
            Err(e) => prop_assert!(false, "unexpected error {e}"),
        }
        for e in &tree.entries {
            let shown = display_path(&e.path) + &escape_name(&e.target);
            prop_assert!(!shown.chars().any(char::is_control), "{shown:?}");
            let _ = utc_rfc3339(e.mtime_sec, e.mtime_nsec);
        }
    }

    #[test]
    fn diff_keeps_its_promises(
        old in prop::collection::vec(entry(), 0..12),
        new in prop::collection::vec(entry(), 0..12),
    ) {
        let diff = diff_trees(&old, &new, |fp| (fp.0[0] != 3).then(|| place(fp, u32::MAX)));
        let old_paths: BTreeSet<&[u8]> = old.iter().map(|e| e.path.as_slice()).collect();
        let new_paths: BTreeSet<&[u8]> = new.iter().map(|e| e.path.as_slice()).collect();
        let mut counts = [0u64; 3];
        for c in &diff.changes {
            let (in_old, in_new) = (old_paths.contains(c.path()), new_paths.contains(c.path()));
            match c.kind {
                ChangeKind::Added => {
                    counts[0] += 1;
                    prop_assert!(!in_old && in_new && c.fields.is_empty());
                }
                ChangeKind::Removed => {
                    counts[1] += 1;
                    prop_assert!(in_old && !in_new && c.fields.is_empty());
                }
                ChangeKind::Modified => {
                    counts[2] += 1;
                    prop_assert!(in_old && in_new && !c.fields.is_empty());
                }
            }
        }
        prop_assert_eq!(counts, [diff.added, diff.removed, diff.modified]);
        let changed: Vec<&[u8]> = diff.changes.iter().map(|c| c.path()).collect();
        prop_assert!(is_tree_ordered(&changed), "not in tree order: {changed:?}");
        let duplicates = (old.len() - old_paths.len()) + (new.len() - new_paths.len());
        prop_assert_eq!(diff.duplicate_paths, duplicates as u64);

        let same = diff_trees(&old, &old, |fp| Some(place(fp, 1)));
        prop_assert!(same.changes.is_empty());
        prop_assert_eq!((same.bytes_added, same.bytes_removed), (0, 0));
    }
}

/// Where a diff test stores chunk `fp`: alone, at a place of its own.
fn place(fp: &Fingerprint, length: u32) -> ChunkLocation {
    ChunkLocation {
        container: u64::from_le_bytes(fp.0[..8].try_into().expect("8 bytes")),
        offset: u32::from_le_bytes(fp.0[8..12].try_into().expect("4 bytes")),
        length,
    }
}
