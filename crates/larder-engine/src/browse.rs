//! Reading one snapshot's tree for `ls` and `cat`: naming a path inside it, listing
//! what is at or below a path, writing one file's content.
//!
//! Any tree the decoder accepts is handled without panics: a damaged or crafted
//! snapshot may repeat paths, order them freely or omit parent directories, which no
//! backup writes (docs/design/format.md). Listing shows such a tree as it is; naming
//! one entry fails with an error where the path is not exactly one entry.

use std::fmt;
use std::io::Write;

use larder_store::{error_chain, EntryKind, Repository, Snapshot, TreeEntry};

use crate::error::{EngineError, Result};
use crate::names::{display_path, escape_name};
use crate::tree_io::{load_tree, ChunkReader};

/// A snapshot with its whole tree, read and verified.
pub struct SnapshotTree {
    /// The snapshot's full id (64 hex digits).
    pub id: String,
    pub snapshot: Snapshot,
    /// In stream order.
    pub entries: Vec<TreeEntry>,
}

impl SnapshotTree {
    /// Loads snapshot `name` (an id prefix or `latest`) and its tree stream, every
    /// chunk of which is verified against its fingerprint.
    pub fn load(repo: &Repository, name: &str) -> Result<Self> {
        let (id, snapshot) = repo.find_snapshot(name)?;
        let mut reader = ChunkReader::new(repo);
        let entries = load_tree(&mut reader, &snapshot.tree.fingerprints()?)?;
        Ok(Self {
            id,
            snapshot,
            entries,
        })
    }

    /// The first 8 digits of the id, as `larder snapshots` shows it.
    pub fn short_id(&self) -> &str {
        self.id.get(..8).unwrap_or(&self.id)
    }

    /// The entries at `path` or below it, in stream order; every entry for the root.
    /// Fails if there is none.
    pub fn list(&self, path: &SnapshotPath) -> Result<Vec<&TreeEntry>> {
        let found: Vec<&TreeEntry> = self
            .entries
            .iter()
            .filter(|e| path.contains(&e.path))
            .collect();
        if found.is_empty() && !path.is_root() {
            return Err(self.not_found(path));
        }
        Ok(found)
    }

    /// The one entry at `path`. Fails if there is none or more than one.
    pub fn entry(&self, path: &SnapshotPath) -> Result<&TreeEntry> {
        let mut at_path = self.entries.iter().filter(|e| e.path == path.0);
        match (at_path.next(), at_path.next()) {
            (Some(entry), None) => Ok(entry),
            (Some(_), Some(_)) => Err(EngineError::AmbiguousPath {
                path: path.to_string(),
                snapshot: self.short_id().to_string(),
                count: 2 + at_path.count(),
            }),
            (None, _) if path.is_root() => Err(EngineError::NotAFile {
                path: path.to_string(),
                snapshot: self.short_id().to_string(),
                what: "the snapshot's root directory".into(),
                advice: NOT_A_FILE_DIR,
            }),
            (None, _) => Err(self.not_found(path)),
        }
    }

    fn not_found(&self, path: &SnapshotPath) -> EngineError {
        EngineError::PathNotInSnapshot {
            path: path.to_string(),
            snapshot: self.short_id().to_string(),
        }
    }

