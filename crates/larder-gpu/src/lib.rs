//! The GPU backend (docs/design/gpu.md): FastCDC 2020's candidate scan and
//! batched chunk fingerprints on an NVIDIA GPU, in one pass over the data.
//!
//! The device scans each block for candidate cut points ([`larder_chunk::Candidate`]),
//! the host selects the cut points among them with
//! [`larder_chunk::CandidateChunker::select`], and the device fingerprints the chunks
//! it already holds; only candidates and fingerprints come back. The CUDA driver and
//! NVRTC are loaded with dlopen on first use: a machine without them builds, links and
//! runs everything here, and [`Gpu::open`] answers [`Error::NoDriver`] or
//! [`Error::NoNvrtc`] instead of panicking.

mod device;
mod emulated;
pub mod kernels;
mod pipeline;
pub mod stretch;

pub use device::{CudaSlot, Gpu, GpuChunkerHasher};
pub use emulated::{EmulatedDevice, EmulatedSlot};
pub use pipeline::{ChunkerHasher, Device, GpuChunk, GpuConfig, StageTimes};

use cudarc::nvrtc::{CompileOptions, Ptx};

/// Everything that can fail in the GPU backend.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// libcuda is not loadable: no NVIDIA driver on this machine (permanent).
    #[error("no CUDA driver (libcuda.so) could be loaded; this machine has no usable NVIDIA GPU")]
    NoDriver,
    /// The driver loaded but reports no device (permanent).
    #[error("the CUDA driver reports no GPU")]
    NoDevice,
    /// libnvrtc is not loadable, so the kernels cannot be compiled (permanent).
    #[error(
        "NVRTC (libnvrtc.so.12) could not be loaded; install the CUDA runtime compiler \
         (e.g. the nvidia-cuda-nvrtc-cu12 wheel) and add its lib directory to LD_LIBRARY_PATH"
    )]
    NoNvrtc,
    /// NVRTC rejected the kernel source: a bug in `kernels.rs` (permanent).
    #[error("NVRTC failed to compile the kernels: {0}")]
    Compile(String),
    /// A driver call failed (may be transient, e.g. out of device memory).
    #[error("CUDA driver error: {0}")]
    Driver(#[from] cudarc::driver::DriverError),
    /// The configuration cannot be run as given.
    #[error("invalid GPU configuration: {0}")]
    Config(String),
}

/// Whether libnvrtc can be loaded (see [`Error::NoNvrtc`] for how to point at it).
pub fn nvrtc_available() -> bool {
    // SAFETY: only tries to dlopen the library's candidate names.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

/// Whether libcuda can be loaded (a driver is installed; a device may still be absent).
pub fn driver_available() -> bool {
    // SAFETY: only tries to dlopen the library's candidate names.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// Compiles [`kernels::source`] to PTX for `arch` (e.g. `"compute_90"`), or NVRTC's
/// default architecture with `None`. Needs only libnvrtc, no GPU.
pub fn compile_kernels(arch: Option<&str>) -> Result<Ptx, Error> {
    if !nvrtc_available() {
        return Err(Error::NoNvrtc);
    }
    let mut options = vec!["--std=c++14".to_string()];
    if let Some(arch) = arch {
        options.push(format!("--gpu-architecture={arch}"));
    }
    let opts = CompileOptions {
        options,
        name: Some("larder_kernels.cu".into()),
        ..Default::default()
    };
    cudarc::nvrtc::compile_ptx_with_opts(kernels::source(), opts)
        .map_err(|e| Error::Compile(e.to_string()))
}
