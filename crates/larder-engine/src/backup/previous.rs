//! The skip logic (docs/design/nightly.md, "Skipping unchanged files"): a file whose
//! size, mtime, ctime and inode equal those of its previous entry is not read; its
//! previous recipe is reused once every chunk of it is found in the index.
//!
//! The previous entries come from the repository's trees, never from a cache: by
//! default, for each path, the newest snapshot of this host that holds it (complete or
//! a checkpoint), so a backup of `/home` after one of `/home/me` still skips
//! `/home/me`'s unchanged files.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use larder_hash::Fingerprint;
use larder_store::{EntryKind, Repository, Snapshot, TreeDecoder, TreeEntry, Xattr};

use super::walk::{normalize, Item};
use crate::error::{Result, Warning};
use crate::time::parse_utc_rfc3339_nanos;
use crate::tree_io::{read_stream, ChunkReader};

/// A previous entry whose ctime or mtime lies less than this before its snapshot's
/// backup began is racy, and not trusted: the file may have changed again after it
/// was read within the same timestamp tick, leaving its metadata as recorded. Two
/// seconds cover FAT's mtime and every coarse kernel clock.
pub const RACY_WINDOW: Duration = Duration::from_secs(2);

/// Snapshots loaded at most to find the previous entries of one backup.
const MAX_PARENTS: usize = 8;

/// Which snapshots a backup compares its files with.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Parents {
    /// For each path, the newest snapshot of this host holding it.
    #[default]
    Auto,
    /// This snapshot only (an id prefix or `latest`).
    Snapshot(String),
    /// None: every file is read (`--force`).
    None,
}

/// What the skip logic compares besides size and mtime.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SkipRules {
    /// Do not compare inodes (file systems whose inodes are not stable: FUSE, some
    /// network file systems).
    pub ignore_inode: bool,
    /// Do not compare ctimes.
    pub ignore_ctime: bool,
    /// Entries changed within this of their backup's start are not trusted
    /// ([`RACY_WINDOW`]); wider for file systems with coarser timestamps, narrower
    /// only in tests that sleep past it.
    pub racy_window: Duration,
}

impl Default for SkipRules {
    fn default() -> Self {
        Self {
            ignore_inode: false,
            ignore_ctime: false,
            racy_window: RACY_WINDOW,
        }
    }
}

/// What the skip logic and the walk use of a previous entry.
pub(super) struct PreviousEntry {
    kind: EntryKind,
    size: u64,
    mtime: (i64, u32),
    ctime: (i64, u32),
    inode: u64,
    chunks: Vec<Fingerprint>,
    pub xattrs: Vec<Xattr>,
    pub target: Vec<u8>,
    pub attr_flags: u32,
    /// The file changed while it was read: never taken as unchanged.
    changed_while_read: bool,
}

impl PreviousEntry {
    fn new(e: TreeEntry) -> Self {
        Self {
            kind: e.kind,
            size: e.size,
            mtime: (e.mtime_sec, e.mtime_nsec),
            ctime: (e.ctime_sec, e.ctime_nsec),
            inode: e.inode,
            chunks: e.chunks,
            xattrs: e.xattrs,
            target: e.target,
            attr_flags: e.attr_flags,
            changed_while_read: e.changed_while_read,
        }
    }
}

/// The previous entries under a backup's roots, each from the newest snapshot that
/// holds its path; racy entries are left out.
#[derive(Default)]
pub(super) struct Previous {
    entries: HashMap<Vec<u8>, PreviousEntry>,
    /// The snapshots they came from, newest first.
    parents: Vec<String>,
}

/// What the skip logic found of a file: no previous entry, one it differs from, or one
/// it equals (its recipe is reused unread).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum FileStatus {
    New,
    Changed,
    Unchanged,
}

/// What happens to each file of a backup.
pub(super) struct Decisions {
    /// Per walk item: the reused recipe of an unchanged file.
    pub reused: Vec<Option<Vec<Fingerprint>>>,
    /// Per walk item: what the skip logic found of a file; `None` for other entries.
    /// A snapshot counts its files by this, those it holds only (a file that could
    /// not be read is in none of the counts).
    pub status: Vec<Option<FileStatus>>,
    pub bytes_skipped: u64,
    /// The snapshots compared with, newest first.
    pub parents: Vec<String>,
}

/// `path` (absolute) as a snapshot path: without its leading `/`.
fn rel(path: &Path) -> &[u8] {
    use std::os::unix::ffi::OsStrExt;
    let b = path.as_os_str().as_bytes();
    b.strip_prefix(b"/").unwrap_or(b)
}

