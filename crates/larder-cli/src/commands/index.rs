//! `larder index rebuild` (also `larder rebuild-index`) and `larder index convert`, and
//! the index options `init` shares. Both report in notes only: they print no result.

use std::process::ExitCode;

use anyhow::Result;
use clap::{Args, Subcommand};
use larder_store::{DiskLookup, IndexSettings, LockMode};

use super::{exit_code, Globals};
use crate::output::Output;
use crate::size;

/// The index options of `init`.
#[derive(Args)]
pub struct IndexArgs {
    /// Fingerprint index: memory (rebuilt from the segments at every open) or disk
    /// (on disk, within --index-memory; for repositories whose index outgrows memory)
    #[arg(long = "index", default_value = "memory", value_parser = ["memory", "disk"])]
    kind: String,
    /// Disk index lookup: eager (each lookup at once) or lazy (buffered, batched)
    #[arg(long, default_value = "lazy", value_parser = ["eager", "lazy"])]
    index_lookup: String,
    /// Disk index memory budget: Bloom filter, cache and buffers together
    #[arg(long, default_value = "256MiB", value_parser = size::parse)]
    index_memory: usize,
}

impl IndexArgs {
    pub fn settings(&self) -> IndexSettings {
        settings(&self.kind, &self.index_lookup, self.index_memory)
    }
}

/// `kind` and `lookup` are among the values clap lets through.
fn settings(kind: &str, lookup: &str, memory: usize) -> IndexSettings {
    match kind {
        "memory" => IndexSettings::Memory,
        _ => IndexSettings::Disk {
            lookup: match lookup {
                "eager" => DiskLookup::Eager,
                _ => DiskLookup::Lazy,
            },
            memory: memory as u64,
        },
    }
}

#[derive(Subcommand)]
pub enum IndexCommand {
    /// Rebuild the index segments, and the disk index if there is one, from the
    /// containers alone
    Rebuild(RebuildArgs),
    /// Convert the index to another kind (or another lookup or budget); the segments
    /// stay the source of truth, so either way nothing is lost
    Convert(ConvertArgs),
}

#[derive(Args)]
pub struct RebuildArgs {}

#[derive(Args)]
pub struct ConvertArgs {
    /// memory or disk
    #[arg(long = "to", value_parser = ["memory", "disk"])]
    kind: String,
    #[arg(long, default_value = "lazy", value_parser = ["eager", "lazy"])]
    index_lookup: String,
    #[arg(long, default_value = "256MiB", value_parser = size::parse)]
    index_memory: usize,
}

pub fn run(command: IndexCommand, g: &Globals, out: &Output) -> Result<ExitCode> {
    match command {
        IndexCommand::Rebuild(args) => rebuild(args, g, out),
        IndexCommand::Convert(args) => convert(args, g, out),
    }
}

/// Exit code 3 when some containers were left out of the index (each is named).
pub fn rebuild(_args: RebuildArgs, g: &Globals, out: &Output) -> Result<ExitCode> {
    let mut repo = g.repo.open(LockMode::Exclusive, out)?;
    let bad = repo.rebuild_index()?;
    for (id, reason) in &bad {
        out.warn(&format!(
            "container {id:016x} left out of the index: {reason}; `larder repair` deletes it and writes copies of the snapshots that used it without what they lost"
        ));
    }
    out.note(&format!(
        "index rebuilt from {} containers ({} chunks, {} index)",
        repo.indexed_containers().len(),
        repo.index().len(),
        repo.config().index.describe()
    ));
    Ok(exit_code(!bad.is_empty()))
}

fn convert(args: ConvertArgs, g: &Globals, out: &Output) -> Result<ExitCode> {
    let to = settings(&args.kind, &args.index_lookup, args.index_memory);
    if let Err(e) = to.validate() {
        return Ok(out.usage(&e.to_string()));
    }
    let mut repo = g.repo.open(LockMode::Exclusive, out)?;
    let from = repo.config().index.describe();
    repo.convert_index(to)?;
    out.note(&format!(
        "index converted from {from} to {} ({} chunks)",
        to.describe(),
        repo.index().len()
    ));
    Ok(ExitCode::SUCCESS)
}
