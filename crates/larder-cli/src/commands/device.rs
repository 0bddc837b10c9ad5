//! `--device auto|cpu|gpu` of `backup` and `chunk`. The GPU backend (crate larder-gpu)
//! is compiled in only with the cargo feature `gpu`; without it `gpu` is an error that
//! says how to get it and `auto` means cpu (docs/design/gpu.md, "Choosing the device").
//! `LARDER_GPU=emulated` puts the GPU backend's CPU emulation in the GPU's place: the
//! same pipeline code and results, slowly, on any machine (`scripts/device-run
//! --dry-run`).

#[cfg(feature = "gpu")]
pub mod gpu;

use std::sync::{Arc, Mutex};

use anyhow::{bail, Result};
use clap::ValueEnum;
use larder_chunk::ChunkerConfig;
use larder_engine::ChunkDevice;
use larder_store::RepoConfig;

use crate::output::Output;

/// Where chunking and fingerprinting run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DeviceArg {
    /// The GPU when one is present and a quick calibration finds it faster, else the CPU
    Auto,
    Cpu,
    Gpu,
}

/// Where `larder chunk` chunks.
pub enum ChunkOn {
    Cpu,
    #[cfg(feature = "gpu")]
    Gpu,
}

#[cfg(not(feature = "gpu"))]
const NO_GPU_BUILD: &str = "--device gpu: this larder was built without GPU support; rebuild \
     it with `cargo build --release -p larder-cli --features gpu` (needs no CUDA toolkit)";

/// The device a backup chunks and fingerprints on, shared with the engine's stage 1.
pub type BackupDevice = Arc<Mutex<Box<dyn ChunkDevice>>>;

/// `larder backup --device` in a build without the GPU backend: the CPU, and a GPU
/// request refused with how to get one.
#[cfg(not(feature = "gpu"))]
pub fn backup_device(
    device: DeviceArg,
    _: &RepoConfig,
    _: &Output,
) -> Result<Option<BackupDevice>> {
    match device {
        DeviceArg::Gpu => bail!(NO_GPU_BUILD),
        DeviceArg::Auto | DeviceArg::Cpu => Ok(None),
    }
}

/// `larder backup --device`: `gpu` chunks and fingerprints large files on the GPU, or
/// says why it cannot (the repository, or the machine); `auto` takes the GPU when the
/// repository allows it and the GPU is faster on this machine (calibrated once, then
/// remembered), and says nothing when there is no GPU.
#[cfg(feature = "gpu")]
pub fn backup_device(
    device: DeviceArg,
    config: &RepoConfig,
    out: &Output,
) -> Result<Option<BackupDevice>> {
    let usable = larder_engine::check_device(config);
    match device {
        DeviceArg::Cpu => Ok(None),
        DeviceArg::Gpu => {
            usable?;
            gpu::backup_device(config).map(Some)
        }
        DeviceArg::Auto if usable.is_err() => Ok(None),
        DeviceArg::Auto => gpu::auto_backup_device(config, out),
    }
}

/// `larder chunk --device` in a build without the GPU backend.
#[cfg(not(feature = "gpu"))]
pub fn chunk_device(device: DeviceArg, _: &ChunkerConfig, _: &Output) -> Result<ChunkOn> {
    match device {
        DeviceArg::Gpu => bail!(NO_GPU_BUILD),
        DeviceArg::Auto | DeviceArg::Cpu => Ok(ChunkOn::Cpu),
    }
}

/// `larder chunk --device`: the GPU chunks FastCDC 2020 only; `auto` takes it when a
/// calibration finds it faster.
#[cfg(feature = "gpu")]
pub fn chunk_device(device: DeviceArg, config: &ChunkerConfig, out: &Output) -> Result<ChunkOn> {
    let fastcdc = config.kind == larder_chunk::ChunkerKind::Fastcdc2020;
    Ok(match device {
        DeviceArg::Cpu => ChunkOn::Cpu,
        DeviceArg::Gpu if !fastcdc => bail!(
            "--device gpu chunks with fastcdc2020 only, not {}",
            config.kind.name()
        ),
        DeviceArg::Gpu if config.seed != 0 => {
            bail!("--device gpu chunks with the unseeded Gear table only: drop --seed")
        }
        DeviceArg::Auto if config.seed != 0 => ChunkOn::Cpu,
        DeviceArg::Gpu => ChunkOn::Gpu,
        DeviceArg::Auto if !fastcdc => ChunkOn::Cpu,
        DeviceArg::Auto if gpu::auto_is_gpu(config, out)? => ChunkOn::Gpu,
        DeviceArg::Auto => ChunkOn::Cpu,
    })
}
