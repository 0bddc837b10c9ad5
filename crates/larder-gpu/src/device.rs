//! The CUDA backend of the pipeline (`pipeline.rs`): one context, the kernels compiled
//! for its architecture, and per slot a stream, pinned host buffers and device buffers.
//!
//! cudarc's automatic event tracking is off; the pipeline's ordering rules 1 and 2 and
//! this rule replace it: the device-to-device leftover copy out of slot `k` is enqueued
//! on slot `k + 1`'s stream, slot `k` records an event after it, and its next upload
//! waits on that event before overwriting the source (rule 3).

use std::ops::Range;
use std::sync::Arc;

use cudarc::driver::{
    result, CudaContext, CudaEvent, CudaFunction, CudaSlice, CudaStream, DevicePtr, LaunchConfig,
    PinnedHostSlice, PushKernelArg,
};
use larder_hash::{Fingerprint, HashAlgo};

use crate::kernels::{BLAKE3_KERNEL, SCAN_KERNEL, SHA1_KERNEL, SHA256_KERNEL};
use crate::pipeline::{ChunkerHasher, Device};
use crate::stretch::{ScanLayout, ScanOutput};
use crate::{compile_kernels, driver_available, Error};

/// Threads per CUDA block, for every kernel.
const THREADS_PER_BLOCK: u32 = 256;

/// An opened GPU: context and kernels, shared by every chunker-hasher on it.
pub struct Gpu {
    ctx: Arc<CudaContext>,
    name: String,
    scan: CudaFunction,
    blake3: CudaFunction,
    sha256: CudaFunction,
    sha1: CudaFunction,
}

impl Gpu {
    /// Opens device `ordinal` and compiles the kernels for its architecture.
    pub fn open(ordinal: usize) -> Result<Self, Error> {
        if !driver_available() {
            return Err(Error::NoDriver);
        }
        if CudaContext::device_count()? <= ordinal as i32 {
            return Err(Error::NoDevice);
        }
        let ctx = CudaContext::new(ordinal)?;
        // SAFETY: called before any stream or buffer exists; the ordering rules of this
        // module replace the tracking.
        unsafe { ctx.disable_event_tracking() };
        let (major, minor) = ctx.compute_capability()?;
        let ptx = compile_kernels(Some(&format!("compute_{major}{minor}")))?;
        let module = ctx.load_module(ptx)?;
        Ok(Self {
            name: ctx.name()?,
            scan: module.load_function(SCAN_KERNEL)?,
            blake3: module.load_function(BLAKE3_KERNEL)?,
            sha256: module.load_function(SHA256_KERNEL)?,
            sha1: module.load_function(SHA1_KERNEL)?,
            ctx,
        })
    }

    /// The device's name as the driver reports it.
    pub fn name(&self) -> &str {
        &self.name
    }

    fn hash_kernel(&self, algo: HashAlgo) -> &CudaFunction {
        match algo {
            HashAlgo::Blake3 => &self.blake3,
            HashAlgo::Sha256 => &self.sha256,
            HashAlgo::Sha1 => &self.sha1,
        }
    }
}

fn grid(threads: usize, per_block: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (threads.div_ceil(per_block as usize) as u32, 1, 1),
        block_dim: (per_block, 1, 1),
        shared_mem_bytes: 0,
    }
}

fn device_addr<T>(slice: &CudaSlice<T>, stream: &CudaStream) -> u64 {
    slice.device_ptr(stream).0
}

/// Pinned host memory that the host reads (not write-combined, which reads slowly).
fn pinned<T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits>(
    ctx: &Arc<CudaContext>,
    len: usize,
) -> Result<PinnedHostSlice<T>, Error> {
    // SAFETY: every element is written before it is read (uploads, or downloads that
    // the stream synchronizes before the host reads them); T is valid as zero bits.
    Ok(unsafe { ctx.alloc_pinned_with_flags::<T>(len.max(1), 0) }?)
}