/// Whether snapshot path `path` lies at or below root `root` (both relative).
fn is_under(path: &[u8], root: &[u8]) -> bool {
    root.is_empty()
        || path
            .strip_prefix(root)
            .is_some_and(|rest| rest.is_empty() || rest[0] == b'/')
}

fn overlaps(a: &Path, b: &Path) -> bool {
    a.starts_with(b) || b.starts_with(a)
}

impl Previous {
    /// Loads the previous entries of the files under `roots` (absolute, normalized).
    /// A snapshot whose tree cannot be read is skipped with a warning: its files are
    /// read again.
    pub fn load(
        repo: &Repository,
        roots: &[PathBuf],
        hostname: &str,
        parents: &Parents,
        racy_window: Duration,
        warnings: &mut Vec<Warning>,
    ) -> Result<Self> {
        let chosen: Vec<(String, Snapshot)> = match parents {
            Parents::None => return Ok(Self::default()),
            Parents::Snapshot(name) => vec![repo.find_snapshot(name)?],
            // A write-only key reads no snapshot: every file is read again.
            Parents::Auto if repo.keys().is_some_and(|k| !k.is_full()) => {
                return Ok(Self::default())
            }
            Parents::Auto => {
                let (all, _) = repo.snapshots()?;
                choose(all, roots, hostname)
            }
        };
        let roots: Vec<&[u8]> = roots.iter().map(|r| rel(r)).collect();
        let mut previous = Self::default();
        let mut reader = ChunkReader::new(repo);
        for (id, snapshot) in chosen {
            // A time that does not parse trusts nothing (racy for every entry).
            let began = parse_utc_rfc3339_nanos(&snapshot.time).unwrap_or((i64::MIN, 0));
            let trusted_before = minus(began, racy_window);
            let entries = snapshot
                .tree
                .fingerprints()
                .map_err(Into::into)
                .and_then(|fps| read_stream(&mut reader, &fps, snapshot.tree.size))
                .and_then(|stream| trusted_entries(&stream, &roots, trusted_before));
            match entries {
                Ok(entries) => previous.add(entries),
                Err(e) => {
                    warnings.push(Warning::notice(
                        repo.location(),
                        format!(
                            "cannot read snapshot {}'s tree ({e}); its files are read again",
                            &id[..8.min(id.len())]
                        ),
                    ));
                    continue;
                }
            }
            previous.parents.push(id);
        }
        Ok(previous)
    }

    /// Adds the entries (of one snapshot) whose paths no newer snapshot gave.
    fn add(&mut self, entries: Vec<(Vec<u8>, PreviousEntry)>) {
        self.entries.reserve(entries.len());
        for (path, e) in entries {
            self.entries.entry(path).or_insert(e);
        }
    }

    /// The previous entry of `now`'s path if it is the same inode in the same state:
    /// same kind, inode (unless ignored) and ctime. Its extended attributes and
    /// symlink target are then `now`'s too, since changing either changes the ctime;
    /// `None` when ctimes are ignored.
    pub fn same_inode(&self, now: &TreeEntry, rules: SkipRules) -> Option<&PreviousEntry> {
        if rules.ignore_ctime {
            return None;
        }
        self.entries.get(&now.path).filter(|prev| {
            prev.kind == now.kind
                && !prev.changed_while_read
                && prev.ctime == (now.ctime_sec, now.ctime_nsec)
                && (rules.ignore_inode || prev.inode == now.inode)
        })
    }

