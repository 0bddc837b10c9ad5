//! The GPU path of `chunk` and `bench gpu`, and the CPU path it is measured against:
//! FastCDC 2020 cut points plus fingerprints of a byte slice.

use std::time::{Duration, Instant};

use std::sync::{Arc, Mutex};

use anyhow::Result;
use larder_chunk::{CandidateChunker, ChunkerConfig, FastCdc2020};
use larder_engine::GpuChunkDevice;
use larder_gpu::{ChunkerHasher, Device, EmulatedDevice, Gpu, GpuChunk, GpuConfig, StageTimes};
use larder_hash::HashAlgo;
use larder_store::RepoConfig;

use super::BackupDevice;
use crate::output::Output;

fn candidate_chunker(config: &ChunkerConfig) -> CandidateChunker {
    CandidateChunker::new(
        config.min_size,
        config.avg_size,
        config.max_size,
        config.level,
    )
}

/// Chunks and fingerprints `data` on `device` (the GPU, or its emulation), fed as
/// streams of `stream` bytes, each a stream of its own (`usize::MAX`: one stream), in
/// pushes of `gpu_config`'s blocks.
pub fn run_gpu<D: Device>(
    device: &D,
    config: &ChunkerConfig,
    algo: HashAlgo,
    gpu_config: GpuConfig,
    stream: usize,
    data: &[u8],
) -> Result<(Vec<GpuChunk>, StageTimes)> {
    let mut hasher = ChunkerHasher::new(
        device,
        candidate_chunker(config),
        config.max_size,
        algo,
        gpu_config,
    )?;
    let mut chunks = Vec::new();
    for part in data.chunks(stream) {
        chunks.extend(hasher.push(part)?);
        chunks.extend(hasher.end_stream()?);
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

/// Whether `LARDER_GPU=emulated` asks for the GPU backend's CPU emulation in the
/// GPU's place (docs/design/gpu.md, "Choosing the device").
pub fn emulated() -> bool {
    std::env::var("LARDER_GPU").is_ok_and(|v| v == "emulated")
}

/// How the GPU is fed: its configuration, and the bytes of each stream it is given.
#[derive(Clone, Copy)]
struct Shape {
    gpu: GpuConfig,
    stream: usize,
}

/// `larder chunk`: each file one stream, in the blocks of [`GpuConfig::default`].
fn chunk_shape() -> Shape {
    Shape {
        gpu: GpuConfig::default(),
        stream: usize::MAX,
    }
}

/// A backup: stage 1 gives the device one 8 MiB block at a time, as a stream of its
/// own; four 2 MiB blocks in flight overlap each one's upload with the others' scans.
/// A starting point, to be tuned on a GPU (docs/performance.md, "GPU").
const BACKUP_SHAPE: Shape = Shape {
    gpu: GpuConfig {
        block_size: 2 << 20,
        stretch: 4096,
        slots: 16,
        streams: 4,
    },
    stream: 8 << 20,
};

/// `--device auto`: whether the GPU is to chunk (and hash) with `config` on this
/// machine: when it opens and its calibration finds it faster. A calibration is
/// remembered per machine (see [`Calibrations`]); a machine without a GPU says nothing.
pub fn auto_is_gpu(config: &ChunkerConfig, out: &Output) -> Result<bool> {
    let Ok(gpu) = Gpu::open(0) else {
        return Ok(false);
    };
    faster_than_cpu(&gpu, config, chunk_shape(), out)
}

/// The GPU of a backup, or with `LARDER_GPU=emulated` its CPU emulation, chunking and
/// hashing as `config` says. The GPU stays open for the life of the process.
pub fn backup_device(config: &RepoConfig) -> Result<BackupDevice> {
    if emulated() {
        static EMULATED: EmulatedDevice = EmulatedDevice;
        return shared(&EMULATED, config);
    }
    let gpu: &'static Gpu = Box::leak(Box::new(Gpu::open(0)?));
    shared(gpu, config)
}

/// `backup --device auto`: the GPU if it opens and is faster here, else `None`.
pub fn auto_backup_device(config: &RepoConfig, out: &Output) -> Result<Option<BackupDevice>> {
    let Ok(gpu) = Gpu::open(0) else {
        return Ok(None);
    };
    if !faster_than_cpu(&gpu, &config.chunker, BACKUP_SHAPE, out)? {
        return Ok(None);
    }
    let gpu: &'static Gpu = Box::leak(Box::new(gpu));
    shared(gpu, config).map(Some)
}

fn shared<D>(device: &'static D, config: &RepoConfig) -> Result<BackupDevice>
where
    D: larder_gpu::Device + Sync + 'static,
    D::Slot: Send,
{
    let device = GpuChunkDevice::new(device, &config.chunker, config.hash, BACKUP_SHAPE.gpu)?;
    Ok(Arc::new(Mutex::new(Box::new(device))))
}

/// Whether `gpu`, fed as `shape` says, chunks plus hashes 64 MiB faster than the CPU
/// path on all cores (one warm-up run each, then one timed run each), as remembered
/// for this machine or measured now (and then remembered).
fn faster_than_cpu(gpu: &Gpu, config: &ChunkerConfig, shape: Shape, out: &Output) -> Result<bool> {
    let key = Calibrations::key(gpu.name(), config, shape);
    let mut known = Calibrations::load();
    if let Some(&on_gpu) = known.0.get(&key) {
        return Ok(on_gpu);
    }
    let on_gpu = calibrate(gpu, config, shape, out)?;
    known.0.insert(key, on_gpu);
    known.save();
    Ok(on_gpu)
}

/// One calibration: 64 MiB of noise on each device, the note on stderr giving both
/// times.
fn calibrate(gpu: &Gpu, config: &ChunkerConfig, shape: Shape, out: &Output) -> Result<bool> {
    let data = noise(64 << 20);
    let time = |f: &mut dyn FnMut() -> Result<()>| -> Result<Duration> {
        f()?;
        let start = Instant::now();
        f()?;
        Ok(start.elapsed())
    };
    let gpu_time = time(&mut || {
        run_gpu(
            gpu,
            config,
            HashAlgo::Blake3,
            shape.gpu,
            shape.stream,
            &data,
        )
        .map(drop)
    })?;
    let cpu_time = time(&mut || {
        run_cpu(config, HashAlgo::Blake3, &data);
        Ok(())
    })?;
    let on_gpu = gpu_time < cpu_time;
    out.note(&format!(
        "--device auto: 64 MiB in {:.1} ms on {} and {:.1} ms on the CPU; using the {} \
         (remembered for this machine)",
        gpu_time.as_secs_f64() * 1e3,
        gpu.name(),
        cpu_time.as_secs_f64() * 1e3,
        if on_gpu { "GPU" } else { "CPU" }
    ));
    Ok(on_gpu)
}

/// `--device auto`'s calibrations of this machine, in
/// `$XDG_CACHE_HOME/larder/device-calibrations.json` (else under `~/.cache`): whether
/// the GPU was faster, by GPU, CPU, core count and chunk sizes. A file that cannot be
/// read is treated as empty, and one that cannot be written is left alone: the cost is
/// calibrating again.
#[derive(Default, serde::Serialize, serde::Deserialize)]
struct Calibrations(std::collections::BTreeMap<String, bool>);

impl Calibrations {
    fn key(gpu: &str, config: &ChunkerConfig, shape: Shape) -> String {
        let cpu = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|info| {
                info.lines().find_map(|l| {
                    l.strip_prefix("model name")
                        .map(|m| m.trim_start_matches([' ', '\t', ':']).to_string())
                })
            })
            .unwrap_or_default();
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        let g = shape.gpu;
        format!(
            "{gpu} | {cpu} | {cores} cores | {}/{}/{} level {} | streams of {} in blocks \
             of {} x {} | larder {}",
            config.min_size,
            config.avg_size,
            config.max_size,
            config.level,
            shape.stream.min(64 << 20),
            g.block_size,
            g.streams,
            env!("CARGO_PKG_VERSION")
        )
    }

    fn path() -> Option<std::path::PathBuf> {
        crate::repo_open::cache_dir("device-calibrations.json").ok()
    }

    fn load() -> Self {
        Self::path()
            .and_then(|p| std::fs::read(p).ok())
            .and_then(|bytes| serde_json::from_slice(&bytes).ok())
            .unwrap_or_default()
    }

    fn save(&self) {
        if let (Some(path), Ok(bytes)) = (Self::path(), serde_json::to_vec_pretty(self)) {
            let _ = std::fs::write(path, bytes);
        }
    }
}
