//! The fixed part of the mounted file system, built once at mount from the list of
//! snapshots (docs/design/mount.md, "Layout"):
//!
//! ```text
//! ids/<snapshot id>/             the snapshot's tree (read when first entered)
//! snapshots/<time>               symlink to ../ids/<id>
//! hosts/<host>/<time>            symlink to ../../ids/<id>
//! latest                         symlink to ids/<id> of the newest complete snapshot
//! ```
//!
//! Invariants: node `n` has inode `n + 1`, so the root is inode 1 and every fixed
//! inode is at most [`Namespace::last_inode`]; the names in one directory are
//! unique; `<time>` names are unique across the repository.

use std::collections::{BTreeMap, HashSet};

use larder_store::IdentifiedSnapshot;

/// The root directory's inode (FUSE's `FUSE_ROOT_ID`).
pub const ROOT: u64 = 1;

/// A fixed node.
#[derive(Debug, PartialEq, Eq)]
pub enum Node {
    /// A directory: its children's names and inodes, ascending by name.
    Dir(Vec<(Vec<u8>, u64)>),
    /// A symlink and its target.
    Link(Vec<u8>),
    /// The root of the tree of snapshot `n` (its place in the snapshot list).
    Snapshot(usize),
}

/// Every fixed node, indexed by inode - 1.
pub struct Namespace {
    nodes: Vec<Node>,
}

impl Namespace {
    /// The nodes for `snapshots` (oldest first, as `Repository::snapshots` lists them).
    pub fn new(snapshots: &[IdentifiedSnapshot]) -> Self {
        let mut ns = Self {
            nodes: vec![Node::Dir(Vec::new())],
        };
        let ids = ns.add_child(ROOT, b"ids", Node::Dir(Vec::new()));
        let by_time = ns.add_child(ROOT, b"snapshots", Node::Dir(Vec::new()));
        let hosts = ns.add_child(ROOT, b"hosts", Node::Dir(Vec::new()));
        let mut host_dirs: BTreeMap<Vec<u8>, u64> = BTreeMap::new();
        let names = time_names(snapshots.iter().map(|(_, s)| s.time.as_str()));
        for (n, ((id, snap), time)) in snapshots.iter().zip(names).enumerate() {
            ns.add_child(ids, id.as_bytes(), Node::Snapshot(n));
            let link = format!("../ids/{id}").into_bytes();
            ns.add_child(by_time, time.as_bytes(), Node::Link(link));
            let host = host_name(&snap.hostname);
            let dir = match host_dirs.get(&host) {
                Some(&dir) => dir,
                None => {
                    let dir = ns.add_child(hosts, &host, Node::Dir(Vec::new()));
                    host_dirs.insert(host, dir);
                    dir
                }
            };
            let link = format!("../../ids/{id}").into_bytes();
            ns.add_child(dir, time.as_bytes(), Node::Link(link));
        }
        // `Repository::find_snapshot("latest")`'s rule: the newest that is not a
        // checkpoint, on the list already read.
        if let Some((id, _)) = snapshots.iter().rev().find(|(_, s)| !s.partial) {
            let link = format!("ids/{id}").into_bytes();
            ns.add_child(ROOT, b"latest", Node::Link(link));
        }
        for node in &mut ns.nodes {
            if let Node::Dir(children) = node {
                children.sort();
            }
        }
        ns
    }

    /// Adds `node` as `name` in directory `parent`; returns its inode.
    fn add_child(&mut self, parent: u64, name: &[u8], node: Node) -> u64 {
        self.nodes.push(node);
        let ino = self.nodes.len() as u64;
        if let Some(Node::Dir(children)) = self.nodes.get_mut(parent as usize - 1) {
            children.push((name.to_vec(), ino));
        }
        ino
    }

    /// The node of fixed inode `ino`, if it is one.
    pub fn node(&self, ino: u64) -> Option<&Node> {
        self.nodes.get(ino.checked_sub(1)? as usize)
    }

    /// The greatest fixed inode; snapshot trees' inodes come after it.
    pub fn last_inode(&self) -> u64 {
        self.nodes.len() as u64
    }

    /// The inode of `name` in fixed directory `dir`.
    pub fn lookup(&self, dir: u64, name: &[u8]) -> Option<u64> {
        let Some(Node::Dir(children)) = self.node(dir) else {
            return None;
        };
        let i = children
            .binary_search_by(|(n, _)| n.as_slice().cmp(name))
            .ok()?;
        Some(children[i].1)
    }
}

/// A directory name for each snapshot time (RFC 3339 as stored, oldest first): the
/// time to the second, `2026-11-28T06:38:11Z`, with `-1`, `-2`, ... added to the
/// second and later snapshots of the same second. A time larder did not write keeps
/// its text, with any `/` made `_`.
pub fn time_names<'a>(times: impl Iterator<Item = &'a str>) -> Vec<String> {
    let mut taken = HashSet::new();
    times
        .map(|time| {
            let base = to_the_second(time).unwrap_or_else(|| time.replace(['/', '\0'], "_"));
            let mut name = base.clone();
            let mut n = 0;
            while !taken.insert(name.clone()) {
                n += 1;
                name = format!("{base}-{n}");
            }
            name
        })
        .collect()
}

