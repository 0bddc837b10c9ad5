//! The device path: one context, the compiled module, and the streaming
//! chunker-hasher that keeps several blocks in flight (docs/design/gpu.md, "Streams").
//!
//! Slot layout, host (pinned) and device alike: `[prefix: PREFIX bytes | block]`. The
//! block is copied to `PREFIX..PREFIX + n`; the bytes just before it are the stream's
//! tail, which is what both the scan's warm-up (47 bytes) and the leftover of the
//! previous block (the bytes after its last cut, under `max_size`) are:
//! `PREFIX >= max_size + 47` holds both.
//!
//! Ordering rules (cudarc's automatic event tracking is off; these are the only ones):
//! 1. A slot's host buffer is written by the host only after its stream was
//!    synchronized by [`GpuChunkerHasher`]'s completion of the block it held.
//! 2. The leftover of block `k` is copied into slot `k + 1` (host and device) below the
//!    range its upload reads, so the copy never races that upload.
//! 3. The device-to-device leftover copy out of slot `k`'s buffer is enqueued on slot
//!    `k + 1`'s stream; slot `k` records an event after it, and its next upload waits on
//!    that event before overwriting the source.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::{
    result, CudaContext, CudaEvent, CudaFunction, CudaSlice, CudaStream, DevicePtr, LaunchConfig,
    PinnedHostSlice, PushKernelArg,
};
use larder_chunk::{Candidate, CandidateChunker, WINDOW};
use larder_hash::{Fingerprint, HashAlgo};

use crate::kernels::{BLAKE3_KERNEL, SCAN_KERNEL, SHA1_KERNEL, SHA256_KERNEL};
use crate::stretch::{decode, ScanLayout, ScanOutput, MAX_SCAN_BUFFER};
use crate::{compile_kernels, driver_available, Error};

/// Tuning of the device path; [`GpuConfig::default`] is the starting point that
/// docs/design/gpu.md explains and `larder bench gpu` varies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuConfig {
    /// Bytes of input per block (per upload, scan and hash launch).
    pub block_size: usize,
    /// Bytes judged by one scan thread.
    pub stretch: usize,
    /// Candidate slots per scan thread; more found means a host rescan of the stretch.
    pub slots: usize,
    /// Blocks in flight, each on its own stream with its own buffers (at least 2).
    pub streams: usize,
    /// Threads per CUDA block for every kernel.
    pub threads_per_block: u32,
}

impl Default for GpuConfig {
    fn default() -> Self {
        Self {
            block_size: 64 << 20,
            stretch: 4096,
            slots: 16,
            streams: 2,
            threads_per_block: 256,
        }
    }
}

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
        let arch: &'static str = Box::leak(format!("compute_{major}{minor}").into_boxed_str());
        let ptx = compile_kernels(Some(arch))?;
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

/// One chunk as the device path returns it, in stream order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuChunk {
    pub len: usize,
    pub fingerprint: Fingerprint,
}

/// Host wall time per stage, summed over blocks (for `larder bench gpu`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StageTimes {
    /// Copying the caller's bytes into pinned buffers.
    pub stage_in: Duration,
    /// Waiting for upload and scan (what the pipeline did not hide).
    pub scan_wait: Duration,
    /// Decoding candidates and selecting cut points on the host.
    pub select: Duration,
    /// Offsets upload, hash kernel and fingerprints download, waited for.
    pub hash_wait: Duration,
    /// Bytes uploaded (host to device) and downloaded (device to host).
    pub bytes_up: u64,
    pub bytes_down: u64,
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

