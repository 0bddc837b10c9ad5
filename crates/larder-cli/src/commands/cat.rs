//! `larder cat` (alias `dump`): write one file of a snapshot to stdout, without
//! restoring it. Takes the repository's shared lock.

use std::ffi::OsString;
use std::io::{BufWriter, Write};
use std::os::unix::ffi::OsStrExt;
use std::process::ExitCode;

use anyhow::Result;
use clap::Args;
use larder_engine::{SnapshotPath, SnapshotTree};
use larder_store::LockMode;

use super::Globals;
use crate::output::Output;

#[derive(Args)]
pub struct CatArgs {
    /// An id prefix, or `latest`
    snapshot: String,
    /// The file: a path inside the snapshot, with or without its leading `/`
    path: OsString,
}

/// Writes the file's raw bytes to stdout. `--json` is a usage error: the output is
/// the file, and there is no JSON object to print.
pub fn run(args: CatArgs, g: &Globals, out: &Output) -> Result<ExitCode> {
    if let Some(code) = out.refuse_json(
        "cat writes the file's raw content to standard output; --json does not apply (use `larder ls --json SNAPSHOT PATH` for its metadata)",
    ) {
        return Ok(code);
    }
    let path = match SnapshotPath::parse(args.path.as_bytes()) {
        Ok(path) => path,
        Err(e) => return Ok(out.usage(&e.to_string())),
    };
    let repo = g.repo.open(LockMode::Shared, out)?;
    repo.require_full_key("read files back")?;
    let tree = SnapshotTree::load(&repo, &args.snapshot)?;
    let mut stdout = BufWriter::with_capacity(1 << 20, std::io::stdout().lock());
    tree.write_file(&repo, &path, &mut stdout)?;
    stdout.flush()?;
    Ok(ExitCode::SUCCESS)
}