    /// Decides, for every file of `items`, whether it is new, changed or unchanged.
    /// `present(fps)` tells which of a list of fingerprints the index holds: a reused
    /// recipe must have every chunk (a `gc` may have removed some since). An unchanged
    /// file, which is not read, takes its attribute flags from its previous entry
    /// (changing them changes the ctime).
    pub fn decide(
        mut self,
        items: &mut [Item],
        rules: SkipRules,
        present: impl FnOnce(&[Fingerprint]) -> Result<Vec<bool>>,
    ) -> Result<Decisions> {
        let mut d = Decisions {
            reused: vec![None; items.len()],
            status: vec![None; items.len()],
            bytes_skipped: 0,
            parents: std::mem::take(&mut self.parents),
        };
        let mut candidates = Vec::new();
        for (i, item) in items.iter().enumerate() {
            if item.entry.kind != EntryKind::File {
                continue;
            }
            d.status[i] = Some(match self.entries.remove(&item.entry.path) {
                None => FileStatus::New,
                Some(prev) if unchanged(&prev, &item.entry, rules) => {
                    candidates.push((i, prev.chunks, prev.attr_flags));
                    continue;
                }
                // A path that held something else before counts as changed.
                Some(_) => FileStatus::Changed,
            });
        }
        let all: Vec<Fingerprint> = candidates.iter().flat_map(|(_, c, _)| c).copied().collect();
        let found = present(&all)?;
        let mut at = 0;
        for (i, chunks, attr_flags) in candidates {
            // This recipe's answers.
            let complete = found[at..at + chunks.len()].iter().all(|&b| b);
            at += chunks.len();
            if complete {
                d.status[i] = Some(FileStatus::Unchanged);
                d.bytes_skipped += items[i].entry.size;
                d.reused[i] = Some(chunks);
                items[i].entry.attr_flags = attr_flags;
            } else {
                d.status[i] = Some(FileStatus::Changed);
            }
        }
        Ok(d)
    }
}

/// The entries of tree stream `stream` under `roots`, keyed by path, but the racy
/// ones: those changed at or after `trusted_before` (their backup's start less the
/// racy window), which are left out, so their files are read again. Nothing if the
/// stream does not decode.
fn trusted_entries(
    stream: &[u8],
    roots: &[&[u8]],
    trusted_before: (i64, u32),
) -> Result<Vec<(Vec<u8>, PreviousEntry)>> {
    let mut entries = Vec::with_capacity(stream.len() / 128);
    for e in TreeDecoder::new(stream)? {
        let mut e = e?;
        let racy = (e.ctime_sec, e.ctime_nsec) >= trusted_before
            || (e.mtime_sec, e.mtime_nsec) >= trusted_before;
        if racy || !roots.iter().any(|r| is_under(&e.path, r)) {
            continue;
        }
        let path = std::mem::take(&mut e.path);
        entries.push((path, PreviousEntry::new(e)));
    }
    Ok(entries)
}

/// The snapshots to load for `roots`, newest first: of this host, each holding a path
/// that overlaps a root and that no newer chosen snapshot covers, until every root is
/// covered or [`MAX_PARENTS`] are chosen. Partial snapshots (checkpoints) count like
/// complete ones: their files were stored completely.
fn choose(
    mut all: Vec<(String, Snapshot)>,
    roots: &[PathBuf],
    hostname: &str,
) -> Vec<(String, Snapshot)> {
    all.reverse();
    let mut covered: Vec<PathBuf> = Vec::new();
    let mut chosen = Vec::new();
    for (id, snapshot) in all {
        if chosen.len() >= MAX_PARENTS
            || roots
                .iter()
                .all(|r| covered.iter().any(|c| r.starts_with(c)))
        {
            break;
        }
        if snapshot.hostname != hostname {
            continue;
        }
        let paths: Vec<PathBuf> = snapshot
            .paths
            .iter()
            .map(|p| normalize(Path::new(p)))
            .collect();
        let useful = paths.iter().any(|p| {
            roots.iter().any(|r| overlaps(p, r)) && !covered.iter().any(|c| p.starts_with(c))
        });
        if useful {
            covered.extend(paths);
            chosen.push((id, snapshot));
        }
    }
    chosen
}

/// `t` (seconds and nanoseconds) less `d`.
fn minus(t: (i64, u32), d: Duration) -> (i64, u32) {
    let nanos = i128::from(t.0) * 1_000_000_000 + i128::from(t.1) - d.as_nanos() as i128;
    let sec = nanos.div_euclid(1_000_000_000);
    (
        i64::try_from(sec).unwrap_or(i64::MIN),
        nanos.rem_euclid(1_000_000_000) as u32,
    )
}

