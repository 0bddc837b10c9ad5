//! `larder chunk` and `larder bench chunk`: chunking without a repository. The work is
//! in larder-bench; this module runs it and hands the results to [`Output`].

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Result};
use larder_bench::{corpus::Corpus, plot, report, run_chunk_bench, stream, Plan};
use larder_chunk::{ChunkerConfig, ChunkerKind};

use crate::output::Output;
use crate::EXIT_PARTIAL;

/// Every chunker name, for help and error texts.
pub fn kind_names() -> String {
    let names: Vec<&str> = ChunkerKind::ALL.iter().map(|k| k.name()).collect();
    names.join(", ")
}

pub fn algo_help() -> String {
    format!(
        "Chunking algorithm: {} (fastcdc means fastcdc2020)",
        kind_names()
    )
}

/// `larder chunk` (`threads` 0: one per core): exit 0, or 3 when some files could not be read (each is named), or
/// an error (exit 1) when none could.
pub fn chunk(
    files: &[PathBuf],
    config: &ChunkerConfig,
    cuts: bool,
    threads: usize,
    out: &Output,
) -> Result<ExitCode> {
    let threads = match threads {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    };
    let report = stream::chunk_files(files, config, cuts, threads)?;
    if report.files.is_empty() {
        let messages: Vec<&str> = report.failed.iter().map(|f| f.message.as_str()).collect();
        bail!("{}", messages.join("; "));
    }
    for failure in &report.failed {
        out.error_line(&failure.message);
    }
    out.chunk_done(&report);
    Ok(if report.failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_PARTIAL)
    })
}

/// `larder bench chunk`: loads the inputs, runs the plan, writes the plots and
/// report.md into `dir`, prints the tables.
pub fn bench_chunk(
    paths: &[PathBuf],
    plan: &Plan,
    dir: &Path,
    max_input: u64,
    out: &Output,
) -> Result<()> {
    let (corpus, skipped) = Corpus::load(paths, max_input)?;
    for s in &skipped {
        out.note(&format!("skipped {}: {}", s.path.display(), s.reason));
    }
    out.note(&format!(
        "loaded {} file(s), {:.1} MB; measuring {} timed run(s) per configuration",
        corpus.streams.len(),
        corpus.bytes() as f64 / 1e6,
        plan.runs
    ));
    let report = run_chunk_bench(&corpus, plan, &mut |step| out.note(step))?;
    let plots = plot::write_all(&report, dir)?;
    let command: Vec<String> = std::iter::once("larder".to_string())
        .chain(std::env::args().skip(1))
        .collect();
    let markdown = report::report_markdown(&report, &plots, &command.join(" "));
    let report_path = dir.join("report.md");
    std::fs::write(&report_path, markdown)
        .map_err(|e| anyhow::anyhow!("writing {}: {e}", report_path.display()))?;
    out.bench_chunk_done(&report, &plots, &report_path);
    Ok(())
}
