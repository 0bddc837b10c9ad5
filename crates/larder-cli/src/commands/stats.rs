//! `larder stats`: the repository's sizes and ratios; with `--index`, the disk index's
//! shape and the last backup's lookups too.

use std::io::{self, Write};
use std::process::ExitCode;

use anyhow::Result;
use clap::Args;
use larder_store::{DiskShape, FileKind, LockMode, RepoConfig, Repository};
use serde::Serialize;
use serde_json::Value;

use super::Globals;
use crate::output::disk_index::{last_backup, write_counters_text};
use crate::output::{mb, Output, Render};

#[derive(Args)]
pub struct StatsArgs {
    /// Also the disk index: its files, Bloom filter, and the last backup's lookups
    #[arg(long)]
    index: bool,
}

pub fn run(args: StatsArgs, g: &Globals, out: &Output) -> Result<ExitCode> {
    let repo = g.repo.open(LockMode::Shared, out)?;
    let (snapshots, _) = repo.snapshots()?;
    let logical: u64 = snapshots.iter().map(|(_, s)| s.summary.bytes_in).sum();
    let stored = stored_bytes(&repo)?;
    let chunk_bytes = repo.chunk_bytes();
    let ratio = |num: u64, den: u64| num as f64 / den.max(1) as f64;
    let config = repo.config();
    let stats = Stats {
        snapshots: snapshots.len(),
        containers: repo.indexed_containers().len(),
        chunks: repo.index().len(),
        index_segments: repo.segment_count(),
        logical_bytes: logical,
        unique_bytes: chunk_bytes.raw,
        chunk_bytes_stored: chunk_bytes.stored,
        stored_bytes: stored,
        dedup_ratio: ratio(logical, chunk_bytes.raw),
        compression_ratio: ratio(chunk_bytes.raw, chunk_bytes.stored),
        overall_ratio: ratio(logical, stored),
        config,
        index: config.index.describe(),
        disk_index: args.index.then(|| DiskIndexStats {
            shape: repo.index().disk_shape(),
            last_backup: last_backup(&repo),
        }),
        location: repo.location(),
    };
    out.print(&stats)?;
    Ok(ExitCode::SUCCESS)
}

/// Bytes the repository occupies: containers, index segments, snapshots and key
/// slots as its storage lists them, and for a local repository its disk index (the
/// sparse table counted as allocated). A remote repository's disk index is in the
/// local cache, not in the repository.
fn stored_bytes(repo: &Repository) -> Result<u64> {
    let backend = repo.backend();
    let mut stored = 0u64;
    for kind in [
        FileKind::Container,
        FileKind::IndexSegment,
        FileKind::Snapshot,
        FileKind::Key,
    ] {
        stored += backend
            .list_sizes(kind)?
            .iter()
            .map(|(_, len)| len)
            .sum::<u64>();
    }
    if backend.flock_dir().is_some() {
        let disk = repo.state_dir().join("index/disk");
        for e in std::fs::read_dir(&disk).into_iter().flatten() {
            let meta = e?.metadata()?;
            if meta.is_file() {
                stored += meta
                    .len()
                    .min(std::os::unix::fs::MetadataExt::blocks(&meta) * 512);
            }
        }
    }
    Ok(stored)
}

#[derive(Serialize)]
struct Stats<'a> {
    snapshots: usize,
    containers: usize,
    chunks: u64,
    index_segments: usize,
    /// Summed over the snapshots.
    logical_bytes: u64,
    /// Of the distinct chunks, before compression.
    unique_bytes: u64,
    chunk_bytes_stored: u64,
    stored_bytes: u64,
    dedup_ratio: f64,
    compression_ratio: f64,
    overall_ratio: f64,
    config: &'a RepoConfig,
    index: String,
    /// With `--index`.
    disk_index: Option<DiskIndexStats>,
    #[serde(skip)]
    location: String,
}

#[derive(Serialize)]
struct DiskIndexStats {
    /// `None` for a memory index.
    shape: Option<DiskShape>,
    /// As the last backup wrote them; `None` before a backup recorded them.
    last_backup: Option<Value>,
}

impl Render for Stats<'_> {
    fn write_text(&self, w: &mut dyn Write) -> io::Result<()> {
        writeln!(w, "repository  {}", self.location)?;
        writeln!(w, "snapshots   {}", self.snapshots)?;
        writeln!(
            w,
            "containers  {} ({} index segments)",
            self.containers, self.index_segments
        )?;
        writeln!(w, "chunks      {} unique", self.chunks)?;
        writeln!(
            w,
            "logical     {} (sum over snapshots)",
            mb(self.logical_bytes)
        )?;
        writeln!(
            w,
            "unique      {} of chunks, {} after compression ({})",
            mb(self.unique_bytes),
            mb(self.chunk_bytes_stored),
            self.config.compression.name()
        )?;
        writeln!(w, "stored      {} in the repository", mb(self.stored_bytes))?;
        writeln!(
            w,
            "ratios      dedup {:.2}x, compression {:.2}x, overall {:.2}x (logical / on disk)",
            self.dedup_ratio, self.compression_ratio, self.overall_ratio
        )?;
        writeln!(w, "index       {}", self.index)?;
        match &self.disk_index {
            Some(d) => d.write_text(w),
            None => Ok(()),
        }
    }
}

impl DiskIndexStats {
    fn write_text(&self, w: &mut dyn Write) -> io::Result<()> {
        match &self.shape {
            None => writeln!(w, "  (a memory index: no disk index metrics)")?,
            Some(d) => {
                writeln!(
                    w,
                    "  files     {} on disk, {} apparent (the table sparse; {} fingerprints, {} table buckets, {} lazy buffer buckets)",
                    mb(d.allocated_bytes),
                    mb(d.disk_bytes),
                    d.fingerprints,
                    d.table_buckets,
                    d.buffer_buckets
                )?;
                writeln!(
                    w,
                    "  memory    {} at full use; Bloom filter {}, false-positive rate {:.4}% at {} fingerprints",
                    mb(d.memory_estimate),
                    mb(d.bloom_bytes),
                    100.0 * d.bloom_false_positive_rate,
                    d.fingerprints
                )?;
            }
        }
        match &self.last_backup {
            Some(m) => {
                writeln!(w, "  last backup's lookups")?;
                write_counters_text(w, m)
            }
            None if self.shape.is_some() => {
                writeln!(w, "  (no backup recorded its lookups yet)")
            }
            None => Ok(()),
        }
    }
}
