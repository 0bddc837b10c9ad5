//! Walking the backup sources into the ordered list of tree entries, leaving out what
//! exclude patterns, `.larderignore` files and tag files select
//! (docs/design/patterns.md), and, with `--one-file-system`, what lies on other file
//! systems than each source's.
//!
//! Directories are listed on several threads (subdirectories in parallel, their
//! listings put back in order), and each entry is `lstat`ed relative to its open
//! directory (`DirEntry::metadata`, `statx` on the directory's descriptor), so the
//! kernel does not walk the whole path again for every entry; a directory is listed
//! only if it is the one its parent's listing saw ([`open_listed_dir`]). The walk needs nothing
//! from earlier snapshots, so it runs while they load; [`complete`] then gives each
//! entry its extended attributes and symlink target, from its previous entry when
//! that is the same inode with the same ctime (changing either changes the ctime;
//! docs/design/nightly.md), else by reading them.

use std::ffi::{OsStr, OsString};
use std::fs::{self, DirEntry, FileType, Metadata};
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use larder_store::{EntryKind, TreeEntry};
use rayon::prelude::*;

use super::exclude_tags::{tagged, ExcludeTag};
use super::lock;
use super::previous::{Previous, SkipRules};
use crate::error::{EngineError, Result, Warning};
use crate::meta::{read_dir_attr_flags, read_xattrs, Owners};
use crate::pattern::{parse_pattern_file, PathUnits, PatternList};

/// One entry to back up: where it is, and its tree entry without a recipe yet.
pub(crate) struct Item {
    pub abs: PathBuf,
    pub entry: TreeEntry,
}

/// The entry `lstat` describes: everything but names, attributes, recipe and target.
pub(crate) fn entry_from_meta(kind: EntryKind, rel: Vec<u8>, meta: &Metadata) -> TreeEntry {
    let mut e = TreeEntry::new(kind, rel);
    set_stat(&mut e, meta);
    e
}

/// Sets the fields of `e` that `lstat` (or `fstat`) gives.
pub(crate) fn set_stat(e: &mut TreeEntry, meta: &Metadata) {
    e.mode = meta.mode();
    e.mtime_sec = meta.mtime();
    e.mtime_nsec = meta.mtime_nsec() as u32;
    e.ctime_sec = meta.ctime();
    e.ctime_nsec = meta.ctime_nsec() as u32;
    e.uid = meta.uid();
    e.gid = meta.gid();
    e.size = if e.kind == EntryKind::File {
        meta.len()
    } else {
        0
    };
    e.inode = meta.ino();
    e.device = meta.dev();
    e.nlink = u32::try_from(meta.nlink()).unwrap_or(u32::MAX);
    if e.kind.is_device() {
        e.rdev = meta.rdev();
    }
}

/// The kind of entry a file type is backed up as; `None` for sockets, which are not.
fn kind_of(ft: FileType) -> Option<EntryKind> {
    Some(if ft.is_file() {
        EntryKind::File
    } else if ft.is_dir() {
        EntryKind::Dir
    } else if ft.is_symlink() {
        EntryKind::Symlink
    } else if ft.is_fifo() {
        EntryKind::Fifo
    } else if ft.is_char_device() {
        EntryKind::CharDevice
    } else if ft.is_block_device() {
        EntryKind::BlockDevice
    } else {
        return None;
    })
}

/// The snapshot path of an absolute path: its bytes without the leading `/`.
fn rel_of(abs: &Path) -> Vec<u8> {
    let bytes = abs.as_os_str().as_bytes();
    bytes.strip_prefix(b"/").unwrap_or(bytes).to_vec()
}

/// The name of the per-directory pattern file (docs/design/patterns.md).
const IGNORE_FILE_NAME: &str = ".larderignore";

/// What the walk found: the entries to back up, and how many entries patterns left out.
pub(crate) struct Walked {
    pub items: Vec<Item>,
    pub excluded: u64,
}

/// What the walk records and leaves out.
pub(crate) struct WalkOptions<'a> {
    /// Patterns matched against snapshot paths; `.larderignore` files add their own.
    pub exclude: &'a PatternList,
    /// Tag files that exclude the other contents of the directory holding them.
    pub exclude_tags: &'a [ExcludeTag],
    /// Stay on each root's file system: a directory on another one (a mount point) is
    /// recorded, its contents are not.
    pub one_file_system: bool,
    /// The threads that list directories.
    pub threads: &'a rayon::ThreadPool,
}

