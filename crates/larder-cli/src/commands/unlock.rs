//! `larder unlock`: remove what killed processes left of the lock: the stale note of a
//! local repository's lock (a `flock` never outlives its process), or a remote
//! repository's stale and unreadable lock objects (docs/design/remote.md, "Lock
//! objects"), which in an encrypted repository only its key opens.

use std::io::{self, Write};
use std::process::ExitCode;

use anyhow::Result;
use clap::Args;
use larder_store::{escape_controls, RemovedLock, RepoLock};
use serde::Serialize;

use super::Globals;
use crate::output::{shown, Output, Render};

#[derive(Args)]
pub struct UnlockArgs {}

pub fn run(_args: UnlockArgs, g: &Globals, out: &Output) -> Result<ExitCode> {
    g.repo.require_lock("removes locks")?;
    let (storage, keys) = g.repo.lock_storage(out)?;
    let removed = RepoLock::remove_stale(&storage.backend, keys.as_ref())?;
    out.print(&Unlocked { removed: &removed })?;
    Ok(ExitCode::SUCCESS)
}

#[derive(Serialize)]
struct Unlocked<'a> {
    /// The stale locks and unreadable lock objects removed.
    removed: &'a [RemovedLock],
}

impl Render for Unlocked<'_> {
    fn write_text(&self, w: &mut dyn Write) -> io::Result<()> {
        if self.removed.is_empty() {
            return writeln!(w, "the repository is not locked; nothing to remove");
        }
        for removed in self.removed {
            match removed {
                RemovedLock::Stale(h) => writeln!(w, "removed the stale lock of {}", h.describe())?,
                RemovedLock::Unreadable { name, why } => writeln!(
                    w,
                    "removed lock object {}, which could not be read: {}",
                    shown(name),
                    escape_controls(why.as_bytes())
                )?,
            }
        }
        writeln!(w, "the repository is not locked by a process that is gone")
    }
}
