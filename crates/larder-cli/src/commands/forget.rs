//! `larder forget`: remove snapshots, named or by a retention policy; their data stays
//! until `gc` (or `--prune`) (docs/design/gc.md).

use std::io::{self, Write};
use std::process::ExitCode;

use anyhow::Result;
use clap::Args;
use larder_engine::{
    local_offset, plan_forget, plan_forget_named, ForgetDecision, RetentionPolicy,
};
use larder_store::{GcOptions, LockMode, Repository};
use serde::Serialize;

use super::gc::Collected;
use super::Globals;
use crate::output::{shown, Output, Render};

#[derive(Args)]
pub struct ForgetArgs {
    /// Snapshots to remove (id prefixes, or `latest`); or give a policy instead
    snapshots: Vec<String>,
    /// Keep the N newest snapshots
    #[arg(long, value_name = "N", default_value_t = 0)]
    keep_last: usize,
    /// Keep the newest snapshot of each of the N newest days (local time) that have one
    #[arg(long, value_name = "N", default_value_t = 0)]
    keep_daily: usize,
    /// Keep the newest snapshot of each of the N newest ISO weeks that have one
    #[arg(long, value_name = "N", default_value_t = 0)]
    keep_weekly: usize,
    /// Keep the newest snapshot of each of the N newest months that have one
    #[arg(long, value_name = "N", default_value_t = 0)]
    keep_monthly: usize,
    /// Only list what would be kept and removed
    #[arg(long)]
    dry_run: bool,
    /// Run `gc` afterwards
    #[arg(long)]
    prune: bool,
    /// With --prune: gc's repack threshold (percent)
    #[arg(long, value_name = "PCT", default_value_t = 50, value_parser = clap::value_parser!(u8).range(0..=100))]
    repack_threshold: u8,
}

impl ForgetArgs {
    /// The policy; on error (snapshots and a policy, or neither), the usage message.
    fn policy(&self) -> Result<RetentionPolicy, &'static str> {
        let policy = RetentionPolicy {
            last: self.keep_last,
            daily: self.keep_daily,
            weekly: self.keep_weekly,
            monthly: self.keep_monthly,
        };
        match (self.snapshots.is_empty(), policy.keeps_nothing()) {
            (true, true) => Err(
                "name the snapshots to forget, or give a policy that keeps some \
                 (--keep-last, --keep-daily, --keep-weekly, --keep-monthly)",
            ),
            (false, false) => Err("give either snapshots to forget or a --keep-* policy, not both"),
            _ => Ok(policy),
        }
    }
}

pub fn run(args: ForgetArgs, g: &Globals, out: &Output) -> Result<ExitCode> {
    let policy = match args.policy() {
        Ok(policy) => policy,
        Err(msg) => return Ok(out.usage(msg)),
    };
    let mut repo = g.repo.open(LockMode::Exclusive, out)?;
    repo.require_full_key("forget snapshots")?;
    let decisions = decide(&repo, &args.snapshots, &policy, out)?;
    let removed: Vec<String> = decisions
        .iter()
        .filter(|d| d.reasons.is_empty())
        .map(|d| d.id.clone())
        .collect();
    if !args.dry_run {
        larder_engine::forget(&repo, &removed)?;
    }
    let gc = if args.prune {
        let opts = GcOptions {
            repack_threshold: args.repack_threshold,
            dry_run: args.dry_run,
            ..GcOptions::default()
        };
        Some(match args.dry_run {
            true => larder_engine::gc_preview(&mut repo, &opts, &removed)?,
            false => larder_engine::gc(&mut repo, &opts)?,
        })
        .inspect(|summary| super::gc::warn_if_disk_was_full(&summary.sweep, out))
    } else {
        None
    };
    out.print(&Forgotten::new(
        &decisions,
        args.dry_run,
        gc.as_ref().map(Collected::from),
    ))?;
    Ok(ExitCode::SUCCESS)
}

