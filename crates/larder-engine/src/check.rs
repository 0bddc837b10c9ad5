//! Checking a repository: structure always, chunk data with `read_data`.
//!
//! Damage found in a container is traced to the snapshots and files that use the
//! damaged chunks, so the report says what a restore would lose.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::Arc;

use larder_hash::Fingerprint;
use larder_store::{error_chain, EntryKind, Repository};
use rayon::prelude::*;
use serde::Serialize;

use crate::error::Result;
use crate::tree_io::{load_tree, ChunkReader};
use crate::Progress;

pub struct CheckOptions {
    /// Re-hash every chunk of every container.
    pub read_data: bool,
    pub progress: Arc<dyn Progress>,
}

/// One problem `check` found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Damage {
    /// An index segment failed verification (its containers were read directly).
    Segment { name: String, reason: String },
    /// A container is unreadable or failed verification.
    Container { id: String, reason: String },
    /// Chunks whose data no longer match their fingerprints.
    Chunks { container: String, count: usize },
    /// A container that no index segment names, though a segment must have: a
    /// later container is named, or a snapshot uses its chunks (what a killed
    /// backup leaves has neither; docs/design/repair.md, "`check` and repair").
    Unindexed { id: String, reason: String },
    /// A snapshot file is unreadable.
    Snapshot { id: String, reason: String },
    /// A snapshot's tree stream cannot be read.
    Tree { snapshot: String, reason: String },
    /// A file of a snapshot uses missing or damaged chunks. Its path as the tree has
    /// it (no leading `/`); in JSON `path`, and `path_hex` where it is not UTF-8.
    File {
        snapshot: String,
        #[serde(flatten, serialize_with = "crate::names::path_fields")]
        path: Vec<u8>,
        bad_chunks: usize,
    },
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct CheckReport {
    pub snapshots: usize,
    pub containers: usize,
    pub chunks: usize,
    pub bytes_read: u64,
    pub damage: Vec<Damage>,
    /// Snapshots `larder repair` rewrote, and their repaired copies (short ids).
    pub repaired_copies: Vec<RepairedCopy>,
}

/// A snapshot and the copy `larder repair` wrote of it without what it lost.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RepairedCopy {
    pub original: String,
    pub copy: String,
}

impl CheckReport {
    pub fn is_ok(&self) -> bool {
        self.damage.is_empty()
    }
}

/// One container's stored bytes and damaged chunks, or why it could not be read.
type ContainerScan = std::result::Result<(u64, Vec<Fingerprint>), String>;

