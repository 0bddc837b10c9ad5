//! `larder bench gpu`: chunking plus fingerprints of generated noise on the GPU
//! (transfers included) against the CPU path on all cores, with each host stage's
//! share of the GPU run.

use std::io::{self, Write};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Result;
use clap::Args;
use larder_chunk::ChunkerConfig;
use larder_gpu::{Device, EmulatedDevice, Gpu, GpuConfig, StageTimes};
use larder_hash::HashAlgo;
use serde::Serialize;

use crate::commands::device::gpu::{noise, run_cpu, run_gpu};
use crate::output::{Output, Render};
use crate::size;

#[derive(Args)]
pub struct GpuArgs {
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
}

pub fn run(args: GpuArgs, out: &Output) -> Result<ExitCode> {
    let Some(algo) = HashAlgo::from_name(&args.hash) else {
        return Ok(out.usage(&format!(
            "unknown hash {:?}: use blake3, sha256 or sha1",
            args.hash
        )));
    };
    let gpu_config = GpuConfig {
        block_size: args.block_size,
        streams: args.streams,
        ..GpuConfig::default()
    };
    if crate::commands::device::gpu::emulated() {
        return measure(&EmulatedDevice, "emulated", &args, algo, gpu_config, out);
    }
    let gpu = Gpu::open(0)?;
    measure(&gpu, gpu.name(), &args, algo, gpu_config, out)
}

/// The runs on `device` (named `name`) and on the CPU, and their table.
fn measure<D: Device>(
    device: &D,
    name: &str,
    args: &GpuArgs,
    algo: HashAlgo,
    gpu_config: GpuConfig,
    out: &Output,
) -> Result<ExitCode> {
    let config = ChunkerConfig::default();
    out.note(&format!("generating {} bytes of noise", args.size));
    let data = noise(args.size);
    let mut gpu_times = Vec::new();
    let mut cpu_times = Vec::new();
    let mut stages = StageTimes::default();
    for _ in 0..args.runs.max(1) {
        let start = Instant::now();
        let (chunks, times) = run_gpu(device, &config, algo, gpu_config, usize::MAX, &data)?;
        gpu_times.push(start.elapsed());
        stages = times;
        let start = Instant::now();
        let cpu_chunks = run_cpu(&config, algo, &data);
        cpu_times.push(start.elapsed());
        anyhow::ensure!(
            chunks.len() == cpu_chunks,
            "GPU and CPU chunk counts differ"
        );
    }
    let measured = Measured {
        device: name,
        bytes: args.size,
        hash: algo.name(),
        gpu_config,
        runs: gpu_times.len(),
        gpu_seconds: median(gpu_times),
        cpu_threads: rayon::current_num_threads(),
        cpu_seconds: median(cpu_times),
        stages: StageShares::new(&stages),
        bytes_up: stages.bytes_up,
        bytes_down: stages.bytes_down,
    };
    out.print(&measured)?;
    Ok(ExitCode::SUCCESS)
}

/// The median of at least one time, in seconds.
fn median(mut times: Vec<Duration>) -> f64 {
    times.sort();
    times[times.len() / 2].as_secs_f64()
}

/// The GPU and CPU medians, and how the last GPU run spent its host time.
#[derive(Serialize)]
struct Measured<'a> {
    device: &'a str,
    bytes: usize,
    hash: &'static str,
    #[serde(serialize_with = "gpu_config_json")]
    gpu_config: GpuConfig,
    /// Timed runs of each path.
    runs: usize,
    /// Median seconds of a GPU run, transfers included.
    gpu_seconds: f64,
    cpu_threads: usize,
    /// Median seconds of a CPU run.
    cpu_seconds: f64,
    stages: StageShares,
    /// PCIe bytes of the last GPU run, host to device and back.
    bytes_up: u64,
    bytes_down: u64,
}

fn gpu_config_json<S: serde::Serializer>(c: &GpuConfig, s: S) -> Result<S::Ok, S::Error> {
    #[derive(Serialize)]
    struct Fields {
        block_size: usize,
        stretch: usize,
        slots: usize,
        streams: usize,
    }
    Fields {
        block_size: c.block_size,
        stretch: c.stretch,
        slots: c.slots,
        streams: c.streams,
    }
    .serialize(s)
}

/// Percent of the host's wall time in each stage of the last GPU run.
#[derive(Serialize)]
struct StageShares {
    staging: f64,
    scan_wait: f64,
    select: f64,
    hash_wait: f64,
}

impl StageShares {
    fn new(s: &StageTimes) -> Self {
        let total = s.stage_in + s.scan_wait + s.select + s.hash_wait;
        let share = |d: Duration| 100.0 * d.as_secs_f64() / total.as_secs_f64().max(1e-9);
        Self {
            staging: share(s.stage_in),
            scan_wait: share(s.scan_wait),
            select: share(s.select),
            hash_wait: share(s.hash_wait),
        }
    }
}

impl Render for Measured<'_> {
    fn write_text(&self, w: &mut dyn Write) -> io::Result<()> {
        let gb_per_sec = |seconds: f64| self.bytes as f64 / seconds / 1e9;
        writeln!(
            w,
            "device: {}; {} bytes, {}, {:?}, median of {} runs",
            self.device, self.bytes, self.hash, self.gpu_config, self.runs
        )?;
        writeln!(
            w,
            "GPU (transfers included): {:.2} GB/s",
            gb_per_sec(self.gpu_seconds)
        )?;
        writeln!(
            w,
            "CPU ({} threads):          {:.2} GB/s",
            self.cpu_threads,
            gb_per_sec(self.cpu_seconds)
        )?;
        writeln!(w, "GPU / CPU: {:.2}x", self.cpu_seconds / self.gpu_seconds)?;
        let s = &self.stages;
        writeln!(
            w,
            "host stages of the last GPU run (share of host wall time):"
        )?;
        writeln!(w, "  staging into pinned buffers {:5.1}%", s.staging)?;
        writeln!(w, "  waiting for upload + scan   {:5.1}%", s.scan_wait)?;
        writeln!(w, "  decode + select on the host {:5.1}%", s.select)?;
        writeln!(w, "  hash launch + fingerprints  {:5.1}%", s.hash_wait)?;
        writeln!(
            w,
            "PCIe: {} bytes up, {} bytes down; {:.2} GB/s up over the whole run",
            self.bytes_up,
            self.bytes_down,
            self.bytes_up as f64 / self.gpu_seconds / 1e9
        )
    }
}