/// Whether the metadata of `now` says the file is the one `prev` recorded; never for a
/// file that changed while it was read (its content may be of no one moment).
fn unchanged(prev: &PreviousEntry, now: &TreeEntry, rules: SkipRules) -> bool {
    prev.kind == EntryKind::File
        && !prev.changed_while_read
        && prev.size == now.size
        && prev.mtime == (now.mtime_sec, now.mtime_nsec)
        && (rules.ignore_ctime || prev.ctime == (now.ctime_sec, now.ctime_nsec))
        && (rules.ignore_inode || prev.inode == now.inode)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap(host: &str, time: &str, paths: &[&str]) -> Snapshot {
        Snapshot {
            version: Snapshot::VERSION,
            time: time.into(),
            hostname: host.into(),
            username: "u".into(),
            paths: paths.iter().map(|p| p.to_string()).collect(),
            tree: larder_store::TreeRef {
                size: 0,
                chunks: Vec::new(),
            },
            summary: Default::default(),
            partial: false,
            parents: Vec::new(),
            original: None,
            repaired_from: None,
        }
    }

    fn ids(chosen: &[(String, Snapshot)]) -> Vec<&str> {
        chosen.iter().map(|(id, _)| id.as_str()).collect()
    }

    #[test]
    fn the_newest_snapshot_of_each_path_of_this_host_is_chosen() {
        let all = vec![
            ("a".to_string(), snap("h", "1", &["/home"])),
            ("b".to_string(), snap("h", "2", &["/home/me"])),
            ("c".to_string(), snap("other", "3", &["/home"])),
            ("d".to_string(), snap("h", "4", &["/etc"])),
        ];
        let roots = [PathBuf::from("/home")];
        // /home/me from b, the rest of /home from a; never another host's.
        assert_eq!(ids(&choose(all.clone(), &roots, "h")), ["b", "a"]);
        // A backup of /home/me/docs needs only b.
        assert_eq!(
            ids(&choose(all.clone(), &[PathBuf::from("/home/me/docs")], "h")),
            ["b"]
        );
        // Once a newer snapshot covers /home whole, older ones are not loaded.
        let mut newer = all.clone();
        newer.push(("e".to_string(), snap("h", "5", &["/home/../home"])));
        assert_eq!(ids(&choose(newer, &roots, "h")), ["e"]);
        assert!(choose(all, &[PathBuf::from("/srv")], "h").is_empty());
    }

    #[test]
    fn entries_changed_near_their_backup_start_are_not_trusted() {
        let file = |name: &str, ctime: i64, mtime: i64| {
            let mut e = TreeEntry::new(EntryKind::File, name.as_bytes().to_vec());
            (e.ctime_sec, e.mtime_sec) = (ctime, mtime);
            e
        };
        let mut stream = Vec::new();
        larder_store::encode_tree_header(&mut stream);
        for e in [
            file("a", 990, 990),
            file("b", 998, 900),
            file("c", 900, 2000),
            file("d", 997, 997),
            file("e", 997, 998),
        ] {
            e.encode(&mut stream);
        }
        stream.push(0);
        let trusted_before = minus((1000, 0), RACY_WINDOW);
        let kept: Vec<Vec<u8>> = trusted_entries(&stream, &[b""], trusted_before)
            .unwrap()
            .into_iter()
            .map(|(path, _)| path)
            .collect();
        assert_eq!(kept, [b"a".to_vec(), b"d".to_vec()]);
        // Half a second off the window's edge, to the nanosecond.
        assert_eq!(
            minus((1000, 200), Duration::from_millis(500)),
            (999, 500_000_200)
        );
    }

    /// An unchanged file takes its previous entry's attribute flags (it is not read);
    /// a file whose previous entry is marked as changed while read is never unchanged.
    #[test]
    fn unchanged_files_keep_their_flags_and_marked_ones_are_read_again() {
        let mut e = TreeEntry::new(EntryKind::File, b"f".to_vec());
        (e.size, e.mtime_sec, e.ctime_sec, e.inode) = (3, 5, 5, 9);
        e.chunks = vec![Fingerprint([1; 32])];
        e.attr_flags = 0x10;
        let decide = |prev: TreeEntry| {
            let previous = Previous {
                entries: HashMap::from([(b"f".to_vec(), PreviousEntry::new(prev))]),
                parents: Vec::new(),
            };
            let mut items = vec![Item {
                abs: PathBuf::from("/f"),
                entry: TreeEntry {
                    attr_flags: 0,
                    ..e.clone()
                },
            }];
            let d = previous
                .decide(&mut items, SkipRules::default(), |fps| {
                    Ok(vec![true; fps.len()])
                })
                .unwrap();
            (d.status[0], items[0].entry.attr_flags)
        };
        assert_eq!(decide(e.clone()), (Some(FileStatus::Unchanged), 0x10));
        let marked = TreeEntry {
            changed_while_read: true,
            ..e.clone()
        };
        assert_eq!(decide(marked), (Some(FileStatus::Changed), 0));
    }

    #[test]
    fn paths_are_under_roots_by_components() {
        assert!(is_under(b"home/me", b"home"));
        assert!(is_under(b"home", b"home"));
        assert!(!is_under(b"homes/x", b"home"));
        assert!(is_under(b"anything", b""));
    }
}
