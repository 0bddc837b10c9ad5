//! Which entries of a snapshot `restore --include/--exclude` restores
//! (docs/design/patterns.md, "Restore").

use std::collections::{HashMap, HashSet};

use larder_store::{EntryKind, TreeEntry};

use crate::pattern::{PathUnits, PatternList};

/// For each entry, whether to restore it: every entry the include list selects (every
/// entry, if the list is empty) and the exclude list does not, and then every
/// directory above such an entry, so that an included file is restored inside its
/// parent directories, with their metadata. An excluded directory is skipped whole:
/// the exclude list selects everything below it too, so it is never needed as a parent.
pub(crate) fn restore_selection(
    entries: &[TreeEntry],
    include: &PatternList,
    exclude: &PatternList,
) -> Vec<bool> {
    if include.is_empty() && exclude.is_empty() {
        return vec![true; entries.len()];
    }
    let mut included = CachedSelection::new(include);
    let mut excluded = CachedSelection::new(exclude);
    let mut wanted: Vec<bool> = entries
        .iter()
        .map(|e| {
            let is_dir = e.kind == EntryKind::Dir;
            (include.is_empty() || included.selects(&e.path, is_dir))
                && !excluded.selects(&e.path, is_dir)
        })
        .collect();
    let mut parents: HashSet<&[u8]> = HashSet::new();
    for (entry, _) in entries.iter().zip(&wanted).filter(|(_, w)| **w) {
        let mut path = entry.path.as_slice();
        while let Some(slash) = path.iter().rposition(|&b| b == b'/') {
            path = &path[..slash];
            // A directory already recorded has its own parents recorded too.
            if !parents.insert(path) {
                break;
            }
        }
    }
    for (entry, wanted) in entries.iter().zip(wanted.iter_mut()) {
        if !*wanted && entry.kind == EntryKind::Dir && parents.contains(entry.path.as_slice()) {
            *wanted = true;
        }
    }
    wanted
}

/// [`PatternList::selects`] with the answer for every parent directory remembered, so
/// that a directory's patterns are matched once, not once per entry below it.
struct CachedSelection<'a> {
    list: &'a PatternList,
    /// Directory path to whether the list selects it or one of its parents.
    dirs: HashMap<Vec<u8>, bool>,
}

impl<'a> CachedSelection<'a> {
    fn new(list: &'a PatternList) -> Self {
        Self {
            list,
            dirs: HashMap::new(),
        }
    }

