//! The streaming chunker-hasher, generic over the device ([`Device`]): the CUDA one
//! (`device.rs`) and the CPU emulation (`emulated.rs`), which runs this very code
//! without a GPU so that its bookkeeping (slots, warm-up, leftovers, carried
//! candidates, offsets) is tested everywhere (docs/design/gpu.md, "Streams").
//!
//! Slot layout, host (pinned) and device alike: `[prefix | block]`. The block is copied
//! to `prefix..prefix + n`; the bytes just before it are the stream's tail, which is
//! what both the scan's warm-up (47 bytes) and the leftover of the previous block (the
//! bytes after its last cut, under `max_size`) are: `prefix >= max_size + 47` holds both.
//!
//! Ordering rules (the backend keeps 3; the pipeline 1 and 2):
//! 1. A slot's host buffer is written only after [`Device::wait`] on the block it held.
//! 2. The leftover of block `k` is copied into slot `k + 1` (host and device) below the
//!    range that slot's upload reads (its last `WINDOW - 1` bytes are the warm-up,
//!    already uploaded), so the copy never races that upload.
//! 3. A device-to-device copy out of slot `k` completes before slot `k`'s next upload
//!    overwrites its source.

use std::collections::VecDeque;
use std::ops::Range;
use std::time::{Duration, Instant};

use larder_chunk::{Candidate, CandidateChunker, WINDOW};
use larder_hash::{Fingerprint, HashAlgo};

use crate::stretch::{decode, ScanLayout, ScanOutput, MAX_SCAN_BUFFER};
use crate::Error;

/// What the pipeline needs from a device. Calls on one slot are ordered as issued
/// (one CUDA stream per slot); calls on different slots may overlap.
pub trait Device {
    type Slot;
    /// A slot of `bytes` bytes (host and device), `threads` scan threads of `slots` slots.
    fn new_slot(&self, bytes: usize, threads: usize, slots: usize) -> Result<Self::Slot, Error>;
    /// The slot's host staging buffer; written only under rule 1.
    fn host<'s>(&self, slot: &'s mut Self::Slot) -> Result<&'s mut [u8], Error>;
    /// Enqueues the upload of `range` of the host buffer to the same range on the device.
    fn upload(&self, slot: &mut Self::Slot, range: Range<usize>) -> Result<(), Error>;
    /// Enqueues the scan of `layout` and the download of its output.
    fn scan(
        &self,
        slot: &mut Self::Slot,
        layout: &ScanLayout,
        masks: (u64, u64),
    ) -> Result<(), Error>;
    /// Waits for everything enqueued on the slot.
    fn wait(&self, slot: &mut Self::Slot) -> Result<(), Error>;
    /// The downloaded scan output of `layout` (after [`Device::wait`]).
    fn scan_output(&self, slot: &mut Self::Slot, layout: &ScanLayout) -> Result<ScanOutput, Error>;
    /// Fingerprints the device bytes `offsets[i]..offsets[i + 1]`, blocking.
    fn hash(
        &self,
        slot: &mut Self::Slot,
        offsets: &[u64],
        algo: HashAlgo,
    ) -> Result<Vec<Fingerprint>, Error>;
    /// Copies device bytes `src..src + len` of `from` to `dst..` of `to`, ordered before
    /// `to`'s later work and before `from`'s next upload (rule 3).
    fn copy_device(
        &self,
        from: &mut Self::Slot,
        to: &mut Self::Slot,
        src: usize,
        dst: usize,
        len: usize,
    ) -> Result<(), Error>;
}

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
}