/// Buffers of one slot; `*_host` are pinned.
pub struct CudaSlot {
    stream: Arc<CudaStream>,
    host: PinnedHostSlice<u8>,
    dev: CudaSlice<u8>,
    counts_dev: CudaSlice<u32>,
    found_dev: CudaSlice<u32>,
    counts_host: PinnedHostSlice<u32>,
    found_host: PinnedHostSlice<u32>,
    offsets_host: PinnedHostSlice<u64>,
    offsets_dev: CudaSlice<u64>,
    fp_host: PinnedHostSlice<u8>,
    fp_dev: CudaSlice<u8>,
    /// Recorded after the last device-to-device copy out of `dev` (rule 3).
    reuse_after: Option<CudaEvent>,
}

impl Drop for CudaSlot {
    /// Pinned and device buffers are freed only once no copy or kernel uses them: a
    /// hasher dropped mid-stream (after an error) must not free memory under a DMA.
    fn drop(&mut self) {
        // An error here means the context is already broken; nothing is left to order.
        let _ = self.stream.synchronize();
    }
}

impl CudaSlot {
    /// Room for the offsets and fingerprints of `chunks` chunks.
    fn reserve_chunks(&mut self, ctx: &Arc<CudaContext>, chunks: usize) -> Result<(), Error> {
        if self.offsets_host.len() > chunks {
            return Ok(());
        }
        let cap = (chunks + 1).next_power_of_two();
        self.offsets_host = pinned(ctx, cap)?;
        self.offsets_dev = self.stream.alloc_zeros(cap)?;
        self.fp_host = pinned(ctx, 32 * cap)?;
        self.fp_dev = self.stream.alloc_zeros(32 * cap)?;
        Ok(())
    }
}

/// The pipeline on a GPU.
pub type GpuChunkerHasher<'g> = ChunkerHasher<'g, Gpu>;

impl Device for Gpu {
    type Slot = CudaSlot;

    fn new_slot(&self, bytes: usize, threads: usize, slots: usize) -> Result<CudaSlot, Error> {
        let ctx = &self.ctx;
        let stream = ctx.new_stream()?;
        let chunks = 1024;
        Ok(CudaSlot {
            host: pinned(ctx, bytes)?,
            dev: stream.alloc_zeros(bytes)?,
            counts_dev: stream.alloc_zeros(threads)?,
            found_dev: stream.alloc_zeros(threads * slots)?,
            counts_host: pinned(ctx, threads)?,
            found_host: pinned(ctx, threads * slots)?,
            offsets_host: pinned(ctx, chunks + 1)?,
            offsets_dev: stream.alloc_zeros(chunks + 1)?,
            fp_host: pinned(ctx, 32 * chunks)?,
            fp_dev: stream.alloc_zeros(32 * chunks)?,
            reuse_after: None,
            stream,
        })
    }

