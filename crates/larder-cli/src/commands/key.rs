//! `larder key`: list, add, remove and change the password of an encrypted
//! repository's key slots (docs/design/crypto.md, "Key slots").

use std::io::{self, Write};
use std::process::ExitCode;

use anyhow::{bail, Result};
use clap::{Args, Subcommand};
use larder_crypto::{KdfParams, KeyKind};
use larder_store::{keys, LockMode, Repository};
use serde::Serialize;

use super::Globals;
use crate::output::{shown, Output, Render};
use crate::password::NewPasswordArgs;
use crate::repo_open::new_slot;

#[derive(Subcommand)]
pub enum KeyCommand {
    /// List the key slots
    List,
    /// Add a key slot with a new password: a full key, or with --write-only one that
    /// can back up but read nothing back
    Add(AddArgs),
    /// Remove a key slot (never the repository's last full key, nor the one in use)
    Remove(RemoveArgs),
    /// Change the password of the key slot in use
    Passwd(PasswdArgs),
}

#[derive(Args)]
pub struct AddArgs {
    /// The new key can back up into the repository and deduplicate, but cannot read,
    /// restore or delete anything
    #[arg(long)]
    write_only: bool,
    #[command(flatten)]
    new_password: NewPasswordArgs,
}

#[derive(Args)]
pub struct RemoveArgs {
    /// The slot's id, as `larder key list` shows it
    id: String,
}

#[derive(Args)]
pub struct PasswdArgs {
    #[command(flatten)]
    new_password: NewPasswordArgs,
}

pub fn run(command: KeyCommand, g: &Globals, out: &Output) -> Result<ExitCode> {
    if !matches!(command, KeyCommand::List) {
        // Key slots are written under the shared lock (docs/design/crypto.md).
        g.repo.require_lock("writes key slots")?;
    }
    let (repo, current) = g.repo.open_keyed(LockMode::Shared, out)?;
    let Some(current) = current else {
        bail!("this repository is not encrypted: it has no keys");
    };
    match command {
        KeyCommand::List => list(&repo, &current, out),
        KeyCommand::Add(args) => add(&repo, &args, out),
        KeyCommand::Remove(args) => remove(&repo, &current, &args.id, out),
        KeyCommand::Passwd(args) => passwd(&repo, &current, &args, out),
    }
}

fn list(repo: &Repository, current: &str, out: &Output) -> Result<ExitCode> {
    let slots = keys::list_slots(&*repo.backend())?
        .into_iter()
        .map(|(id, slot)| match slot {
            Ok(s) => Listed {
                current: id == current,
                id,
                kind: Some(s.kind().name()),
                created: s.created().to_string(),
                hostname: s.hostname().to_string(),
                username: s.username().to_string(),
                damaged: None,
            },
            Err(e) => Listed {
                current: false,
                id,
                kind: None,
                created: String::new(),
                hostname: String::new(),
                username: String::new(),
                damaged: Some(e.to_string()),
            },
        })
        .collect();
    out.print(&KeyList { slots })?;
    Ok(ExitCode::SUCCESS)
}

fn add(repo: &Repository, args: &AddArgs, out: &Output) -> Result<ExitCode> {
    repo.require_full_key("add keys")?;
    let keys = repo.keys().expect("an encrypted repository has keys");
    let kind = if args.write_only {
        KeyKind::WriteOnly
    } else {
        KeyKind::Full
    };
    let password = args.new_password.get()?;
    let slot = new_slot(keys, kind, &password, KdfParams::DEFAULT)?;
    let id = larder_crypto::random_id_hex(8);
    keys::write_slot(&*repo.backend(), &id, &slot)?;
    out.print(&Changed {
        action: "added",
        id: &id,
        kind: kind.name(),
    })?;
    Ok(ExitCode::SUCCESS)
}

fn remove(repo: &Repository, current: &str, id: &str, out: &Output) -> Result<ExitCode> {
    repo.require_full_key("remove keys")?;
    if id == current {
        bail!("refusing to remove key {id}: it is the one in use (unlock with another key to remove it)");
    }
    keys::remove_slot(&*repo.backend(), id)?;
    out.print(&Changed {
        action: "removed",
        id,
        kind: "",
    })?;
    Ok(ExitCode::SUCCESS)
}

/// Writes a slot of the same kind under the new password, then removes the old one: a
/// crash in between leaves both, each opening the key.
fn passwd(repo: &Repository, current: &str, args: &PasswdArgs, out: &Output) -> Result<ExitCode> {
    let keys = repo.keys().expect("an encrypted repository has keys");
    let kind = keys.kind();
    let password = args.new_password.get()?;
    let slot = new_slot(keys, kind, &password, KdfParams::DEFAULT)?;
    let id = larder_crypto::random_id_hex(8);
    keys::write_slot(&*repo.backend(), &id, &slot)?;
    keys::remove_slot(&*repo.backend(), current)?;
    out.print(&Changed {
        action: "changed the password: now",
        id: &id,
        kind: kind.name(),
    })?;
    Ok(ExitCode::SUCCESS)
}

#[derive(Serialize)]
struct Listed {
    id: String,
    current: bool,
    kind: Option<&'static str>,
    created: String,
    hostname: String,
    username: String,
    damaged: Option<String>,
}

#[derive(Serialize)]
struct KeyList {
    slots: Vec<Listed>,
}

impl Render for KeyList {
    fn write_text(&self, w: &mut dyn Write) -> io::Result<()> {
        writeln!(
            w,
            "  {:<16}  {:<10}  {:<20}  host / user",
            "id", "kind", "created"
        )?;
        // Slots come from storage: what they hold is escaped, as any name.
        for s in &self.slots {
            let mark = if s.current { "*" } else { " " };
            match &s.damaged {
                Some(e) => writeln!(w, "{mark} {:<16}  damaged: {}", shown(&s.id), shown(e))?,
                None => writeln!(
                    w,
                    "{mark} {:<16}  {:<10}  {:<20}  {} / {}",
                    shown(&s.id),
                    s.kind.unwrap_or(""),
                    shown(&s.created),
                    shown(&s.hostname),
                    shown(&s.username)
                )?,
            }
        }
        Ok(())
    }
}

#[derive(Serialize)]
struct Changed<'a> {
    action: &'static str,
    id: &'a str,
    kind: &'static str,
}

impl Render for Changed<'_> {
    fn write_text(&self, w: &mut dyn Write) -> io::Result<()> {
        match self.kind {
            "" => writeln!(w, "{} key {}", self.action, self.id),
            kind => writeln!(w, "{} {kind} key {}", self.action, self.id),
        }
    }
}
