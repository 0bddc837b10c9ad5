//! `larder backup`: back files and directories up into a new snapshot, locally or
//! through a cluster's node (`--cluster`).

use std::ffi::OsString;
use std::io::{self, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Result};
use clap::Args;
use larder_engine::{
    BackupOptions, BackupSummary, ExcludeTag, Parents, Progress, SkipRules, Warning,
};
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
    #[arg(required_unless_present = "stdin")]
    paths: Vec<PathBuf>,
    /// Fingerprinting threads [default: one per core]
    #[arg(long, default_value_t = 0)]
    threads: usize,
    /// Where chunking and fingerprinting run (gpu needs a build with the `gpu` feature)
    #[arg(long, value_enum, default_value = "auto")]
    device: DeviceArg,
    #[command(flatten)]
    excludes: BackupExcludes,
    /// Leave out the contents of directories holding a valid CACHEDIR.TAG file (the tag
    /// file itself is kept)
    #[arg(long)]
    exclude_caches: bool,
    /// Leave out the contents of directories holding a file named FILE (starting with
    /// HEADER, if given); the file itself is kept. Repeatable
    #[arg(long, value_name = "FILE[:HEADER]")]
    exclude_if_present: Vec<OsString>,
    /// Do not cross file system boundaries below a source path: a mount point is
    /// recorded as an empty directory
    #[arg(short = 'x', long)]
    one_file_system: bool,
    /// Compare files with this snapshot only (an id prefix or `latest`) [default: for
    /// each path, the newest snapshot of this host that holds it]
    #[arg(long, value_name = "SNAPSHOT", conflicts_with = "force")]
    parent: Option<String>,
    /// Read every file, even those whose metadata says they did not change
    #[arg(long)]
    force: bool,
    /// Do not compare inode numbers (FUSE and network file systems whose inodes change)
    #[arg(long)]
    ignore_inode: bool,
    /// Do not compare ctimes (a same-size rewrite that restores the mtime then goes unseen)
    #[arg(long)]
    ignore_ctime: bool,
    /// Do not record extended attributes (POSIX ACLs among them)
    #[arg(long)]
    no_xattrs: bool,
    /// Write a checkpoint at least this often (and after each twentieth of the data to
    /// read), so that a killed backup's successor does not read it again; 0: never
    #[arg(long, default_value = "5m", value_name = "DURATION", value_parser = crate::duration::parse)]
    checkpoint_interval: Duration,
    /// Back up standard input as one file, read to its end (database dumps, pipes)
    #[arg(long, conflicts_with_all = ["paths", "parent", "force"])]
    stdin: bool,
    /// The name of standard input's file in the snapshot (`cat SNAPSHOT /NAME` writes
    /// it back): a path of normal components, without `.`, `..` or empty ones
    #[arg(
        long,
        default_value = "stdin",
        value_name = "NAME",
        requires = "stdin",
        value_parser = stdin_filename
    )]
    stdin_filename: String,
}

/// A `--stdin-filename` that names a file inside the snapshot (a leading `/` is
/// allowed); anything else is a usage error, refused before the repository is opened.
fn stdin_filename(name: &str) -> Result<String, String> {
    if larder_store::is_safe_relative_path(name.trim_start_matches('/').as_bytes()) {
        Ok(name.to_string())
    } else {
        Err("only normal components are allowed (no `.`, `..` or empty ones)".into())
    }
}

/// Exit code 3 when some paths could not be read (the snapshot holds the rest).
pub fn run(args: BackupArgs, g: &Globals, out: &Output) -> Result<ExitCode> {
    let exclude = match args.excludes.patterns() {
        Ok(list) => list,
        Err(msg) => return Ok(out.usage(&msg)),
    };
    let mut exclude_tags: Vec<ExcludeTag> = match args
        .exclude_if_present
        .iter()
        .map(|spec| ExcludeTag::parse(spec.as_bytes()))
        .collect()
    {
        Ok(tags) => tags,
        Err(msg) => return Ok(out.usage(&msg)),
    };
    if args.exclude_caches {
        exclude_tags.push(ExcludeTag::cachedir());
    }
    if !g.cluster.is_empty() {
        if !exclude.is_empty() || !exclude_tags.is_empty() || args.one_file_system || args.stdin {
            return Ok(out.usage(
                "--exclude, --exclude-caches, --exclude-if-present, --one-file-system and \
                 --stdin are not supported through a cluster yet",
            ));
        }
        if args.device == DeviceArg::Gpu {
            bail!("--device gpu: a backup through a cluster chunks on its nodes");
        }
        return remote::backup(&g.cluster, &g.tls, &args.paths, out);
    }
    let mut repo = g.repo.open(LockMode::Exclusive, out)?;
    let device = device::backup_device(args.device, repo.config(), out)?;
    let bar = Arc::new(Bar::bytes(out));
    let opts = BackupOptions {
        threads: args.threads,
        hostname: crate::host::hostname(),
        username: crate::host::username(),
        exclude,
        exclude_tags,
        one_file_system: args.one_file_system,
        progress: bar.clone() as Arc<dyn Progress>,
        parents: match (&args.parent, args.force) {
            (_, true) => Parents::None,
            (Some(name), false) => Parents::Snapshot(name.clone()),
            (None, false) => Parents::Auto,
        },
        skip: SkipRules {
            ignore_inode: args.ignore_inode,
            ignore_ctime: args.ignore_ctime,
            ..SkipRules::default()
        },
        xattrs: !args.no_xattrs,
        checkpoint_interval: Some(args.checkpoint_interval).filter(|d| !d.is_zero()),
        device,
        ..BackupOptions::default()
    };
    let summary = if args.stdin {
        larder_engine::backup_stdin(&mut repo, &args.stdin_filename, &opts)?
    } else {
        larder_engine::backup(&mut repo, &args.paths, &opts)?
    };
    bar.finish();
    let saved = Saved::new(&summary);
    if let Some(counters) = &saved.disk_index {
        disk_index::save_last_backup(&repo, counters);
    }
    out.print(&saved)?;
    Ok(exit_code(summary.is_partial()))
}