/// Buffers and state of one block in flight.
struct Slot {
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
    /// Bytes of the block at `PREFIX..`.
    len: usize,
    /// Leftover bytes of the previous block at `PREFIX - lead..PREFIX`.
    lead: usize,
    /// The launch's layout; `None` when no byte of the block is judged.
    layout: Option<ScanLayout>,
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

impl Slot {
    fn new(ctx: &Arc<CudaContext>, prefix: usize, config: &GpuConfig) -> Result<Self, Error> {
        let stream = ctx.new_stream()?;
        let bytes = prefix + config.block_size;
        let threads = config.block_size.div_ceil(config.stretch);
        let chunks = 1024;
        Ok(Self {
            host: pinned(ctx, bytes)?,
            dev: stream.alloc_zeros(bytes)?,
            counts_dev: stream.alloc_zeros(threads)?,
            found_dev: stream.alloc_zeros(threads * config.slots)?,
            counts_host: pinned(ctx, threads)?,
            found_host: pinned(ctx, threads * config.slots)?,
            offsets_host: pinned(ctx, chunks + 1)?,
            offsets_dev: stream.alloc_zeros(chunks + 1)?,
            fp_host: pinned(ctx, 32 * chunks)?,
            fp_dev: stream.alloc_zeros(32 * chunks)?,
            reuse_after: None,
            len: 0,
            lead: 0,
            layout: None,
            stream,
        })
    }

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

/// Chunks and fingerprints a byte stream block by block on the GPU, with exactly the
/// CPU path's result: FastCDC 2020 cut points ([`larder_chunk::FastCdc2020`]) and
/// [`HashAlgo::fingerprint`] of every chunk.
pub struct GpuChunkerHasher<'g> {
    gpu: &'g Gpu,
    chunker: CandidateChunker,
    algo: HashAlgo,
    config: GpuConfig,
    prefix: usize,
    in_flight: VecDeque<Slot>,
    free: Vec<Slot>,
    /// Stream offset of the next byte pushed.
    stream_pos: u64,
    /// The last (at most WINDOW - 1) bytes of the stream: the next block's warm-up.
    tail: Vec<u8>,
    /// Candidates in the leftover that the next block's selection starts with, at
    /// offsets from the leftover's start.
    carried: Vec<Candidate>,
    times: StageTimes,
}

impl<'g> GpuChunkerHasher<'g> {
    pub fn new(
        gpu: &'g Gpu,
        chunker: CandidateChunker,
        max_size: usize,
        algo: HashAlgo,
        config: GpuConfig,
    ) -> Result<Self, Error> {
        let prefix = (max_size + WINDOW).next_multiple_of(256);
        if config.streams < 2 {
            return Err(Error::Config(
                "at least 2 streams (double buffering)".into(),
            ));
        }
        if prefix + config.block_size > MAX_SCAN_BUFFER {
            return Err(Error::Config(format!(
                "block of {} bytes: over the scan's 1 GiB buffer limit",
                config.block_size
            )));
        }
        if config.block_size == 0 || config.stretch == 0 || config.slots == 0 {
            return Err(Error::Config(
                "block size, stretch and slots must be > 0".into(),
            ));
        }
        Ok(Self {
            gpu,
            chunker,
            algo,
            config,
            prefix,
            in_flight: VecDeque::new(),
            free: Vec::new(),
            stream_pos: 0,
            tail: Vec::new(),
            carried: Vec::new(),
            times: StageTimes::default(),
        })
    }

    /// The time spent per stage so far.
    pub fn times(&self) -> StageTimes {
        self.times
    }

    /// Feeds the next bytes of the stream; returns the chunks completed so far.
    pub fn push(&mut self, data: &[u8]) -> Result<Vec<GpuChunk>, Error> {
        let mut done = Vec::new();
        for block in data.chunks(self.config.block_size) {
            self.submit(block)?;
            if self.in_flight.len() == self.config.streams {
                self.complete_oldest(false, &mut done)?;
            }
        }
        Ok(done)
    }

    /// Ends the stream; returns its last chunks.
    pub fn finish(mut self) -> Result<(Vec<GpuChunk>, StageTimes), Error> {
        let mut done = Vec::new();
        while !self.in_flight.is_empty() {
            let last = self.in_flight.len() == 1;
            self.complete_oldest(last, &mut done)?;
        }
        Ok((done, self.times))
    }

