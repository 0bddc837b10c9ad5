//! `larder copy`: copy snapshots from another repository (`--from-repo`) into this one
//! (docs/design/copy.md).

use std::io::{self, Write};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::Args;
use larder_engine::{CopyOptions, CopySummary, SkipReason};
use larder_store::LockMode;
use serde::Serialize;

use super::Globals;
use crate::location::{self, RepoLocation};
use crate::output::{mb, secs, Bar, Output, Render};
use crate::password::FromPasswordArgs;

#[derive(Args)]
pub struct CopyArgs {
    /// The repository to copy snapshots from (opened with a shared lock)
    #[arg(long, value_name = "REPO", env = "LARDER_FROM_REPO", value_parser = location::parse)]
    from_repo: RepoLocation,
    #[command(flatten)]
    from_password: FromPasswordArgs,
    /// Source snapshots to copy (id prefixes or `latest`) [default: every snapshot
    /// but checkpoints]
    #[arg(value_name = "SNAPSHOT")]
    snapshots: Vec<String>,
    /// Threads that cut and fingerprint files again when the repositories chunk
    /// differently [default: one per core]
    #[arg(long, default_value_t = 0)]
    threads: usize,
}

/// Copies the snapshots; the source's lock is waited for and its requests retried as
/// the destination's are (`--retry-lock`, `--retries`).
pub fn run(args: CopyArgs, g: &Globals, out: &Output) -> Result<ExitCode> {
    if same_repository(&args.from_repo, &g.repo.init_location()?) {
        return Ok(
            out.usage("--from-repo names the repository --repo names: copy from another one")
        );
    }
    let source = g.repo.other(
        args.from_repo.clone(),
        args.from_password.into_password_args(),
    );
    let src = source
        .open(LockMode::Shared, out)
        .with_context(|| format!("opening the source repository {}", args.from_repo))?;
    let mut dst = g.repo.open(LockMode::Exclusive, out)?;
    let bar = Arc::new(Bar::bytes(out));
    let opts = CopyOptions {
        snapshots: args.snapshots,
        threads: args.threads,
        progress: bar.clone(),
    };
    let summary = larder_engine::copy(&src, &mut dst, &opts);
    bar.finish();
    out.print(&Copied::from(&summary?))?;
    Ok(ExitCode::SUCCESS)
}

/// What a copy did, as `--json` prints it.
#[derive(Serialize)]
struct Copied<'a> {
    #[serde(flatten)]
    summary: &'a CopySummary,
    snapshots_copied: usize,
    snapshots_skipped: usize,
    seconds: f64,
}

impl<'a> From<&'a CopySummary> for Copied<'a> {
    fn from(summary: &'a CopySummary) -> Self {
        Self {
            summary,
            snapshots_copied: summary.copied.len(),
            snapshots_skipped: summary.skipped.len(),
            seconds: secs(summary.elapsed),
        }
    }
}

impl Render for Copied<'_> {
    fn write_text(&self, w: &mut dyn Write) -> io::Result<()> {
        let s = self.summary;
        for c in &s.copied {
            writeln!(
                w,
                "copied snapshot {} as {} ({} chunks, {})",
                short(&c.source),
                short(&c.destination),
                c.chunks_sent,
                mb(c.bytes_sent)
            )?;
        }
        for skipped in &s.skipped {
            let why = match skipped.reason {
                SkipReason::AlreadyCopied => "the destination holds it",
                SkipReason::Checkpoint => "a checkpoint; name it to copy it",
            };
            writeln!(w, "skipped snapshot {} ({why})", short(&skipped.source))?;
        }
        writeln!(
            w,
            "copied {} snapshots, {} chunks ({} raw, {} stored in {} containers); {} skipped",
            self.snapshots_copied,
            s.chunks_sent,
            mb(s.bytes_sent),
            mb(s.bytes_stored),
            s.containers_written,
            self.snapshots_skipped
        )?;
        if s.rechunked && self.snapshots_copied > 0 {
            writeln!(
                w,
                "  the repositories chunk differently: {} of files were cut again",
                mb(s.bytes_rechunked)
            )?;
        }
        writeln!(w, "  time {:.3} s", s.elapsed.as_secs_f64())
    }
}

/// Whether two paths name one directory (the source's shared lock would then refuse
/// the destination's exclusive one, as if another process held it).
/// Whether `a` and `b` are one repository: the same directory, or the same URL.
fn same_repository(a: &RepoLocation, b: &RepoLocation) -> bool {
    match (a, b) {
        (RepoLocation::Local(a), RepoLocation::Local(b)) => {
            match (a.canonicalize(), b.canonicalize()) {
                (Ok(a), Ok(b)) => a == b,
                _ => false,
            }
        }
        _ => a == b,
    }
}

/// The first 8 digits of a snapshot id, as `snapshots` shows them.
fn short(id: &str) -> &str {
    &id[..8.min(id.len())]
}
