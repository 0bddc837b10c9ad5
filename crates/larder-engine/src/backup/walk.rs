//! Walking the backup sources into the ordered list of tree entries, leaving out what
//! exclude patterns and `.larderignore` files select (docs/design/patterns.md).

use std::ffi::OsStr;
use std::fs::{self, FileType, Metadata};
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use larder_store::{EntryKind, TreeEntry};

use crate::error::{EngineError, Result, Warning};
use crate::meta::{read_xattrs, Owners};
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
    /// Record extended attributes (ACLs included).
    pub xattrs: bool,
}

/// Lists every entry under `roots` (from [`source_roots`]) in tree order (depth-first, each directory before
/// its contents, names sorted bytewise), with entries for the roots' parent
/// directories, each with its owner names and (if asked) extended attributes.
/// Entries that `exclude` (matched against snapshot paths) or a `.larderignore` file
/// selects are left out without being read; an excluded directory is not listed.
/// Sockets are skipped with a notice. Problems with single paths become warnings.
pub(crate) fn walk(
    roots: &[PathBuf],
    opts: &WalkOptions<'_>,
    warnings: &mut Vec<Warning>,
) -> Result<Walked> {
    let exclude = opts.exclude;
    let mut kept = Vec::new();
    for root in roots {
        let meta = fs::symlink_metadata(root).map_err(|e| EngineError::Source {
            path: root.clone(),
            reason: format!("cannot back up: {e}"),
        })?;
        kept.push((root.clone(), meta.is_dir()));
    }
    let mut walker = Walker {
        items: Vec::new(),
        warnings,
        exclude,
        xattrs: opts.xattrs,
        owners: Owners::default(),
        ignore_files: Vec::new(),
        excluded: 0,
    };
    let mut emitted_parents = std::collections::BTreeSet::new();
    for (root, is_dir) in &kept {
        // The roots' parents are not scanned, so only `exclude` applies to a root, and
        // to it as to any path: through its parent directories too.
        if exclude.selects(&rel_of(root), *is_dir) {
            walker.excluded += 1;
            walker.warnings.push(Warning::notice(
                root,
                "not backed up: it matches an exclude pattern",
            ));
            continue;
        }
        let mut parent = PathBuf::from("/");
        let components: Vec<&OsStr> = root.iter().skip(1).collect();
        for c in components.iter().take(components.len().saturating_sub(1)) {
            parent.push(c);
            if emitted_parents.insert(parent.clone()) {
                match fs::symlink_metadata(&parent) {
                    Ok(meta) => {
                        let entry = entry_from_meta(EntryKind::Dir, rel_of(&parent), &meta);
                        walker.push(&parent, entry);
                    }
                    Err(e) => walker.warnings.push(Warning::error(&parent, e)),
                }
            }
        }
        walker.visit(root);
    }
    Ok(Walked {
        items: walker.items,
        excluded: walker.excluded,
    })
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

struct Walker<'a> {
    items: Vec<Item>,
    warnings: &'a mut Vec<Warning>,
    exclude: &'a PatternList,
    xattrs: bool,
    owners: Owners,
    /// The `.larderignore` files of the directories being visited, outermost first:
    /// the depth in components of the directory holding each, and its patterns.
    ignore_files: Vec<(usize, PatternList)>,
    excluded: u64,
}

