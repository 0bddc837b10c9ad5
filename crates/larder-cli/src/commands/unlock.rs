//! `larder unlock`: remove what killed processes left of the lock: the stale note of a
//! local repository's lock (a `flock` never outlives its process), or a remote
//! repository's stale and unreadable lock objects (docs/design/remote.md, "Lock
//! objects"), which in an encrypted repository only its key opens.

use std::io::{self, Write};
use std::process::ExitCode;

use anyhow::Result;
use clap::Args;
use larder_store::{escape_controls, Removal, RemovedLock, RepoLock};

use super::Globals;
use crate::output::{shown, Output, Render};

#[derive(Args)]
pub struct UnlockArgs {
    /// Remove every lock object of a remote repository, those of holders that may still
    /// run included (restic's option): for a holder you know is gone that larder cannot
    /// see gone (another host's, or one whose clock ran ahead). A local repository's
    /// lock ends with its process; this removes nothing more there
    #[arg(long)]
    remove_all: bool,
}

pub fn run(args: UnlockArgs, g: &Globals, out: &Output) -> Result<ExitCode> {
    g.repo.require_lock("removes locks")?;
    let (storage, keys) = g.repo.lock_storage(out)?;
    let removal = RepoLock::remove_stale(&storage.backend, keys.as_ref(), args.remove_all)?;
    out.print(&Unlocked(&removal))?;
    Ok(ExitCode::SUCCESS)
}

/// What was removed and which holders' locks remain (`removed`, `kept` in JSON).
#[derive(serde::Serialize)]
#[serde(transparent)]
struct Unlocked<'a>(&'a Removal);

impl Render for Unlocked<'_> {
    fn write_text(&self, w: &mut dyn Write) -> io::Result<()> {
        for removed in &self.0.removed {
            match removed {
                RemovedLock::Stale(h) => writeln!(w, "removed the stale lock of {}", h.describe())?,
                RemovedLock::Live(h) => writeln!(w, "removed the lock of {}", h.describe())?,
                RemovedLock::Unreadable { name, why } => writeln!(
                    w,
                    "removed lock object {}, which could not be read: {}",
                    shown(name),
                    escape_controls(why.as_bytes())
                )?,
            }
        }
        for h in &self.0.kept {
            writeln!(
                w,
                "left the lock of {}: its holder may still run (`larder unlock --remove-all` \
                 removes it, once you know it is gone)",
                h.describe()
            )?;
        }
        match (self.0.removed.is_empty(), self.0.kept.is_empty()) {
            (true, true) => writeln!(w, "the repository is not locked; nothing to remove"),
            (_, true) => writeln!(w, "the repository is not locked by a process that is gone"),
            (_, false) => writeln!(w, "the repository is still locked"),
        }
    }
}