/// Checks `repo`; never modifies it.
pub fn check(repo: &Repository, opts: &CheckOptions) -> Result<CheckReport> {
    let mut report = CheckReport::default();
    let open = repo.report();
    for (name, reason) in &open.bad_segments {
        report.damage.push(Damage::Segment {
            name: name.clone(),
            reason: reason.clone(),
        });
    }
    for (id, reason) in &open.bad_containers {
        report.damage.push(Damage::Container {
            id: format!("{id:016x}"),
            reason: reason.clone(),
        });
    }

    // Every indexed container: structure, and with read_data every chunk.
    let codec = repo.codec();
    let ids: Vec<u64> = repo.indexed_containers().iter().copied().collect();
    report.containers = ids.len();
    let results: Vec<(u64, ContainerScan)> = ids
        .par_iter()
        .map(|&id| {
            let r = repo
                .load_container(id)
                .map_err(|e| error_chain(&e))
                .and_then(|c| {
                    if opts.read_data {
                        c.verify_padding()?;
                    }
                    Ok(c)
                })
                .map(|c| {
                    let bytes = larder_store::stored_bytes(&c.entries);
                    opts.progress.advance(bytes);
                    let bad = if opts.read_data {
                        c.verify_chunks(&codec)
                            .iter()
                            .map(|e| e.fingerprint)
                            .collect()
                    } else {
                        Vec::new()
                    };
                    (bytes, bad)
                });
            (id, r)
        })
        .collect();
    let mut bad_containers = HashSet::new();
    let mut bad_fps: HashSet<Fingerprint> = HashSet::new();
    for (id, r) in results {
        match r {
            Ok((bytes, bad)) => {
                report.bytes_read += bytes;
                if !bad.is_empty() {
                    report.damage.push(Damage::Chunks {
                        container: format!("{id:016x}"),
                        count: bad.len(),
                    });
                }
                bad_fps.extend(bad);
            }
            Err(reason) => {
                bad_containers.insert(id);
                report.damage.push(Damage::Container {
                    id: format!("{id:016x}"),
                    reason,
                });
            }
        }
    }
    let index = repo.index();
    report.chunks = index.len() as usize;
    let adopted: HashSet<u64> = open.adopted_containers.iter().copied().collect();
    // Adopted containers whose chunks a snapshot uses.
    let used = std::cell::RefCell::new(BTreeSet::new());
    // A chunk whose index lookup fails (a disk index I/O error) stops the check: it
    // must not be reported as missing.
    let usable = |fp: &Fingerprint| -> Result<bool> {
        Ok(match index.get(fp)? {
            Some(loc) => {
                if adopted.contains(&loc.container) {
                    used.borrow_mut().insert(loc.container);
                }
                !bad_containers.contains(&loc.container) && !bad_fps.contains(fp)
            }
            None => false,
        })
    };

    // Every snapshot: its tree, then every file's recipe.
    let (snapshots, unreadable) = repo.snapshots()?;
    for e in unreadable {
        report.damage.push(match e {
            larder_store::StoreError::UnreadableSnapshot { id, reason } => {
                Damage::Snapshot { id, reason }
            }
            e => Damage::Snapshot {
                id: String::new(),
                reason: error_chain(&e),
            },
        });
    }
    report.snapshots = snapshots.len();
    report.repaired_copies = repaired_copies(&snapshots);
    let mut reader = ChunkReader::new(repo);
    for (id, snap) in &snapshots {
        let short = id[..8].to_string();
        let tree = snap
            .tree
            .fingerprints()
            .map_err(crate::EngineError::from)
            .and_then(|fps| {
                for fp in &fps {
                    if !usable(fp)? {
                        return Err(larder_store::StoreError::MissingChunk(*fp).into());
                    }
                }
                load_tree(&mut reader, &fps)
            });
        let entries = match tree {
            Ok(entries) => entries,
            Err(e) => {
                report.damage.push(Damage::Tree {
                    snapshot: short,
                    reason: error_chain(&e),
                });
                continue;
            }
        };
        let mut damaged = BTreeMap::new();
        for entry in entries.iter().filter(|e| e.kind == EntryKind::File) {
            let mut bad = 0;
            for fp in &entry.chunks {
                bad += usize::from(!usable(fp)?);
            }
            if bad > 0 {
                damaged.insert(entry.path.clone(), bad);
            }
        }
        for (path, bad_chunks) in damaged {
            report.damage.push(Damage::File {
                snapshot: short.clone(),
                path,
                bad_chunks,
            });
        }
    }
    // A damaged segment explains its containers' being adopted (and is reported).
    if open.bad_segments.is_empty() {
        report
            .damage
            .extend(lost_segment_damage(repo, &used.into_inner()));
    }
    Ok(report)
}

/// The adopted containers that a lost segment must have named: those below a named
/// container, and those whose chunks a snapshot uses (`used`).
fn lost_segment_damage(repo: &Repository, used: &BTreeSet<u64>) -> Vec<Damage> {
    let below: BTreeSet<u64> = repo.report().adopted_below_named.iter().copied().collect();
    let lost = |reason: &str| {
        format!("no index segment names it, but {reason}: an index segment was deleted or lost")
    };
    let mut out = Vec::new();
    for id in below.union(used) {
        let reason = match below.contains(id) {
            true => lost("later containers are named"),
            false => lost("snapshots use its chunks"),
        };
        out.push(Damage::Unindexed {
            id: format!("{id:016x}"),
            reason,
        });
    }
    out
}

/// The snapshots among `snapshots` that have a repaired copy among them.
fn repaired_copies(snapshots: &[larder_store::IdentifiedSnapshot]) -> Vec<RepairedCopy> {
    let ids: HashSet<&str> = snapshots.iter().map(|(id, _)| id.as_str()).collect();
    snapshots
        .iter()
        .filter_map(|(id, s)| {
            let original = s.repaired_from.as_deref().filter(|o| ids.contains(o))?;
            Some(RepairedCopy {
                original: original.get(..8).unwrap_or(original).to_string(),
                copy: id.get(..8).unwrap_or(id).to_string(),
            })
        })
        .collect()
}
