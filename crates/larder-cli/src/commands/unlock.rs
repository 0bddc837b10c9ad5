//! `larder unlock`: remove what killed processes left of the lock: the stale note of a
//! local repository's lock (a `flock` never outlives its process), or a remote
//! repository's stale lock objects (docs/design/remote.md, "Lock objects").

use std::io::{self, Write};
use std::process::ExitCode;

use anyhow::Result;
use clap::Args;
use larder_store::{LockHolder, RepoLock};
use serde::Serialize;

use super::Globals;
use crate::output::{shown, Output, Render};

#[derive(Args)]
pub struct UnlockArgs {}

pub fn run(_args: UnlockArgs, g: &Globals, out: &Output) -> Result<ExitCode> {
    let storage = g.repo.storage(out)?;
    let removed = RepoLock::remove_stale(&storage.backend)?;
    out.print(&Unlocked { removed: &removed })?;
    Ok(ExitCode::SUCCESS)
}

#[derive(Serialize)]
struct Unlocked<'a> {
    /// The holders of the stale locks removed.
    removed: &'a [LockHolder],
}

impl Render for Unlocked<'_> {
    fn write_text(&self, w: &mut dyn Write) -> io::Result<()> {
        if self.removed.is_empty() {
            return writeln!(w, "the repository is not locked; nothing to remove");
        }
        // A lock note is another process's (or storage's) text: escaped.
        for h in self.removed {
            writeln!(
                w,
                "removed the stale lock of pid {} on {} (`{}`)",
                h.pid,
                shown(&h.hostname),
                shown(&h.command)
            )?;
        }
        writeln!(w, "the repository is not locked by a process that is gone")
    }
}
