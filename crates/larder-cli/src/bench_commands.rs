//! `larder bench report` (every experiment of larder-bench in one run) and `larder
//! bench index` (eager against lazy lookup in the disk index). The work is in
//! `larder_bench::report_all` and `larder_bench::disk_index`; this module sets the plan
//! from the arguments and hands the result to [`Output`].

use std::path::PathBuf;

use anyhow::Result;
use clap::{Args, ValueEnum};
use larder_bench::disk_index::{run_disk_index_bench, DirectMode, DiskIndexPlan, RunKind};
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

/// The runs `--lookup` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LookupArg {
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
pub enum DirectArg {
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
    pub quick: bool,
    /// Chunks of the first generation; each later one is about 4% larger [default:
    /// 500000, or 20000 with --quick]
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub chunks: Option<u64>,
    /// Backup generations
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..))]
    pub generations: u64,
    /// The index's memory budget: Bloom filter, cache, insert buffer and lazy buffer
    /// (KiB/MiB/GiB suffixes accepted) [default: 8MiB, or 2MiB with --quick]
    #[arg(long, value_parser = size::parse_nonzero)]
    pub index_memory: Option<usize>,
    /// Buffer fingerprint thresholds of the lazy runs, comma-separated
    #[arg(long, value_delimiter = ',', default_values = ["4", "8", "16", "32", "48", "64"],
          value_parser = clap::value_parser!(u64).range(1..))]
    pub bft: Vec<u64>,
    /// Which runs, comma-separated
    #[arg(long, value_enum, value_delimiter = ',',
          default_values = ["eager", "lazy", "lazy-no-prelookup"])]
    pub lookup: Vec<LookupArg>,
    /// Timed runs of each configuration, interleaved [default: 3, or 1 with --quick]
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub runs: Option<u32>,
    /// Open the index files with O_DIRECT, so that every read reaches the disk
    #[arg(long, value_enum, default_value = "auto")]
    pub direct: DirectArg,
    /// Sync and drop the page cache (write 3 to /proc/sys/vm/drop_caches) before each
    /// run; needs root
    #[arg(long)]
    pub drop_caches: bool,
    /// Scratch directory for the runs' indexes (a temporary directory inside it,
    /// removed after) [default: the system's temporary directory]
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Directory for disk-index.md and the SVG plots (created)
    #[arg(long, default_value = "larder-bench-index")]
    pub out: PathBuf,
    /// Split a lazy batch's read where more than PAGES unneeded table pages lie between
    /// needed ones [default: one read per batch, as the paper]
    #[arg(long, value_name = "PAGES")]
    pub batch_gap: Option<u64>,
    /// Bytes of chunk data the index's budget reserves per lazily buffered fingerprint:
    /// 0 as backup configures it (stage 3 holds the chunks in its own share), 8192 for
    /// the paper's layout (chunks inside the budget: fewer, wider buffer buckets)
    #[arg(long, value_name = "BYTES", default_value_t = 0)]
    pub buffered_chunk_bytes: u64,
    /// Seed of the chunk stream
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

/// `larder bench index`.
pub fn index(args: &IndexArgs, out: &Output) -> Result<()> {
    let mut plan = DiskIndexPlan::new(args.quick);
    plan.seed = args.seed;
    if let Some(chunks) = args.chunks {
        plan.first_generation = chunks as usize;
    }
    plan.generations = args.generations as usize;
    if let Some(budget) = args.index_memory {
        plan.memory_budget = budget as u64;
    }
    plan.bfts = args.bft.iter().map(|&b| b as usize).collect();
    plan.bfts.sort_unstable();
    plan.bfts.dedup();
    plan.kinds = args.lookup.iter().map(|l| l.kind()).collect();
    if let Some(runs) = args.runs {
        plan.runs = runs as usize;
    }
    plan.direct = match args.direct {
        DirectArg::Auto => DirectMode::Auto,
        DirectArg::On => DirectMode::On,
        DirectArg::Off => DirectMode::Off,
    };
    plan.drop_caches = args.drop_caches;
    if let Some(gap) = args.batch_gap {
        plan.batch_gap_pages = gap;
    }
    plan.buffered_chunk_bytes = args.buffered_chunk_bytes;
    if let Some(dir) = &args.dir {
        plan.dir = dir.clone();
    }
    let command: Vec<String> = std::iter::once("larder".to_string())
        .chain(std::env::args().skip(1))
        .collect();
    let results = run_disk_index_bench(&plan, &args.out, &command.join(" "), &mut |step| {
        out.note(step)
    })?;
    out.bench_index_done(&results);
    Ok(())
}
