//! `larder bench chunk|report|index|gpu`: the experiments of larder-bench (and of
//! larder-gpu), without a repository.

mod chunk;
#[cfg(feature = "gpu")]
mod gpu;
mod index;
mod report;

use std::process::ExitCode;

use anyhow::Result;
use clap::{Args, Subcommand};

use crate::output::Output;

#[derive(Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    bench: BenchCommand,
}

#[derive(Subcommand)]
enum BenchCommand {
    /// The FastCDC paper's chunking comparisons on PATHs: speed, dedup ratio and average
    /// chunk size per algorithm and expected size, the minimum size's effect, chunk-size
    /// distributions. Tables on stdout; SVG plots and report.md in --out
    Chunk(chunk::ChunkArgs),
    /// The papers' key experiments in one run, on generated backup generations and on
    /// PATHs: FastCDC's chunking comparisons, P-Dedupe's serial, pipelined and parallel
    /// backups against its model, parallel against sequential chunking, larder's dedup
    /// against the generator's ground truth, index rates. report.md and SVG plots in --out
    Report(report::ReportArgs),
    /// Eager against lazy lookup in the disk index (the Lazy Exact Deduplication
    /// paper's Tables V to VII and Fig. 12) on a generated multi-generation chunk stream
    /// whose index is many times --index-memory: lazy with and without prelookup at
    /// each BFT, every answer checked against an oracle. Tables on stdout;
    /// disk-index.md and SVG plots in --out
    Index(index::IndexArgs),
    /// Chunking (FastCDC 2020, default sizes) plus fingerprints on the GPU, transfers
    /// included, against the CPU path on all cores: throughput, each host stage's share,
    /// PCIe bytes (built with the `gpu` feature only)
    #[cfg(feature = "gpu")]
    Gpu(gpu::GpuArgs),
}

pub fn run(args: BenchArgs, out: &Output) -> Result<ExitCode> {
    match args.bench {
        BenchCommand::Chunk(args) => chunk::run(args, out),
        BenchCommand::Report(args) => report::run(args, out),
        BenchCommand::Index(args) => index::run(args, out),
        #[cfg(feature = "gpu")]
        BenchCommand::Gpu(args) => gpu::run(args, out),
    }
}

/// The command line as run, for the reports to name.
fn command_line() -> String {
    let command: Vec<String> = std::iter::once("larder".to_string())
        .chain(
            std::env::args_os()
                .skip(1)
                .map(|a| a.to_string_lossy().into_owned()),
        )
        .collect();
    command.join(" ")
}
