//! `larder chunk`: chunk files without a repository, on the CPU (the work is in
//! larder-bench) or on the GPU (`--device`, feature `gpu`).

#[cfg(feature = "gpu")]
mod gpu;

use std::io::{self, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Result};
use clap::Args;
use larder_bench::experiment_key::KeySource;
use larder_bench::plot::format_size;
use larder_bench::{experiment_key, report, stream};
use larder_chunk::{ChunkerConfig, ChunkerKind};
use serde::Serialize;

use super::device::{self, ChunkOn, DeviceArg};
use super::exit_code;
use crate::output::{mb, Output, Render};
use crate::size;

#[derive(Args)]
pub struct ChunkArgs {
    /// Files to chunk; each is its own stream
    #[arg(required = true)]
    files: Vec<PathBuf>,
    #[arg(long, visible_alias = "chunker", default_value = "fastcdc", help = algo_help())]
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
    /// Normalization level, 0 to 3 (fastcdc and keyed)
    #[arg(long, default_value_t = 2)]
    level: u8,
    /// XORed into every entry of FastCDC's Gear table, as the fastcdc crate's
    /// with_level_and_seed and the Remote Execution API's FastCDC seed
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// The keyed chunker's 32-byte secret, as 64 hex digits, for reproducible cut
    /// points [default: a random key for each run]
    #[arg(long, value_name = "HEX", value_parser = parse_secret)]
    secret: Option<Secret>,
    /// Also list every chunk: its file, offset and length, and for fastcdc2020 the
    /// 64-bit Gear value at the cut (the Remote Execution API's fingerprint)
    #[arg(long)]
    cuts: bool,
    /// Chunking threads; the cut points are exactly those of one thread [default: one per core]
    #[arg(long, default_value_t = 0)]
    threads: usize,
    /// Where chunking runs (gpu: fastcdc only, needs a build with the `gpu` feature)
    #[arg(long, value_enum, default_value = "auto")]
    device: DeviceArg,
}

/// Every chunker name, for help and error texts.
fn kind_names() -> String {
    let names: Vec<&str> = ChunkerKind::ALL.iter().map(|k| k.name()).collect();
    names.join(", ")
}

fn algo_help() -> String {
    format!(
        "Chunking algorithm: {} (fastcdc means fastcdc2020)",
        kind_names()
    )
}

/// A chunker secret from the command line.
#[derive(Clone)]
struct Secret([u8; 32]);

fn parse_secret(hex: &str) -> Result<Secret, String> {
    let digits = hex.trim().as_bytes();
    if digits.len() != 64 {
        return Err(format!(
            "a secret is 64 hex digits (32 bytes), not {}",
            digits.len()
        ));
    }
    let mut secret = [0u8; 32];
    for (byte, pair) in secret.iter_mut().zip(digits.chunks_exact(2)) {
        let pair = std::str::from_utf8(pair).map_err(|_| "a secret is hex digits only")?;
        *byte = u8::from_str_radix(pair, 16).map_err(|_| "a secret is hex digits only")?;
    }
    Ok(Secret(secret))
}

impl ChunkArgs {
    /// On error, the usage message.
    fn config(&self) -> Result<ChunkerConfig, String> {
        let Some(kind) = ChunkerKind::from_name(&self.algo) else {
            return Err(format!(
                "unknown algorithm {:?}: use {}",
                self.algo,
                kind_names()
            ));
        };
        let config = ChunkerConfig {
            kind,
            min_size: self.min,
            avg_size: self.avg,
            max_size: self.max,
            level: self.level,
            seed: self.seed,
        };
        config.validate().map_err(|e| e.to_string())?;
        if self.secret.is_some() && !kind.needs_key() {
            return Err(format!(
                "--secret is for the keyed chunker, not {}",
                kind.name()
            ));
        }
        Ok(config)
    }
}

pub fn run(args: ChunkArgs, out: &Output) -> Result<ExitCode> {
    let config = match args.config() {
        Ok(config) => config,
        Err(msg) => return Ok(out.usage(&msg)),
    };
    if let Some(Secret(secret)) = &args.secret {
        experiment_key::use_secret(secret)?;
    }
    match device::chunk_device(args.device, &config, out)? {
        ChunkOn::Cpu => on_cpu(&args, &config, out),
        #[cfg(feature = "gpu")]
        ChunkOn::Gpu => gpu::chunk_files(&args.files, &config, args.cuts, out),
    }
}

