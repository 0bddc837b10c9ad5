//! `larder gen`: synthetic backup generations (larder-gen) streamed to stdout or
//! written one file per generation and client, with the achieved statistics and the
//! ground truth on request.

use std::fs::{self, File, OpenOptions};
use std::io::{self, IsTerminal, Write};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::Args;
use larder_gen::{
    Config, Edits, Generation, Model, PoolPick, Report, Summary, Transitions, Workload, BLOCK,
};
use serde::Serialize;

use crate::output::{Output, Render};
use crate::size;

#[derive(Args)]
pub struct GenArgs {
    /// Seed: the same seed and options give the same bytes
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Bytes of each generation of each client (KiB/MiB/GiB suffixes accepted)
    #[arg(long, default_value = "1GiB", value_parser = size::parse)]
    size: usize,
    /// Backup generations; the first has no data of earlier ones
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    generations: u32,
    /// Clients: independent streams sharing the pool of redundant blocks
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    clients: u32,
    /// Write DIR/gen-NNN/client-NNN.bin instead of streaming everything to stdout
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Target dedup ratio of each later generation (its bytes over the bytes it adds)
    #[arg(long, default_value_t = 50.0)]
    dedup_ratio: f64,
    /// No shifting edits: every run starts on a 4 KiB block boundary
    #[arg(long)]
    aligned: bool,
    /// The paper's model unchanged: --aligned, and every redundant block picked on its own
    #[arg(long)]
    pure: bool,
    /// Print the achieved statistics and the ground truth (on stderr when streaming)
    #[arg(long)]
    stats: bool,
    /// Mean unique (U) run length
    #[arg(long, default_value = "337KiB", value_parser = size::parse)]
    u_mean: usize,
    /// Median unique (U) run length
    #[arg(long, default_value = "19KiB", value_parser = size::parse)]
    u_median: usize,
    /// Longest unique (U) run
    #[arg(long, default_value = "6582MiB", value_parser = size::parse)]
    u_max: usize,
    /// Mean redundant (R) run length
    #[arg(long, default_value = "143KiB", value_parser = size::parse)]
    r_mean: usize,
    /// Median redundant (R) run length
    #[arg(long, default_value = "16KiB", value_parser = size::parse)]
    r_median: usize,
    /// Longest redundant (R) run
    #[arg(long, default_value = "3498MiB", value_parser = size::parse)]
    r_max: usize,
    /// P(BR -> U) in later generations; P(BR -> R) is the rest
    #[arg(long, default_value_t = Transitions::PAPER.br_to_u)]
    p_br_u: f64,
    /// P(U -> BR) in later generations; P(U -> R) is the rest
    #[arg(long, default_value_t = Transitions::PAPER.u_to_br)]
    p_u_br: f64,
    /// P(R -> BR) in later generations; P(R -> U) is the rest
    #[arg(long, default_value_t = Transitions::PAPER.r_to_br)]
    p_r_br: f64,
    /// Size of the pool of redundant blocks (a multiple of 4 KiB)
    #[arg(long, default_value = "16MiB", value_parser = size::parse)]
    pool: usize,
    /// Mean of the exponential pick into the pool, from its start
    #[arg(long, default_value = "1MiB", value_parser = size::parse)]
    pool_pick_mean: usize,
    /// Mean bytes copied between two shifting edits
    #[arg(long, default_value = "4MiB", value_parser = size::parse)]
    edit_gap: usize,
    /// Longest insertion or deletion
    #[arg(long, default_value = "1KiB", value_parser = size::parse)]
    edit_max: usize,
}

