//! `larder ls`: list a snapshot's entries, or those at and below a path, without
//! restoring them. Takes the repository's shared lock.

use std::ffi::OsString;
use std::io::{self, Write};
use std::os::unix::ffi::OsStrExt;
use std::process::ExitCode;

use anyhow::Result;
use clap::Args;
use larder_engine::{display_path, BytesField, SnapshotPath, SnapshotTree};
use larder_store::LockMode;
use serde::Serialize;

use super::Globals;
use crate::output::tree::{long_line, EntryJson};
use crate::output::{Output, Render};

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

pub fn run(args: LsArgs, g: &Globals, out: &Output) -> Result<ExitCode> {
    let arg = args.path.as_ref().map_or(&[][..], |p| p.as_bytes());
    let path = match SnapshotPath::parse(arg) {
        Ok(path) => path,
        Err(e) => return Ok(out.usage(&e.to_string())),
    };
    let repo = g.repo.open(LockMode::Shared, out)?;
    repo.require_full_key("list snapshots' files")?;
    let tree = SnapshotTree::load(&repo, &args.snapshot)?;
    let entries = tree.list(&path)?;
    out.print(&Listing {
        snapshot: &tree.id,
        path: BytesField::slash_path("path", path.as_bytes()),
        count: entries.len(),
        entries: entries.iter().map(|e| EntryJson(e)).collect(),
        long: args.long,
    })?;
    Ok(ExitCode::SUCCESS)
}

/// The entries listed; text: one path a line, or with `--long` a line like `ls -l`.
#[derive(Serialize)]
struct Listing<'a> {
    snapshot: &'a str,
    /// The path listed under.
    #[serde(flatten)]
    path: BytesField<'a>,
    count: usize,
    entries: Vec<EntryJson<'a>>,
    #[serde(skip)]
    long: bool,
}

impl Render for Listing<'_> {
    fn write_text(&self, w: &mut dyn Write) -> io::Result<()> {
        for EntryJson(entry) in &self.entries {
            if self.long {
                writeln!(w, "{}", long_line(entry))?;
            } else {
                writeln!(w, "{}", display_path(&entry.path))?;
            }
        }
        Ok(())
    }
}
