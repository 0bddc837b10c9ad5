//! `larder check`: verify the repository; with `--read-data`, every chunk too.

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

/// Exit code 1 when the check found damage.
pub fn run(args: CheckArgs, g: &Globals, out: &Output) -> Result<ExitCode> {
    let repo = g.repo.open(LockMode::Shared, out)?;
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
    out.print(&Checked {
        ok: report.is_ok(),
        read_data: args.read_data,
        report: &report,
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
}

impl Render for Checked<'_> {
    fn problems(&self) -> Vec<String> {
        let r = self.report;
        let mut lines: Vec<String> = r
            .damage
            .iter()
            .map(|d| format!("damage: {}", describe(d)))
            .collect();
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
        Damage::Snapshot { reason } => format!("snapshot unreadable: {reason}"),
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