impl GenArgs {
    fn config(&self) -> Result<Config, String> {
        let block = BLOCK as usize;
        if self.pool == 0
            || !self.pool.is_multiple_of(block)
            || self.pool / block > u32::MAX as usize
        {
            return Err(format!(
                "--pool must be a positive multiple of {block} bytes, got {}",
                self.pool
            ));
        }
        let edit_max = u32::try_from(self.edit_max)
            .map_err(|_| format!("--edit-max {} is too large", self.edit_max))?;
        let stats = |mean: usize, median: usize, max: usize| larder_gen::RunStats {
            mean: mean as f64,
            median: median as f64,
            max: max as f64,
        };
        let model = Model {
            unique: stats(self.u_mean, self.u_median, self.u_max),
            redundant: stats(self.r_mean, self.r_median, self.r_max),
            transitions: Transitions {
                br_to_u: self.p_br_u,
                u_to_br: self.p_u_br,
                r_to_br: self.p_r_br,
            },
            dedup_ratio: self.dedup_ratio,
            edits: (!self.aligned && !self.pure).then_some(Edits {
                mean_gap: self.edit_gap as u64,
                max_len: edit_max,
            }),
            pool_blocks: (self.pool / block) as u32,
            pool_pick_mean: self.pool_pick_mean as f64 / BLOCK as f64,
            pool_pick: if self.pure {
                PoolPick::Block
            } else {
                PoolPick::Run
            },
        };
        Ok(Config {
            seed: self.seed,
            generation_size: self.size as u64,
            generations: self.generations,
            clients: self.clients,
            model,
        })
    }
}

/// `larder gen`: exit 0, or 2 for settings the model cannot meet and for binary
/// output to a terminal.
pub fn run(args: GenArgs, out: &Output) -> Result<ExitCode> {
    let config = match args.config() {
        Ok(c) => c,
        Err(msg) => return Ok(out.usage(&msg)),
    };
    let mut workload = match Workload::new(config) {
        Ok(w) => w,
        Err(e) => return Ok(out.usage(&e.to_string())),
    };
    let mut sink = match &args.out {
        Some(dir) => Sink::Dir(dir),
        None if std::io::stdout().is_terminal() => {
            return Ok(out.usage(
                "refusing to write binary data to a terminal: redirect stdout, pipe \
                 it, or give --out DIR",
            ))
        }
        None => Sink::Stdout(stdout_file()?),
    };
    let mut summary = Summary::default();
    let start = Instant::now();
    while let Some(generation) = workload.next_generation() {
        summary.add(&generation);
        sink.write(&workload, &generation)?;
    }
    let generated = Generated {
        report: summary.report(workload.fitted()),
        seed: args.seed,
        mode: mode(&args),
        seconds: start.elapsed().as_secs_f64(),
        args: &args,
    };
    match sink {
        Sink::Stdout(_) => out.print_beside_data(&generated)?,
        Sink::Dir(_) => out.print(&generated)?,
    }
    Ok(ExitCode::SUCCESS)
}

/// Where the generations go.
enum Sink<'a> {
    /// All of them, one after another (never a terminal).
    Stdout(File),
    /// One file per generation and client under DIR.
    Dir(&'a Path),
}

impl Sink<'_> {
    fn write(&mut self, workload: &Workload, generation: &Generation) -> Result<()> {
        match self {
            Sink::Stdout(file) => workload.write(generation, file)?,
            Sink::Dir(dir) => {
                let path =
                    generation_path(dir, generation.truth.generation, generation.truth.client);
                let mut file = create_new(&path)?;
                workload
                    .write(generation, &mut file)
                    .with_context(|| format!("writing {}", path.display()))?;
            }
        }
        Ok(())
    }
}

/// Rust's stdout is line-buffered; the generator writes 1 MiB at a time, so it writes
/// to the descriptor directly.
fn stdout_file() -> Result<File> {
    let fd = std::io::stdout()
        .as_fd()
        .try_clone_to_owned()
        .context("opening stdout")?;
    Ok(File::from(fd))
}

fn generation_path(dir: &Path, generation: u32, client: u32) -> PathBuf {
    dir.join(format!("gen-{generation:03}"))
        .join(format!("client-{client:03}.bin"))
}

/// Creates the file and its directory; an existing file is an error, never overwritten.
fn create_new(path: &Path) -> Result<File> {
    if let Some(parent) = path.parent() {
        fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    }
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .with_context(|| {
            format!(
                "creating {} (an existing file is never overwritten)",
                path.display()
            )
        })
}