/// Which snapshots to keep (each with its reasons) and which to remove: those `named`,
/// or those the policy keeps no reason for.
fn decide(
    repo: &Repository,
    named: &[String],
    policy: &RetentionPolicy,
    out: &Output,
) -> Result<Vec<ForgetDecision>> {
    let (snapshots, unreadable) = repo.snapshots()?;
    for e in unreadable.iter().filter(|e| !names_unreadable(named, e)) {
        out.warn(&larder_store::error_chain(e));
    }
    if named.is_empty() {
        return Ok(plan_forget(&snapshots, policy, local_offset));
    }
    // By file name, so that a snapshot that cannot be read can be named too.
    let mut ids = Vec::new();
    for name in named {
        ids.push(repo.resolve_snapshot(name)?);
    }
    Ok(plan_forget_named(&snapshots, &ids))
}

/// Whether `e` is about a snapshot that one of `named` names: no warning then, it is
/// being removed.
fn names_unreadable(named: &[String], e: &larder_store::StoreError) -> bool {
    matches!(e, larder_store::StoreError::UnreadableSnapshot { id, .. }
        if named.iter().any(|n| !n.is_empty() && id.starts_with(n.as_str())))
}

/// The snapshots kept and removed (or, in a dry run, that would be), and the gc after.
#[derive(Serialize)]
struct Forgotten<'a> {
    dry_run: bool,
    keep: Vec<Kept<'a>>,
    remove: Vec<Removed<'a>>,
    /// With `--prune`.
    gc: Option<Collected<'a>>,
}

#[derive(Serialize)]
struct Kept<'a> {
    #[serde(flatten)]
    snapshot: Removed<'a>,
    reasons: Vec<&'static str>,
}

#[derive(Serialize)]
struct Removed<'a> {
    id: &'a str,
    time: &'a str,
    hostname: &'a str,
    paths: &'a [String],
    /// A snapshot file that cannot be read: only its id is known.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    unreadable: bool,
}

impl<'a> Removed<'a> {
    fn new(d: &'a ForgetDecision) -> Self {
        Self {
            id: &d.id,
            time: &d.time,
            hostname: &d.hostname,
            paths: &d.paths,
            unreadable: d.unreadable,
        }
    }

    /// `  ID8  TIME  HOST  PATHS` and `why`; what came from storage escaped.
    fn write_line(&self, w: &mut dyn Write, why: &str) -> io::Result<()> {
        if self.unreadable {
            let short = shown(self.id.get(..8).unwrap_or(self.id));
            return writeln!(w, "  {short}  (unreadable){why}");
        }
        let paths: Vec<String> = self.paths.iter().map(|p| shown(p)).collect();
        writeln!(
            w,
            "  {}  {}  {}  {}{why}",
            shown(self.id.get(..8).unwrap_or(self.id)),
            shown(self.time.get(..19).unwrap_or(self.time)),
            shown(self.hostname),
            paths.join(" ")
        )
    }
}

impl<'a> Forgotten<'a> {
    fn new(decisions: &'a [ForgetDecision], dry_run: bool, gc: Option<Collected<'a>>) -> Self {
        let (keep, remove): (Vec<&ForgetDecision>, Vec<&ForgetDecision>) =
            decisions.iter().partition(|d| !d.reasons.is_empty());
        Self {
            dry_run,
            keep: keep
                .into_iter()
                .map(|d| Kept {
                    snapshot: Removed::new(d),
                    reasons: d.reasons.iter().map(|r| r.name()).collect(),
                })
                .collect(),
            remove: remove.into_iter().map(Removed::new).collect(),
            gc,
        }
    }
}

impl Render for Forgotten<'_> {
    fn write_text(&self, w: &mut dyn Write) -> io::Result<()> {
        writeln!(w, "keep {} snapshot(s):", self.keep.len())?;
        for k in &self.keep {
            k.snapshot
                .write_line(w, &format!("  ({})", k.reasons.join(", ")))?;
        }
        let verb = if self.dry_run {
            "would remove"
        } else {
            "removed"
        };
        writeln!(w, "{verb} {} snapshot(s):", self.remove.len())?;
        for r in &self.remove {
            r.write_line(w, "")?;
        }
        if let Some(gc) = &self.gc {
            // In a dry run, what gc would do once those snapshots were gone.
            gc.write_text(w)?;
        }
        if self.dry_run {
            writeln!(w, "dry run: nothing was changed")
        } else if self.gc.is_some() {
            Ok(())
        } else if !self.remove.is_empty() {
            writeln!(w, "their data stays in the repository until `larder gc`")
        } else {
            Ok(())
        }
    }
}
