//! One snapshot's tree as directories, from its flat tree stream, and the inode
//! numbers of the entries of the trees loaded so far (docs/design/mount.md, "Inodes").
//!
//! A tree stream lists paths; a directory's children are the entries whose path is
//! its path, `/` and one more component. Any tree the decoder accepts is handled
//! without panics: an entry whose parent directory is not in the tree is not
//! reachable, and of entries with the same path only the first is.

use std::collections::HashMap;

use larder_store::{EntryKind, TreeEntry};

/// A snapshot's entries and, for each directory, its children by name.
pub struct MountedTree {
    pub entries: Vec<TreeEntry>,
    /// The children of the snapshot's root, ascending by name, unique.
    root: Vec<u32>,
    /// The children of each entry, as `root` (empty for all but directories).
    children: Vec<Vec<u32>>,
}

impl MountedTree {
    pub fn new(entries: Vec<TreeEntry>) -> Self {
        let mut dirs: HashMap<&[u8], u32> = HashMap::new();
        for (i, e) in entries.iter().enumerate() {
            if e.kind == EntryKind::Dir {
                dirs.entry(e.path.as_slice()).or_insert(i as u32);
            }
        }
        let mut root = Vec::new();
        let mut children = vec![Vec::new(); entries.len()];
        for (i, e) in entries.iter().enumerate() {
            let list = match e.path.iter().rposition(|&b| b == b'/') {
                Some(slash) => match dirs.get(&e.path[..slash]) {
                    Some(&dir) => &mut children[dir as usize],
                    None => continue,
                },
                None => &mut root,
            };
            if !matches!(name_of(&e.path), b"" | b"." | b"..") {
                list.push(i as u32);
            }
        }
        for list in std::iter::once(&mut root).chain(children.iter_mut()) {
            // Stable: of equal names, the first in the stream stays.
            list.sort_by(|&a, &b| {
                name_of(&entries[a as usize].path).cmp(name_of(&entries[b as usize].path))
            });
            list.dedup_by(|a, b| entries[*a as usize].path == entries[*b as usize].path);
        }
        Self {
            entries,
            root,
            children,
        }
    }

    /// The children of entry `dir`, or of the root for `None`, ascending by name.
    pub fn children(&self, dir: Option<u32>) -> &[u32] {
        match dir {
            None => &self.root,
            Some(d) => self.children.get(d as usize).map_or(&[], Vec::as_slice),
        }
    }

    /// The child `name` of entry `dir`, or of the root for `None`.
    pub fn lookup(&self, dir: Option<u32>, name: &[u8]) -> Option<u32> {
        let list = self.children(dir);
        let i = list.binary_search_by(|&c| self.name(c).cmp(name)).ok()?;
        Some(list[i])
    }

    /// The last component of entry `i`'s path.
    pub fn name(&self, i: u32) -> &[u8] {
        name_of(&self.entries[i as usize].path)
    }
}

fn name_of(path: &[u8]) -> &[u8] {
    path.rsplit(|&b| b == b'/').next().unwrap_or(path)
}

/// The inodes of tree entries: each loaded tree takes a block of consecutive inodes,
/// entry `i` the block's first + `i`, after the fixed inodes and every earlier block.
///
/// Invariant: blocks never overlap and are never reused while mounted, so an inode
/// names one entry for the whole mount.
pub struct Inodes {
    next: u64,
    /// (first inode, entries, snapshot), ascending by first inode.
    blocks: Vec<(u64, u64, usize)>,
}

impl Inodes {
    /// Blocks start after `last_fixed`, the greatest fixed inode.
    pub fn new(last_fixed: u64) -> Self {
        Self {
            next: last_fixed + 1,
            blocks: Vec::new(),
        }
    }

    /// A block of `count` inodes for snapshot `snapshot`'s entries; its first inode.
    pub fn allocate(&mut self, snapshot: usize, count: usize) -> u64 {
        let first = self.next;
        self.blocks.push((first, count as u64, snapshot));
        self.next += count as u64;
        first
    }

    /// The snapshot and entry of inode `ino`, if a block holds it.
    pub fn find(&self, ino: u64) -> Option<(usize, u32)> {
        let i = self
            .blocks
            .partition_point(|&(first, _, _)| first <= ino)
            .checked_sub(1)?;
        let (first, count, snapshot) = self.blocks[i];
        (ino - first < count).then(|| (snapshot, (ino - first) as u32))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(kind: EntryKind, path: &str) -> TreeEntry {
        TreeEntry::new(kind, path.as_bytes().to_vec())
    }

    fn names(t: &MountedTree, dir: Option<u32>) -> Vec<String> {
        t.children(dir)
            .iter()
            .map(|&c| String::from_utf8_lossy(t.name(c)).into_owned())
            .collect()
    }

    #[test]
    fn paths_become_directories_of_children_by_name() {
        let t = MountedTree::new(vec![
            entry(EntryKind::Dir, "home"),
            entry(EntryKind::Dir, "home/me"),
            entry(EntryKind::File, "home/me/z.txt"),
            entry(EntryKind::Symlink, "home/me/a-link"),
            entry(EntryKind::Dir, "home/me/sub"),
            entry(EntryKind::File, "home/me/sub/deep"),
            entry(EntryKind::File, "etc"),
        ]);
        assert_eq!(names(&t, None), ["etc", "home"]);
        let me = t.lookup(t.lookup(None, b"home"), b"me").unwrap();
        assert_eq!(names(&t, Some(me)), ["a-link", "sub", "z.txt"]);
        let sub = t.lookup(Some(me), b"sub").unwrap();
        assert_eq!(t.lookup(Some(sub), b"deep"), Some(5));
        assert_eq!(t.lookup(Some(me), b"missing"), None);
        assert!(t.children(Some(2)).is_empty(), "a file has no children");
        assert_eq!(t.lookup(Some(2), b"x"), None);
    }

    #[test]
    fn hostile_trees_keep_the_first_of_a_path_and_drop_orphans() {
        let t = MountedTree::new(vec![
            entry(EntryKind::File, "dup"),
            entry(EntryKind::Dir, "dup"),
            entry(EntryKind::File, "no/parent"),
            entry(EntryKind::File, ""),
            entry(EntryKind::File, "a/.."),
            entry(EntryKind::Dir, "a"),
        ]);
        assert_eq!(names(&t, None), ["a", "dup"]);
        assert_eq!(t.lookup(None, b"dup"), Some(0));
        assert!(t.children(Some(5)).is_empty(), "`..` is never a child");
    }

    #[test]
    fn inode_blocks_follow_the_fixed_inodes_and_never_overlap() {
        let mut inodes = Inodes::new(10);
        assert_eq!(inodes.find(5), None);
        assert_eq!(inodes.allocate(3, 4), 11);
        assert_eq!(inodes.allocate(0, 0), 15);
        assert_eq!(inodes.allocate(1, 2), 15);
        assert_eq!(inodes.find(11), Some((3, 0)));
        assert_eq!(inodes.find(14), Some((3, 3)));
        assert_eq!(inodes.find(15), Some((1, 0)));
        assert_eq!(inodes.find(16), Some((1, 1)));
        assert_eq!(inodes.find(17), None);
        assert_eq!(inodes.find(10), None);
    }
}
