//! `larder bench report`: every experiment of larder-bench in one run. The work is in
//! `larder_bench::report_all`; this module sets the plan from the arguments.

use std::io::{self, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use clap::Args;
use larder_bench::report_all::{run_report, ReportPlan, ReportResults};
use serde::Serialize;

use crate::output::{Output, Render};
use crate::size;

#[derive(Args)]
pub struct ReportArgs {
    /// Files, or directories whose regular files are taken in sorted order: a second
    /// dataset beside the generated one (each file one stream for the chunking
    /// experiments; all backed up together for the pipeline's)
    paths: Vec<PathBuf>,
    /// Fewer runs and sizes: 64 MiB generations, 1 million index keys, under 10
    /// minutes on 2 cores with the Django release series as PATH
    #[arg(long)]
    quick: bool,
    /// Directory for report.md and the SVG plots (created)
    #[arg(long, default_value = "larder-bench-report")]
    out: PathBuf,
    /// Bytes of each generated generation [default: 256MiB, or 64MiB with --quick]
    #[arg(long, value_parser = size::parse_nonzero)]
    size: Option<usize>,
    /// Keys of the index experiment, one size [default: 1 and 10 million, or 1 million with --quick]
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    index_keys: Option<u64>,
    /// Runs of every timed configuration [default: 5, or 3 with --quick]
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    runs: Option<u32>,
    /// Most input loaded into memory from PATHs (KiB/MiB/GiB suffixes accepted)
    #[arg(long, default_value = "2GiB", value_parser = size::parse)]
    max_input: usize,
}

impl ReportArgs {
    fn plan(&self) -> ReportPlan {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let mut plan = ReportPlan::new(self.quick, cores);
        if let Some(size) = self.size {
            plan.generated.generation_size = size as u64;
        }
        if let Some(keys) = self.index_keys {
            plan.index.sizes = vec![keys as usize];
        }
        if let Some(runs) = self.runs {
            let runs = runs as usize;
            (plan.chunk.runs, plan.pipeline.runs, plan.index.runs) = (runs, runs, runs);
        }
        plan.max_input = self.max_input as u64;
        plan
    }
}

pub fn run(args: ReportArgs, out: &Output) -> Result<ExitCode> {
    let results = run_report(
        &args.paths,
        &args.plan(),
        &args.out,
        &super::command_line(),
        &mut |step| out.note(step),
    )?;
    out.print(&Written::new(&results))?;
    Ok(ExitCode::SUCCESS)
}

/// The files the report wrote.
#[derive(Serialize)]
struct Written<'a> {
    report_md: &'a std::path::Path,
    plots: Vec<&'a str>,
    seconds: f64,
}

impl<'a> Written<'a> {
    fn new(r: &'a ReportResults) -> Self {
        Self {
            report_md: &r.report_path,
            plots: r.plots().into_iter().map(|p| p.file.as_str()).collect(),
            seconds: r.seconds,
        }
    }
}

impl Render for Written<'_> {
    fn write_text(&self, w: &mut dyn Write) -> io::Result<()> {
        writeln!(
            w,
            "{} plots and the report in {:.0} s: {}",
            self.plots.len(),
            self.seconds,
            self.report_md.display()
        )
    }
}
