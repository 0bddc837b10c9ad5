//! The GPU path of `chunk` and `bench gpu`, and the CPU path it is measured against:
//! FastCDC 2020 cut points plus fingerprints of a byte slice.

use std::time::{Duration, Instant};

use anyhow::Result;
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
pub fn run_gpu(
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
/// chunking), fingerprints on rayon's pool. Returns the number of chunks.
pub fn run_cpu(config: &ChunkerConfig, algo: HashAlgo, data: &[u8]) -> usize {
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
pub fn noise(len: usize) -> Vec<u8> {
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