/// The roots (from [`source_roots`]) that exist, each with its `lstat`. A root that
/// does not (or cannot be `lstat`ed) is an error warning: the backup saves the others
/// and is partial. Fails if no root exists.
pub(crate) fn existing_roots(
    roots: Vec<PathBuf>,
    warnings: &mut Vec<Warning>,
) -> Result<Vec<(PathBuf, Metadata)>> {
    let mut kept = Vec::new();
    let mut missing = Vec::new();
    for root in roots {
        match fs::symlink_metadata(&root) {
            Ok(meta) => kept.push((root, meta)),
            Err(e) => missing.push((root, e)),
        }
    }
    if kept.is_empty() {
        let others = missing.len().saturating_sub(1);
        let Some((path, e)) = missing.into_iter().next() else {
            return Err(EngineError::Source {
                path: PathBuf::new(),
                reason: "no source path given".into(),
            });
        };
        let reason = match others {
            0 => format!("cannot back up: {e}"),
            n => format!("cannot back up: {e}; and none of the {n} other source paths exists"),
        };
        return Err(EngineError::Source { path, reason });
    }
    for (root, e) in missing {
        warnings.push(Warning::error(
            root,
            format!("cannot back up: {e}; the other source paths are saved"),
        ));
    }
    Ok(kept)
}

/// Lists every entry under `roots` (from [`existing_roots`]) in tree order
/// (depth-first, each directory before its contents, names sorted bytewise), with
/// entries for the roots' parent directories, each with its `lstat` fields and owner
/// names (extended attributes, symlink targets and directories' attribute flags come
/// from [`complete`]). Entries that `exclude` (matched against snapshot paths) or a
/// `.larderignore` file selects are left out without being read; an excluded
/// directory is not listed. Sockets are skipped with a notice. Problems with single
/// paths become warnings.
///
/// A root's parent directories are recorded as the directories they resolve to (as
/// `stat` follows symlinks), so that the root restores at the path it was given even
/// where a parent is a symlink (`/lib` to `usr/lib`); a root that is itself a symlink
/// is recorded as the symlink.
pub(crate) fn walk(
    roots: &[(PathBuf, Metadata)],
    opts: &WalkOptions<'_>,
    warnings: &mut Vec<Warning>,
) -> Result<Walked> {
    let walker = Walker {
        opts,
        owners: Mutex::new(Owners::default()),
    };
    let mut out = Listing::default();
    let mut emitted_parents = std::collections::BTreeSet::new();
    for (root, meta) in roots {
        let root = root.clone();
        // The roots' parents are not scanned, so only `exclude` applies to a root, and
        // to it as to any path: through its parent directories too.
        if opts.exclude.selects(&rel_of(&root), meta.is_dir()) {
            out.excluded += 1;
            out.warnings.push(Warning::notice(
                &root,
                "not backed up: it matches an exclude pattern",
            ));
            continue;
        }
        let mut parent = PathBuf::from("/");
        let components: Vec<&OsStr> = root.iter().skip(1).collect();
        for c in components.iter().take(components.len().saturating_sub(1)) {
            parent.push(c);
            if emitted_parents.insert(parent.clone()) {
                walker.add_parent(&mut out, &parent);
            }
        }
        walker.visit_root(&mut out, root, meta);
    }
    warnings.extend(std::mem::take(&mut out.warnings));
    let excluded = out.excluded_total();
    let mut items = Vec::with_capacity(out.count());
    out.flatten_into(&mut items, warnings);
    Ok(Walked { items, excluded })
}

/// The sources of a backup as the walk takes them: absolute, normalized, sorted, and
/// without those inside another (already covered by it).
pub(super) fn source_roots(paths: &[PathBuf]) -> Result<Vec<PathBuf>> {
    let mut roots = Vec::new();
    for path in paths {
        let abs = std::path::absolute(path).map_err(|e| EngineError::io(path, e))?;
        roots.push(normalize(&abs));
    }
    roots.sort();
    let mut kept: Vec<PathBuf> = Vec::new();
    for root in roots {
        if !kept.iter().any(|k| root.starts_with(k)) {
            kept.push(root);
        }
    }
    Ok(kept)
}