/// `YYYY-MM-DDTHH:MM:SS` and `Z` of a UTC RFC 3339 time, without its fraction.
fn to_the_second(time: &str) -> Option<String> {
    let (seconds, rest) = time.split_at_checked(19)?;
    let fraction_ok = match rest.strip_prefix('.') {
        Some(f) => f.strip_suffix('Z')?.bytes().all(|b| b.is_ascii_digit()),
        None => rest == "Z",
    };
    let shape_ok = seconds.bytes().enumerate().all(|(i, b)| match i {
        4 | 7 => b == b'-',
        10 => b == b'T',
        13 | 16 => b == b':',
        _ => b.is_ascii_digit(),
    });
    (fraction_ok && shape_ok).then(|| format!("{seconds}Z"))
}

/// A host name as a directory name: `/` and NUL made `_`; an empty name, `.` and `..`
/// become `_`, `_.` and `_..`.
fn host_name(host: &str) -> Vec<u8> {
    let name = host.replace(['/', '\0'], "_");
    match name.as_str() {
        "" => b"_".to_vec(),
        "." | ".." => format!("_{name}").into_bytes(),
        _ => name.into_bytes(),
    }
}

#[cfg(test)]
mod tests {
    use larder_store::{Snapshot, SnapshotSummary, TreeRef};

    use super::*;

    fn snap(id: &str, time: &str, host: &str, partial: bool) -> IdentifiedSnapshot {
        let snapshot = Snapshot {
            version: Snapshot::VERSION,
            time: time.into(),
            hostname: host.into(),
            username: "me".into(),
            paths: vec![],
            tree: TreeRef {
                size: 0,
                chunks: vec![],
            },
            summary: SnapshotSummary::default(),
            partial,
            parents: vec![],
            original: None,
            repaired_from: None,
        };
        (id.into(), snapshot)
    }

    fn target(ns: &Namespace, ino: u64) -> &[u8] {
        match ns.node(ino) {
            Some(Node::Link(t)) => t,
            other => panic!("inode {ino} is {other:?}, not a symlink"),
        }
    }

    #[test]
    fn times_are_named_to_the_second_and_made_unique() {
        let times = [
            "2026-11-28T06:38:11.123456789Z",
            "2026-11-28T06:38:11.923456789Z",
            "2026-11-28T06:38:12Z",
            "2026-11-28T06:38:11.000000000Z",
            "not/a time",
        ];
        assert_eq!(
            time_names(times.into_iter()),
            [
                "2026-11-28T06:38:11Z",
                "2026-11-28T06:38:11Z-1",
                "2026-11-28T06:38:12Z",
                "2026-11-28T06:38:11Z-2",
                "not_a time"
            ]
        );
    }

    #[test]
    fn hosts_become_safe_directory_names() {
        assert_eq!(host_name("box"), b"box");
        assert_eq!(host_name("a/b"), b"a_b");
        assert_eq!(host_name(""), b"_");
        assert_eq!(host_name(".."), b"_..");
    }

    #[test]
    fn every_snapshot_is_named_by_id_time_and_host_and_latest_skips_checkpoints() {
        let ns = Namespace::new(&[
            snap("aaaa", "2026-01-01T00:00:00.5Z", "box", false),
            snap("bbbb", "2026-01-02T00:00:00.5Z", "other", false),
            snap("cccc", "2026-01-03T00:00:00.5Z", "box", true),
        ]);
        let ids = ns.lookup(ROOT, b"ids").unwrap();
        let b = ns.lookup(ids, b"bbbb").unwrap();
        assert_eq!(ns.node(b), Some(&Node::Snapshot(1)));
        let by_time = ns.lookup(ROOT, b"snapshots").unwrap();
        let t = ns.lookup(by_time, b"2026-01-03T00:00:00Z").unwrap();
        assert_eq!(target(&ns, t), b"../ids/cccc");
        let hosts = ns.lookup(ROOT, b"hosts").unwrap();
        let bx = ns.lookup(hosts, b"box").unwrap();
        let Some(Node::Dir(in_box)) = ns.node(bx) else {
            panic!("hosts/box is not a directory");
        };
        let names: Vec<&[u8]> = in_box.iter().map(|(n, _)| n.as_slice()).collect();
        assert_eq!(
            names,
            [&b"2026-01-01T00:00:00Z"[..], b"2026-01-03T00:00:00Z"]
        );
        assert_eq!(target(&ns, in_box[0].1), b"../../ids/aaaa");
        let latest = ns.lookup(ROOT, b"latest").unwrap();
        assert_eq!(
            target(&ns, latest),
            b"ids/bbbb",
            "the checkpoint is not latest"
        );
        assert_eq!(ns.lookup(ROOT, b"nothing"), None);
        assert_eq!(ns.lookup(latest, b"x"), None, "a symlink has no children");
        assert!(ns.node(ns.last_inode()).is_some() && ns.node(ns.last_inode() + 1).is_none());
    }

    #[test]
    fn no_latest_without_a_complete_snapshot() {
        let ns = Namespace::new(&[snap("aaaa", "2026-01-01T00:00:00Z", "box", true)]);
        assert_eq!(ns.lookup(ROOT, b"latest"), None);
        assert!(Namespace::new(&[]).lookup(ROOT, b"ids").is_some());
    }
}
