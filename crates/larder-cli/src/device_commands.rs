//! `--device auto|cpu|gpu` and `larder bench gpu`. The GPU backend (crate larder-gpu)
//! is compiled in only with the cargo feature `gpu`; without it `gpu` is an error that
//! says how to get it and `auto` means cpu (docs/design/gpu.md, "Choosing the device").

use anyhow::{bail, Result};
use clap::ValueEnum;
use larder_chunk::{ChunkerConfig, ChunkerKind};

use crate::output::Output;

/// Where chunking and fingerprinting run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DeviceArg {
    /// The GPU when one is present and a quick calibration finds it faster, else the CPU
    Auto,
    Cpu,
    Gpu,
}

/// `larder backup --device`: the backup pipeline runs on the CPU; a GPU request is
/// refused with the reason rather than silently ignored.
pub fn backup_device(device: DeviceArg, out: &Output) -> Result<()> {
    match device {
        DeviceArg::Cpu => Ok(()),
        DeviceArg::Auto => {
            if cfg!(feature = "gpu") {
                out.note("--device auto: the backup pipeline does not take the GPU backend yet; using the CPU");
            }
            Ok(())
        }
        DeviceArg::Gpu if !cfg!(feature = "gpu") => bail!(no_gpu_build()),
        DeviceArg::Gpu => bail!(
            "--device gpu: the backup pipeline does not take the GPU backend yet (issue 8); \
             `larder chunk --device gpu` and `larder bench gpu` run it"
        ),
    }
}

fn no_gpu_build() -> &'static str {
    "--device gpu: this larder was built without GPU support; rebuild it with \
     `cargo build --release -p larder-cli --features gpu` (needs no CUDA toolkit)"
}

/// `larder chunk --device`: true when the chunking runs on the GPU (then
/// [`gpu::chunk_files`] does it), false for the CPU path.
pub fn chunk_on_gpu(device: DeviceArg, config: &ChunkerConfig, out: &Output) -> Result<bool> {
    let fastcdc = config.kind == ChunkerKind::Fastcdc2020;
    match device {
        DeviceArg::Cpu => Ok(false),
        DeviceArg::Gpu if !cfg!(feature = "gpu") => bail!(no_gpu_build()),
        DeviceArg::Gpu if !fastcdc => bail!(
            "--device gpu chunks with fastcdc2020 only, not {}",
            config.kind.name()
        ),
        DeviceArg::Gpu => Ok(true),
        DeviceArg::Auto if !cfg!(feature = "gpu") || !fastcdc => Ok(false),
        DeviceArg::Auto => auto_prefers_gpu(config, out),
    }
}

#[cfg(not(feature = "gpu"))]
fn auto_prefers_gpu(_config: &ChunkerConfig, _out: &Output) -> Result<bool> {
    Ok(false)
}

#[cfg(feature = "gpu")]
fn auto_prefers_gpu(config: &ChunkerConfig, out: &Output) -> Result<bool> {
    gpu::calibrate(config, out)
}

#[cfg(feature = "gpu")]
pub use gpu::{bench_gpu, chunk_files};

#[cfg(feature = "gpu")]
mod gpu {
    use std::path::PathBuf;
    use std::time::{Duration, Instant};

    use anyhow::{Context, Result};
    use larder_chunk::{CandidateChunker, ChunkerConfig, FastCdc2020};
    use larder_gpu::{Gpu, GpuChunk, GpuChunkerHasher, GpuConfig, StageTimes};
    use larder_hash::HashAlgo;

    use crate::output::Output;

    fn candidate_chunker(config: &ChunkerConfig) -> CandidateChunker {
        CandidateChunker::new(
            config.min_size,
            config.avg_size,
            config.max_size,
            config.level,
        )
    }

    /// Chunks and fingerprints `data` on the GPU, fed in block-sized pushes.
    fn run_gpu(
        gpu: &Gpu,
        config: &ChunkerConfig,
        algo: HashAlgo,
        gpu_config: GpuConfig,
        data: &[u8],
    ) -> Result<(Vec<GpuChunk>, StageTimes)> {
        let mut hasher = GpuChunkerHasher::new(
            gpu,
            candidate_chunker(config),
            config.max_size,
            algo,
            gpu_config,
        )?;
        let mut chunks = Vec::new();
        for block in data.chunks(gpu_config.block_size) {
            chunks.extend(hasher.push(block)?);
        }
        let (last, times) = hasher.finish()?;
        chunks.extend(last);
        Ok((chunks, times))
    }

    /// The same work on the CPU: FastCDC 2020 cut points on rayon's pool (exact parallel
    /// chunking), fingerprints on rayon's pool.
    fn run_cpu(config: &ChunkerConfig, algo: HashAlgo, data: &[u8]) -> usize {
        let chunker = FastCdc2020::new(
            config.min_size,
            config.avg_size,
            config.max_size,
            config.level,
        );
        let pool = rayon::ThreadPoolBuilder::new()
            .build()
            .expect("a rayon pool");
        let lengths = larder_chunk::ParallelChunker::new(&chunker, &pool)
            .chunk_lengths(data)
            .lengths;
        let mut at = 0;
        let chunks: Vec<&[u8]> = lengths
            .iter()
            .map(|&len| {
                at += len;
                &data[at - len..at]
            })
            .collect();
        algo.fingerprint_batch(&chunks).len()
    }

