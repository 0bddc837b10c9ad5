//! `larder snapshots`: list the snapshots, of the repository or of every node of a
//! cluster (`--cluster`).

use std::io::{self, Write};
use std::process::ExitCode;

use anyhow::Result;
use clap::Args;
use larder_store::{LockMode, Snapshot};
use serde::Serialize;

use super::{remote, Globals};
use crate::output::{mb, shown, Output, Render};

#[derive(Args)]
pub struct SnapshotsArgs {}

pub fn run(_args: SnapshotsArgs, g: &Globals, out: &Output) -> Result<ExitCode> {
    if !g.cluster.is_empty() {
        return remote::snapshots(&g.cluster, &g.tls, out);
    }
    let repo = g.repo.open(LockMode::Shared, out)?;
    repo.require_full_key("list snapshots")?;
    let (snapshots, bad) = repo.snapshots()?;
    for e in &bad {
        out.warn(&larder_store::error_chain(e));
    }
    let snapshots: Vec<Listed> = snapshots
        .iter()
        .map(|(id, snapshot)| Listed { id, snapshot })
        .collect();
    out.print(&SnapshotList { snapshots })?;
    Ok(ExitCode::SUCCESS)
}

/// Every readable snapshot, oldest first; JSON: `{"snapshots": [{"id": ID,
/// "snapshot": SNAPSHOT}, ...]}`. Host, user and paths are strings as the snapshot
/// file holds them (a source path that was not UTF-8 was recorded lossily; its exact
/// bytes are in the tree, as `ls --json` shows them).
#[derive(Serialize)]
struct SnapshotList<'a> {
    snapshots: Vec<Listed<'a>>,
}

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
        // Time, host and paths come from storage: each escaped, as any name.
        for Listed { id, snapshot: s } in &self.snapshots {
            let time = s.time.get(..19).unwrap_or(&s.time).replace('T', " ");
            let paths: Vec<String> = s.paths.iter().map(|p| shown(p)).collect();
            let mark = match (&s.repaired_from, s.partial) {
                (Some(from), _) => format!(
                    "  (repaired copy of {})",
                    shown(from.get(..8).unwrap_or(from))
                ),
                (None, true) => "  (checkpoint)".to_string(),
                (None, false) => String::new(),
            };
            writeln!(
                w,
                "{:<10} {:<20} {:<16} {:>12}  {}{mark}",
                shown(id.get(..8).unwrap_or(id)),
                shown(&time),
                shown(&s.hostname),
                mb(s.summary.bytes_in),
                paths.join(" "),
            )?;
        }
        writeln!(w, "{} snapshot(s)", self.snapshots.len())?;
        let checkpoints = self.snapshots.iter().filter(|l| l.snapshot.partial).count();
        if checkpoints > 0 {
            writeln!(
                w,
                "{checkpoints} of them checkpoint(s): what a backup that was killed (or is running) had stored; the next backup of the same paths goes on from it and removes it"
            )?;
        }
        Ok(())
    }
}
