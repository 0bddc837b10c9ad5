//! Hard links: files of one snapshot that share a device and inode, with a link count
//! above one. The first of them a restore selects carries the data; each later one
//! becomes a `link` to it once it is restored, and is never read from the containers.
//! If the first is not restored (a damaged chunk, a name already taken), the later
//! ones are restored with their own data in a further pass (`restore.rs`).

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::{Condvar, Mutex, Weak};

use larder_store::{EntryKind, TreeEntry};

/// What an entry is to the hard links of a restore.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum LinkRole {
    /// Not a hard link, or the only one of its inode selected.
    Alone,
    /// The first selected name of link group `g`: restored with its data.
    First(usize),
    /// A later name of link group `g`: a link to the first.
    Later(usize),
}

/// The role of each of `entries` (in tree order), and the number of link groups.
pub(super) fn link_roles<'a>(
    entries: impl IntoIterator<Item = &'a TreeEntry>,
) -> (Vec<LinkRole>, usize) {
    let mut groups: HashMap<(u64, u64), (usize, usize)> = HashMap::new();
    let mut roles: Vec<LinkRole> = Vec::new();
    for (i, e) in entries.into_iter().enumerate() {
        if e.kind != EntryKind::File || e.nlink < 2 {
            roles.push(LinkRole::Alone);
            continue;
        }
        let next = groups.len();
        match groups.entry((e.device, e.inode)) {
            std::collections::hash_map::Entry::Occupied(g) => {
                let (group, first) = *g.get();
                roles[first] = LinkRole::First(group);
                roles.push(LinkRole::Later(group));
            }
            std::collections::hash_map::Entry::Vacant(v) => {
                v.insert((next, i));
                roles.push(LinkRole::Alone);
            }
        }
    }
    // Number the groups that have a later name densely, in tree order.
    let mut dense: HashMap<usize, usize> = HashMap::new();
    for role in &mut roles {
        if let LinkRole::First(g) | LinkRole::Later(g) = role {
            let n = dense.len();
            *g = *dense.entry(*g).or_insert(n);
        }
    }
    let count = dense.len();
    (roles, count)
}

/// How the first name of a link group ended.
#[derive(Debug, Clone)]
pub(super) enum FirstOutcome {
    Pending,
    /// Restored with its data as `name` in directory `parent` (relative to the target;
    /// `dir` is its descriptor while anyone still holds it open), which was then inode
    /// `ino` of device `dev`.
    Restored {
        dir: Weak<OwnedFd>,
        parent: Vec<u8>,
        name: Vec<u8>,
        dev: u64,
        ino: u64,
    },
    /// Not restored: later names carry their own data.
    Failed,
}

/// The outcome of each link group's first name, for the writers of its later names to
/// wait on. Every first is resolved exactly once ([`FirstGuard`] makes sure), so no
/// waiter waits forever.
pub(super) struct LinkBoard {
    outcomes: Mutex<Vec<FirstOutcome>>,
    resolved: Condvar,
}

impl LinkBoard {
    pub fn new(groups: usize) -> Self {
        Self {
            outcomes: Mutex::new(vec![FirstOutcome::Pending; groups]),
            resolved: Condvar::new(),
        }
    }

    fn resolve(&self, group: usize, outcome: FirstOutcome) {
        let mut outcomes = self.outcomes.lock().unwrap_or_else(|p| p.into_inner());
        outcomes[group] = outcome;
        self.resolved.notify_all();
    }

    /// Waits until group `group`'s first name is resolved.
    pub fn wait(&self, group: usize) -> FirstOutcome {
        let mut outcomes = self.outcomes.lock().unwrap_or_else(|p| p.into_inner());
        while matches!(outcomes[group], FirstOutcome::Pending) {
            outcomes = self
                .resolved
                .wait(outcomes)
                .unwrap_or_else(|p| p.into_inner());
        }
        outcomes[group].clone()
    }

    /// The promise to resolve group `group`.
    pub fn guard(&self, group: usize) -> FirstGuard<'_> {
        FirstGuard {
            board: self,
            group,
            done: false,
        }
    }
}

/// Resolves its group when told, or as failed when dropped unresolved (the first name
/// was skipped, its task dropped, its writer panicked).
pub(super) struct FirstGuard<'a> {
    board: &'a LinkBoard,
    group: usize,
    done: bool,
}

impl FirstGuard<'_> {
    pub fn resolve(mut self, outcome: FirstOutcome) {
        self.board.resolve(self.group, outcome);
        self.done = true;
    }
}

impl Drop for FirstGuard<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.board.resolve(self.group, FirstOutcome::Failed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(path: &str, device: u64, inode: u64, nlink: u32) -> TreeEntry {
        TreeEntry {
            device,
            inode,
            nlink,
            ..TreeEntry::new(EntryKind::File, path.as_bytes().to_vec())
        }
    }

    #[test]
    fn names_of_one_inode_link_to_the_first() {
        let entries = [
            file("a", 1, 10, 3),
            file("b", 1, 11, 1),
            file("c", 1, 10, 3),
            // Same inode on another device: another file.
            file("d", 2, 10, 2),
            file("e", 1, 10, 3),
            // Only one name of this inode is selected: nothing to link.
            file("f", 1, 12, 2),
            file("g", 2, 10, 2),
        ];
        let (roles, groups) = link_roles(&entries);
        use LinkRole::*;
        assert_eq!(
            roles,
            [
                First(0),
                Alone,
                Later(0),
                First(1),
                Later(0),
                Alone,
                Later(1)
            ]
        );
        assert_eq!(groups, 2);
    }

    /// Regression guard: version 1 trees record no inode, device or link count (all
    /// zero); their files must not all become links to the first.
    #[test]
    fn version_1_entries_are_never_links() {
        let entries = [file("a", 0, 0, 0), file("b", 0, 0, 0)];
        assert_eq!(link_roles(&entries), (vec![LinkRole::Alone; 2], 0));
        let mut dir = file("d", 1, 10, 2);
        dir.kind = EntryKind::Dir;
        assert_eq!(
            link_roles(&[dir.clone(), dir]),
            (vec![LinkRole::Alone; 2], 0)
        );
    }

    #[test]
    fn a_dropped_guard_fails_its_group() {
        let board = LinkBoard::new(2);
        drop(board.guard(0));
        board.guard(1).resolve(FirstOutcome::Restored {
            dir: Weak::new(),
            parent: Vec::new(),
            name: b"x".to_vec(),
            dev: 1,
            ino: 2,
        });
        assert!(matches!(board.wait(0), FirstOutcome::Failed));
        assert!(matches!(
            board.wait(1),
            FirstOutcome::Restored { ino: 2, .. }
        ));
    }
}
