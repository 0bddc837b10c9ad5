//! `forget`, `gc` (alias `prune`) and `unlock` (docs/design/gc.md).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Result;
use clap::Args;
use larder_engine::{
    local_offset, plan_forget, plan_forget_named, ForgetDecision, RetentionPolicy,
};
use larder_store::{GcOptions, LockMode, RepoLock};

use crate::output::Output;

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

#[derive(Args)]
pub struct GcArgs {
    /// Repack containers whose live fraction (of stored bytes) is below PCT percent
    #[arg(long, value_name = "PCT", default_value_t = 50, value_parser = clap::value_parser!(u8).range(0..=100))]
    repack_threshold: u8,
    /// Only report what would be deleted, repacked and reclaimed
    #[arg(long)]
    dry_run: bool,
}

pub fn forget(args: ForgetArgs, repo: Option<PathBuf>, out: &Output) -> Result<ExitCode> {
    let policy = RetentionPolicy {
        last: args.keep_last,
        daily: args.keep_daily,
        weekly: args.keep_weekly,
        monthly: args.keep_monthly,
    };
    match (args.snapshots.is_empty(), policy.keeps_nothing()) {
        (true, true) => {
            return Ok(out.usage(
                "name the snapshots to forget, or give a policy that keeps some \
                 (--keep-last, --keep-daily, --keep-weekly, --keep-monthly)",
            ))
        }
        (false, false) => {
            return Ok(out.usage("give either snapshots to forget or a --keep-* policy, not both"))
        }
        _ => {}
    }
    let path = crate::repo_path(repo, out)?;
    let mut repo = crate::open(&path, LockMode::Exclusive, out)?;
    let (snapshots, unreadable) = repo.snapshots()?;
    for e in &unreadable {
        out.warn(&larder_store::error_chain(e));
    }
    let decisions: Vec<ForgetDecision> = if args.snapshots.is_empty() {
        plan_forget(&snapshots, &policy, local_offset)
    } else {
        let mut named = Vec::new();
        for name in &args.snapshots {
            named.push(repo.find_snapshot(name)?.0);
        }
        plan_forget_named(&snapshots, &named)
    };
    let removed: Vec<String> = decisions
        .iter()
        .filter(|d| d.reasons.is_empty())
        .map(|d| d.id.clone())
        .collect();
    if !args.dry_run {
        larder_engine::forget(&repo, &removed)?;
    }
    let gc = if args.prune && !args.dry_run {
        let opts = GcOptions {
            repack_threshold: args.repack_threshold,
            ..GcOptions::default()
        };
        Some(larder_engine::gc(&mut repo, &opts)?)
    } else {
        None
    };
    out.forget_done(&decisions, args.dry_run, gc.as_ref());
    Ok(ExitCode::SUCCESS)
}

pub fn gc(args: GcArgs, repo: Option<PathBuf>, out: &Output) -> Result<ExitCode> {
    let path = crate::repo_path(repo, out)?;
    let mut repo = crate::open(&path, LockMode::Exclusive, out)?;
    let opts = GcOptions {
        repack_threshold: args.repack_threshold,
        dry_run: args.dry_run,
        crash_after_ops: None,
    };
    let summary = larder_engine::gc(&mut repo, &opts)?;
    out.gc_done(&summary);
    Ok(ExitCode::SUCCESS)
}

pub fn unlock(repo: Option<PathBuf>, out: &Output) -> Result<ExitCode> {
    let path = crate::repo_path(repo, out)?;
    let removed = RepoLock::remove_stale(&path)?;
    out.unlock_done(removed.as_ref());
    Ok(ExitCode::SUCCESS)
}

/// Parses `--retry-lock`: a number with a unit, `500ms`, `30s`, `5m`, `2h` (a bare
/// number is seconds).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(s.len());
    let (number, unit) = s.split_at(split);
    let n: f64 = number
        .parse()
        .map_err(|_| format!("{s:?} is not a duration (try 30s, 5m or 1h)"))?;
    let scale = match unit.trim() {
        "ms" => 1e-3,
        "" | "s" => 1.0,
        "m" | "min" => 60.0,
        "h" => 3600.0,
        other => {
            return Err(format!(
                "unknown duration unit {other:?} (use ms, s, m or h)"
            ))
        }
    };
    Duration::try_from_secs_f64(n * scale).map_err(|e| format!("{s:?}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::parse_duration;
    use std::time::Duration;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("30"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("1.5m"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("2h"), Ok(Duration::from_secs(7200)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert!(parse_duration("5 parsecs").is_err());
        assert!(parse_duration("s").is_err());
        assert!(parse_duration("-1s").is_err());
    }
}
