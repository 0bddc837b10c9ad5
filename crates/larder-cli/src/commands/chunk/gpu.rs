//! `larder chunk --device gpu`: every file chunked and fingerprinted (BLAKE3) on the
//! GPU, one result per file as it is done.

use std::io::{self, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Context, Result};
use larder_chunk::ChunkerConfig;
use larder_engine::{escape_name, BytesField};
use larder_gpu::{Device, EmulatedDevice, Gpu, GpuChunk, GpuConfig};
use larder_hash::HashAlgo;
use serde::Serialize;

use crate::commands::device::gpu::run_gpu;
use crate::output::{Output, Render};

pub fn chunk_files(
    files: &[PathBuf],
    config: &ChunkerConfig,
    cuts: bool,
    out: &Output,
) -> Result<ExitCode> {
    if crate::commands::device::gpu::emulated() {
        return chunk_on(&EmulatedDevice, "emulated", files, config, cuts, out);
    }
    let gpu = Gpu::open(0)?;
    chunk_on(&gpu, gpu.name(), files, config, cuts, out)
}

/// `larder chunk` on `device`, named `name` in the output.
fn chunk_on<D: Device>(
    device: &D,
    name: &str,
    files: &[PathBuf],
    config: &ChunkerConfig,
    cuts: bool,
    out: &Output,
) -> Result<ExitCode> {
    for file in files {
        let data = std::fs::read(file).with_context(|| format!("reading {}", file.display()))?;
        let start = Instant::now();
        let (chunks, _) = run_gpu(
            device,
            config,
            HashAlgo::Blake3,
            GpuConfig::default(),
            usize::MAX,
            &data,
        )?;
        let seconds = start.elapsed().as_secs_f64();
        out.print(&ChunkedOnGpu {
            name: BytesField::new("path", file.as_os_str().as_bytes()),
            path: file,
            bytes: data.len(),
            chunks: chunks.len(),
            mean_bytes: data.len() as f64 / chunks.len().max(1) as f64,
            gb_per_sec: data.len() as f64 / seconds / 1e9,
            device: name,
            cuts: cuts.then(|| cut_list(&chunks)),
        })?;
    }
    Ok(ExitCode::SUCCESS)
}

/// One file chunked on the GPU; its path in JSON as `path` (and `path_hex` where it
/// is not UTF-8), in text escaped.
#[derive(Serialize)]
struct ChunkedOnGpu<'a> {
    #[serde(flatten)]
    name: BytesField<'a>,
    #[serde(skip)]
    path: &'a Path,
    bytes: usize,
    chunks: usize,
    mean_bytes: f64,
    gb_per_sec: f64,
    device: &'a str,
    /// With `--cuts`.
    cuts: Option<Vec<Cut>>,
}

#[derive(Serialize)]
struct Cut {
    offset: usize,
    length: usize,
    fingerprint: String,
}

fn cut_list(chunks: &[GpuChunk]) -> Vec<Cut> {
    let mut offset = 0;
    chunks
        .iter()
        .map(|c| {
            let cut = Cut {
                offset,
                length: c.len,
                fingerprint: c.fingerprint.to_string(),
            };
            offset += c.len;
            cut
        })
        .collect()
}

impl Render for ChunkedOnGpu<'_> {
    /// The cuts were asked for with `--cuts`; `--quiet` leaves them, as it always has.
    const QUIET_SILENCES_TEXT: bool = false;

    fn write_text(&self, w: &mut dyn Write) -> io::Result<()> {
        for cut in self.cuts.iter().flatten() {
            writeln!(
                w,
                "{}\t{}\t{}\t{}",
                escape_name(self.path.as_os_str().as_bytes()),
                cut.offset,
                cut.length,
                cut.fingerprint
            )?;
        }
        Ok(())
    }

    fn notes(&self) -> Vec<String> {
        vec![format!(
            "{}: {} bytes, {} chunks, mean {:.0} bytes, {:.2} GB/s on {}",
            self.path.display(),
            self.bytes,
            self.chunks,
            self.mean_bytes,
            self.gb_per_sec,
            self.device
        )]
    }
}
