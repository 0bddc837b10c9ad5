//! Walking the backup sources into the ordered list of tree entries.

use std::ffi::OsStr;
use std::fs::{self, Metadata};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use larder_store::{EntryKind, TreeEntry};

use crate::error::{EngineError, Result, Warning};

/// One entry to back up: where it is, and its tree entry without a recipe yet.
pub(crate) struct Item {
    pub abs: PathBuf,
    pub entry: TreeEntry,
}

pub(crate) fn entry_from_meta(kind: EntryKind, rel: Vec<u8>, meta: &Metadata) -> TreeEntry {
    TreeEntry {
        kind,
        path: rel,
        mode: meta.mode(),
        mtime_sec: meta.mtime(),
        mtime_nsec: meta.mtime_nsec() as u32,
        uid: meta.uid(),
        gid: meta.gid(),
        size: if kind == EntryKind::File {
            meta.len()
        } else {
            0
        },
        chunks: Vec::new(),
        target: Vec::new(),
    }
}

/// The snapshot path of an absolute path: its bytes without the leading `/`.
fn rel_of(abs: &Path) -> Vec<u8> {
    let bytes = abs.as_os_str().as_bytes();
    bytes.strip_prefix(b"/").unwrap_or(bytes).to_vec()
}

/// Lists every entry under `roots` in tree order (depth-first, each directory before
/// its contents, names sorted bytewise), with entries for the roots' parent
/// directories. Problems with single paths become warnings.
pub(crate) fn walk(roots: &[PathBuf], warnings: &mut Vec<Warning>) -> Result<Vec<Item>> {
    let mut abs_roots = Vec::new();
    for root in roots {
        let abs = std::path::absolute(root).map_err(|e| EngineError::io(root, e))?;
        let abs = normalize(&abs);
        fs::symlink_metadata(&abs).map_err(|e| EngineError::Source {
            path: root.clone(),
            reason: format!("cannot back up: {e}"),
        })?;
        abs_roots.push(abs);
    }
    abs_roots.sort();
    // A root inside an earlier root is already covered by it.
    let mut kept: Vec<PathBuf> = Vec::new();
    for r in abs_roots {
        if !kept.iter().any(|k| r.starts_with(k)) {
            kept.push(r);
        }
    }
    let mut items = Vec::new();
    let mut emitted_parents = std::collections::BTreeSet::new();
    for root in &kept {
        let mut parent = PathBuf::from("/");
        let components: Vec<&OsStr> = root.iter().skip(1).collect();
        for c in components.iter().take(components.len().saturating_sub(1)) {
            parent.push(c);
            if emitted_parents.insert(parent.clone()) {
                match fs::symlink_metadata(&parent) {
                    Ok(meta) => items.push(Item {
                        entry: entry_from_meta(EntryKind::Dir, rel_of(&parent), &meta),
                        abs: parent.clone(),
                    }),
                    Err(e) => warnings.push(Warning::error(&parent, e)),
                }
            }
        }
        visit(root, &mut items, warnings);
    }
    Ok(items)
}

/// Removes `.` and resolves `..` lexically, without following symlinks.
fn normalize(path: &Path) -> PathBuf {
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

fn visit(path: &Path, items: &mut Vec<Item>, warnings: &mut Vec<Warning>) {
    let meta = match fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) => {
            warnings.push(Warning::error(path, e));
            return;
        }
    };
    let rel = rel_of(path);
    let ft = meta.file_type();
    if rel.is_empty() {
        // The filesystem root itself: its children are the snapshot's top level.
        if ft.is_dir() {
            visit_children(path, items, warnings);
        }
        return;
    }
    if ft.is_file() {
        items.push(Item {
            entry: entry_from_meta(EntryKind::File, rel, &meta),
            abs: path.to_path_buf(),
        });
    } else if ft.is_symlink() {
        match fs::read_link(path) {
            Ok(target) => {
                let mut entry = entry_from_meta(EntryKind::Symlink, rel, &meta);
                entry.target = target.as_os_str().as_bytes().to_vec();
                items.push(Item {
                    entry,
                    abs: path.to_path_buf(),
                });
            }
            Err(e) => warnings.push(Warning::error(path, format!("cannot read symlink: {e}"))),
        }
    } else if ft.is_dir() {
        items.push(Item {
            entry: entry_from_meta(EntryKind::Dir, rel, &meta),
            abs: path.to_path_buf(),
        });
        visit_children(path, items, warnings);
    } else {
        warnings.push(Warning::notice(
            path,
            "skipped: special file (device, FIFO or socket) is not backed up",
        ));
    }
}

fn visit_children(dir: &Path, items: &mut Vec<Item>, warnings: &mut Vec<Warning>) {
    let entries = match fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) => {
            warnings.push(Warning::error(dir, format!("cannot read directory: {e}")));
            return;
        }
    };
    let mut names = Vec::new();
    for entry in entries {
        match entry {
            Ok(e) => names.push(e.file_name()),
            Err(e) => warnings.push(Warning::error(dir, format!("cannot list directory: {e}"))),
        }
    }
    names.sort_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
    for name in names {
        visit(&dir.join(name), items, warnings);
    }
}