/// Removes `.` and resolves `..` lexically, without following symlinks.
pub(super) fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// What the walk found below one directory, in tree order, its subdirectories'
/// listings nested.
#[derive(Default)]
struct Listing {
    nodes: Vec<Node>,
    warnings: Vec<Warning>,
    excluded: u64,
}

enum Node {
    Item(Item),
    Below(Listing),
}

impl Listing {
    fn count(&self) -> usize {
        self.nodes
            .iter()
            .map(|n| match n {
                Node::Item(_) => 1,
                Node::Below(l) => l.count(),
            })
            .sum()
    }

    /// Moves every item, in order, into `items`, and every warning into `warnings`.
    fn flatten_into(self, items: &mut Vec<Item>, warnings: &mut Vec<Warning>) {
        warnings.extend(self.warnings);
        for node in self.nodes {
            match node {
                Node::Item(item) => items.push(item),
                Node::Below(listing) => listing.flatten_into(items, warnings),
            }
        }
    }

    fn excluded_total(&self) -> u64 {
        self.excluded
            + self
                .nodes
                .iter()
                .map(|n| match n {
                    Node::Below(l) => l.excluded_total(),
                    Node::Item(_) => 0,
                })
                .sum::<u64>()
    }
}

/// The `.larderignore` files of the directories above, outermost first: the depth in
/// components of the directory holding each, and its patterns.
type IgnoreFiles = Vec<(usize, Arc<PatternList>)>;

/// An entry of a directory being listed: its name, its type where the listing gives
/// it, and the listing's entry.
type Child = (OsString, Option<FileType>, DirEntry);

/// Where a directory being listed lies.
#[derive(Clone)]
struct Scope {
    /// Components below the snapshot root.
    depth: usize,
    /// The `.larderignore` files in force.
    ignore_files: IgnoreFiles,
    /// With `--one-file-system`, the root's device: directories on another are not
    /// listed.
    device: Option<u64>,
}

struct Walker<'a> {
    opts: &'a WalkOptions<'a>,
    owners: Mutex<Owners>,
}

