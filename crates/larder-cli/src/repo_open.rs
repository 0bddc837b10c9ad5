//! Finding and opening the repository: `--repo` (or `LARDER_REPO`, or the default one
//! under `$XDG_DATA_HOME`, created on first use) and `--retry-lock`. Opening says what
//! the repository recovered from (interrupted gc, unindexed containers, a stale disk
//! index) in notes and warnings.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use larder_chunk::ChunkerConfig;
use larder_hash::HashAlgo;
use larder_store::{LockMode, OpenReport, RepoConfig, Repository};

use crate::output::Output;

/// The global options that say which repository a command works on, and how long it
/// waits for another process's lock.
pub struct RepoOpener {
    path: Option<PathBuf>,
    retry_lock: Duration,
}

impl RepoOpener {
    pub fn new(path: Option<PathBuf>, retry_lock: Duration) -> Self {
        Self { path, retry_lock }
    }

    /// Where `init` creates the repository: `--repo`, or the default path.
    pub fn init_path(&self) -> Result<PathBuf> {
        match &self.path {
            Some(p) => Ok(p.clone()),
            None => default_repo(),
        }
    }

    /// The repository to use; the default one is created on first use.
    pub fn path(&self, out: &Output) -> Result<PathBuf> {
        if let Some(p) = &self.path {
            return Ok(p.clone());
        }
        let path = default_repo()?;
        if !path.join("config").exists() {
            Repository::init(
                &path,
                &RepoConfig::new(ChunkerConfig::default(), HashAlgo::Blake3),
            )
            .with_context(|| format!("creating the default repository at {}", path.display()))?;
            out.note(&format!(
                "created the default repository at {}",
                path.display()
            ));
        }
        Ok(path)
    }

    /// Opens the repository with the lock `mode`, waiting up to `--retry-lock` for it.
    pub fn open(&self, mode: LockMode, out: &Output) -> Result<Repository> {
        let repo = Repository::open_waiting(&self.path(out)?, mode, self.retry_lock)?;
        report_gc_recovery(repo.report(), out);
        report_index_recovery(repo.report(), out);
        Ok(repo)
    }
}

fn default_repo() -> Result<PathBuf> {
    let base = match std::env::var_os("XDG_DATA_HOME").filter(|v| !v.is_empty()) {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(
            std::env::var_os("HOME").context("neither --repo, LARDER_REPO nor HOME is set")?,
        )
        .join(".local/share"),
    };
    Ok(base.join("larder").join("repo"))
}

/// What opening did about garbage collections that were interrupted.
fn report_gc_recovery(report: &OpenReport, out: &Output) {
    for id in &report.finished_gc {
        out.note(&format!(
            "finished garbage collection {id:016x}, which was interrupted after it committed"
        ));
    }
    for id in &report.rolled_back_gc {
        out.note(&format!(
            "rolled back garbage collection {id:016x}, which was interrupted before it committed; nothing was deleted"
        ));
    }
    for (name, reason) in &report.bad_gc_plans {
        out.warn(&format!(
            "gc plan {name} is damaged ({reason}); removed it and deleted nothing"
        ));
    }
}

/// What opening found and did about the index and the containers.
fn report_index_recovery(report: &OpenReport, out: &Output) {
    if !report.adopted_containers.is_empty() {
        out.note(&format!(
            "indexed {} container(s) that no index segment names (left by an interrupted backup); the next backup records them",
            report.adopted_containers.len()
        ));
    }
    for (name, reason) in &report.bad_segments {
        out.warn(&format!(
            "index segment {name} is damaged ({reason}); its containers were read directly"
        ));
    }
    if !report.disk_caught_up.is_empty() {
        out.note(&format!(
            "the disk index caught up with {} container(s) it lacked",
            report.disk_caught_up.len()
        ));
    }
    if let Some(why) = &report.disk_rebuilt {
        out.note(&format!(
            "the disk index was {why}: rebuilt it from the index segments"
        ));
    }
    if let Some(why) = &report.disk_fallback {
        out.warn(&format!(
            "the disk index is {why}: using the memory index for this command; a writer (e.g. `larder index rebuild`) repairs it"
        ));
    }
    for (id, reason) in &report.bad_containers {
        out.warn(&format!(
            "container {id:016x} is damaged and ignored: {reason}"
        ));
    }
}