/// The snapshot a backup saved, and what it took.
#[derive(Serialize)]
struct Saved<'a> {
    snapshot: &'a str,
    files: u64,
    files_new: u64,
    files_changed: u64,
    files_unchanged: u64,
    dirs: u64,
    symlinks: u64,
    specials: u64,
    bytes_in: u64,
    bytes_read: u64,
    bytes_skipped: u64,
    bytes_new: u64,
    bytes_new_stored: u64,
    bytes_stored: u64,
    dedup_ratio: f64,
    compression_ratio: f64,
    overall_ratio: f64,
    chunks: u64,
    chunks_new: u64,
    chunks_unused: u64,
    tree_chunks: u64,
    tree_chunks_new: u64,
    containers_written: u64,
    checkpoints: u64,
    parents: &'a [String],
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
    previous: f64,
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
            files_new: s.files_new,
            files_changed: s.files_changed,
            files_unchanged: s.files_unchanged,
            dirs: s.dirs,
            symlinks: s.symlinks,
            specials: s.specials,
            bytes_in: s.bytes_in,
            bytes_read: s.bytes_read,
            bytes_skipped: s.bytes_skipped,
            bytes_new: s.bytes_new,
            bytes_new_stored: s.bytes_new_stored,
            bytes_stored: s.bytes_stored,
            dedup_ratio: s.dedup_ratio(),
            compression_ratio: s.compression_ratio(),
            overall_ratio: s.overall_ratio(),
            chunks: s.chunks,
            chunks_new: s.chunks_new,
            chunks_unused: s.chunks_unused,
            tree_chunks: s.tree_chunks,
            tree_chunks_new: s.tree_chunks_new,
            containers_written: s.containers_written,
            checkpoints: s.checkpoints,
            parents: &s.parents,
            excluded: s.excluded,
            seconds: secs(s.elapsed),
            mb_per_sec: s.mb_per_sec(),
            stage_seconds: StageSeconds {
                walk: secs(t.walk),
                previous: secs(t.previous),
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
        let specials = match self.specials {
            0 => String::new(),
            n => format!(", {n} FIFOs and devices"),
        };
        writeln!(
            w,
            "  files       {} files ({} new, {} changed, {} unchanged), {} dirs, {} symlinks{specials}, {} in",
            self.files,
            self.files_new,
            self.files_changed,
            self.files_unchanged,
            self.dirs,
            self.symlinks,
            mb(self.bytes_in)
        )?;
        let parents = match self.parents {
            [] => String::from("no earlier snapshot compared"),
            [one] => format!("unchanged files taken from snapshot {}", &one[..8]),
            many => format!("unchanged files taken from {} snapshots", many.len()),
        };
        writeln!(
            w,
            "  read        {} read, {} skipped ({parents})",
            mb(self.bytes_read),
            mb(self.bytes_skipped)
        )?;
        if self.excluded > 0 {
            writeln!(
                w,
                "  excluded    {} entries (by --exclude, --exclude-file, .larderignore, tag files or \
                 --one-file-system; not read)",
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
        let unused = match self.chunks_unused {
            0 => String::new(),
            n => format!("; {n} more stored for checkpoints or failed files"),
        };
        writeln!(
            w,
            "  chunks      {} ({} new; of them the tree's {}, {} new{unused}) in {} new containers",
            self.chunks,
            self.chunks_new,
            self.tree_chunks,
            self.tree_chunks_new,
            self.containers_written
        )?;
        if self.checkpoints > 0 {
            writeln!(
                w,
                "  checkpoints {} written while it ran, removed once it was saved",
                self.checkpoints
            )?;
        }
        writeln!(
            w,
            "  time        {:.3} s, {:.0} MB/s",
            self.elapsed.as_secs_f64(),
            self.mb_per_sec
        )?;
        let t = &self.stage_seconds;
        writeln!(
            w,
            "  stages      walk {:.3} s, previous {:.3} s, chunk {:.3} s, fingerprint {:.3} s (all threads), index {:.3} s, compress {:.3} s (all threads), write {:.3} s, sync {:.3} s",
            t.walk, t.previous, t.chunk, t.fingerprint, t.index, t.compress, t.write, t.sync
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