/// Exit 0, or 3 when some files could not be read (each is named), or an error (exit
/// 1) when none could.
fn on_cpu(args: &ChunkArgs, config: &ChunkerConfig, out: &Output) -> Result<ExitCode> {
    let threads = match args.threads {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    };
    let report = stream::chunk_files(&args.files, config, args.cuts, threads)?;
    if report.files.is_empty() {
        let messages: Vec<&str> = report.failed.iter().map(|f| f.message.as_str()).collect();
        bail!("{}", messages.join("; "));
    }
    for failure in &report.failed {
        out.error_line(&failure.message);
    }
    out.print(&Chunked {
        report: &report,
        timed: "the chunker alone: file reads and fingerprinting are excluded",
    })?;
    Ok(exit_code(!report.failed.is_empty()))
}

/// The files chunked on the CPU: chunk sizes, dedup, speed, and the cuts if asked.
#[derive(Serialize)]
struct Chunked<'a> {
    #[serde(flatten)]
    report: &'a stream::ChunkFilesReport,
    /// What the speed measures.
    timed: &'static str,
}

impl Render for Chunked<'_> {
    fn write_text(&self, w: &mut dyn Write) -> io::Result<()> {
        let r = self.report;
        write_cuts(w, r)?;
        let c = &r.config;
        let s = &r.sizes;
        let d = &r.dedup;
        write!(
            w,
            "chunker     {}, min {}, avg {}, max {}, level {}",
            r.algo,
            format_size(c.min_size as f64),
            format_size(c.avg_size as f64),
            format_size(c.max_size as f64),
            c.level
        )?;
        if c.seed != 0 {
            write!(w, ", seed {}", c.seed)?;
        }
        writeln!(w)?;
        match r.key {
            Some(KeySource::Random) => writeln!(
                w,
                "key         random, for this run only: cut points differ between runs (--secret fixes them)"
            )?,
            Some(KeySource::Given) => writeln!(w, "key         given with --secret")?,
            None => {}
        }
        writeln!(
            w,
            "input       {} file(s), {} ({} bytes)",
            r.files.len(),
            mb(s.bytes),
            s.bytes
        )?;
        writeln!(
            w,
            "chunks      {}: mean {:.0} B, std dev {:.0} B, smallest {} B, largest {} B",
            s.chunks, s.mean, s.std_dev, s.min, s.max
        )?;
        writeln!(
            w,
            "dedup       {:.3}x: {} bytes in {} distinct chunks ({:.2}% duplicate, by BLAKE3 fingerprint)",
            d.ratio, d.distinct_bytes, d.distinct_chunks, d.duplicate_percent
        )?;
        writeln!(
            w,
            "speed       {:.0} MB/s in the chunker alone on {} thread(s) ({:.3} s; file reads and fingerprinting not timed)",
            r.chunk_mb_per_sec, r.threads, r.chunk_seconds
        )?;
        if r.threads > 1 {
            let p = &r.parallel;
            writeln!(
                w,
                "parallel    {} segments; {} bytes ({} chunks) re-chunked to resynchronise, {} by the sequential merge; cut points identical to one thread by construction",
                p.segments, p.rechunked_bytes, p.rechunked_chunks, p.merge_chunked_bytes
            )?;
        }
        writeln!(w, "sizes       chunks per power-of-two size range:")?;
        for line in report::histogram_lines(&s.histogram, 40) {
            writeln!(w, "  {line}")?;
        }
        Ok(())
    }
}

/// With `--cuts`: every chunk of every file, before the summary.
fn write_cuts(w: &mut dyn Write, r: &stream::ChunkFilesReport) -> io::Result<()> {
    let with_cuts: Vec<_> = r
        .files
        .iter()
        .filter_map(|f| Some((f, f.cuts.as_ref()?)))
        .collect();
    if with_cuts.is_empty() {
        return Ok(());
    }
    let gear = with_cuts
        .iter()
        .any(|(_, c)| !c.gear_fingerprints.is_empty());
    match gear {
        true => writeln!(w, "cuts (offset, length, gear fingerprint, file):")?,
        false => writeln!(w, "cuts (offset, length, file):")?,
    }
    for (file, cuts) in with_cuts {
        for (i, (offset, len)) in cuts.offsets.iter().zip(&cuts.lengths).enumerate() {
            match cuts.gear_fingerprints.get(i) {
                Some(fp) => writeln!(w, "{offset:>14} {len:>10} {fp:>20}  {}", file.path)?,
                None => writeln!(w, "{offset:>14} {len:>10}  {}", file.path)?,
            }
        }
    }
    Ok(())
}
