//! `larder gc` (alias `prune`): delete the data no snapshot uses (docs/design/gc.md).

use std::io::{self, Write};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Result;
use clap::Args;
use larder_engine::GcSummary;
use larder_store::{GcOptions, GcReport, LockMode};
use serde::Serialize;

use super::Globals;
use crate::output::{mb, secs, Output, Render};

#[derive(Args)]
pub struct GcArgs {
    /// Repack containers whose live fraction (of stored bytes) is below PCT percent
    #[arg(long, value_name = "PCT", default_value_t = 50, value_parser = clap::value_parser!(u8).range(0..=100))]
    repack_threshold: u8,
    /// Only report what would be deleted, repacked and reclaimed
    #[arg(long)]
    dry_run: bool,
}

pub fn run(args: GcArgs, g: &Globals, out: &Output) -> Result<ExitCode> {
    let mut repo = g.repo.open(LockMode::Exclusive, out)?;
    repo.require_full_key("collect garbage (it deletes)")?;
    let opts = GcOptions {
        repack_threshold: args.repack_threshold,
        dry_run: args.dry_run,
        crash_after_ops: None,
    };
    let summary = larder_engine::gc(&mut repo, &opts)?;
    warn_if_disk_was_full(&summary.sweep, out);
    out.print(&Collected::from(&summary))?;
    Ok(ExitCode::SUCCESS)
}

/// Says what a collection on a full disk left undone (docs/design/gc.md, "A full
/// disk").
pub fn warn_if_disk_was_full(report: &GcReport, out: &Output) {
    if report.disk_was_full {
        out.warn(
            "the disk was full: gc deleted the containers no snapshot uses and repacked none; \
             run gc again to repack the rest",
        );
    }
}

/// What a gc did (or, in a dry run, would do); also part of `forget --prune`'s result.
#[derive(Serialize)]
pub struct Collected<'a> {
    #[serde(flatten)]
    sweep: &'a GcReport,
    /// Snapshots whose chunks were marked live.
    snapshots: usize,
    seconds: f64,
    /// The text shows the time unrounded.
    #[serde(skip)]
    duration: Duration,
}

impl<'a> From<&'a GcSummary> for Collected<'a> {
    fn from(s: &'a GcSummary) -> Self {
        Self {
            sweep: &s.sweep,
            snapshots: s.snapshots,
            seconds: secs(s.duration),
            duration: s.duration,
        }
    }
}

impl Render for Collected<'_> {
    fn write_text(&self, w: &mut dyn Write) -> io::Result<()> {
        let r = self.sweep;
        let would = if r.dry_run { "would be " } else { "" };
        writeln!(
            w,
            "gc: {} snapshot(s) marked {} live chunks ({})",
            self.snapshots,
            r.chunks_live,
            mb(r.live_bytes)
        )?;
        writeln!(
            w,
            "  containers  {} {would}deleted, {} {would}repacked into {}, {} kept",
            r.containers_deleted, r.containers_repacked, r.containers_written, r.containers_kept
        )?;
        writeln!(w, "  chunks      {} {would}removed", r.chunks_removed)?;
        writeln!(
            w,
            "  reclaimed   {} {would}reclaimed ({} -> {} of containers and index)",
            mb(r.bytes_reclaimed.max(0) as u64),
            mb(r.bytes_before),
            mb(r.bytes_after)
        )?;
        writeln!(w, "  time        {:.3} s", self.duration.as_secs_f64())?;
        if r.dry_run {
            writeln!(w, "dry run: nothing was changed")?;
        }
        Ok(())
    }
}