impl Walker<'_> {
    /// Makes the entry at `path` (`meta` its `lstat`), with its owner names; `None`
    /// for a socket (with a notice).
    fn entry(
        &self,
        path: &Path,
        meta: &Metadata,
        warnings: &mut Vec<Warning>,
    ) -> Option<TreeEntry> {
        let Some(kind) = kind_of(meta.file_type()) else {
            warnings.push(Warning::notice(path, "skipped: a socket is not backed up"));
            return None;
        };
        let mut entry = entry_from_meta(kind, rel_of(path), meta);
        let mut owners = lock(&self.owners);
        entry.user = owners.user(entry.uid);
        entry.group = owners.group(entry.gid);
        Some(entry)
    }

    /// Adds the entry at `path` to `out`.
    fn add(&self, out: &mut Listing, path: PathBuf, meta: &Metadata) {
        if let Some(entry) = self.entry(&path, meta, &mut out.warnings) {
            out.nodes.push(Node::Item(Item { abs: path, entry }));
        }
    }

    /// Adds a root's parent directory `path` as the directory it resolves to: with
    /// the metadata `stat` gives, its attributes read there (`abs` is the resolved
    /// path).
    fn add_parent(&self, out: &mut Listing, path: &Path) {
        let resolved = fs::canonicalize(path).and_then(|abs| Ok((fs::metadata(&abs)?, abs)));
        match resolved {
            Ok((meta, abs)) if meta.is_dir() => {
                if let Some(entry) = self.entry(path, &meta, &mut out.warnings) {
                    out.nodes.push(Node::Item(Item { abs, entry }));
                }
            }
            Ok(_) => out.warnings.push(Warning::error(
                path,
                "not a directory, yet a source path lies below it",
            )),
            Err(e) => out.warnings.push(Warning::error(path, e)),
        }
    }

    /// Adds a root and everything below it.
    fn visit_root(&self, out: &mut Listing, root: PathBuf, meta: &Metadata) {
        let scope = |depth| Scope {
            depth,
            ignore_files: IgnoreFiles::new(),
            device: self.opts.one_file_system.then(|| meta.dev()),
        };
        if root.as_os_str() == "/" {
            // The filesystem root itself: its children are the snapshot's top level.
            if meta.is_dir() {
                let below = self.list(&root, meta, &scope(0));
                out.nodes.push(Node::Below(below));
            }
            return;
        }
        let depth = root.iter().count() - 1;
        let is_dir = meta.is_dir();
        self.add(out, root.clone(), meta);
        if is_dir && matches!(out.nodes.last(), Some(Node::Item(item)) if item.abs == root) {
            let below = self.list(&root, meta, &scope(depth));
            out.nodes.push(Node::Below(below));
        }
    }

    /// Lists the children of `dir` (`walked`: its `lstat` when its parent was
    /// listed) that are not excluded, with `dir`'s `.larderignore` patterns in force,
    /// and the subdirectories' contents, these on the walk's threads. A directory
    /// tagged by a tag file keeps its tag files only; one on another file system than
    /// `scope.device` is not listed.
    fn list(&self, dir: &Path, walked: &Metadata, scope: &Scope) -> Listing {
        let mut out = Listing::default();
        let mut children: Vec<Child> = Vec::new();
        match open_listed_dir(dir, walked).and_then(|opened| read_dir_of(&opened, dir)) {
            Ok(entries) => {
                for entry in entries {
                    match entry {
                        // The type comes from the directory listing where the file
                        // system gives it, so an excluded entry is not even stat'ed.
                        Ok(e) => children.push((e.file_name(), e.file_type().ok(), e)),
                        Err(e) => out
                            .warnings
                            .push(Warning::error(dir, format!("cannot list directory: {e}"))),
                    }
                }
            }
            Err(e) => {
                out.warnings
                    .push(Warning::error(dir, format!("cannot read directory: {e}")));
                return out;
            }
        }
        children.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
        self.keep_tags_only_if_tagged(dir, &mut children, &mut out);
        let mut here = Scope {
            depth: scope.depth + 1,
            ..scope.clone()
        };
        if let Some((_, file_type, _)) = children
            .iter()
            .find(|(name, _, _)| name == IGNORE_FILE_NAME)
        {
            if let Some(list) = read_ignore_file(dir, *file_type, &mut out.warnings) {
                here.ignore_files.push((scope.depth, Arc::new(list)));
            }
        }
        let mut subdirs = Vec::new();
        for (name, file_type, dir_entry) in children {
            let path = dir.join(name);
            let is_dir = file_type.is_some_and(|t| t.is_dir());
            if self.is_excluded(&rel_of(&path), is_dir, &here.ignore_files) {
                out.excluded += 1;
                continue;
            }
            // Relative to the directory's open descriptor (no path walk).
            let meta = match dir_entry.metadata() {
                Ok(m) => m,
                Err(e) => {
                    out.warnings.push(Warning::error(&path, e));
                    continue;
                }
            };
            let elsewhere = scope.device.is_some_and(|dev| dev != meta.dev());
            if elsewhere && !meta.is_dir() {
                // A file mounted over another (a bind mount), left out as the
                // contents of a directory on another file system are.
                out.excluded += 1;
                continue;
            }
            let Some(entry) = self.entry(&path, &meta, &mut out.warnings) else {
                continue;
            };
            if entry.kind == EntryKind::Dir {
                if elsewhere {
                    // A mount point: recorded, its contents not (one excluded entry).
                    out.excluded += 1;
                } else {
                    subdirs.push((path.clone(), meta));
                }
            }
            out.nodes.push(Node::Item(Item { abs: path, entry }));
        }
        let listings: Vec<Listing> = self.opts.threads.install(|| {
            subdirs
                .par_iter()
                .map(|(dir, meta)| self.list(dir, meta, &here))
                .collect()
        });
        // Each listed subdirectory's listing goes right after its own entry.
        let mut listings = subdirs.iter().map(|(dir, _)| dir).zip(listings).peekable();
        let nodes = std::mem::take(&mut out.nodes);
        for node in nodes {
            let listed = match &node {
                Node::Item(item) => listings.next_if(|(dir, _)| **dir == item.abs),
                Node::Below(_) => None,
            };
            out.nodes.push(node);
            out.nodes
                .extend(listed.map(|(_, listing)| Node::Below(listing)));
        }
        out
    }

    /// If `dir` is tagged by one of the tag files in force, leaves only those tag files
    /// in `children` (the others count as excluded).
    fn keep_tags_only_if_tagged(&self, dir: &Path, children: &mut Vec<Child>, out: &mut Listing) {
        if self.opts.exclude_tags.is_empty() {
            return;
        }
        let names = children.iter().map(|(n, t, _)| (n.as_os_str(), *t));
        let tags: Vec<OsString> = tagged(dir, names, self.opts.exclude_tags, &mut out.warnings)
            .into_iter()
            .map(OsStr::to_os_string)
            .collect();
        if !tags.is_empty() {
            let before = children.len();
            children.retain(|(name, _, _)| tags.contains(name));
            out.excluded += (before - children.len()) as u64;
        }
    }

    /// Whether `rel` (a snapshot path whose parent directory is not excluded) is
    /// excluded: by `exclude`, or by the `.larderignore` files above it, in which the
    /// last matching pattern decides and a deeper file's patterns come later.
    fn is_excluded(&self, rel: &[u8], is_dir: bool, ignore_files: &IgnoreFiles) -> bool {
        if self.opts.exclude.is_empty() && ignore_files.is_empty() {
            return false;
        }
        let units = PathUnits::new(rel);
        if self.opts.exclude.decide(units.all(), is_dir) == Some(true) {
            return true;
        }
        // The deepest file with an opinion decides.
        let by_files = ignore_files
            .iter()
            .rev()
            .find_map(|(depth, list)| list.decide(units.below(*depth), is_dir));
        by_files == Some(true)
    }
}