    /// Stages `block`, uploads it with its warm-up, and launches its scan.
    fn submit(&mut self, block: &[u8]) -> Result<(), Error> {
        let started = Instant::now();
        let mut slot = match self.free.pop() {
            Some(slot) => slot,
            None => Slot::new(&self.gpu.ctx, self.prefix, &self.config)?,
        };
        let p = self.prefix;
        let h = self.tail.len();
        {
            let host = slot.host.as_mut_slice()?;
            host[p - h..p].copy_from_slice(&self.tail);
            host[p..p + block.len()].copy_from_slice(block);
        }
        slot.len = block.len();
        slot.lead = 0;
        self.times.stage_in += started.elapsed();
        if let Some(event) = slot.reuse_after.take() {
            slot.stream.wait(&event)?;
        }
        let stream = slot.stream.clone();
        let cu_stream = stream.cu_stream();
        let dev = device_addr(&slot.dev, &stream);
        // SAFETY: rule 1 (the slot is idle) and rule 3 (the wait above); the range is
        // inside both buffers, which have the same length.
        unsafe {
            let host = slot.host.as_slice()?;
            result::memcpy_htod_async(
                dev + (p - h) as u64,
                &host[p - h..p + block.len()],
                cu_stream,
            )?;
        }
        self.times.bytes_up += (h + block.len()) as u64;
        // Stream offset of buffer index 0 is stream_pos - p; index i is judged when its
        // stream offset is at least WINDOW - 1.
        let judge_from = p
            + (WINDOW - 1)
                .saturating_sub(self.stream_pos as usize)
                .min(block.len());
        slot.layout = ScanLayout::new(
            judge_from,
            p + block.len(),
            self.config.stretch,
            self.config.slots,
        );
        if let Some(layout) = slot.layout {
            let (mask_s, mask_l) = self.chunker.masks();
            let threads = layout.threads();
            let (from, end) = (layout.from as u64, layout.end as u64);
            let (stretch, slots, n) = (layout.stretch as u32, layout.slots as u32, threads as u32);
            let counts = device_addr(&slot.counts_dev, &stream);
            let found = device_addr(&slot.found_dev, &stream);
            let mut launch = stream.launch_builder(&self.gpu.scan);
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
            // SAFETY: the argument list matches `fastcdc_scan`'s signature; the layout
            // keeps every access inside `dev`, `counts_dev` and `found_dev`.
            unsafe { launch.launch(grid(threads, self.config.threads_per_block)) }?;
            // SAFETY: the pinned buffers hold `threads` counts and their slots.
            unsafe {
                let counts_host = &mut slot.counts_host.as_mut_slice()?[..threads];
                result::memcpy_dtoh_async(counts_host, counts, cu_stream)?;
                let found_host = &mut slot.found_host.as_mut_slice()?[..threads * layout.slots];
                result::memcpy_dtoh_async(found_host, found, cu_stream)?;
            }
            self.times.bytes_down += (4 * threads * (1 + layout.slots)) as u64;
        }
        self.stream_pos += block.len() as u64;
        let mut tail = std::mem::take(&mut self.tail);
        tail.extend_from_slice(block);
        let keep = tail.len().min(WINDOW - 1);
        tail.drain(..tail.len() - keep);
        self.tail = tail;
        self.in_flight.push_back(slot);
        Ok(())
    }

