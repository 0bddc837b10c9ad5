//! Repairing a damaged repository (`larder repair`, docs/design/repair.md): damaged
//! containers' intact chunks are salvaged into new containers and the damaged ones
//! leave the index (so the next backup stores them again from the source); each
//! snapshot that lost data is rewritten into a repaired copy without what cannot be
//! recovered, and the loss is reported file by file. The originals stay.
//!
//! `damage` decides what happens to each chunk, `snapshots` what each snapshot
//! loses; this module puts the repaired snapshots together and hands the writes to
//! the store ([`Repository::apply_repair`]), which orders them.

mod damage;
mod snapshots;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use larder_hash::Fingerprint;
use larder_store::{
    encode_tree, RepairWork, RepairWriteOptions, Repository, Snapshot, StoreError, TreeRef,
};

pub use snapshots::{LostFile, TreeLoss};

use crate::error::Result;
use crate::{NoProgress, Progress};
use damage::{Availability, Scan, Tables};
use snapshots::{examine, repaired_summary, Loss, TreeReader};

pub struct RepairOptions {
    /// Decide and report; write nothing.
    pub dry_run: bool,
    /// Read the chunk data of these containers only (the structure of every one is
    /// checked); empty: read every container's.
    pub containers: Vec<u64>,
    /// Rewrite only these snapshots (id prefixes or `latest`); empty: every one.
    pub snapshots: Vec<String>,
    pub progress: Arc<dyn Progress>,
    /// For crash tests: stop after this many file operations
    /// ([`RepairWriteOptions::crash_after_ops`]).
    pub crash_after_ops: Option<usize>,
}

impl Default for RepairOptions {
    fn default() -> Self {
        Self {
            dry_run: false,
            containers: Vec::new(),
            snapshots: Vec::new(),
            progress: Arc::new(NoProgress),
            crash_after_ops: None,
        }
    }
}

/// A damaged container and what became of its chunks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepairedContainer {
    pub id: u64,
    pub reason: String,
    pub chunks: usize,
    /// Chunks that no longer verify.
    pub damaged: usize,
    /// Chunks copied into new containers.
    pub salvaged: usize,
    /// Damaged chunks with no other copy, and their raw bytes.
    pub lost: usize,
    pub lost_bytes: u64,
}

/// A snapshot that loses data, and its repaired copy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotLoss {
    pub id: String,
    pub time: String,
    pub hostname: String,
    pub paths: Vec<String>,
    /// The repaired copy's id: written now, or found (`existing`); `None` in a dry
    /// run.
    pub repaired: Option<String>,
    pub existing: bool,
    pub tree: Option<TreeLoss>,
    pub files: Vec<LostFile>,
}

/// What a repair did (or, in a dry run, would do).
#[derive(Debug, Clone, Default)]
pub struct RepairReport {
    pub dry_run: bool,
    pub containers_read: usize,
    /// Stored bytes of the containers whose data was read.
    pub bytes_read: u64,
    pub containers: Vec<RepairedContainer>,
    /// Containers no segment names that failed verification: deleted.
    pub unindexed_deleted: Vec<(u64, String)>,
    /// Containers of a format this larder does not read: left alone.
    pub left_alone: Vec<(u64, String)>,
    /// Index segments that failed verification: replaced.
    pub segments_replaced: Vec<(String, String)>,
    /// Containers no segment named (a killed backup's or a lost segment's), which the
    /// new segment names.
    pub adopted: Vec<u64>,
    pub containers_written: usize,
    pub snapshots: Vec<SnapshotLoss>,
    /// Snapshot files that cannot be read: id and why.
    pub unreadable_snapshots: Vec<(String, String)>,
    /// Set when `crash_after_ops` stopped it part way.
    pub interrupted: bool,
}

impl RepairReport {
    /// Whether a snapshot lost data (now, or in an earlier repair whose copy exists).
    pub fn lost_data(&self) -> bool {
        self.snapshots
            .iter()
            .any(|s| s.tree.is_some() || !s.files.is_empty())
    }
}