/// The patterns of `dir`'s `.larderignore`. A file that is not a regular file is not
/// followed (like git, which never follows a symlinked `.gitignore`); an unreadable
/// file or an invalid line is an error warning, so the backup is reported partial: it
/// may hold entries the file meant to exclude.
fn read_ignore_file(
    dir: &Path,
    file_type: Option<FileType>,
    warnings: &mut Vec<Warning>,
) -> Option<PatternList> {
    let path = dir.join(IGNORE_FILE_NAME);
    if !file_type.is_some_and(|t| t.is_file()) {
        warnings.push(Warning::notice(
            &path,
            "not a regular file, so its patterns are not applied (symlinks are not followed)",
        ));
        return None;
    }
    let text = match read_nofollow(&path) {
        Ok(text) => text,
        Err(e) => {
            warnings.push(Warning::error(
                &path,
                format!("cannot read: {e}; its patterns are not applied"),
            ));
            return None;
        }
    };
    let mut patterns = Vec::new();
    for (line, parsed) in parse_pattern_file(&text) {
        match parsed {
            Ok(pattern) => patterns.push(pattern),
            Err(e) => warnings.push(Warning::error(
                &path,
                format!("line {line}: {e}; line skipped"),
            )),
        }
    }
    Some(PatternList::new(patterns))
}

/// Opens the directory at `dir` for listing, refusing one that is not the directory
/// its parent's listing saw (`walked`, by device and inode): a user who can write
/// beside it may have swapped it, or a directory above it, for a symlink since, and
/// the walk must not list what that leads to (a root backup, or a cluster job bound
/// to granted paths, would store files its caller may not read).
fn open_listed_dir(dir: &Path, walked: &Metadata) -> std::io::Result<fs::File> {
    let opened = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW)
        .open(dir)?;
    let now = opened.metadata()?;
    if (now.dev(), now.ino()) != (walked.dev(), walked.ino()) {
        return Err(std::io::Error::other(
            "it is another directory than the one listed (it or a directory above it \
             was replaced since)",
        ));
    }
    Ok(opened)
}

/// The entries of the open directory `opened` (at `dir`), listed through its
/// descriptor (`/proc/self/fd/N`), so that the path is not looked up again; by
/// `dir` where `/proc` is not mounted.
fn read_dir_of(opened: &fs::File, dir: &Path) -> std::io::Result<fs::ReadDir> {
    use std::os::fd::AsRawFd;
    let by_fd = PathBuf::from(format!("/proc/self/fd/{}", opened.as_raw_fd()));
    match fs::read_dir(&by_fd) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => fs::read_dir(dir),
        other => other,
    }
}

