//! `larder snapshots`: list the snapshots, of the repository or of every node of a
//! cluster (`--cluster`).

use std::io::{self, Write};
use std::process::ExitCode;

use anyhow::Result;
use clap::Args;
use larder_store::{LockMode, Snapshot};
use serde::Serialize;

use super::{remote, Globals};
use crate::output::{mb, Output, Render};

#[derive(Args)]
pub struct SnapshotsArgs {}

pub fn run(_args: SnapshotsArgs, g: &Globals, out: &Output) -> Result<ExitCode> {
    if !g.cluster.is_empty() {
        return remote::snapshots(&g.cluster, out);
    }
    let repo = g.repo.open(LockMode::Shared, out)?;
    repo.require_full_key("list snapshots")?;
    let (snapshots, bad) = repo.snapshots()?;
    for e in &bad {
        out.warn(&larder_store::error_chain(e));
    }
    let list: Vec<Listed> = snapshots
        .iter()
        .map(|(id, snapshot)| Listed { id, snapshot })
        .collect();
    out.print(&SnapshotList(list))?;
    Ok(ExitCode::SUCCESS)
}

/// Every readable snapshot, oldest first; JSON: an array.
#[derive(Serialize)]
#[serde(transparent)]
struct SnapshotList<'a>(Vec<Listed<'a>>);

#[derive(Serialize)]
struct Listed<'a> {
    id: &'a str,
    snapshot: &'a Snapshot,
}

impl Render for SnapshotList<'_> {
    fn write_text(&self, w: &mut dyn Write) -> io::Result<()> {
        writeln!(
            w,
            "{:<10} {:<20} {:<16} {:>12}  paths",
            "id", "time", "host", "size"
        )?;
        for Listed { id, snapshot: s } in &self.0 {
            let time = s.time.get(..19).unwrap_or(&s.time).replace('T', " ");
            writeln!(
                w,
                "{:<10} {:<20} {:<16} {:>12}  {}{}",
                &id[..8],
                time,
                s.hostname,
                mb(s.summary.bytes_in),
                s.paths.join(" "),
                if s.partial { "  (checkpoint)" } else { "" }
            )?;
        }
        writeln!(w, "{} snapshot(s)", self.0.len())?;
        let checkpoints = self.0.iter().filter(|l| l.snapshot.partial).count();
        if checkpoints > 0 {
            writeln!(
                w,
                "{checkpoints} of them checkpoint(s): what a backup that was killed (or is running) had stored; the next backup of the same paths goes on from it and removes it"
            )?;
        }
        Ok(())
    }
}
