//! `larder`: back up directory trees into a deduplicating repository.
//!
//! Exit codes: 0 success; 1 failure (nothing was committed, or `check` found damage);
//! 2 usage error; 3 partial success (a snapshot was saved or a restore finished, but
//! some files could not be read or restored).

mod bench_commands;
mod browse_commands;
mod chunk_commands;
mod cluster_commands;
mod device_commands;
mod gc_commands;
mod gen_commands;
mod output;
mod pattern_args;
mod size;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use larder_bench::Plan;
use larder_chunk::{ChunkerConfig, ChunkerKind};
use larder_engine::{BackupOptions, CheckOptions, Progress, RestoreOptions};
use larder_hash::HashAlgo;
use larder_store::{Compression, DiskLookup, IndexSettings, LockMode, RepoConfig, Repository};

use crate::output::{Bar, Output};

const EXIT_PARTIAL: u8 = 3;

#[derive(Parser)]
#[command(name = "larder", version, about = "Fast exact-deduplication backups")]
struct Cli {
    /// Repository path [default: $XDG_DATA_HOME/larder/repo, created on first use]
    #[arg(long, global = true, env = "LARDER_REPO")]
    repo: Option<PathBuf>,
    /// Print machine-readable JSON on stdout instead of text
    #[arg(long, global = true)]
    json: bool,
    /// Print nothing but errors
    #[arg(short, long, global = true)]
    quiet: bool,
    /// Wait up to DURATION (e.g. 30s, 5m) for a repository lock held by another process
    #[arg(long, global = true, value_name = "DURATION", value_parser = gc_commands::parse_duration)]
    retry_lock: Option<Duration>,
    /// Back up, restore and list snapshots through a cluster's nodes instead of a local
    /// repository: node lookup addresses, comma-separated, tried in order (paths are
    /// read and restored on the node's file system; docs/design/cluster.md)
    #[arg(
        long,
        global = true,
        value_delimiter = ',',
        value_name = "ADDR,...",
        env = "LARDER_CLUSTER"
    )]
    cluster: Vec<String>,
    #[command(subcommand)]
    command: Command,
}

/// The index options of `init` and `index convert`.
#[derive(clap::Args)]
struct IndexArgs {
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
    fn settings(&self) -> IndexSettings {
        match self.kind.as_str() {
            "memory" => IndexSettings::Memory,
            _ => IndexSettings::Disk {
                lookup: match self.index_lookup.as_str() {
                    "eager" => DiskLookup::Eager,
                    _ => DiskLookup::Lazy,
                },
                memory: self.index_memory as u64,
            },
        }
    }
}

#[derive(Subcommand)]
enum IndexCommand {
    /// Rebuild the index segments, and the disk index if there is one, from the
    /// containers alone
    Rebuild,
    /// Convert the index to another kind (or another lookup or budget); the segments
    /// stay the source of truth, so either way nothing is lost
    Convert {
        /// memory or disk
        #[arg(long = "to", value_parser = ["memory", "disk"])]
        kind: String,
        #[arg(long, default_value = "lazy", value_parser = ["eager", "lazy"])]
        index_lookup: String,
        #[arg(long, default_value = "256MiB", value_parser = size::parse)]
        index_memory: usize,
    },
}