fn read_nofollow(path: &Path) -> std::io::Result<Vec<u8>> {
    let mut file = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)?;
    let mut text = Vec::new();
    file.read_to_end(&mut text)?;
    Ok(text)
}

/// Completes walked entries with their extended attributes (if `xattrs`), symlink
/// targets and directories' attribute flags, on `threads`: taken from the previous
/// entry when it is the same inode in the same state ([`Previous::same_inode`]), read
/// otherwise. An entry whose symlink target cannot be read is dropped with a warning;
/// one whose attributes cannot be read is kept without them, with a warning. Files'
/// attribute flags are left 0 here: stage 1 reads them from the descriptor it reads
/// the file through, and an unchanged file, not read, takes its previous entry's
/// (`Previous::decide`).
pub(crate) fn complete(
    items: &mut Vec<Item>,
    previous: &Previous,
    rules: SkipRules,
    xattrs: bool,
    threads: &rayon::ThreadPool,
) -> Vec<Warning> {
    let outcomes: Vec<(bool, Option<Warning>)> = threads.install(|| {
        items
            .par_iter_mut()
            .with_min_len(64)
            .map(|item| complete_one(item, previous, rules, xattrs))
            .collect()
    });
    let mut keep = outcomes.iter().map(|(keep, _)| *keep);
    items.retain(|_| keep.next().unwrap_or(true));
    outcomes.into_iter().filter_map(|(_, w)| w).collect()
}

/// Completes one entry; `false` when it must be dropped.
fn complete_one(
    item: &mut Item,
    previous: &Previous,
    rules: SkipRules,
    xattrs: bool,
) -> (bool, Option<Warning>) {
    let entry = &mut item.entry;
    if let Some(prev) = previous.same_inode(entry, rules) {
        if xattrs {
            entry.xattrs.clone_from(&prev.xattrs);
        }
        entry.target.clone_from(&prev.target);
        if entry.kind == EntryKind::Dir {
            entry.attr_flags = prev.attr_flags;
        }
        return (true, None);
    }
    if entry.kind == EntryKind::Dir {
        entry.attr_flags = read_dir_attr_flags(&item.abs);
    }
    let mut warning = None;
    if xattrs {
        match read_xattrs(&item.abs) {
            Ok(found) => entry.xattrs = found,
            Err(e) => {
                let w = Warning::error(&item.abs, format!("cannot read extended attributes: {e}"));
                warning = Some(w);
            }
        }
    }
    if entry.kind == EntryKind::Symlink {
        match fs::read_link(&item.abs) {
            Ok(target) => entry.target = target.as_os_str().as_bytes().to_vec(),
            Err(e) => {
                let w = Warning::error(&item.abs, format!("cannot read symlink: {e}"));
                return (false, Some(w));
            }
        }
    }
    (true, warning)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Guards against listing what a directory swapped for a symlink since its
    /// parent was listed leads to: the swapped directory itself, or one above it.
    #[test]
    fn a_directory_swapped_since_it_was_listed_is_not_listed() {
        let dir = tempfile::tempdir().unwrap();
        let shared = dir.path().join("shared");
        fs::create_dir_all(shared.join("sub")).unwrap();
        fs::create_dir_all(dir.path().join("secret/sub")).unwrap();
        let walked = [
            fs::symlink_metadata(&shared).unwrap(),
            fs::symlink_metadata(shared.join("sub")).unwrap(),
        ];
        assert!(open_listed_dir(&shared, &walked[0]).is_ok());
        fs::rename(&shared, dir.path().join("moved")).unwrap();
        std::os::unix::fs::symlink(dir.path().join("secret"), &shared).unwrap();
        for (path, meta) in [
            (shared.clone(), &walked[0]),
            (shared.join("sub"), &walked[1]),
        ] {
            let e = open_listed_dir(&path, meta).expect_err("a swapped directory was opened");
            let refused = matches!(e.raw_os_error(), Some(libc::ELOOP | libc::ENOTDIR))
                || e.to_string().contains("another directory");
            assert!(refused, "{}: {e}", path.display());
        }
    }
}
