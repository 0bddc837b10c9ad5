//! `larder restore`: restore a snapshot into a directory, locally or through a
//! cluster's node (`--cluster`).

use std::io::{self, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use clap::Args;
use larder_engine::{Progress, ReadStats, RestoreOptions, RestoreSummary, Warning};
use larder_store::LockMode;
use serde::Serialize;

use super::{exit_code, remote, Globals};
use crate::output::{mb, secs, write_failed_paths, Bar, Output, Render};
use crate::pattern_args::RestoreSelection;
use crate::size;

#[derive(Args)]
pub struct RestoreArgs {
    snapshot: String,
    target: PathBuf,
    /// Replace what already exists in TARGET where the snapshot holds an entry; a
    /// directory is replaced only if it is empty (or with --delete)
    #[arg(long)]
    overwrite: bool,
    /// Remove what TARGET holds below the restored directories that the snapshot
    /// does not hold (only what --include/--exclude would select)
    #[arg(long)]
    delete: bool,
    /// Memory for container data: the restore reads ahead in windows whose
    /// containers' byte ranges fit in this, and reads each container once per window
    #[arg(long, default_value = "256MiB", value_parser = size::parse)]
    cache_size: usize,
    /// Leave owners as the restoring user's: do not set the recorded uid and gid
    #[arg(long)]
    no_owner: bool,
    /// Threads creating and writing files, spread over directories [default: one per
    /// core]
    #[arg(long, default_value_t = 0)]
    threads: usize,
    #[command(flatten)]
    selection: RestoreSelection,
}

/// Exit code 3 when the restore finished with warnings (each was printed as it came).
pub fn run(args: RestoreArgs, g: &Globals, out: &Output) -> Result<ExitCode> {
    let (include, exclude) = match args.selection.patterns() {
        Ok(lists) => lists,
        Err(msg) => return Ok(out.usage(&msg)),
    };
    if !g.cluster.is_empty() {
        if !include.is_empty() || !exclude.is_empty() || args.overwrite || args.delete {
            return Ok(out.usage(
                "--include, --exclude, --overwrite and --delete are not supported through a cluster yet",
            ));
        }
        return remote::restore(&g.cluster, &g.tls, &args.snapshot, &args.target, out);
    }
    let repo = g.repo.open(LockMode::Shared, out)?;
    repo.require_full_key("restore snapshots")?;
    let bar = Arc::new(Bar::bytes(out));
    let opts = RestoreOptions {
        overwrite: args.overwrite,
        delete: args.delete,
        include,
        exclude,
        cache_size: args.cache_size,
        progress: bar.clone() as Arc<dyn Progress>,
        owners: !args.no_owner,
        threads: args.threads,
    };
    let summary = larder_engine::restore(&repo, &args.snapshot, &args.target, &opts)?;
    bar.finish();
    out.print(&Restored::new(&summary))?;
    Ok(exit_code(summary.warnings.iter().any(|w| w.is_error)))
}

/// What a restore wrote, and what it read to do so.
#[derive(Serialize)]
struct Restored<'a> {
    snapshot: &'a str,
    files: u64,
    /// Of `files`, those restored as a hard link to another restored file.
    hard_links: u64,
    dirs: u64,
    symlinks: u64,
    /// FIFOs and device nodes.
    specials: u64,
    bytes: u64,
    filtered_out: u64,
    /// Entries of TARGET removed: empty directories replaced (--overwrite), and what
    /// the snapshot does not hold (--delete).
    removed: u64,
    reads: &'a ReadStats,
    container_reads_per_mb: f64,
    seconds: f64,
    warnings: &'a [Warning],
    /// The text shows the time unrounded.
    #[serde(skip)]
    elapsed: Duration,
}

impl<'a> Restored<'a> {
    fn new(s: &'a RestoreSummary) -> Self {
        Self {
            snapshot: &s.snapshot_id,
            files: s.files,
            hard_links: s.hard_links,
            dirs: s.dirs,
            symlinks: s.symlinks,
            specials: s.specials,
            bytes: s.bytes,
            filtered_out: s.filtered_out,
            removed: s.removed,
            reads: &s.reads,
            container_reads_per_mb: s.container_reads_per_mb(),
            seconds: secs(s.elapsed),
            warnings: &s.warnings,
            elapsed: s.elapsed,
        }
    }
}

impl Render for Restored<'_> {
    fn write_text(&self, w: &mut dyn Write) -> io::Result<()> {
        let links = match self.hard_links {
            0 => String::new(),
            n => format!(" ({n} as hard links)"),
        };
        let specials = match self.specials {
            0 => String::new(),
            n => format!(", {n} FIFOs and devices"),
        };
        writeln!(
            w,
            "restored snapshot {}: {} files{links}, {} dirs, {} symlinks{specials}, {} in {:.3} s",
            &self.snapshot[..8],
            self.files,
            self.dirs,
            self.symlinks,
            mb(self.bytes),
            self.elapsed.as_secs_f64()
        )?;
        let r = self.reads;
        writeln!(
            w,
            "  read {} containers in {} reads ({} distinct; {} tables, {} for the tree), {}: {:.3} container reads per MB restored",
            r.container_reads,
            r.range_reads,
            r.distinct_containers,
            r.table_reads,
            r.tree_container_reads,
            mb(r.bytes_read),
            self.container_reads_per_mb
        )?;
        if self.filtered_out > 0 {
            writeln!(
                w,
                "  {} entries not selected by --include/--exclude",
                self.filtered_out
            )?;
        }
        if self.removed > 0 {
            writeln!(w, "  {} entries of the target removed", self.removed)?;
        }
        write_failed_paths(w, self.warnings)
    }
}
