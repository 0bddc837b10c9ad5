//! `--device auto|cpu|gpu` of `backup` and `chunk`. The GPU backend (crate larder-gpu)
//! is compiled in only with the cargo feature `gpu`; without it `gpu` is an error that
//! says how to get it and `auto` means cpu (docs/design/gpu.md, "Choosing the device").

#[cfg(feature = "gpu")]
pub mod gpu;

use anyhow::{bail, Result};
use clap::ValueEnum;
use larder_chunk::ChunkerConfig;

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
pub enum ChunkDevice {
    Cpu,
    #[cfg(feature = "gpu")]
    Gpu,
}

const NO_GPU_BUILD: &str = "--device gpu: this larder was built without GPU support; rebuild \
     it with `cargo build --release -p larder-cli --features gpu` (needs no CUDA toolkit)";

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
        DeviceArg::Gpu if !cfg!(feature = "gpu") => bail!(NO_GPU_BUILD),
        DeviceArg::Gpu => bail!(
            "--device gpu: the backup pipeline does not take the GPU backend yet; \
             `larder chunk --device gpu` and `larder bench gpu` run it"
        ),
    }
}

/// `larder chunk --device` in a build without the GPU backend.
#[cfg(not(feature = "gpu"))]
pub fn chunk_device(device: DeviceArg, _: &ChunkerConfig, _: &Output) -> Result<ChunkDevice> {
    match device {
        DeviceArg::Gpu => bail!(NO_GPU_BUILD),
        DeviceArg::Auto | DeviceArg::Cpu => Ok(ChunkDevice::Cpu),
    }
}

/// `larder chunk --device`: the GPU chunks FastCDC 2020 only; `auto` takes it when a
/// calibration finds it faster.
#[cfg(feature = "gpu")]
pub fn chunk_device(
    device: DeviceArg,
    config: &ChunkerConfig,
    out: &Output,
) -> Result<ChunkDevice> {
    let fastcdc = config.kind == larder_chunk::ChunkerKind::Fastcdc2020;
    Ok(match device {
        DeviceArg::Cpu => ChunkDevice::Cpu,
        DeviceArg::Gpu if !fastcdc => bail!(
            "--device gpu chunks with fastcdc2020 only, not {}",
            config.kind.name()
        ),
        DeviceArg::Gpu if config.seed != 0 => {
            bail!("--device gpu chunks with the unseeded Gear table only: drop --seed")
        }
        DeviceArg::Auto if config.seed != 0 => ChunkDevice::Cpu,
        DeviceArg::Gpu => ChunkDevice::Gpu,
        DeviceArg::Auto if !fastcdc => ChunkDevice::Cpu,
        DeviceArg::Auto if gpu::calibrate(config, out)? => ChunkDevice::Gpu,
        DeviceArg::Auto => ChunkDevice::Cpu,
    })
}
