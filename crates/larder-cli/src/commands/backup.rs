//! `larder backup`: back files and directories up into a new snapshot, locally or
//! through a cluster's node (`--cluster`).

use std::io::{self, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use clap::Args;
use larder_engine::{BackupOptions, BackupSummary, Progress, Warning};
use larder_index::disk::DiskIndexMetrics;
use larder_store::LockMode;
use serde::Serialize;

use super::device::{self, DeviceArg};
use super::{exit_code, remote, Globals};
use crate::output::disk_index::{self, DiskIndexCounters};
use crate::output::{mb, secs, write_failed_paths, Bar, Output, Render};
use crate::pattern_args::BackupExcludes;

#[derive(Args)]
pub struct BackupArgs {
    #[arg(required = true)]
    paths: Vec<PathBuf>,
    /// Fingerprinting threads [default: one per core]
    #[arg(long, default_value_t = 0)]
    threads: usize,
    /// Where chunking and fingerprinting run (gpu needs a build with the `gpu` feature)
    #[arg(long, value_enum, default_value = "auto")]
    device: DeviceArg,
    #[command(flatten)]
    excludes: BackupExcludes,
}

/// Exit code 3 when some paths could not be read (the snapshot holds the rest).
pub fn run(args: BackupArgs, g: &Globals, out: &Output) -> Result<ExitCode> {
    device::backup_device(args.device, out)?;
    let exclude = match args.excludes.patterns() {
        Ok(list) => list,
        Err(msg) => return Ok(out.usage(&msg)),
    };
    if !g.cluster.is_empty() {
        if !exclude.is_empty() {
            return Ok(out.usage("--exclude is not supported through a cluster yet"));
        }
        return remote::backup(&g.cluster, &args.paths, out);
    }
    let mut repo = g.repo.open(LockMode::Exclusive, out)?;
    let bar = Arc::new(Bar::bytes(out));
    let opts = BackupOptions {
        threads: args.threads,
        hostname: hostname(),
        username: std::env::var("USER").unwrap_or_default(),
        exclude,
        progress: bar.clone() as Arc<dyn Progress>,
        serial: false,
        remote: None,
    };
    let summary = larder_engine::backup(&mut repo, &args.paths, &opts)?;
    bar.finish();
    let saved = Saved::new(&summary);
    if let Some(counters) = &saved.disk_index {
        disk_index::save_last_backup(&repo, counters);
    }
    out.print(&saved)?;
    Ok(exit_code(summary.is_partial()))
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::fs::read_to_string("/etc/hostname"))
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// The snapshot a backup saved, and what it took.
#[derive(Serialize)]
struct Saved<'a> {
    snapshot: &'a str,
    files: u64,
    dirs: u64,
    symlinks: u64,
    bytes_in: u64,
    bytes_new: u64,
    bytes_new_stored: u64,
    bytes_stored: u64,
    dedup_ratio: f64,
    compression_ratio: f64,
    overall_ratio: f64,
    chunks: u64,
    chunks_new: u64,
    containers_written: u64,
    excluded: u64,
    seconds: f64,
    mb_per_sec: f64,
    stage_seconds: StageSeconds,
    warnings: &'a [Warning],
    /// `None` for a memory index.
    disk_index: Option<DiskIndexCounters>,
    /// The text shows the time unrounded, and the disk index in its own format.
    #[serde(skip)]
    elapsed: Duration,
    #[serde(skip)]
    disk_metrics: Option<&'a DiskIndexMetrics>,
}

/// Each stage's working time (`larder_engine::StageTimes`).
#[derive(Serialize)]
struct StageSeconds {
    walk: f64,
    chunk: f64,
    fingerprint: f64,
    index: f64,
    compress: f64,
    write: f64,
    sync: f64,
}

impl<'a> Saved<'a> {
    fn new(s: &'a BackupSummary) -> Self {
        let t = &s.stages;
        Self {
            snapshot: &s.snapshot_id,
            files: s.files,
            dirs: s.dirs,
            symlinks: s.symlinks,
            bytes_in: s.bytes_in,
            bytes_new: s.bytes_new,
            bytes_new_stored: s.bytes_new_stored,
            bytes_stored: s.bytes_stored,
            dedup_ratio: s.dedup_ratio(),
            compression_ratio: s.compression_ratio(),
            overall_ratio: s.overall_ratio(),
            chunks: s.chunks,
            chunks_new: s.chunks_new,
            containers_written: s.containers_written,
            excluded: s.excluded,
            seconds: secs(s.elapsed),
            mb_per_sec: s.mb_per_sec(),
            stage_seconds: StageSeconds {
                walk: secs(t.walk),
                chunk: secs(t.chunk),
                fingerprint: secs(t.fingerprint),
                index: secs(t.index),
                compress: secs(t.compress),
                write: secs(t.write),
                sync: secs(t.sync),
            },
            warnings: &s.warnings,
            disk_index: s.disk_index.as_ref().map(DiskIndexCounters::from),
            elapsed: s.elapsed,
            disk_metrics: s.disk_index.as_ref(),
        }
    }
}

impl Render for Saved<'_> {
    fn write_text(&self, w: &mut dyn Write) -> io::Result<()> {
        writeln!(w, "snapshot {} saved", &self.snapshot[..8])?;
        writeln!(
            w,
            "  files       {} files, {} dirs, {} symlinks, {} in",
            self.files,
            self.dirs,
            self.symlinks,
            mb(self.bytes_in)
        )?;
        if self.excluded > 0 {
            writeln!(
                w,
                "  excluded    {} entries (matched --exclude, --exclude-file or .larderignore; not read)",
                self.excluded
            )?;
        }
        writeln!(
            w,
            "  new         {} after dedup, {} after compression ({} with metadata)",
            mb(self.bytes_new),
            mb(self.bytes_new_stored),
            mb(self.bytes_stored)
        )?;
        writeln!(
            w,
            "  ratios      dedup {:.2}x, compression {:.2}x, overall {:.2}x (input / repository growth)",
            self.dedup_ratio, self.compression_ratio, self.overall_ratio
        )?;
        writeln!(
            w,
            "  chunks      {} ({} new) in {} new containers",
            self.chunks, self.chunks_new, self.containers_written
        )?;
        writeln!(
            w,
            "  time        {:.3} s, {:.0} MB/s",
            self.elapsed.as_secs_f64(),
            self.mb_per_sec
        )?;
        let t = &self.stage_seconds;
        writeln!(
            w,
            "  stages      walk {:.3} s, chunk {:.3} s, fingerprint {:.3} s (all threads), index {:.3} s, compress {:.3} s (all threads), write {:.3} s, sync {:.3} s",
            t.walk, t.chunk, t.fingerprint, t.index, t.compress, t.write, t.sync
        )?;
        if let Some(m) = self.disk_metrics {
            writeln!(w, "  disk index")?;
            for line in m.to_string().lines() {
                writeln!(w, "    {line}")?;
            }
        }
        write_failed_paths(w, self.warnings)
    }
}
