//! `larder bench report`: every experiment of larder-bench in one run. The work is in
//! `larder_bench::report_all`; this module sets the plan from the arguments and hands
//! the result to [`Output`].

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;
use larder_bench::report_all::{run_report, ReportPlan};

use crate::output::Output;
use crate::size;

#[derive(Args)]
pub struct ReportArgs {
    /// Files, or directories whose regular files are taken in sorted order: a second
    /// dataset beside the generated one (each file one stream for the chunking
    /// experiments; all backed up together for the pipeline's)
    pub paths: Vec<PathBuf>,
    /// Fewer runs and sizes: 64 MiB generations, 1 million index keys, under 10
    /// minutes on 2 cores with the Django release series as PATH
    #[arg(long)]
    pub quick: bool,
    /// Directory for report.md and the SVG plots (created)
    #[arg(long, default_value = "larder-bench-report")]
    pub out: PathBuf,
    /// Bytes of each generated generation [default: 256MiB, or 64MiB with --quick]
    #[arg(long, value_parser = size::parse_nonzero)]
    pub size: Option<usize>,
    /// Keys of the index experiment, one size [default: 1 and 10 million, or 1 million with --quick]
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub index_keys: Option<u64>,
    /// Runs of every timed configuration [default: 5, or 3 with --quick]
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub runs: Option<u32>,
    /// Most input loaded into memory from PATHs (KiB/MiB/GiB suffixes accepted)
    #[arg(long, default_value = "2GiB", value_parser = size::parse)]
    pub max_input: usize,
}

/// `larder bench report`.
pub fn report(args: &ReportArgs, out: &Output) -> Result<()> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut plan = ReportPlan::new(args.quick, cores);
    if let Some(size) = args.size {
        plan.generated.generation_size = size as u64;
    }
    if let Some(keys) = args.index_keys {
        plan.index.sizes = vec![keys as usize];
    }
    if let Some(runs) = args.runs {
        let runs = runs as usize;
        (plan.chunk.runs, plan.pipeline.runs, plan.index.runs) = (runs, runs, runs);
    }
    plan.max_input = args.max_input as u64;
    let command: Vec<String> = std::iter::once("larder".to_string())
        .chain(std::env::args().skip(1))
        .collect();
    let results = run_report(
        &args.paths,
        &plan,
        &args.out,
        &command.join(" "),
        &mut |step| out.note(step),
    )?;
    out.bench_report_done(&results);
    Ok(())
}
