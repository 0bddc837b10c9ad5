//! `larder unlock`: remove a stale lock note left by a killed process. A lock never
//! outlives its process, so only the note can be stale (docs/design/format.md,
//! "Locking").

use std::io::{self, Write};
use std::process::ExitCode;

use anyhow::Result;
use clap::Args;
use larder_store::{LockHolder, RepoLock};
use serde::Serialize;

use super::Globals;
use crate::output::{Output, Render};

#[derive(Args)]
pub struct UnlockArgs {}

pub fn run(_args: UnlockArgs, g: &Globals, out: &Output) -> Result<ExitCode> {
    let path = g.repo.path(out)?;
    let removed = RepoLock::remove_stale(&path)?;
    out.print(&Unlocked {
        removed: removed.as_ref(),
    })?;
    Ok(ExitCode::SUCCESS)
}

#[derive(Serialize)]
struct Unlocked<'a> {
    /// The stale note's holder; `None` when there was no note.
    removed: Option<&'a LockHolder>,
}

impl Render for Unlocked<'_> {
    fn write_text(&self, w: &mut dyn Write) -> io::Result<()> {
        match self.removed {
            Some(h) => writeln!(
                w,
                "removed the stale lock note of pid {} on {} (`{}`); the repository is not locked",
                h.pid, h.hostname, h.command
            ),
            None => writeln!(w, "the repository is not locked; nothing to remove"),
        }
    }
}
