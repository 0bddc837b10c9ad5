//! Comparing two snapshots' trees: what was added, removed or modified, and how many
//! bytes of file content only one of them references.
//!
//! Entries are matched by path. Any tree the decoder accepts is handled: where a
//! damaged or crafted tree repeats a path, the first entry with that path is compared
//! and the others are counted in [`TreeDiff::duplicate_paths`].

use std::cmp::Ordering;
use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, HashSet};

use larder_hash::Fingerprint;
use larder_index::ChunkLocation;
use larder_store::{EntryKind, Repository, TreeEntry};

use crate::browse::SnapshotTree;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeKind {
    Added,
    Removed,
    Modified,
}

/// What differs between two entries with the same path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangedField {
    /// File, directory or symlink; when the type differs, nothing else is compared.
    Type,
    /// A file's recipe: its content.
    Content,
    Size,
    /// A symlink's target.
    Target,
    /// Permission and type bits.
    Mode,
    Mtime,
    /// uid or gid.
    Owner,
}

impl ChangedField {
    pub fn name(self) -> &'static str {
        match self {
            Self::Type => "type",
            Self::Content => "content",
            Self::Size => "size",
            Self::Target => "target",
            Self::Mode => "mode",
            Self::Mtime => "mtime",
            Self::Owner => "owner",
        }
    }
}

/// One path that differs.
#[derive(Debug, Clone)]
pub struct Change<'a> {
    pub kind: ChangeKind,
    /// The entry in the first snapshot (none if added).
    pub old: Option<&'a TreeEntry>,
    /// The entry in the second snapshot (none if removed).
    pub new: Option<&'a TreeEntry>,
    /// What differs, for a modified entry; empty otherwise.
    pub fields: Vec<ChangedField>,
}

impl Change<'_> {
    /// The path both entries share.
    pub fn path(&self) -> &[u8] {
        self.new.or(self.old).map_or(&[], |e| e.path.as_slice())
    }
}

/// The differences between two trees.
#[derive(Debug, Clone, Default)]
pub struct TreeDiff<'a> {
    /// In tree order: depth-first, names sorted bytewise.
    pub changes: Vec<Change<'a>>,
    pub added: u64,
    pub removed: u64,
    pub modified: u64,
    /// Stored bytes of the distinct chunks that files of the second snapshot use and
    /// files of the first do not: the data it added. A compression unit holding any
    /// of them counts once, whole.
    pub bytes_added: u64,
    /// The same, the other way round: data only the first snapshot's files use.
    pub bytes_removed: u64,
    /// Chunks counted above whose length the index does not know (a damaged
    /// repository); they add nothing to the byte counts.
    pub unknown_chunks: u64,
    /// Entries left out of the comparison because an earlier entry of the same tree
    /// has the same path (only in damaged or crafted trees).
    pub duplicate_paths: u64,
}

/// Compares `old` with `new` in `repo`, whose index gives where chunks are stored.
pub fn diff_snapshots<'a>(
    repo: &Repository,
    old: &'a SnapshotTree,
    new: &'a SnapshotTree,
) -> TreeDiff<'a> {
    let index = repo.index();
    // A length the index cannot give (a disk index I/O error) is shown as unknown,
    // as for a chunk missing from the index.
    diff_trees(&old.entries, &new.entries, |fp| {
        index.get(fp).ok().flatten()
    })
}