/// Repairs `repo` (opened with the exclusive lock, a full key) as `opts` say.
pub fn repair(repo: &mut Repository, opts: &RepairOptions) -> Result<RepairReport> {
    repo.require_full_key("repair the repository")?;
    let tables = repo.indexed_tables()?;
    check_named(repo, &tables, &opts.containers)?;
    let read_data = |id: u64| opts.containers.is_empty() || opts.containers.contains(&id);
    let scan = damage::scan(repo, &tables, &read_data, opts.progress.as_ref())?;
    let avail = Availability::new(repo, &tables, &scan)?;
    let mut report = RepairReport {
        dry_run: opts.dry_run,
        containers_read: scan.containers_read,
        bytes_read: scan.bytes_read,
        containers: damaged_containers(&tables, &scan, &avail),
        unindexed_deleted: scan.unindexed.clone(),
        left_alone: scan.unknown.clone(),
        segments_replaced: repo.report().bad_segments.clone(),
        adopted: repo.report().adopted_containers.clone(),
        ..RepairReport::default()
    };
    let mut reader = TreeReader::new(repo, &tables, !opts.containers.is_empty());
    let (repaired, new_chunks) = rewrite_snapshots(repo, &avail, &mut reader, opts, &mut report)?;
    drop(reader);
    if opts.dry_run {
        return Ok(report);
    }
    let work = RepairWork {
        salvage: avail
            .salvage
            .iter()
            .map(|(id, take)| (*id, (tables[id].clone(), take.clone())))
            .collect(),
        delete: scan
            .damaged
            .keys()
            .copied()
            .chain(scan.unindexed.iter().map(|(id, _)| *id))
            .collect(),
        new_chunks,
        snapshots: repaired.iter().map(|(_, s)| s.clone()).collect(),
    };
    drop(avail);
    let written = repo.apply_repair(
        work,
        &RepairWriteOptions {
            crash_after_ops: opts.crash_after_ops,
        },
    )?;
    report.containers_written = written.containers_written;
    report.interrupted = written.interrupted;
    for ((at, _), id) in repaired.iter().zip(written.snapshots) {
        report.snapshots[*at].repaired = Some(id);
    }
    Ok(report)
}

/// Refuses `--container` ids that name no container the repository indexes or that
/// failed verification.
fn check_named(repo: &Repository, tables: &Tables, named: &[u64]) -> Result<()> {
    let bad: HashSet<u64> = repo
        .report()
        .bad_containers
        .iter()
        .map(|(id, _)| *id)
        .collect();
    match named
        .iter()
        .find(|id| !tables.contains_key(id) && !bad.contains(id))
    {
        Some(id) => Err(crate::EngineError::RepairStopped(format!(
            "container {id:016x} is not in the repository (see `larder check`)"
        ))),
        None => Ok(()),
    }
}

/// Each damaged container with the fate of its chunks.
fn damaged_containers(
    tables: &Tables,
    scan: &Scan,
    avail: &Availability<'_>,
) -> Vec<RepairedContainer> {
    scan.damaged
        .iter()
        .map(|(&id, d)| {
            let table = &tables[&id];
            let lost: Vec<u64> = d
                .bad
                .iter()
                .filter(|&&i| avail.lost.contains_key(&table[i].fingerprint))
                .map(|&i| u64::from(table[i].raw_len))
                .collect();
            RepairedContainer {
                id,
                reason: d.reason.clone(),
                chunks: table.len(),
                damaged: d.bad.len(),
                salvaged: avail.salvage.get(&id).map_or(0, Vec::len),
                lost: lost.len(),
                lost_bytes: lost.iter().sum(),
            }
        })
        .collect()
}

/// A repaired snapshot to write: its place in the report's `snapshots`, and itself.
type Repaired = (usize, Snapshot);

/// A chunk to store, with its raw bytes.
type RawChunk = (Fingerprint, Vec<u8>);

