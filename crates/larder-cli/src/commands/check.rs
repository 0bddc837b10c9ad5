//! `larder check`: verify the repository; with `--read-data`, every chunk too.

use std::collections::BTreeSet;
use std::io::{self, Write};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Result;
use clap::Args;
use larder_engine::{escape_name, CheckOptions, CheckReport, Damage, Progress};
use larder_store::LockMode;
use serde::Serialize;

use super::Globals;
use crate::output::{mb, Bar, Output, Render};

#[derive(Args)]
pub struct CheckArgs {
    #[arg(long)]
    read_data: bool,
}

/// Exit code 1 when the check found damage in the repository. A remote repository's
/// metadata is read from its storage, not from the cache; cache entries that differ
/// from it are refreshed and named, which alone is no damage (exit code 0).
pub fn run(args: CheckArgs, g: &Globals, out: &Output) -> Result<ExitCode> {
    let (repo, cache) = g.repo.open_verifying(LockMode::Shared, out)?;
    repo.require_full_key("check the repository")?;
    let bar = Arc::new(Bar::bytes(out));
    let opts = CheckOptions {
        read_data: args.read_data,
        progress: bar.clone() as Arc<dyn Progress>,
    };
    let report = larder_engine::check(&repo, &opts)?;
    bar.finish();
    for plan in repo.pending_gc_plans()? {
        out.note(&format!(
            "garbage collection {plan} was interrupted; the next writer (backup, gc, ...) finishes or rolls it back (docs/design/gc.md)"
        ));
    }
    // Every segment was read at open and every snapshot by the check.
    let cache_refreshed = cache.map(|c| c.refreshed()).unwrap_or_default();
    for path in &cache_refreshed {
        out.warn(&format!(
            "cache entry {path} differs from the repository; refreshed"
        ));
    }
    out.print(&Checked {
        ok: report.is_ok(),
        read_data: args.read_data,
        report: &report,
        cache_refreshed: &cache_refreshed,
        advice: advice(&report),
    })?;
    Ok(if report.is_ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// The check's report, which names every problem.
#[derive(Serialize)]
struct Checked<'a> {
    ok: bool,
    read_data: bool,
    report: &'a CheckReport,
    /// Cache entries (as repository paths) that differed from the repository's files
    /// and were replaced with them: damage of the local cache, not of the repository.
    cache_refreshed: &'a [String],
    /// What fixes the damage found, each line naming its command.
    advice: Vec<String>,
}

impl Render for Checked<'_> {
    fn problems(&self) -> Vec<String> {
        let r = self.report;
        let mut lines: Vec<String> = r
            .damage
            .iter()
            .map(|d| format!("damage: {}", describe(d)))
            .collect();
        lines.extend(self.advice.iter().map(|a| format!("advice: {a}")));
        if !self.ok {
            lines.push(format!("error: check found {} problem(s)", r.damage.len()));
        }
        lines
    }

    fn write_text(&self, w: &mut dyn Write) -> io::Result<()> {
        let r = self.report;
        let read = if self.read_data {
            format!(", read {}", mb(r.bytes_read))
        } else {
            String::new()
        };
        let verdict = if self.ok {
            "no errors".to_string()
        } else {
            format!("{} problem(s)", r.damage.len())
        };
        writeln!(
            w,
            "checked {} snapshots, {} containers, {} chunks{read}: {verdict}",
            r.snapshots, r.containers, r.chunks
        )
    }
}

fn describe(d: &Damage) -> String {
    match d {
        Damage::Segment { name, reason } => format!("index segment {name}: {reason}"),
        Damage::Container { id, reason } => format!("container {id}: {reason}"),
        Damage::Chunks { container, count } => {
            format!("container {container}: {count} chunk(s) damaged")
        }
        Damage::Unindexed { id, reason } => format!("container {id}: {reason}"),
        Damage::Snapshot { id, reason } => format!("snapshot {id} is unreadable: {reason}"),
        Damage::Tree { snapshot, reason } => {
            format!("snapshot {snapshot}: tree unreadable: {reason}")
        }
        Damage::File {
            snapshot,
            path,
            bad_chunks,
        } => {
            let path = escape_name(path);
            format!("snapshot {snapshot}: file {path} has {bad_chunks} damaged or missing chunk(s)")
        }
    }
}

/// What fixes the damage `r` found, each remedy naming its command (shown after the
/// damage as `advice: LINE`).
fn advice(r: &CheckReport) -> Vec<String> {
    let mut lines = Vec::new();
    let mut containers = BTreeSet::new();
    let mut index_only = true;
    for d in &r.damage {
        match d {
            Damage::Chunks { container, .. } | Damage::Container { id: container, .. } => {
                containers.insert(container.as_str());
                index_only = false;
            }
            Damage::Tree { .. } | Damage::File { .. } => index_only = false,
            Damage::Segment { .. } | Damage::Unindexed { .. } | Damage::Snapshot { .. } => {}
        }
    }
    let repairable = r
        .damage
        .iter()
        .any(|d| !matches!(d, Damage::Snapshot { .. }));
    if repairable && index_only {
        lines.push("`larder repair` (or `larder index rebuild`) writes the index again".into());
    } else if repairable {
        let only: String = containers
            .iter()
            .map(|c| format!(" --container {c}"))
            .collect();
        let only = match only.is_empty() {
            true => String::new(),
            false => format!("; `larder repair{only}` reads only the damaged containers"),
        };
        lines.push(format!(
            "`larder repair` salvages the intact chunks, removes the damaged ones from \
             the index so that the next backup stores them again, and writes copies of the \
             snapshots that lost data without it{only}"
        ));
    }
    for d in &r.damage {
        if let Damage::Snapshot { id, .. } = d {
            let short = id.get(..8).unwrap_or(id);
            lines.push(format!(
                "`larder forget {short}` removes snapshot {short}, which is unreadable"
            ));
        }
    }
    let damaged: BTreeSet<&str> = r
        .damage
        .iter()
        .filter_map(|d| match d {
            Damage::Tree { snapshot, .. } | Damage::File { snapshot, .. } => {
                Some(snapshot.as_str())
            }
            _ => None,
        })
        .collect();
    for c in r
        .repaired_copies
        .iter()
        .filter(|c| damaged.contains(c.original.as_str()))
    {
        lines.push(format!(
            "snapshot {} has a repaired copy, {}: a backup of the same files makes it whole again; `larder forget {}` once what it still holds is not needed",
            c.original, c.copy, c.original
        ));
    }
    lines
}