    /// Waits for the oldest block's scan, selects its cut points, hashes its chunks on
    /// the device, and hands its leftover to the next block.
    fn complete_oldest(&mut self, is_last: bool, done: &mut Vec<GpuChunk>) -> Result<(), Error> {
        let mut slot = self.in_flight.pop_front().expect("a block in flight");
        let waited = Instant::now();
        slot.stream.synchronize()?;
        self.times.scan_wait += waited.elapsed();
        let selecting = Instant::now();
        let p = self.prefix;
        let start = p - slot.lead;
        let pending_len = slot.lead + slot.len;
        let mut candidates = std::mem::take(&mut self.carried);
        let (lengths, consumed) = {
            let host = slot.host.as_slice()?;
            if let Some(layout) = slot.layout {
                let threads = layout.threads();
                let output = ScanOutput {
                    counts: slot.counts_host.as_slice()?[..threads].to_vec(),
                    found: slot.found_host.as_slice()?[..threads * layout.slots].to_vec(),
                };
                let before = candidates.len();
                decode(host, &layout, &self.chunker, &output, &mut candidates);
                for c in &mut candidates[before..] {
                    c.pos -= start;
                }
            }
            self.chunker
                .select(&host[start..p + slot.len], &candidates, is_last)
        };
        self.times.select += selecting.elapsed();

        let hashing = Instant::now();
        slot.reserve_chunks(&self.gpu.ctx, lengths.len())?;
        let stream = slot.stream.clone();
        let cu_stream = stream.cu_stream();
        if !lengths.is_empty() {
            let n = lengths.len();
            let offsets = slot.offsets_host.as_mut_slice()?;
            offsets[0] = start as u64;
            for (i, len) in lengths.iter().enumerate() {
                offsets[i + 1] = offsets[i] + *len as u64;
            }
            let offsets_dev = device_addr(&slot.offsets_dev, &stream);
            let fp_dev = device_addr(&slot.fp_dev, &stream);
            let dev = device_addr(&slot.dev, &stream);
            // SAFETY: both offset buffers hold at least n + 1 entries (reserve_chunks).
            unsafe {
                result::memcpy_htod_async(
                    offsets_dev,
                    &slot.offsets_host.as_slice()?[..n + 1],
                    cu_stream,
                )?;
            }
            let count = n as u32;
            let mut launch = stream.launch_builder(self.gpu.hash_kernel(self.algo));
            launch.arg(&dev).arg(&offsets_dev).arg(&count).arg(&fp_dev);
            // SAFETY: matches the `*_batch` signature; the offsets lie in `dev`.
            unsafe { launch.launch(grid(n, self.config.threads_per_block)) }?;
            // SAFETY: fp_host holds at least 32 * n bytes (reserve_chunks).
            unsafe {
                result::memcpy_dtoh_async(
                    &mut slot.fp_host.as_mut_slice()?[..32 * n],
                    fp_dev,
                    cu_stream,
                )?;
            }
            stream.synchronize()?;
            self.times.bytes_up += 8 * (n as u64 + 1);
            self.times.bytes_down += 32 * n as u64;
            let fps = slot.fp_host.as_slice()?;
            done.extend(lengths.iter().enumerate().map(|(i, &len)| {
                let mut fp = [0u8; 32];
                fp.copy_from_slice(&fps[32 * i..32 * i + 32]);
                GpuChunk {
                    len,
                    fingerprint: Fingerprint(fp),
                }
            }));
        }
        self.times.hash_wait += hashing.elapsed();

        let leftover = pending_len - consumed;
        self.carried = candidates
            .into_iter()
            .filter(|c| c.pos >= consumed)
            .map(|c| Candidate {
                pos: c.pos - consumed,
                ..c
            })
            .collect();
        if leftover > 0 {
            let next = self.in_flight.front_mut().ok_or_else(|| {
                Error::Config("a leftover with no block after it (is_last was not set)".into())
            })?;
            next.lead = leftover;
            // The next block's upload already holds the stream's last min(leftover,
            // WINDOW - 1) bytes as its warm-up (rule 2): the older part is copied.
            let copy = leftover - leftover.min(WINDOW - 1);
            if copy > 0 {
                let src = p + slot.len - leftover;
                let dst = p - leftover;
                let host = slot.host.as_slice()?;
                next.host.as_mut_slice()?[dst..dst + copy].copy_from_slice(&host[src..src + copy]);
                let from = device_addr(&slot.dev, &next.stream) + src as u64;
                let to = device_addr(&next.dev, &next.stream) + dst as u64;
                // SAFETY: disjoint buffers; both ranges in bounds; ordered by rule 3.
                unsafe { result::memcpy_dtod_async(to, from, copy, next.stream.cu_stream())? };
                slot.reuse_after = Some(next.stream.record_event(None)?);
            }
        }
        self.free.push(slot);
        Ok(())
    }
}