#[derive(Subcommand)]
enum Command {
    /// Create a repository
    Init {
        /// fastcdc (= fastcdc2020), fastcdc2016, fixed; the papers' baselines rabin, adler, gear, ae
        #[arg(long, default_value = "fastcdc")]
        chunker: String,
        /// Minimum chunk size (bytes; KiB/MiB suffixes accepted)
        #[arg(long, default_value = "2KiB", value_parser = size::parse)]
        min: usize,
        /// Average (expected) chunk size; the chunk size for `fixed`
        #[arg(long, default_value = "8KiB", value_parser = size::parse)]
        avg: usize,
        /// Maximum chunk size
        #[arg(long, default_value = "64KiB", value_parser = size::parse)]
        max: usize,
        /// FastCDC normalization level, 0 to 3
        #[arg(long, default_value_t = 2)]
        level: u8,
        /// Fingerprint: blake3, sha256 or sha1 (sha1 only to reproduce the papers)
        #[arg(long, default_value = "blake3")]
        hash: String,
        /// How new chunks are stored: zstd (level 3), zstd:LEVEL (1 to 19) or none
        #[arg(long, default_value = "zstd")]
        compression: String,
        #[command(flatten)]
        index: IndexArgs,
    },
    /// Back up files and directories into a new snapshot
    Backup {
        #[arg(required = true)]
        paths: Vec<PathBuf>,
        /// Fingerprinting threads [default: one per core]
        #[arg(long, default_value_t = 0)]
        threads: usize,
        /// Where chunking and fingerprinting run (gpu needs a build with the `gpu` feature)
        #[arg(long, value_enum, default_value = "auto")]
        device: device_commands::DeviceArg,
        #[command(flatten)]
        excludes: pattern_args::BackupExcludes,
    },
    /// Restore a snapshot (an id prefix, or `latest`) into TARGET
    Restore {
        snapshot: String,
        target: PathBuf,
        /// Replace files that already exist in TARGET
        #[arg(long)]
        overwrite: bool,
        /// Memory for container data: the restore reads ahead in windows whose
        /// containers' byte ranges fit in this, and reads each container once per window
        #[arg(long, default_value = "256MiB", value_parser = size::parse)]
        cache_size: usize,
        #[command(flatten)]
        selection: pattern_args::RestoreSelection,
    },
    /// List the entries of a snapshot, or those at and below PATH
    Ls(browse_commands::LsArgs),
    /// Show what changed between two snapshots: added, removed and modified entries
    Diff(browse_commands::DiffArgs),
    /// Write the content of one file of a snapshot to standard output
    #[command(visible_alias = "dump")]
    Cat(browse_commands::CatArgs),
    /// List snapshots
    Snapshots,
    /// Verify the repository; with --read-data, every chunk too
    Check {
        #[arg(long)]
        read_data: bool,
    },
    /// Show repository statistics
    Stats {
        /// Also the disk index: its files, Bloom filter, and the last backup's lookups
        #[arg(long)]
        index: bool,
    },
    /// Rebuild the index from the containers alone (= `larder index rebuild`)
    RebuildIndex,
    /// The fingerprint index: rebuild it, or convert it between memory and disk
    #[command(subcommand)]
    Index(IndexCommand),
    /// Remove snapshots, named or by a retention policy (their data stays until gc)
    Forget(gc_commands::ForgetArgs),
    /// Delete the data no snapshot uses, repacking containers that are mostly dead
    #[command(visible_alias = "prune")]
    Gc(gc_commands::GcArgs),
    /// Remove a stale lock note left by a killed process (a lock never outlives its process)
    Unlock,
    /// Chunk files (no repository): chunk sizes, dedup ratio, chunking speed
    Chunk {
        /// Files to chunk; each is its own stream
        #[arg(required = true)]
        files: Vec<PathBuf>,
        #[arg(long, default_value = "fastcdc", help = chunk_commands::algo_help())]
        algo: String,
        /// Minimum chunk size (bytes; KiB/MiB suffixes accepted)
        #[arg(long, default_value = "2KiB", value_parser = size::parse)]
        min: usize,
        /// Average (expected) chunk size; the chunk size for `fixed`
        #[arg(long, default_value = "8KiB", value_parser = size::parse)]
        avg: usize,
        /// Maximum chunk size
        #[arg(long, default_value = "64KiB", value_parser = size::parse)]
        max: usize,
        /// FastCDC normalization level, 0 to 3
        #[arg(long, default_value_t = 2)]
        level: u8,
        /// Also list every chunk: its file, offset and length
        #[arg(long)]
        cuts: bool,
        /// Chunking threads; the cut points are exactly those of one thread [default: one per core]
        #[arg(long, default_value_t = 0)]
        threads: usize,
        /// Where chunking runs (gpu: fastcdc only, needs a build with the `gpu` feature)
        #[arg(long, value_enum, default_value = "auto")]
        device: device_commands::DeviceArg,
    },
    /// Synthetic backup generations (no repository): stdout, or --out DIR
    Gen(gen_commands::GenArgs),
    /// Run a dedup node of a cluster: it serves its share of the partitioned chunk
    /// index to the other nodes, until SIGINT or SIGTERM (docs/design/cluster.md)
    Node(cluster_commands::NodeArgs),
    /// Create a cluster, or show its nodes, master, partitions and message rates
    #[command(subcommand)]
    Cluster(cluster_commands::ClusterCommand),
    /// Benchmarks (no repository)
    Bench {
        #[command(subcommand)]
        bench: BenchCommand,
    },
}

