//! `larder ls`, `larder diff` and `larder cat`: reading snapshots back without
//! restoring them. Each takes the repository's shared lock.

use std::ffi::OsString;
use std::io::{BufWriter, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use clap::Args;
use larder_engine::{diff_snapshots, SnapshotPath, SnapshotTree};
use larder_store::LockMode;

use crate::output::Output;

#[derive(Args)]
pub struct LsArgs {
    /// An id prefix, or `latest`
    snapshot: String,
    /// List only this path and what is below it: a path inside the snapshot, with or
    /// without its leading `/`
    path: Option<OsString>,
    /// Show type and permissions, owner, size and mtime (UTC), like `ls -l`, and
    /// symlink targets
    #[arg(short, long)]
    long: bool,
}

#[derive(Args)]
pub struct DiffArgs {
    /// The earlier snapshot: an id prefix, or `latest`
    snapshot1: String,
    /// The later snapshot: an id prefix, or `latest`
    snapshot2: String,
}

#[derive(Args)]
pub struct CatArgs {
    /// An id prefix, or `latest`
    snapshot: String,
    /// The file: a path inside the snapshot, with or without its leading `/`
    path: OsString,
}

pub fn ls(args: LsArgs, repo: Option<PathBuf>, out: &Output) -> Result<ExitCode> {
    let arg = args.path.as_ref().map_or(&[][..], |p| p.as_bytes());
    let path = match SnapshotPath::parse(arg) {
        Ok(path) => path,
        Err(e) => return Ok(out.usage(&e.to_string())),
    };
    let repo = crate::open(&crate::repo_path(repo, out)?, LockMode::Shared, out)?;
    let tree = SnapshotTree::load(&repo, &args.snapshot)?;
    let entries = tree.list(&path)?;
    out.listing(&tree, &path, &entries, args.long)?;
    Ok(ExitCode::SUCCESS)
}

pub fn diff(args: DiffArgs, repo: Option<PathBuf>, out: &Output) -> Result<ExitCode> {
    let repo = crate::open(&crate::repo_path(repo, out)?, LockMode::Shared, out)?;
    let old = SnapshotTree::load(&repo, &args.snapshot1)?;
    let new = SnapshotTree::load(&repo, &args.snapshot2)?;
    let diff = diff_snapshots(&repo, &old, &new);
    if diff.duplicate_paths > 0 {
        out.warn(&format!(
            "{} entries repeat a path of their snapshot (a damaged or crafted tree); the first entry of each path was compared",
            diff.duplicate_paths
        ));
    }
    if diff.unknown_chunks > 0 {
        out.warn(&format!(
            "{} chunks are not in the index, so the byte counts leave them out (run `larder check`)",
            diff.unknown_chunks
        ));
    }
    out.diff(&old, &new, &diff)?;
    Ok(ExitCode::SUCCESS)
}

/// Writes the file's raw bytes to stdout. `--json` is refused: the output is the
/// file, and there is no JSON object to print.
pub fn cat(args: CatArgs, repo: Option<PathBuf>, json: bool, out: &Output) -> Result<ExitCode> {
    if json {
        return Ok(out.usage(
            "cat writes the file's raw content to standard output; --json does not apply (use `larder ls --json SNAPSHOT PATH` for its metadata)",
        ));
    }
    let path = match SnapshotPath::parse(args.path.as_bytes()) {
        Ok(path) => path,
        Err(e) => return Ok(out.usage(&e.to_string())),
    };
    let repo = crate::open(&crate::repo_path(repo, out)?, LockMode::Shared, out)?;
    let tree = SnapshotTree::load(&repo, &args.snapshot)?;
    let mut stdout = BufWriter::with_capacity(1 << 20, std::io::stdout().lock());
    tree.write_file(&repo, &path, &mut stdout)?;
    stdout.flush()?;
    Ok(ExitCode::SUCCESS)
}