impl Default for GpuConfig {
    fn default() -> Self {
        Self {
            block_size: 64 << 20,
            stretch: 4096,
            slots: 16,
            streams: 2,
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

/// A slot and the block it holds.
struct InFlight<S> {
    slot: S,
    /// Bytes of the block at `prefix..`.
    len: usize,
    /// Leftover bytes of the previous block at `prefix - lead..prefix`.
    lead: usize,
    /// The scan's layout; `None` when no byte of the block is judged.
    layout: Option<ScanLayout>,
}

/// Chunks and fingerprints a byte stream block by block on a device, with exactly the
/// CPU path's result: FastCDC 2020 cut points ([`larder_chunk::FastCdc2020`]) and
/// [`HashAlgo::fingerprint`] of every chunk.
pub struct ChunkerHasher<'d, D: Device> {
    device: &'d D,
    chunker: CandidateChunker,
    algo: HashAlgo,
    config: GpuConfig,
    prefix: usize,
    in_flight: VecDeque<InFlight<D::Slot>>,
    free: Vec<D::Slot>,
    /// Stream offset of the next byte pushed.
    stream_pos: u64,
    /// The last (at most WINDOW - 1) bytes of the stream: the next block's warm-up.
    tail: Vec<u8>,
    /// Candidates in the leftover that the next block's selection starts with, at
    /// offsets from the leftover's start.
    carried: Vec<Candidate>,
    times: StageTimes,
}

impl<'d, D: Device> ChunkerHasher<'d, D> {
    pub fn new(
        device: &'d D,
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
        if config.block_size == 0 || config.stretch == 0 || config.slots == 0 {
            return Err(Error::Config(
                "block size, stretch and slots must be > 0".into(),
            ));
        }
        if prefix + config.block_size > MAX_SCAN_BUFFER {
            return Err(Error::Config(format!(
                "block of {} bytes: over the scan's 1 GiB buffer limit",
                config.block_size
            )));
        }
        Ok(Self {
            device,
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

    /// Ends the stream; returns its last chunks and the time spent per stage.
    pub fn finish(mut self) -> Result<(Vec<GpuChunk>, StageTimes), Error> {
        let done = self.end_stream()?;
        Ok((done, self.times))
    }

    /// Ends the stream and returns its last chunks, keeping the slots (pinned and
    /// device buffers) for the next stream, which starts at the next [`Self::push`] as
    /// a stream of its own: no byte of this one warms it up.
    pub fn end_stream(&mut self) -> Result<Vec<GpuChunk>, Error> {
        let mut done = Vec::new();
        while !self.in_flight.is_empty() {
            let last = self.in_flight.len() == 1;
            self.complete_oldest(last, &mut done)?;
        }
        self.stream_pos = 0;
        self.tail.clear();
        self.carried.clear();
        Ok(done)
    }

    /// Stages `block`, uploads it with its warm-up, and launches its scan.
    fn submit(&mut self, block: &[u8]) -> Result<(), Error> {
        let started = Instant::now();
        let (p, n, h) = (self.prefix, block.len(), self.tail.len());
        let mut slot = match self.free.pop() {
            Some(slot) => slot,
            None => {
                let threads = self.config.block_size.div_ceil(self.config.stretch);
                self.device
                    .new_slot(p + self.config.block_size, threads, self.config.slots)?
            }
        };
        let host = self.device.host(&mut slot)?;
        host[p - h..p].copy_from_slice(&self.tail);
        host[p..p + n].copy_from_slice(block);
        self.times.stage_in += started.elapsed();
        self.device.upload(&mut slot, p - h..p + n)?;
        self.times.bytes_up += (h + n) as u64;
        // Buffer index p holds stream offset stream_pos; an index is judged when its
        // stream offset is at least WINDOW - 1 (CandidateChunker::scan's rule).
        let unjudged = (WINDOW - 1).saturating_sub(self.stream_pos as usize).min(n);
        let layout = ScanLayout::new(p + unjudged, p + n, self.config.stretch, self.config.slots);
        if let Some(layout) = &layout {
            self.device.scan(&mut slot, layout, self.chunker.masks())?;
            self.times.bytes_down += (4 * layout.threads() * (1 + layout.slots)) as u64;
        }
        self.stream_pos += n as u64;
        self.tail.extend_from_slice(block);
        let excess = self.tail.len().saturating_sub(WINDOW - 1);
        self.tail.drain(..excess);
        self.in_flight.push_back(InFlight {
            slot,
            len: n,
            lead: 0,
            layout,
        });
        Ok(())
    }

    /// Waits for the oldest block's scan, selects its cut points, hashes its chunks on
    /// the device, and hands its leftover to the next block.
    fn complete_oldest(&mut self, is_last: bool, done: &mut Vec<GpuChunk>) -> Result<(), Error> {
        let Some(mut block) = self.in_flight.pop_front() else {
            return Ok(());
        };
        let device = self.device;
        let waited = Instant::now();
        device.wait(&mut block.slot)?;
        self.times.scan_wait += waited.elapsed();

        let selecting = Instant::now();
        let p = self.prefix;
        let start = p - block.lead;
        let pending_len = block.lead + block.len;
        let mut candidates = std::mem::take(&mut self.carried);
        let output = match &block.layout {
            Some(layout) => Some(device.scan_output(&mut block.slot, layout)?),
            None => None,
        };
        let host = device.host(&mut block.slot)?;
        if let (Some(layout), Some(output)) = (&block.layout, &output) {
            let before = candidates.len();
            decode(host, layout, &self.chunker, output, &mut candidates);
            for c in &mut candidates[before..] {
                c.pos -= start;
            }
        }
        let (lengths, consumed) =
            self.chunker
                .select(&host[start..p + block.len], &candidates, is_last);
        self.times.select += selecting.elapsed();

        let hashing = Instant::now();
        if !lengths.is_empty() {
            let mut offsets = Vec::with_capacity(lengths.len() + 1);
            offsets.push(start as u64);
            for len in &lengths {
                offsets.push(offsets[offsets.len() - 1] + *len as u64);
            }
            let fingerprints = device.hash(&mut block.slot, &offsets, self.algo)?;
            self.times.bytes_up += 8 * offsets.len() as u64;
            self.times.bytes_down += 32 * fingerprints.len() as u64;
            done.extend(
                lengths
                    .iter()
                    .zip(fingerprints)
                    .map(|(&len, fingerprint)| GpuChunk { len, fingerprint }),
            );
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
            let Some(next) = self.in_flight.front_mut() else {
                return Err(Error::Config("a leftover with no block after it".into()));
            };
            next.lead = leftover;
            // Rule 2: the next upload holds the stream's last min(leftover, WINDOW - 1)
            // bytes as its warm-up; the older part of the leftover is copied below it.
            let copy = leftover - leftover.min(WINDOW - 1);
            if copy > 0 {
                let src = p + block.len - leftover;
                let dst = p - leftover;
                let older = device.host(&mut block.slot)?[src..src + copy].to_vec();
                device.host(&mut next.slot)?[dst..dst + copy].copy_from_slice(&older);
                device.copy_device(&mut block.slot, &mut next.slot, src, dst, copy)?;
            }
        }
        self.free.push(block.slot);
        Ok(())
    }
}