#[derive(Subcommand)]
enum BenchCommand {
    /// The FastCDC paper's chunking comparisons on PATHs: speed, dedup ratio and average
    /// chunk size per algorithm and expected size, the minimum size's effect, chunk-size
    /// distributions. Tables on stdout; SVG plots and report.md in --out
    Chunk {
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
    },
    /// The papers' key experiments in one run, on generated backup generations and on
    /// PATHs: FastCDC's chunking comparisons, P-Dedupe's serial, pipelined and parallel
    /// backups against its model, parallel against sequential chunking, larder's dedup
    /// against the generator's ground truth, index rates. report.md and SVG plots in --out
    Report(bench_commands::ReportArgs),
    /// Eager against lazy lookup in the disk index (the Lazy Exact Deduplication
    /// paper's Tables V to VII and Fig. 12) on a generated multi-generation chunk stream
    /// whose index is many times --index-memory: lazy with and without prelookup at
    /// each BFT, every answer checked against an oracle. Tables on stdout;
    /// disk-index.md and SVG plots in --out
    Index(bench_commands::IndexArgs),
    /// Chunking (FastCDC 2020, default sizes) plus fingerprints on the GPU, transfers
    /// included, against the CPU path on all cores: throughput, each host stage's share,
    /// PCIe bytes (built with the `gpu` feature only)
    #[cfg(feature = "gpu")]
    Gpu {
        /// Bytes of generated input (KiB/MiB/GiB suffixes accepted)
        #[arg(long, default_value = "4GiB", value_parser = size::parse)]
        size: usize,
        /// Fingerprint: blake3, sha256 or sha1
        #[arg(long, default_value = "blake3")]
        hash: String,
        /// Bytes per block (upload, scan and hash launch)
        #[arg(long, default_value = "64MiB", value_parser = size::parse)]
        block_size: usize,
        /// Blocks in flight, one stream each (at least 2)
        #[arg(long, default_value_t = 2)]
        streams: usize,
        /// Timed runs; medians are printed
        #[arg(long, default_value_t = 3)]
        runs: usize,
    },
}

fn main() -> ExitCode {
    restore_default_sigpipe();
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_env("LARDER_LOG"))
        .with_writer(std::io::stderr)
        .init();
    let out = Output::new(cli.json, cli.quiet);
    match run(cli, &out) {
        Ok(code) => code,
        Err(e) => {
            out.error(&e);
            ExitCode::FAILURE
        }
    }
}