    /// Writes the content of the file at `path` to `out` chunk by chunk, each chunk
    /// verified against its fingerprint before it is written, and returns the bytes
    /// written. Directories and symlinks are refused (a symlink is never followed). A
    /// missing or damaged chunk stops the output with an error after the chunks before
    /// it, and so does content whose length is not the size the snapshot records.
    pub fn write_file(
        &self,
        repo: &Repository,
        path: &SnapshotPath,
        out: &mut dyn Write,
    ) -> Result<u64> {
        let entry = self.entry(path)?;
        let snapshot = self.short_id().to_string();
        match entry.kind {
            EntryKind::File => {}
            EntryKind::Dir => {
                return Err(EngineError::NotAFile {
                    path: path.to_string(),
                    snapshot,
                    what: "a directory".into(),
                    advice: NOT_A_FILE_DIR,
                })
            }
            EntryKind::Symlink => {
                return Err(EngineError::NotAFile {
                    path: path.to_string(),
                    snapshot,
                    what: format!("a symlink to {}", escape_name(&entry.target)),
                    advice: "symlinks are not followed: give the path of the file it points to",
                })
            }
            EntryKind::Fifo | EntryKind::CharDevice | EntryKind::BlockDevice => {
                return Err(EngineError::NotAFile {
                    path: path.to_string(),
                    snapshot,
                    what: "a FIFO or device node".into(),
                    advice: "it holds no data: restore it with `larder restore --include`",
                })
            }
        }
        let damaged = |reason: String| EngineError::DamagedEntry {
            path: path.to_string(),
            snapshot: snapshot.clone(),
            reason,
        };
        let write_error = |source| EngineError::Write {
            path: path.to_string(),
            source,
        };
        let mut reader = ChunkReader::new(repo);
        let mut buf = Vec::new();
        let mut written = 0u64;
        for (i, fp) in entry.chunks.iter().enumerate() {
            buf.clear();
            reader.read_into(fp, &mut buf).map_err(|e| {
                damaged(format!(
                    "chunk {} of {} cannot be read: {}",
                    i + 1,
                    entry.chunks.len(),
                    error_chain(&e)
                ))
            })?;
            out.write_all(&buf).map_err(write_error)?;
            written += buf.len() as u64;
        }
        out.flush().map_err(write_error)?;
        if written != entry.size {
            return Err(damaged(format!(
                "its chunks hold {written} bytes but the snapshot records {}",
                entry.size
            )));
        }
        Ok(written)
    }
}

const NOT_A_FILE_DIR: &str =
    "only a file's content can be written: list it with `larder ls`, or restore it with `larder restore --include`";

/// A path inside a snapshot, as given on the command line: components separated by
/// `/`, with or without a leading `/` (the source path it was backed up from).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotPath(Vec<u8>);

impl SnapshotPath {
    /// The snapshot's root: every entry is below it.
    pub fn root() -> Self {
        Self(Vec::new())
    }

    /// Normalizes `arg`: empty and `.` components are dropped, so `/`, `` and `.` name
    /// the root and `/a//b/` names `a/b`. A `..` component is refused: snapshot paths
    /// never hold one, and resolving it would need to follow symlinks.
    pub fn parse(arg: &[u8]) -> Result<Self> {
        let mut path = Vec::with_capacity(arg.len());
        for component in arg.split(|&b| b == b'/') {
            match component {
                b"" | b"." => {}
                b".." => {
                    return Err(EngineError::InvalidSnapshotPath {
                        path: escape_name(arg),
                        reason: "`..` is not allowed; give the path from the snapshot root, as `larder ls` shows it".into(),
                    })
                }
                name => {
                    if !path.is_empty() {
                        path.push(b'/');
                    }
                    path.extend_from_slice(name);
                }
            }
        }
        Ok(Self(path))
    }

    pub fn is_root(&self) -> bool {
        self.0.is_empty()
    }

    /// The path as stored in a tree stream (no leading `/`; empty for the root).
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// Whether `entry_path` is this path or below it.
    fn contains(&self, entry_path: &[u8]) -> bool {
        self.is_root()
            || entry_path
                .strip_prefix(self.0.as_slice())
                .is_some_and(|rest| rest.is_empty() || rest.starts_with(b"/"))
    }
}

impl fmt::Display for SnapshotPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&display_path(&self.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_normalized_with_or_without_leading_slash() {
        for (arg, stored) in [
            ("/home/me", "home/me"),
            ("home/me", "home/me"),
            ("//home//me/", "home/me"),
            ("./home/./me", "home/me"),
            ("/", ""),
            ("", ""),
            (".", ""),
        ] {
            assert_eq!(
                SnapshotPath::parse(arg.as_bytes()).unwrap().as_bytes(),
                stored.as_bytes(),
                "{arg:?}"
            );
        }
        assert!(SnapshotPath::parse(b"/home/../etc").is_err());
        let err = SnapshotPath::parse(b"\xff\x1b[2J/../etc")
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with(r#"invalid snapshot path "\xff\x1b[2J/../etc""#),
            "{err}"
        );
    }

    #[test]
    fn contains_means_the_path_or_below_it() {
        let p = SnapshotPath::parse(b"home/me").unwrap();
        assert!(p.contains(b"home/me"));
        assert!(p.contains(b"home/me/a"));
        assert!(!p.contains(b"home/meat"));
        assert!(!p.contains(b"home"));
        assert!(SnapshotPath::root().contains(b"anything"));
    }
}
