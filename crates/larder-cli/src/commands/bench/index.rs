//! `larder bench index`: eager against lazy lookup in the disk index. The work is in
//! `larder_bench::disk_index`; this module sets the plan from the arguments.

use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Result;
use clap::{Args, ValueEnum};
use larder_bench::disk_index::{
    report_tables, run_disk_index_bench, DirectMode, DiskIndexPlan, DiskIndexReport,
    DiskIndexResults, RunKind,
};
use larder_bench::plot::PlotFile;
use serde::Serialize;

use crate::output::{Output, Render};
use crate::size;

/// The runs `--lookup` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum LookupArg {
    /// Eager lookup (one run: BFT does not apply)
    Eager,
    /// Lazy lookup with prelookup, at each BFT
    Lazy,
    /// Lazy lookup without prelookup, at each BFT
    LazyNoPrelookup,
}

impl LookupArg {
    fn kind(self) -> RunKind {
        match self {
            LookupArg::Eager => RunKind::Eager,
            LookupArg::Lazy => RunKind::Lazy,
            LookupArg::LazyNoPrelookup => RunKind::LazyNoPrelookup,
        }
    }
}

/// `--direct`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum DirectArg {
    /// O_DIRECT where --dir's filesystem takes it (not with --drop-caches)
    Auto,
    /// O_DIRECT, or fail
    On,
    /// Through the page cache
    Off,
}

#[derive(Args)]
pub struct IndexArgs {
    /// A small run for tests and CI: a first generation of 20 000 chunks under a 2 MiB
    /// budget, one run of each configuration
    #[arg(long)]
    quick: bool,
    /// Chunks of the first generation; each later one is about 4% larger [default:
    /// 500000, or 20000 with --quick]
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    chunks: Option<u64>,
    /// Backup generations
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..))]
    generations: u64,
    /// The index's memory budget: Bloom filter, cache, insert buffer and lazy buffer
    /// (KiB/MiB/GiB suffixes accepted) [default: 8MiB, or 2MiB with --quick]
    #[arg(long, value_parser = size::parse_nonzero)]
    index_memory: Option<usize>,
    /// Buffer fingerprint thresholds of the lazy runs, comma-separated
    #[arg(long, value_delimiter = ',', default_values = ["4", "8", "16", "32", "48", "64"],
          value_parser = clap::value_parser!(u64).range(1..))]
    bft: Vec<u64>,
    /// Which runs, comma-separated
    #[arg(long, value_enum, value_delimiter = ',',
          default_values = ["eager", "lazy", "lazy-no-prelookup"])]
    lookup: Vec<LookupArg>,
    /// Timed runs of each configuration, interleaved [default: 3, or 1 with --quick]
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    runs: Option<u32>,
    /// Open the index files with O_DIRECT, so that every read reaches the disk
    #[arg(long, value_enum, default_value = "auto")]
    direct: DirectArg,
    /// Sync and drop the page cache (write 3 to /proc/sys/vm/drop_caches) before each
    /// run; needs root
    #[arg(long)]
    drop_caches: bool,
    /// Scratch directory for the runs' indexes (a temporary directory inside it,
    /// removed after) [default: the system's temporary directory]
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Directory for disk-index.md and the SVG plots (created)
    #[arg(long, default_value = "larder-bench-index")]
    out: PathBuf,
    /// Split a lazy batch's read where more than PAGES unneeded table pages lie between
    /// needed ones [default: one read per batch, as the paper]
    #[arg(long, value_name = "PAGES")]
    batch_gap: Option<u64>,
    /// Bytes of chunk data the index's budget reserves per lazily buffered fingerprint:
    /// 0 as backup configures it (stage 3 holds the chunks in its own share), 8192 for
    /// the paper's layout (chunks inside the budget: fewer, wider buffer buckets)
    #[arg(long, value_name = "BYTES", default_value_t = 0)]
    buffered_chunk_bytes: u64,
    /// Seed of the chunk stream
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

impl IndexArgs {
    fn plan(&self) -> DiskIndexPlan {
        let mut plan = DiskIndexPlan::new(self.quick);
        plan.seed = self.seed;
        if let Some(chunks) = self.chunks {
            plan.first_generation = chunks as usize;
        }
        plan.generations = self.generations as usize;
        if let Some(budget) = self.index_memory {
            plan.memory_budget = budget as u64;
        }
        plan.bfts = self.bft.iter().map(|&b| b as usize).collect();
        plan.bfts.sort_unstable();
        plan.bfts.dedup();
        plan.kinds = self.lookup.iter().map(|l| l.kind()).collect();
        if let Some(runs) = self.runs {
            plan.runs = runs as usize;
        }
        plan.direct = match self.direct {
            DirectArg::Auto => DirectMode::Auto,
            DirectArg::On => DirectMode::On,
            DirectArg::Off => DirectMode::Off,
        };
        plan.drop_caches = self.drop_caches;
        if let Some(gap) = self.batch_gap {
            plan.batch_gap_pages = gap;
        }
        plan.buffered_chunk_bytes = self.buffered_chunk_bytes;
        if let Some(dir) = &self.dir {
            plan.dir = dir.clone();
        }
        plan
    }
}

pub fn run(args: IndexArgs, out: &Output) -> Result<ExitCode> {
    let results = run_disk_index_bench(
        &args.plan(),
        &args.out,
        &super::command_line(),
        &mut |step| out.note(step),
    )?;
    out.print(&Measured::from(&results))?;
    Ok(ExitCode::SUCCESS)
}

/// The measurements, and the files written.
#[derive(Serialize)]
struct Measured<'a> {
    report: &'a DiskIndexReport,
    report_md: &'a Path,
    plots: &'a [PlotFile],
}

impl<'a> From<&'a DiskIndexResults> for Measured<'a> {
    fn from(r: &'a DiskIndexResults) -> Self {
        Self {
            report: &r.report,
            report_md: &r.report_path,
            plots: &r.plots,
        }
    }
}

impl Render for Measured<'_> {
    fn write_text(&self, w: &mut dyn Write) -> io::Result<()> {
        write!(w, "{}", report_tables(self.report))?;
        writeln!(
            w,
            "{} plots and the report: {}",
            self.plots.len(),
            self.report_md.display()
        )
    }
}