/// Compares two trees; `chunk_place` gives where a chunk is stored, if known (the
/// members of a compression unit share their unit's place).
pub fn diff_trees<'a>(
    old: &'a [TreeEntry],
    new: &'a [TreeEntry],
    chunk_place: impl Fn(&Fingerprint) -> Option<ChunkLocation>,
) -> TreeDiff<'a> {
    let mut diff = TreeDiff::default();
    let old_by_path = by_path(old, &mut diff.duplicate_paths);
    let new_by_path = by_path(new, &mut diff.duplicate_paths);
    let mut old_iter = old_by_path.into_iter().peekable();
    let mut new_iter = new_by_path.into_iter().peekable();
    loop {
        let order = match (old_iter.peek(), new_iter.peek()) {
            (None, None) => break,
            (Some(_), None) => Ordering::Less,
            (None, Some(_)) => Ordering::Greater,
            (Some((o, _)), Some((n, _))) => o.cmp(n),
        };
        let (old_entry, new_entry) = match order {
            Ordering::Less => (old_iter.next().map(|(_, e)| e), None),
            Ordering::Greater => (None, new_iter.next().map(|(_, e)| e)),
            Ordering::Equal => (
                old_iter.next().map(|(_, e)| e),
                new_iter.next().map(|(_, e)| e),
            ),
        };
        let change = match (old_entry, new_entry) {
            (Some(o), Some(n)) => {
                let fields = changed_fields(o, n);
                if fields.is_empty() {
                    continue;
                }
                diff.modified += 1;
                Change {
                    kind: ChangeKind::Modified,
                    old: Some(o),
                    new: Some(n),
                    fields,
                }
            }
            (Some(o), None) => {
                diff.removed += 1;
                Change {
                    kind: ChangeKind::Removed,
                    old: Some(o),
                    new: None,
                    fields: Vec::new(),
                }
            }
            (None, Some(n)) => {
                diff.added += 1;
                Change {
                    kind: ChangeKind::Added,
                    old: None,
                    new: Some(n),
                    fields: Vec::new(),
                }
            }
            // Each arm above takes at least one entry.
            (None, None) => break,
        };
        diff.changes.push(change);
    }

    let old_chunks = file_chunks(old);
    let new_chunks = file_chunks(new);
    for (only_in, counter) in [
        (new_chunks.difference(&old_chunks), &mut diff.bytes_added),
        (old_chunks.difference(&new_chunks), &mut diff.bytes_removed),
    ] {
        let mut places = HashSet::new();
        for fp in only_in {
            match chunk_place(fp) {
                Some(loc) if places.insert((loc.container, loc.offset)) => {
                    *counter = counter.saturating_add(u64::from(loc.length));
                }
                Some(_) => {}
                None => diff.unknown_chunks += 1,
            }
        }
    }
    diff
}

/// A path ordered as a tree stream orders it: component by component, bytewise.
#[derive(Debug, PartialEq, Eq)]
struct TreeOrder<'a>(&'a [u8]);

impl Ord for TreeOrder<'_> {
    fn cmp(&self, other: &Self) -> Ordering {
        let is_slash = |b: &u8| *b == b'/';
        self.0.split(is_slash).cmp(other.0.split(is_slash))
    }
}

impl PartialOrd for TreeOrder<'_> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// The first entry of each path; later ones are counted in `duplicates`.
fn by_path<'a>(
    entries: &'a [TreeEntry],
    duplicates: &mut u64,
) -> BTreeMap<TreeOrder<'a>, &'a TreeEntry> {
    let mut map = BTreeMap::new();
    for entry in entries {
        match map.entry(TreeOrder(&entry.path)) {
            Entry::Occupied(_) => *duplicates += 1,
            Entry::Vacant(slot) => {
                slot.insert(entry);
            }
        }
    }
    map
}

fn file_chunks(entries: &[TreeEntry]) -> HashSet<Fingerprint> {
    entries
        .iter()
        .filter(|e| e.kind == EntryKind::File)
        .flat_map(|e| e.chunks.iter().copied())
        .collect()
}