fn mode(args: &GenArgs) -> &'static str {
    if args.pure {
        "pure"
    } else if args.aligned {
        "aligned"
    } else {
        "shifting"
    }
}

/// The achieved statistics and the ground truth. JSON always has them; the text only
/// with `--stats`.
#[derive(Serialize)]
struct Generated<'a> {
    #[serde(flatten)]
    report: Report,
    seed: u64,
    mode: &'static str,
    seconds: f64,
    #[serde(skip)]
    args: &'a GenArgs,
}

fn kib(bytes: f64) -> String {
    format!("{:.1}", bytes / 1024.0)
}

impl Render for Generated<'_> {
    /// `--stats` asks for the text; `--quiet` leaves it, as it always has.
    const QUIET_SILENCES_TEXT: bool = false;

    fn write_text(&self, w: &mut dyn Write) -> io::Result<()> {
        if !self.args.stats {
            return Ok(());
        }
        let (r, args) = (&self.report, self.args);
        writeln!(
            w,
            "generated   {} generation(s) x {} client(s), {:.3} GB in {:.2} s ({:.0} MB/s), seed {}, {} model",
            args.generations,
            args.clients,
            r.bytes as f64 / 1e9,
            self.seconds,
            r.bytes as f64 / 1e6 / self.seconds.max(1e-9),
            self.seed,
            self.mode,
        )?;
        writeln!(
            w,
            "truth       {} new bytes, {} duplicate; dedup ratio {:.4} (later generations: target {})",
            r.new_bytes, r.duplicate_bytes, r.dedup_ratio, r.target_later_dedup_ratio
        )?;
        writeln!(w, "generation        bytes    new bytes  dedup ratio")?;
        for g in &r.generations {
            writeln!(
                w,
                "{:>10} {:>12} {:>12} {:>12.4}",
                g.generation, g.bytes, g.new_bytes, g.dedup_ratio
            )?;
        }
        write_runs(w, r)?;
        write_transitions(w, r, args)?;
        writeln!(
            w,
            "edits       {} insertions ({} bytes), {} deletions ({} bytes)",
            r.insertions, r.inserted_bytes, r.deletions, r.deleted_bytes
        )
    }
}

/// Run lengths per state: as configured, as sampled, and as rounded to blocks.
fn write_runs(w: &mut dyn Write, r: &Report) -> io::Result<()> {
    writeln!(w, "runs (KiB)   count   target mean/median/max       sampled mean/median/max      rounded mean/median/max")?;
    for run in &r.runs {
        let triple = |mean: f64, median: f64, max: f64| {
            format!("{:>8}/{:>6}/{:>10}", kib(mean), kib(median), kib(max))
        };
        writeln!(
            w,
            "{:<5} {:>12}   {}   {}   {}",
            run.state,
            run.runs,
            triple(run.target.mean, run.target.median, run.target.max),
            triple(run.sampled.mean, run.sampled.median, run.sampled.max),
            triple(run.rounded.mean, run.rounded.median, run.rounded.max),
        )?;
    }
    Ok(())
}

/// The state transitions observed, beside those configured.
fn write_transitions(w: &mut dyn Write, r: &Report, args: &GenArgs) -> io::Result<()> {
    let names = ["U", "R", "BR"];
    let configured = Transitions {
        br_to_u: args.p_br_u,
        u_to_br: args.p_u_br,
        r_to_br: args.p_r_br,
    };
    let mut pairs = Vec::new();
    for (i, row) in r.transitions.iter().enumerate() {
        for (j, p) in row.iter().enumerate() {
            if let Some(p) = p.filter(|_| i != j) {
                let want = configured.p(larder_gen::State::ALL[i], larder_gen::State::ALL[j]);
                pairs.push(format!("{}->{} {p:.3} ({want:.3})", names[i], names[j]));
            }
        }
    }
    if !pairs.is_empty() {
        writeln!(w, "transitions {} (observed, configured)", pairs.join(", "))?;
    }
    Ok(())
}
