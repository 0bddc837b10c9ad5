//! `larder bench chunk`: the FastCDC paper's chunking comparisons on files. The work is
//! in larder-bench; this module loads the inputs, runs the plan, and writes the plots
//! and report.md.

use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Result;
use clap::Args;
use larder_bench::chunk_plots;
use larder_bench::plot::PlotFile;
use larder_bench::{corpus::Corpus, report, run_chunk_bench, ChunkBenchReport, Plan};
use serde::Serialize;

use crate::output::{Output, Render};
use crate::size;

#[derive(Args)]
pub struct ChunkArgs {
    /// Files, or directories whose regular files are taken in sorted order; each
    /// file is one stream, and dedup is counted across all of them
    #[arg(required = true)]
    paths: Vec<PathBuf>,
    /// Fewer runs and sizes, for a first look
    #[arg(long)]
    quick: bool,
    /// Directory for the plots and report.md (created)
    #[arg(long, default_value = "larder-bench-chunk")]
    out: PathBuf,
    /// Timed runs of each configuration [default: 5, or 1 with --quick]
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    runs: Option<u32>,
    /// Most input loaded into memory (KiB/MiB/GiB suffixes accepted)
    #[arg(long, default_value = "2GiB", value_parser = size::parse)]
    max_input: usize,
}

pub fn run(args: ChunkArgs, out: &Output) -> Result<ExitCode> {
    let mut plan = if args.quick {
        Plan::quick()
    } else {
        Plan::full()
    };
    if let Some(runs) = args.runs {
        plan.runs = runs as usize;
    }
    let (corpus, skipped) = Corpus::load(&args.paths, args.max_input as u64)?;
    for s in &skipped {
        out.note(&format!("skipped {}: {}", s.path.display(), s.reason));
    }
    out.note(&format!(
        "loaded {} file(s), {:.1} MB; measuring {} timed run(s) per configuration",
        corpus.streams.len(),
        corpus.bytes() as f64 / 1e6,
        plan.runs
    ));
    let report = run_chunk_bench(&corpus, &plan, &mut |step| out.note(step))?;
    let plots = chunk_plots::write_all(&report, &args.out)?;
    let markdown = report::report_markdown(&report, &plots, &super::command_line());
    let report_path = args.out.join("report.md");
    std::fs::write(&report_path, markdown)
        .map_err(|e| anyhow::anyhow!("writing {}: {e}", report_path.display()))?;
    out.print(&Measured {
        report: &report,
        report_md: &report_path,
        plots: &plots,
    })?;
    Ok(ExitCode::SUCCESS)
}

/// The measurements, and the files written.
#[derive(Serialize)]
struct Measured<'a> {
    report: &'a ChunkBenchReport,
    report_md: &'a Path,
    plots: &'a [PlotFile],
}

impl Render for Measured<'_> {
    fn write_text(&self, w: &mut dyn Write) -> io::Result<()> {
        write!(w, "{}", report::markdown_tables(self.report))?;
        writeln!(
            w,
            "{} plots and the report: {}",
            self.plots.len(),
            self.report_md.display()
        )
    }
}