fn changed_fields(old: &TreeEntry, new: &TreeEntry) -> Vec<ChangedField> {
    if old.kind != new.kind {
        return vec![ChangedField::Type];
    }
    let mut fields = Vec::new();
    if old.kind == EntryKind::File && old.chunks != new.chunks {
        fields.push(ChangedField::Content);
    }
    if old.size != new.size {
        fields.push(ChangedField::Size);
    }
    if old.kind == EntryKind::Symlink && old.target != new.target {
        fields.push(ChangedField::Target);
    }
    if old.mode != new.mode {
        fields.push(ChangedField::Mode);
    }
    if (old.mtime_sec, old.mtime_nsec) != (new.mtime_sec, new.mtime_nsec) {
        fields.push(ChangedField::Mtime);
    }
    if (old.uid, old.gid) != (new.uid, new.gid) {
        fields.push(ChangedField::Owner);
    }
    fields
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fp(n: u8) -> Fingerprint {
        Fingerprint([n; 32])
    }

    fn file(path: &str, chunks: &[u8]) -> TreeEntry {
        TreeEntry {
            mode: 0o100644,
            mtime_sec: 1,
            size: 10 * chunks.len() as u64,
            chunks: chunks.iter().map(|&c| fp(c)).collect(),
            ..TreeEntry::new(EntryKind::File, path.as_bytes().to_vec())
        }
    }

    fn dir(path: &str) -> TreeEntry {
        TreeEntry {
            kind: EntryKind::Dir,
            size: 0,
            chunks: Vec::new(),
            mode: 0o40755,
            ..file(path, &[])
        }
    }

    fn summary(diff: &TreeDiff<'_>) -> Vec<String> {
        diff.changes
            .iter()
            .map(|c| {
                let fields: Vec<&str> = c.fields.iter().map(|f| f.name()).collect();
                format!(
                    "{:?} {} {}",
                    c.kind,
                    String::from_utf8_lossy(c.path()),
                    fields.join(",")
                )
            })
            .collect()
    }

    /// A chunk stored alone at a place of its own, `length` bytes.
    fn place(fp: &Fingerprint, length: u32) -> ChunkLocation {
        ChunkLocation {
            container: 1,
            offset: u32::from(fp.0[0]) * 100,
            length,
        }
    }

    #[test]
    fn a_unit_counts_once_whatever_its_members() {
        let old = vec![file("f", &[1])];
        let new = vec![file("f", &[2, 3, 4])];
        // Chunks 2 and 3 share a unit of 50 bytes; 4 is alone.
        let diff = diff_trees(&old, &new, |f| {
            Some(match f.0[0] {
                2 | 3 => place(&Fingerprint([2; 32]), 50),
                _ => place(f, 9),
            })
        });
        assert_eq!((diff.bytes_added, diff.bytes_removed), (59, 9));
    }

    #[test]
    fn identical_trees_have_no_changes() {
        let tree = vec![dir("a"), file("a/f", &[1, 2])];
        let diff = diff_trees(&tree, &tree, |f| Some(place(f, 10)));
        assert!(diff.changes.is_empty());
        assert_eq!((diff.bytes_added, diff.bytes_removed), (0, 0));
    }

    #[test]
    fn changes_come_in_tree_order_with_what_changed() {
        let old = vec![
            dir("a"),
            file("a/f", &[1, 2]),
            file("a/gone", &[3]),
            file("a-b", &[4]),
        ];
        let mut moved = file("a/f", &[1, 5]);
        moved.mode = 0o100600;
        let new = vec![dir("a"), moved, file("a/new", &[6]), dir("a-b")];
        let diff = diff_trees(&old, &new, |f| (f.0[0] != 6).then(|| place(f, 7)));
        assert_eq!(
            summary(&diff),
            [
                "Modified a/f content,mode",
                "Removed a/gone ",
                "Added a/new ",
                "Modified a-b type",
            ]
        );
        assert_eq!((diff.added, diff.removed, diff.modified), (1, 1, 2));
        // Added: chunk 5 (7 bytes) and chunk 6 (length unknown); removed: 2, 3 and 4.
        assert_eq!(diff.bytes_added, 7);
        assert_eq!(diff.unknown_chunks, 1);
        assert_eq!(diff.bytes_removed, 21);
    }

    #[test]
    fn repeated_paths_compare_the_first_entry() {
        let old = vec![file("f", &[1]), file("f", &[2])];
        let new = vec![file("f", &[1])];
        let diff = diff_trees(&old, &new, |f| Some(place(f, 1)));
        assert!(diff.changes.is_empty());
        assert_eq!(diff.duplicate_paths, 1);
        assert_eq!(
            diff.bytes_removed, 1,
            "chunk 2 is used only by the old tree"
        );
    }
}
