//! `larder bench report`: the papers' key experiments in one run, on generated
//! backup generations and on the files the user names, written as `report.md` and SVG
//! plots. Each experiment lives in its own module ([`crate::chunk`] for FastCDC,
//! [`crate::pipeline`] for P-Dedupe, [`crate::gen_truth`], [`crate::index`]); this one
//! runs them, and writes the report. `docs/design/bench.md` describes it.

use std::path::{Path, PathBuf};
use std::time::Instant;

use larder_chunk::ChunkerConfig;
use serde::Serialize;

use crate::chunk::{run_chunk_bench, ChunkBenchReport, Plan};
use crate::chunk_plots::render_all;
use crate::corpus::{Corpus, SkippedPath};
use crate::gen_truth::{generate, run_gen_truth, GenPlan, GenTruthReport};
use crate::index::{run_index_bench, IndexPlan, IndexRate};
use crate::pipeline::{run_pipeline_bench, PipelinePlan, PipelineReport};
use crate::plot::{format_size, PlotFile};
use crate::report_plots::{gen_truth_plot, index_plot, pipeline_plots};
use crate::BenchError;

/// Everything the report measures.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReportPlan {
    pub quick: bool,
    pub chunk: Plan,
    pub pipeline: PipelinePlan,
    pub generated: GenPlan,
    pub index: IndexPlan,
    /// Most bytes of the user's files loaded into memory.
    pub max_input: u64,
}

impl ReportPlan {
    /// `--quick`: three runs, fewer sizes, 64 MiB generations; otherwise the chunking
    /// bench's full plan, five runs and 256 MiB generations. `cores` sets the thread
    /// counts.
    pub fn new(quick: bool, cores: usize) -> Self {
        Self {
            quick,
            // Three runs even when quick, so that every speed has a spread.
            chunk: if quick {
                Plan {
                    runs: 3,
                    ..Plan::quick()
                }
            } else {
                Plan::full()
            },
            pipeline: PipelinePlan::new(quick, cores),
            generated: GenPlan {
                seed: 0,
                generation_size: if quick { 64 << 20 } else { 256 << 20 },
                generations: 5,
            },
            index: IndexPlan::new(quick, cores),
            max_input: 2 << 30,
        }
    }
}

/// The machine, as every figure states it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Machine {
    pub cpu: String,
    pub cores: usize,
    pub memory: String,
    pub os: String,
}

fn read_field(path: &str, key: &str, sep: char) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    text.lines()
        .filter_map(|l| l.split_once(sep))
        .find(|(k, _)| k.trim() == key)
        .map(|(_, v)| v.trim().trim_matches('"').to_string())
}

impl Machine {
    /// Read from `/proc` and `/etc/os-release`; what cannot be read says so.
    pub fn this() -> Self {
        let unknown = || "unknown".to_string();
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|_| unknown());
        let memory = read_field("/proc/meminfo", "MemTotal", ':')
            .and_then(|v| v.trim_end_matches(" kB").trim().parse::<f64>().ok())
            .map_or_else(unknown, |kib| format_size(kib * 1024.0));
        Self {
            cpu: read_field("/proc/cpuinfo", "model name", ':').unwrap_or_else(unknown),
            cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
            memory,
            os: format!(
                "{}, Linux {kernel}",
                read_field("/etc/os-release", "PRETTY_NAME", '=').unwrap_or_else(unknown)
            ),
        }
    }

    pub fn describe(&self) -> String {
        format!(
            "{}, {} cores, {} RAM, {}",
            self.cpu, self.cores, self.memory, self.os
        )
    }
}

/// One input of the experiments: the generated generations, or the user's files.
pub struct Dataset {
    pub name: String,
    /// File-name prefix of its plots.
    pub prefix: String,
    pub corpus: Corpus,
    pub files: Vec<PathBuf>,
}

/// What one dataset gave.
pub struct DatasetResults {
    pub name: String,
    pub bytes: u64,
    pub files: usize,
    pub chunk: ChunkBenchReport,
    pub pipeline: PipelineReport,
    pub plots: Vec<PlotFile>,
}

/// Everything measured, and the files written.
pub struct ReportResults {
    pub machine: Machine,
    pub plan: ReportPlan,
    pub scratch: String,
    pub datasets: Vec<DatasetResults>,
    pub gen_truth: GenTruthReport,
    pub gen_plot: PlotFile,
    pub index: Vec<IndexRate>,
    pub index_plot: PlotFile,
    pub skipped: Vec<SkippedPath>,
    pub seconds: f64,
    pub report_path: PathBuf,
}

impl ReportResults {
    /// Every plot written, in the order report.md shows them.
    pub fn plots(&self) -> Vec<&PlotFile> {
        self.datasets
            .iter()
            .flat_map(|d| &d.plots)
            .chain([&self.gen_plot, &self.index_plot])
            .collect()
    }
}