    fn host<'s>(&self, slot: &'s mut CudaSlot) -> Result<&'s mut [u8], Error> {
        Ok(slot.host.as_mut_slice()?)
    }

    fn upload(&self, slot: &mut CudaSlot, range: Range<usize>) -> Result<(), Error> {
        if let Some(event) = slot.reuse_after.take() {
            slot.stream.wait(&event)?;
        }
        let dev = device_addr(&slot.dev, &slot.stream) + range.start as u64;
        let host = &slot.host.as_slice()?[range];
        // SAFETY: the range lies in both buffers (same length); the host bytes stay
        // unwritten until the pipeline waits on this slot (rule 1).
        unsafe { result::memcpy_htod_async(dev, host, slot.stream.cu_stream()) }?;
        Ok(())
    }

    fn scan(
        &self,
        slot: &mut CudaSlot,
        layout: &ScanLayout,
        masks: (u64, u64),
    ) -> Result<(), Error> {
        let stream = slot.stream.clone();
        let threads = layout.threads();
        let (from, end) = (layout.from as u64, layout.end as u64);
        let (stretch, slots, n) = (layout.stretch as u32, layout.slots as u32, threads as u32);
        let (mask_s, mask_l) = masks;
        let dev = device_addr(&slot.dev, &stream);
        let counts = device_addr(&slot.counts_dev, &stream);
        let found = device_addr(&slot.found_dev, &stream);
        let mut launch = stream.launch_builder(&self.scan);
        launch
            .arg(&dev)
            .arg(&from)
            .arg(&end)
            .arg(&stretch)
            .arg(&mask_s)
            .arg(&mask_l)
            .arg(&slots)
            .arg(&n)
            .arg(&counts)
            .arg(&found);
        // SAFETY: the arguments match `fastcdc_scan`'s signature; the layout keeps every
        // access inside `dev`, `counts_dev` and `found_dev` (sized for block_size).
        unsafe { launch.launch(grid(threads, THREADS_PER_BLOCK)) }?;
        // SAFETY: the pinned buffers hold `threads` counts and their slots.
        unsafe {
            let counts_host = &mut slot.counts_host.as_mut_slice()?[..threads];
            result::memcpy_dtoh_async(counts_host, counts, stream.cu_stream())?;
            let found_host = &mut slot.found_host.as_mut_slice()?[..threads * layout.slots];
            result::memcpy_dtoh_async(found_host, found, stream.cu_stream())?;
        }
        Ok(())
    }

    fn wait(&self, slot: &mut CudaSlot) -> Result<(), Error> {
        Ok(slot.stream.synchronize()?)
    }

    fn scan_output(&self, slot: &mut CudaSlot, layout: &ScanLayout) -> Result<ScanOutput, Error> {
        let threads = layout.threads();
        Ok(ScanOutput {
            counts: slot.counts_host.as_slice()?[..threads].to_vec(),
            found: slot.found_host.as_slice()?[..threads * layout.slots].to_vec(),
        })
    }

    fn hash(
        &self,
        slot: &mut CudaSlot,
        offsets: &[u64],
        algo: HashAlgo,
    ) -> Result<Vec<Fingerprint>, Error> {
        let n = offsets.len() - 1;
        slot.reserve_chunks(&self.ctx, n)?;
        let stream = slot.stream.clone();
        slot.offsets_host.as_mut_slice()?[..n + 1].copy_from_slice(offsets);
        let offsets_dev = device_addr(&slot.offsets_dev, &stream);
        let fp_dev = device_addr(&slot.fp_dev, &stream);
        let dev = device_addr(&slot.dev, &stream);
        // SAFETY: both offset buffers hold at least n + 1 entries (reserve_chunks).
        unsafe {
            result::memcpy_htod_async(
                offsets_dev,
                &slot.offsets_host.as_slice()?[..n + 1],
                stream.cu_stream(),
            )?;
        }
        let count = n as u32;
        let mut launch = stream.launch_builder(self.hash_kernel(algo));
        launch.arg(&dev).arg(&offsets_dev).arg(&count).arg(&fp_dev);
        // SAFETY: matches the `*_batch` signature; the offsets lie in `dev`.
        unsafe { launch.launch(grid(n, THREADS_PER_BLOCK)) }?;
        // SAFETY: fp_host holds at least 32 * n bytes (reserve_chunks).
        unsafe {
            result::memcpy_dtoh_async(
                &mut slot.fp_host.as_mut_slice()?[..32 * n],
                fp_dev,
                stream.cu_stream(),
            )?;
        }
        stream.synchronize()?;
        let fps = slot.fp_host.as_slice()?;
        Ok(fps[..32 * n]
            .chunks_exact(32)
            .map(|fp| Fingerprint(fp.try_into().expect("32 bytes")))
            .collect())
    }

    fn copy_device(
        &self,
        from: &mut CudaSlot,
        to: &mut CudaSlot,
        src: usize,
        dst: usize,
        len: usize,
    ) -> Result<(), Error> {
        let source = device_addr(&from.dev, &to.stream) + src as u64;
        let target = device_addr(&to.dev, &to.stream) + dst as u64;
        // SAFETY: distinct slots, both ranges in bounds; ordered on `to`'s stream and,
        // through the event, before `from`'s next upload (rule 3).
        unsafe { result::memcpy_dtod_async(target, source, len, to.stream.cu_stream()) }?;
        from.reuse_after = Some(to.stream.record_event(None)?);
        Ok(())
    }
}