    fn selects(&mut self, path: &[u8], is_dir: bool) -> bool {
        if self.list.is_empty() {
            return false;
        }
        let units = PathUnits::new(path);
        let components = units.all();
        // `ends[d - 1]`: where the parent directory of depth `d` ends in `path`.
        let ends: Vec<usize> = path
            .iter()
            .enumerate()
            .filter(|(_, &b)| b == b'/')
            .map(|(i, _)| i)
            .collect();
        // The deepest parent whose answer is known; above the top one, nothing is.
        let (mut depth, mut selected) = (0, false);
        for d in (1..=ends.len()).rev() {
            if let Some(&known) = self.dirs.get(&path[..ends[d - 1]]) {
                (depth, selected) = (d, known);
                break;
            }
        }
        for d in depth + 1..=ends.len() {
            selected = selected || self.list.decide(&components[..d], true) == Some(true);
            self.dirs.insert(path[..ends[d - 1]].to_vec(), selected);
        }
        selected || self.list.decide(components, is_dir) == Some(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pattern::Pattern;

    fn entry(kind: EntryKind, path: &str) -> TreeEntry {
        TreeEntry::new(kind, path.as_bytes().to_vec())
    }

    fn list(patterns: &[&str]) -> PatternList {
        PatternList::new(
            patterns
                .iter()
                .map(|p| Pattern::parse(p.as_bytes()).unwrap())
                .collect(),
        )
    }

    fn restored(entries: &[TreeEntry], include: &[&str], exclude: &[&str]) -> Vec<String> {
        restore_selection(entries, &list(include), &list(exclude))
            .iter()
            .zip(entries)
            .filter(|(w, _)| **w)
            .map(|(_, e)| String::from_utf8_lossy(&e.path).into_owned())
            .collect()
    }

    fn tree() -> Vec<TreeEntry> {
        use EntryKind::*;
        vec![
            entry(Dir, "home"),
            entry(Dir, "home/me"),
            entry(File, "home/me/a.txt"),
            entry(File, "home/me/b.log"),
            entry(Dir, "home/me/docs"),
            entry(File, "home/me/docs/c.txt"),
            entry(Dir, "home/me/docs/old"),
            entry(File, "home/me/docs/old/d.txt"),
            entry(Symlink, "home/me/link"),
        ]
    }

    #[test]
    fn no_patterns_restore_everything() {
        assert_eq!(restored(&tree(), &[], &[]).len(), tree().len());
    }

    #[test]
    fn included_files_bring_their_parent_directories() {
        assert_eq!(
            restored(&tree(), &["*.log"], &[]),
            ["home", "home/me", "home/me/b.log"]
        );
        assert_eq!(
            restored(&tree(), &["/home/me/docs/old/d.txt"], &[]),
            [
                "home",
                "home/me",
                "home/me/docs",
                "home/me/docs/old",
                "home/me/docs/old/d.txt"
            ]
        );
    }

    #[test]
    fn an_included_directory_brings_everything_inside() {
        assert_eq!(
            restored(&tree(), &["docs/"], &[]),
            [
                "home",
                "home/me",
                "home/me/docs",
                "home/me/docs/c.txt",
                "home/me/docs/old",
                "home/me/docs/old/d.txt"
            ]
        );
    }

    #[test]
    fn an_excluded_directory_is_skipped_whole() {
        assert_eq!(
            restored(&tree(), &["*.txt"], &["/home/me/docs"]),
            ["home", "home/me", "home/me/a.txt"]
        );
        assert_eq!(
            restored(&tree(), &[], &["old", "*.log", "link"]),
            [
                "home",
                "home/me",
                "home/me/a.txt",
                "home/me/docs",
                "home/me/docs/c.txt"
            ]
        );
    }

    proptest::proptest! {
        /// On any tree, hostile ones included: the parents of a restored entry are
        /// restored where the tree has them, and nothing the exclude list selects is.
        #[test]
        fn parents_come_along_and_exclusions_hold(
            paths in proptest::collection::vec(
                proptest::collection::vec(proptest::sample::select(vec!["a", "b", "c.txt"]), 1..4),
                0..16,
            ),
            dirs in proptest::collection::vec(proptest::prelude::any::<bool>(), 16),
            include in proptest::sample::subsequence(vec!["*.txt", "/a", "b/", "!c.txt"], 0..3),
            exclude in proptest::sample::subsequence(vec!["/a/b", "c.txt/", "!b", "a/**"], 0..3),
        ) {
            let entries: Vec<TreeEntry> = paths
                .iter()
                .zip(&dirs)
                .map(|(p, &d)| entry(if d { EntryKind::Dir } else { EntryKind::File }, &p.join("/")))
                .collect();
            let (include, exclude) = (list(&include), list(&exclude));
            let wanted = restore_selection(&entries, &include, &exclude);
            for (e, _) in entries.iter().zip(&wanted).filter(|(_, w)| **w) {
                let is_dir = e.kind == EntryKind::Dir;
                proptest::prop_assert!(!exclude.selects(&e.path, is_dir));
                for (parent, parent_wanted) in entries.iter().zip(&wanted) {
                    let is_parent = parent.kind == EntryKind::Dir
                        && e.path.starts_with(&parent.path)
                        && e.path.get(parent.path.len()) == Some(&b'/');
                    proptest::prop_assert!(!is_parent || *parent_wanted);
                }
            }
        }
    }

    #[test]
    fn answers_do_not_depend_on_entry_order() {
        let mut reversed = tree();
        reversed.reverse();
        let mut forward = restored(&tree(), &["*.txt"], &["old/"]);
        let mut backward = restored(&reversed, &["*.txt"], &["old/"]);
        forward.sort();
        backward.sort();
        assert_eq!(forward, backward);
    }
}