/// A directory on tmpfs for the benchmark's repositories and generated files where
/// there is one (`/dev/shm`), so that the disk stays out of the figures; the system
/// temporary directory otherwise. Removed when dropped.
fn scratch_dir() -> Result<(tempfile::TempDir, String), BenchError> {
    let shm = Path::new("/dev/shm");
    let make = |base: &Path| {
        tempfile::Builder::new()
            .prefix("larder-bench-report-")
            .tempdir_in(base)
    };
    if shm.is_dir() {
        if let Ok(dir) = make(shm) {
            let shown = format!("{} (tmpfs)", dir.path().display());
            return Ok((dir, shown));
        }
    }
    let base = std::env::temp_dir();
    let dir = make(&base).map_err(|e| BenchError::io(&base, e))?;
    let shown = format!(
        "{} (not tmpfs: disk writes are in the figures)",
        dir.path().display()
    );
    Ok((dir, shown))
}

fn write_plots(
    dir: &Path,
    plots: Vec<(PlotFile, String)>,
    prefix: &str,
) -> Result<Vec<PlotFile>, BenchError> {
    let mut files = Vec::new();
    for (mut file, svg) in plots {
        if !file.file.starts_with(prefix) {
            file.file = format!("{prefix}{}", file.file);
        }
        let path = dir.join(&file.file);
        std::fs::write(&path, svg).map_err(|e| BenchError::io(&path, e))?;
        files.push(file);
    }
    Ok(files)
}

/// Runs every experiment and writes `out/report.md` with its plots. `paths` (files or
/// directories, as `larder bench chunk` takes them) are a second dataset beside the
/// generated one. `command` is quoted in the report.
pub fn run_report(
    paths: &[PathBuf],
    plan: &ReportPlan,
    out: &Path,
    command: &str,
    progress: &mut dyn FnMut(&str),
) -> Result<ReportResults, BenchError> {
    let started = Instant::now();
    let machine = Machine::this();
    std::fs::create_dir_all(out).map_err(|e| BenchError::io(out, e))?;
    // The user's files first: a bad path fails before anything long has run.
    let mut skipped = Vec::new();
    let mut given = None;
    if !paths.is_empty() {
        let (corpus, s) = Corpus::load(paths, plan.max_input)?;
        skipped = s;
        let files = corpus
            .streams
            .iter()
            .map(|s| PathBuf::from(&s.name))
            .collect();
        let name = paths
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", ");
        given = Some(Dataset {
            name,
            prefix: "paths-".into(),
            corpus,
            files,
        });
    }
    let (scratch, scratch_shown) = scratch_dir()?;
    progress(&format!(
        "generating {} generations of {}",
        plan.generated.generations,
        format_size(plan.generated.generation_size as f64)
    ));
    let mut generated = generate(&plan.generated, &scratch.path().join("generations"))?;
    // The ground truth first, so that the generations' bytes then move into their
    // dataset instead of being held twice.
    progress("generator ground truth");
    let gen_truth = run_gen_truth(&generated, scratch.path(), progress)?;
    let mut inputs = vec![Dataset {
        name: "generated".into(),
        prefix: "generated-".into(),
        corpus: std::mem::take(&mut generated.corpus),
        files: std::mem::take(&mut generated.files),
    }];
    drop(generated);
    inputs.extend(given);
    let mut datasets = Vec::new();
    for d in inputs {
        progress(&format!("FastCDC experiments on {}", d.name));
        let chunk = run_chunk_bench(&d.corpus, &plan.chunk, progress)?;
        // Of the per-kind histograms, only larder's default chunker's: the cumulative
        // plot shows every kind's distribution, and `bench chunk` draws them all.
        let default_histogram = format!(
            "size-distribution-{}.svg",
            ChunkerConfig::default().kind.name()
        );
        let chunk_plots = render_all(&chunk)?
            .into_iter()
            .filter(|(p, _)| {
                !p.file.starts_with("size-distribution-") || p.file == default_histogram
            })
            .collect();
        let mut plots = write_plots(out, chunk_plots, &d.prefix)?;
        progress(&format!("P-Dedupe experiments on {}", d.name));
        let repos = scratch.path().join("repositories");
        std::fs::create_dir_all(&repos).map_err(|e| BenchError::io(&repos, e))?;
        let pipeline = run_pipeline_bench(
            &d.corpus,
            &d.files,
            &repos,
            &plan.pipeline,
            machine.cores,
            progress,
        )?;
        let short = if d.prefix == "generated-" {
            "generated data".to_string()
        } else {
            "the given files".to_string()
        };
        plots.extend(write_plots(
            out,
            pipeline_plots(&pipeline, &d.prefix, &short)?,
            &d.prefix,
        )?);
        datasets.push(DatasetResults {
            bytes: d.corpus.bytes(),
            files: d.files.len(),
            name: d.name,
            chunk,
            pipeline,
            plots,
        });
    }
    let gen_plot = write_plots(out, vec![gen_truth_plot(&gen_truth)?], "")?.remove(0);
    let index = run_index_bench(&plan.index, progress);
    let index_plot = write_plots(out, vec![index_plot(&index)?], "")?.remove(0);
    let mut results = ReportResults {
        machine,
        plan: plan.clone(),
        scratch: scratch_shown,
        datasets,
        gen_truth,
        gen_plot,
        index,
        index_plot,
        skipped,
        seconds: 0.0,
        report_path: out.join("report.md"),
    };
    results.seconds = started.elapsed().as_secs_f64();
    let markdown = crate::report_text::report_markdown(&results, command);
    std::fs::write(&results.report_path, markdown)
        .map_err(|e| BenchError::io(&results.report_path, e))?;
    Ok(results)
}