impl Walker<'_> {
    /// Adds the entry at `path`, with its owner names and extended attributes.
    fn push(&mut self, path: &Path, mut entry: TreeEntry) {
        entry.user = self.owners.user(entry.uid);
        entry.group = self.owners.group(entry.gid);
        if self.xattrs {
            match read_xattrs(path) {
                Ok(xattrs) => entry.xattrs = xattrs,
                Err(e) => self.warnings.push(Warning::error(
                    path,
                    format!("cannot read extended attributes: {e}"),
                )),
            }
        }
        self.items.push(Item {
            entry,
            abs: path.to_path_buf(),
        });
    }

    /// Whether `rel` (a snapshot path whose parent directory is not excluded) is
    /// excluded: by `exclude`, or by the `.larderignore` files above it, in which the
    /// last matching pattern decides and a deeper file's patterns come later.
    fn is_excluded(&self, rel: &[u8], is_dir: bool) -> bool {
        if self.exclude.is_empty() && self.ignore_files.is_empty() {
            return false;
        }
        let units = PathUnits::new(rel);
        if self.exclude.decide(units.all(), is_dir) == Some(true) {
            return true;
        }
        // The deepest file with an opinion decides.
        let by_files = self
            .ignore_files
            .iter()
            .rev()
            .find_map(|(depth, list)| list.decide(units.below(*depth), is_dir));
        by_files == Some(true)
    }

    fn visit(&mut self, path: &Path) {
        let meta = match fs::symlink_metadata(path) {
            Ok(m) => m,
            Err(e) => {
                self.warnings.push(Warning::error(path, e));
                return;
            }
        };
        let rel = rel_of(path);
        let ft = meta.file_type();
        if rel.is_empty() {
            // The filesystem root itself: its children are the snapshot's top level.
            if ft.is_dir() {
                self.visit_children(path, 0);
            }
            return;
        }
        let Some(kind) = kind_of(ft) else {
            self.warnings
                .push(Warning::notice(path, "skipped: a socket is not backed up"));
            return;
        };
        let mut entry = entry_from_meta(kind, rel, &meta);
        if kind == EntryKind::Symlink {
            match fs::read_link(path) {
                Ok(target) => entry.target = target.as_os_str().as_bytes().to_vec(),
                Err(e) => {
                    self.warnings
                        .push(Warning::error(path, format!("cannot read symlink: {e}")));
                    return;
                }
            }
        }
        let depth = entry.path.split(|&b| b == b'/').count();
        self.push(path, entry);
        if kind == EntryKind::Dir {
            self.visit_children(path, depth);
        }
    }

    /// Visits the children of `dir` (`depth` components below the snapshot root) that
    /// are not excluded, with the patterns of its `.larderignore` file in force.
    fn visit_children(&mut self, dir: &Path, depth: usize) {
        let entries = match fs::read_dir(dir) {
            Ok(rd) => rd,
            Err(e) => {
                self.warnings
                    .push(Warning::error(dir, format!("cannot read directory: {e}")));
                return;
            }
        };
        let mut children = Vec::new();
        for entry in entries {
            match entry {
                // The type comes from the directory listing where the filesystem
                // gives it, so an excluded entry is not even stat'ed.
                Ok(e) => children.push((e.file_name(), e.file_type().ok())),
                Err(e) => self
                    .warnings
                    .push(Warning::error(dir, format!("cannot list directory: {e}"))),
            }
        }
        children.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
        let ignore_file = children
            .iter()
            .find(|(name, _)| name == IGNORE_FILE_NAME)
            .and_then(|(_, file_type)| self.read_ignore_file(dir, *file_type));
        let pushed = ignore_file.is_some();
        if let Some(list) = ignore_file {
            self.ignore_files.push((depth, list));
        }
        for (name, file_type) in children {
            let path = dir.join(name);
            let is_dir = file_type.is_some_and(|t| t.is_dir());
            if self.is_excluded(&rel_of(&path), is_dir) {
                self.excluded += 1;
                continue;
            }
            self.visit(&path);
        }
        if pushed {
            self.ignore_files.pop();
        }
    }

    /// The patterns of `dir`'s `.larderignore`. A file that is not a regular file is
    /// not followed (like git, which never follows a symlinked `.gitignore`); an
    /// unreadable file or an invalid line is an error warning, so the backup is
    /// reported partial: it may hold entries the file meant to exclude.
    fn read_ignore_file(&mut self, dir: &Path, file_type: Option<FileType>) -> Option<PatternList> {
        let path = dir.join(IGNORE_FILE_NAME);
        if !file_type.is_some_and(|t| t.is_file()) {
            self.warnings.push(Warning::notice(
                &path,
                "not a regular file, so its patterns are not applied (symlinks are not followed)",
            ));
            return None;
        }
        let text = match read_nofollow(&path) {
            Ok(text) => text,
            Err(e) => {
                self.warnings.push(Warning::error(
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
                Err(e) => self.warnings.push(Warning::error(
                    &path,
                    format!("line {line}: {e}; line skipped"),
                )),
            }
        }
        Some(PatternList::new(patterns))
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