/// Rust ignores SIGPIPE, so `larder snapshots | head` would panic on the closed pipe.
/// With the default action the process ends quietly, like other Unix tools; a backup
/// ended that way is safe (nothing is committed out of order, docs/design/format.md).
fn restore_default_sigpipe() {
    // SAFETY: called first in `main`, before any other thread exists; SIG_DFL is a
    // valid disposition for SIGPIPE.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
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

/// The repository to use; the default one is created on first use.
fn repo_path(cli_repo: Option<PathBuf>, out: &Output) -> Result<PathBuf> {
    if let Some(p) = cli_repo {
        return Ok(p);
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

/// How long `open` waits for the lock (`--retry-lock`); set once in `run`.
static RETRY_LOCK: OnceLock<Duration> = OnceLock::new();

fn open(path: &Path, mode: LockMode, out: &Output) -> Result<Repository> {
    let wait = RETRY_LOCK.get().copied().unwrap_or_default();
    let repo = Repository::open_waiting(path, mode, wait)?;
    let report = repo.report();
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
    if let Some(why) = report.disk_rebuilt {
        out.note(&format!(
            "the disk index was {why}: rebuilt it from the index segments"
        ));
    }
    if let Some(why) = report.disk_fallback {
        out.warn(&format!(
            "the disk index is {why}: using the memory index for this command; a writer (e.g. `larder index rebuild`) repairs it"
        ));
    }
    for (id, reason) in &report.bad_containers {
        out.warn(&format!(
            "container {id:016x} is damaged and ignored: {reason}"
        ));
    }
    Ok(repo)
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::fs::read_to_string("/etc/hostname"))
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

fn run(cli: Cli, out: &Output) -> Result<ExitCode> {
    RETRY_LOCK.get_or_init(|| cli.retry_lock.unwrap_or_default());
    match cli.command {
        Command::Init {
            chunker,
            min,
            avg,
            max,
            level,
            hash,
            compression,
            index,
        } => {
            let compression = match Compression::parse(&compression) {
                Ok(c) => c,
                Err(e) => return Ok(out.usage(&e)),
            };
            let Some(kind) = ChunkerKind::from_name(&chunker) else {
                let names: Vec<&str> = ChunkerKind::ALL.iter().map(|k| k.name()).collect();
                return Ok(out.usage(&format!(
                    "unknown chunker {chunker:?}: use fastcdc or one of {}",
                    names.join(", ")
                )));
            };
            let Some(hash) = HashAlgo::from_name(&hash) else {
                return Ok(out.usage(&format!(
                    "unknown hash {hash:?}: use blake3, sha256 or sha1"
                )));
            };
            if hash == HashAlgo::Sha1 {
                out.warn("SHA-1 is broken against chosen collisions: use it only to reproduce the papers");
            }
            let chunker = ChunkerConfig {
                kind,
                min_size: min,
                avg_size: avg,
                max_size: max,
                level,
            };
            if let Err(e) = chunker.validate() {
                return Ok(out.usage(&e.to_string()));
            }
            let path = match cli.repo {
                Some(p) => p,
                None => default_repo()?,
            };
            let config = RepoConfig::new(chunker, hash)
                .with_compression(compression)
                .with_index(index.settings());
            if let Err(e) = config.index.validate() {
                return Ok(out.usage(&e.to_string()));
            }
            Repository::init(&path, &config)?;
            out.init_done(&path, &config);
            Ok(ExitCode::SUCCESS)
        }
        Command::Backup {
            paths,
            threads,
            device,
            excludes,
        } => {
            device_commands::backup_device(device, out)?;
            let exclude = match excludes.patterns() {
                Ok(list) => list,
                Err(msg) => return Ok(out.usage(&msg)),
            };
            if !cli.cluster.is_empty() {
                if !exclude.is_empty() {
                    return Ok(out.usage("--exclude is not supported through a cluster yet"));
                }
                return cluster_commands::backup(&cli.cluster, &paths, out);
            }
            let path = repo_path(cli.repo, out)?;
            let mut repo = open(&path, LockMode::Exclusive, out)?;
            let bar = Arc::new(Bar::bytes(out));
            let opts = BackupOptions {
                threads,
                hostname: hostname(),
                username: std::env::var("USER").unwrap_or_default(),
                exclude,
                progress: bar.clone() as Arc<dyn Progress>,
                ..BackupOptions::default()
            };
            let summary = larder_engine::backup(&mut repo, &paths, &opts)?;
            bar.finish();
            if let Some(m) = &summary.disk_index {
                output::save_last_backup_metrics(&repo, m);
            }
            out.backup_done(&summary);
            Ok(if summary.is_partial() {
                ExitCode::from(EXIT_PARTIAL)
            } else {
                ExitCode::SUCCESS
            })
        }
        Command::Restore {
            snapshot,
            target,
            overwrite,
            cache_size,
            selection,
        } => {
            let (include, exclude) = match selection.patterns() {
                Ok(lists) => lists,
                Err(msg) => return Ok(out.usage(&msg)),
            };
            if !cli.cluster.is_empty() {
                if !include.is_empty() || !exclude.is_empty() || overwrite {
                    return Ok(out.usage(
                        "--include, --exclude and --overwrite are not supported through a cluster yet",
                    ));
                }
                return cluster_commands::restore(&cli.cluster, &snapshot, &target, out);
            }
            let path = repo_path(cli.repo, out)?;
            let repo = open(&path, LockMode::Shared, out)?;
            let bar = Arc::new(Bar::bytes(out));
            let opts = RestoreOptions {
                overwrite,
                include,
                exclude,
                cache_size,
                progress: bar.clone() as Arc<dyn Progress>,
                ..RestoreOptions::default()
            };
            let summary = larder_engine::restore(&repo, &snapshot, &target, &opts)?;
            bar.finish();
            out.restore_done(&summary);
            Ok(if summary.warnings.is_empty() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(EXIT_PARTIAL)
            })
        }
        Command::Ls(args) => browse_commands::ls(args, cli.repo, out),
        Command::Diff(args) => browse_commands::diff(args, cli.repo, out),
        Command::Cat(args) => browse_commands::cat(args, cli.repo, cli.json, out),
        Command::Snapshots if !cli.cluster.is_empty() => {
            cluster_commands::snapshots(&cli.cluster, out)
        }
        Command::Snapshots => {
            let path = repo_path(cli.repo, out)?;
            let repo = open(&path, LockMode::Shared, out)?;
            let (snapshots, bad) = repo.snapshots()?;
            for e in &bad {
                out.warn(&larder_store::error_chain(e));
            }
            out.snapshots(&snapshots);
            Ok(ExitCode::SUCCESS)
        }
        Command::Check { read_data } => {
            let path = repo_path(cli.repo, out)?;
            let repo = open(&path, LockMode::Shared, out)?;
            let bar = Arc::new(Bar::bytes(out));
            let opts = CheckOptions {
                read_data,
                progress: bar.clone() as Arc<dyn Progress>,
            };
            let report = larder_engine::check(&repo, &opts)?;
            bar.finish();
            for plan in repo.pending_gc_plans()? {
                out.note(&format!(
                    "garbage collection {plan} was interrupted; the next writer (backup, gc, ...) finishes or rolls it back (docs/design/gc.md)"
                ));
            }
            // The report itself names every problem (one JSON object with --json).
            out.check_done(&report, read_data);
            Ok(if report.is_ok() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        Command::RebuildIndex | Command::Index(IndexCommand::Rebuild) => {
            let path = repo_path(cli.repo, out)?;
            let mut repo = open(&path, LockMode::Exclusive, out)?;
            let bad = repo.rebuild_index()?;
            for (id, reason) in &bad {
                out.warn(&format!(
                    "container {id:016x} left out of the index: {reason}"
                ));
            }
            out.note(&format!(
                "index rebuilt from {} containers ({} chunks, {} index)",
                repo.indexed_containers().len(),
                repo.index().len(),
                repo.config().index.describe()
            ));
            Ok(if bad.is_empty() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(EXIT_PARTIAL)
            })
        }
        Command::Forget(args) => gc_commands::forget(args, cli.repo, out),
        Command::Gc(args) => gc_commands::gc(args, cli.repo, out),
        Command::Unlock => gc_commands::unlock(cli.repo, out),
        Command::Index(IndexCommand::Convert {
            kind,
            index_lookup,
            index_memory,
        }) => {
            let to = IndexArgs {
                kind,
                index_lookup,
                index_memory,
            }
            .settings();
            if let Err(e) = to.validate() {
                return Ok(out.usage(&e.to_string()));
            }
            let path = repo_path(cli.repo, out)?;
            let mut repo = open(&path, LockMode::Exclusive, out)?;
            let from = repo.config().index.describe();
            repo.convert_index(to)?;
            out.note(&format!(
                "index converted from {from} to {} ({} chunks)",
                to.describe(),
                repo.index().len()
            ));
            Ok(ExitCode::SUCCESS)
        }
        Command::Stats { index } => {
            let path = repo_path(cli.repo, out)?;
            let repo = open(&path, LockMode::Shared, out)?;
            out.stats(&repo, index)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Chunk {
            files,
            algo,
            min,
            avg,
            max,
            level,
            cuts,
            threads,
            device,
        } => {
            let Some(kind) = ChunkerKind::from_name(&algo) else {
                return Ok(out.usage(&format!(
                    "unknown algorithm {algo:?}: use {}",
                    chunk_commands::kind_names()
                )));
            };
            let config = ChunkerConfig {
                kind,
                min_size: min,
                avg_size: avg,
                max_size: max,
                level,
            };
            if let Err(e) = config.validate() {
                return Ok(out.usage(&e.to_string()));
            }
            if device_commands::chunk_on_gpu(device, &config, out)? {
                #[cfg(feature = "gpu")]
                {
                    device_commands::chunk_files(&files, &config, cuts, out)?;
                    return Ok(ExitCode::SUCCESS);
                }
            }
            chunk_commands::chunk(&files, &config, cuts, threads, out)
        }
        Command::Gen(args) => gen_commands::gen(&args, cli.json, out),
        Command::Node(args) => cluster_commands::node(args, out),
        Command::Cluster(command) => cluster_commands::cluster(command, out),
        Command::Bench {
            bench:
                BenchCommand::Chunk {
                    paths,
                    quick,
                    out: dir,
                    runs,
                    max_input,
                },
        } => {
            let mut plan = if quick { Plan::quick() } else { Plan::full() };
            if let Some(runs) = runs {
                plan.runs = runs as usize;
            }
            chunk_commands::bench_chunk(&paths, &plan, &dir, max_input as u64, out)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Bench {
            bench: BenchCommand::Report(args),
        } => {
            bench_commands::report(&args, out)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Bench {
            bench: BenchCommand::Index(args),
        } => {
            bench_commands::index(&args, out)?;
            Ok(ExitCode::SUCCESS)
        }
        #[cfg(feature = "gpu")]
        Command::Bench {
            bench:
                BenchCommand::Gpu {
                    size,
                    hash,
                    block_size,
                    streams,
                    runs,
                },
        } => {
            let Some(algo) = HashAlgo::from_name(&hash) else {
                return Ok(out.usage(&format!(
                    "unknown hash {hash:?}: use blake3, sha256 or sha1"
                )));
            };
            let config = larder_gpu::GpuConfig {
                block_size,
                streams,
                ..larder_gpu::GpuConfig::default()
            };
            device_commands::bench_gpu(size, algo, config, runs, out)?;
            Ok(ExitCode::SUCCESS)
        }
    }
}