/// Examines every readable snapshot; for each selected one that loses data and has
/// no whole repaired copy yet, builds its repaired copy. Returns those and the new
/// chunks their trees need; fills the report's snapshots.
fn rewrite_snapshots(
    repo: &Repository,
    avail: &Availability<'_>,
    reader: &mut TreeReader<'_>,
    opts: &RepairOptions,
    report: &mut RepairReport,
) -> Result<(Vec<Repaired>, Vec<RawChunk>)> {
    let selected = selected_ids(repo, &opts.snapshots)?;
    let is_selected = |id: &str| selected.as_ref().is_none_or(|s| s.contains(id));
    let (all, unreadable) = repo.snapshots()?;
    for e in unreadable {
        match e {
            StoreError::UnreadableSnapshot { id, reason } => {
                if is_selected(&id) {
                    report.unreadable_snapshots.push((id, reason));
                }
            }
            // A snapshot not read for a passing fault: stop rather than skip it.
            e => return Err(e.into()),
        }
    }
    let mut losses: Vec<Option<Loss>> = Vec::with_capacity(all.len());
    for (_, snap) in &all {
        losses.push(examine(reader, avail, snap)?);
    }
    // A repaired copy that is itself whole answers for its original.
    let copies: HashMap<&str, &str> = all
        .iter()
        .zip(&losses)
        .filter(|(_, loss)| loss.is_none())
        .filter_map(|((id, s), _)| Some((s.repaired_from.as_deref()?, id.as_str())))
        .collect();
    let mut repaired = Vec::new();
    let mut new_chunks = NewChunks::default();
    for ((id, snap), loss) in all.iter().zip(losses) {
        let Some(loss) = loss.filter(|_| is_selected(id)) else {
            continue;
        };
        let existing = copies.get(id.as_str()).map(|c| c.to_string());
        if existing.is_none() {
            let tree = new_chunks.store_tree(repo, avail, &encode_tree(&loss.kept))?;
            let copy = Snapshot {
                version: Snapshot::VERSION,
                tree,
                summary: repaired_summary(snap, &loss),
                repaired_from: Some(id.clone()),
                ..snap.clone()
            };
            repaired.push((report.snapshots.len(), copy));
        }
        report.snapshots.push(SnapshotLoss {
            id: id.clone(),
            time: snap.time.clone(),
            hostname: snap.hostname.clone(),
            paths: snap.paths.clone(),
            existing: existing.is_some(),
            repaired: existing,
            tree: loss.tree,
            files: loss.files,
        });
    }
    Ok((repaired, new_chunks.chunks))
}

/// The full ids `names` name (`None`: every snapshot). A name may be an unreadable
/// snapshot's: its file name is its id.
fn selected_ids(repo: &Repository, names: &[String]) -> Result<Option<HashSet<String>>> {
    if names.is_empty() {
        return Ok(None);
    }
    let mut ids = HashSet::new();
    for name in names {
        ids.insert(repo.resolve_snapshot(name)?);
    }
    Ok(Some(ids))
}

/// The chunks of repaired trees that the repository will not hold otherwise, each
/// once.
#[derive(Default)]
struct NewChunks {
    chunks: Vec<RawChunk>,
    seen: HashSet<Fingerprint>,
}

impl NewChunks {
    /// Cuts `stream` with the repository's chunker, keeps the chunks it lacks, and
    /// returns the stream's reference.
    fn store_tree(
        &mut self,
        repo: &Repository,
        avail: &Availability<'_>,
        stream: &[u8],
    ) -> Result<TreeRef> {
        let codec = repo.codec();
        let mut fps = Vec::new();
        let mut start = 0;
        for len in repo.chunker().chunk_lengths(stream) {
            let raw = &stream[start..start + len];
            start += len;
            let fp = codec.fingerprint(raw);
            fps.push(fp.to_hex());
            if !self.seen.contains(&fp) && !avail.usable(&fp)? {
                self.seen.insert(fp);
                self.chunks.push((fp, raw.to_vec()));
            }
        }
        Ok(TreeRef {
            size: stream.len() as u64,
            chunks: fps,
        })
    }
}