    /// `len` incompressible bytes, the same on every run (the generator's xoshiro256**).
    fn noise(len: usize) -> Vec<u8> {
        let mut rng = larder_gen::Xoshiro256::new(0x9e37_79b9_7f4a_7c15);
        let mut out = Vec::with_capacity(len + 8);
        while out.len() < len {
            out.extend_from_slice(&rng.next_u64().to_le_bytes());
        }
        out.truncate(len);
        out
    }

    /// `--device auto`: the GPU when it opens and chunks plus hashes 64 MiB faster than
    /// the CPU path on all cores (one warm-up run each, then one timed run each).
    pub fn calibrate(config: &ChunkerConfig, out: &Output) -> Result<bool> {
        let gpu = match Gpu::open(0) {
            Ok(gpu) => gpu,
            Err(e) => {
                out.note(&format!("--device auto: using the CPU ({e})"));
                return Ok(false);
            }
        };
        let data = noise(64 << 20);
        let time = |f: &mut dyn FnMut() -> Result<()>| -> Result<Duration> {
            f()?;
            let start = Instant::now();
            f()?;
            Ok(start.elapsed())
        };
        let gpu_time = time(&mut || {
            run_gpu(&gpu, config, HashAlgo::Blake3, GpuConfig::default(), &data).map(drop)
        })?;
        let cpu_time = time(&mut || {
            run_cpu(config, HashAlgo::Blake3, &data);
            Ok(())
        })?;
        let on_gpu = gpu_time < cpu_time;
        out.note(&format!(
            "--device auto: 64 MiB in {:.1} ms on {} and {:.1} ms on the CPU; using the {}",
            gpu_time.as_secs_f64() * 1e3,
            gpu.name(),
            cpu_time.as_secs_f64() * 1e3,
            if on_gpu { "GPU" } else { "CPU" }
        ));
        Ok(on_gpu)
    }

    /// `larder chunk --device gpu`: every file chunked and fingerprinted (BLAKE3) on the
    /// GPU; one summary line per file, and with `cuts` every chunk.
    pub fn chunk_files(
        files: &[PathBuf],
        config: &ChunkerConfig,
        cuts: bool,
        out: &Output,
    ) -> Result<()> {
        let gpu = Gpu::open(0)?;
        for file in files {
            let data =
                std::fs::read(file).with_context(|| format!("reading {}", file.display()))?;
            let start = Instant::now();
            let (chunks, _) = run_gpu(&gpu, config, HashAlgo::Blake3, GpuConfig::default(), &data)?;
            let secs = start.elapsed().as_secs_f64();
            if cuts {
                let mut at = 0;
                for c in &chunks {
                    println!("{}\t{at}\t{}\t{}", file.display(), c.len, c.fingerprint);
                    at += c.len;
                }
            }
            out.note(&format!(
                "{}: {} bytes, {} chunks, mean {:.0} bytes, {:.2} GB/s on {}",
                file.display(),
                data.len(),
                chunks.len(),
                data.len() as f64 / chunks.len().max(1) as f64,
                data.len() as f64 / secs / 1e9,
                gpu.name()
            ));
        }
        Ok(())
    }

    /// `larder bench gpu`: chunking plus fingerprints of `size` bytes of noise on the GPU
    /// (transfers included) against the CPU path on all cores, with each stage's share.
    pub fn bench_gpu(
        size: usize,
        algo: HashAlgo,
        gpu_config: GpuConfig,
        runs: usize,
        out: &Output,
    ) -> Result<()> {
        let config = ChunkerConfig::default();
        let gpu = Gpu::open(0)?;
        out.note(&format!("generating {size} bytes of noise"));
        let data = noise(size);
        let mut gpu_times = Vec::new();
        let mut cpu_times = Vec::new();
        let mut stages = StageTimes::default();
        for _ in 0..runs.max(1) {
            let start = Instant::now();
            let (chunks, times) = run_gpu(&gpu, &config, algo, gpu_config, &data)?;
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
        gpu_times.sort();
        cpu_times.sort();
        let gpu_median = gpu_times[gpu_times.len() / 2].as_secs_f64();
        let cpu_median = cpu_times[cpu_times.len() / 2].as_secs_f64();
        let total = stages.stage_in + stages.scan_wait + stages.select + stages.hash_wait;
        let share = |d: Duration| 100.0 * d.as_secs_f64() / total.as_secs_f64().max(1e-9);
        println!(
            "device: {}; {} bytes, {}, {gpu_config:?}, median of {} runs",
            gpu.name(),
            size,
            algo.name(),
            gpu_times.len()
        );
        println!(
            "GPU (transfers included): {:.2} GB/s",
            size as f64 / gpu_median / 1e9
        );
        println!(
            "CPU ({} threads):          {:.2} GB/s",
            rayon::current_num_threads(),
            size as f64 / cpu_median / 1e9
        );
        println!("GPU / CPU: {:.2}x", cpu_median / gpu_median);
        println!("host stages of the last GPU run (share of host wall time):");
        println!(
            "  staging into pinned buffers {:5.1}%",
            share(stages.stage_in)
        );
        println!(
            "  waiting for upload + scan   {:5.1}%",
            share(stages.scan_wait)
        );
        println!(
            "  decode + select on the host {:5.1}%",
            share(stages.select)
        );
        println!(
            "  hash launch + fingerprints  {:5.1}%",
            share(stages.hash_wait)
        );
        println!(
            "PCIe: {} bytes up, {} bytes down; {:.2} GB/s up over the whole run",
            stages.bytes_up,
            stages.bytes_down,
            stages.bytes_up as f64 / gpu_median / 1e9
        );
        Ok(())
    }
}
