//! Garbage collection's mark (docs/design/gc.md): the fingerprints every snapshot
//! reaches, through its tree stream and its files' recipes. The sweep is the store's
//! ([`Repository::collect_garbage`]).

use std::collections::HashSet;
use std::time::{Duration, Instant};

use larder_hash::Fingerprint;
use larder_store::{error_chain, GcOptions, GcReport, Repository};

use crate::error::{EngineError, Result};
use crate::tree_io::{load_tree, ChunkReader};

/// What `gc` did, and how long it took.
#[derive(Debug, Clone)]
pub struct GcSummary {
    /// Snapshots whose chunks were marked live.
    pub snapshots: usize,
    pub sweep: GcReport,
    pub duration: Duration,
}

/// Every fingerprint the snapshots of `repo` reach. Refuses to answer when a snapshot
/// or a tree stream cannot be read: what it uses would be unknown, and a sweep would
/// delete it.
pub fn mark(repo: &Repository) -> Result<(usize, HashSet<Fingerprint>)> {
    mark_except(repo, &[])
}

/// As [`mark`], as if the snapshots `forgotten` (full ids) were gone: what
/// `forget --dry-run --prune` previews.
fn mark_except(repo: &Repository, forgotten: &[String]) -> Result<(usize, HashSet<Fingerprint>)> {
    let (mut snapshots, unreadable) = repo.snapshots()?;
    snapshots.retain(|(id, _)| !forgotten.contains(id));
    if let Some(e) = unreadable.first() {
        // The error names the snapshot and the `larder forget` that removes it.
        return Err(EngineError::GcRefused(error_chain(e)));
    }
    let mut live = HashSet::new();
    let mut reader = ChunkReader::new(repo);
    for (id, snap) in &snapshots {
        let tree = snap
            .tree
            .fingerprints()
            .map_err(EngineError::from)
            .and_then(|fps| {
                live.extend(fps.iter().copied());
                load_tree(&mut reader, &fps)
            })
            .map_err(|e| {
                let short = id.get(..8).unwrap_or(id);
                EngineError::GcRefused(format!(
                    "the tree of snapshot {short} cannot be read ({}); `larder repair` writes a copy of it without what was lost, after which `larder forget {short}` lets gc run",
                    error_chain(&e)
                ))
            })?;
        for entry in tree {
            live.extend(entry.chunks);
        }
    }
    Ok((snapshots.len(), live))
}

/// Marks, then sweeps with `opts`. Needs the exclusive lock.
pub fn gc(repo: &mut Repository, opts: &GcOptions) -> Result<GcSummary> {
    gc_except(repo, opts, &[])
}

/// What a gc would do once the snapshots `forgotten` are gone: a dry run
/// (`opts.dry_run` must be set, since they are still there).
pub fn gc_preview(
    repo: &mut Repository,
    opts: &GcOptions,
    forgotten: &[String],
) -> Result<GcSummary> {
    assert!(
        opts.dry_run,
        "a gc that ignores live snapshots must not sweep"
    );
    gc_except(repo, opts, forgotten)
}

fn gc_except(repo: &mut Repository, opts: &GcOptions, forgotten: &[String]) -> Result<GcSummary> {
    let start = Instant::now();
    let (snapshots, live) = mark_except(repo, forgotten)?;
    let sweep = repo.collect_garbage(&live, opts)?;
    Ok(GcSummary {
        snapshots,
        sweep,
        duration: start.elapsed(),
    })
}
