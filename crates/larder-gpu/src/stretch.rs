//! How the device scan splits a buffer among threads, and how the host reads back
//! its output: the layout shared by the kernel (`kernels.rs`, `fastcdc_scan`), the
//! CPU emulation of that kernel ([`emulate_scan`]) and the device path.
//!
//! A scan judges the buffer indices `from..end`. Thread `t` owns the stretch
//! `from + t * stretch .. min(from + (t + 1) * stretch, end)` and warms its window hash
//! up on the 47 bytes before the stretch, so every stretch computes exactly
//! [`CandidateChunker::scan`] of its range (the window hash depends on those 48 bytes
//! only). Each thread writes the first `slots` candidates it finds into its own slots
//! and its true count; [`decode`] concatenates the stretches in order and rescans on
//! the host, with [`CandidateChunker::scan`], any stretch whose count exceeds its slots
//! (long runs of a byte whose window hash matches, e.g. zeros at some averages).

use std::ops::Range;

use larder_chunk::{Candidate, CandidateChunker, WINDOW};

/// Encoded candidates hold a buffer index in 30 bits (`index << 2 | strict << 1 |
/// loose`): a scanned buffer is at most this long.
pub const MAX_SCAN_BUFFER: usize = 1 << 30;

/// The shape of one scan launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScanLayout {
    /// First judged buffer index; at least `WINDOW - 1`, so every warm-up is in bounds.
    pub from: usize,
    /// One past the last judged index.
    pub end: usize,
    /// Bytes judged by one thread.
    pub stretch: usize,
    /// Candidate slots per thread.
    pub slots: usize,
}

impl ScanLayout {
    /// A layout for judging `from..end`; `None` when nothing is judged.
    ///
    /// # Panics
    /// If `from < WINDOW - 1`, `end > MAX_SCAN_BUFFER`, or `stretch` or `slots` is 0:
    /// the kernel's invariants, which the callers establish.
    pub fn new(from: usize, end: usize, stretch: usize, slots: usize) -> Option<Self> {
        assert!(
            from >= WINDOW - 1,
            "a stretch at {from} has no full warm-up"
        );
        assert!(
            end <= MAX_SCAN_BUFFER,
            "scan buffer of {end} bytes over 1 GiB"
        );
        assert!(stretch > 0 && slots > 0);
        (from < end).then_some(Self {
            from,
            end,
            stretch,
            slots,
        })
    }

    /// Threads of the launch: one per stretch.
    pub fn threads(&self) -> usize {
        (self.end - self.from).div_ceil(self.stretch)
    }

    /// The judged indices of thread `t`.
    pub fn stretch_of(&self, t: usize) -> Range<usize> {
        let lo = self.from + t * self.stretch;
        lo..(lo + self.stretch).min(self.end)
    }
}

/// The scan kernel's output: `counts[t]` and `found[t * slots..][..min(count, slots)]`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScanOutput {
    pub counts: Vec<u32>,
    pub found: Vec<u32>,
}

/// One candidate as the kernel encodes it.
fn encode(pos: usize, strict: bool, loose: bool) -> u32 {
    ((pos as u32) << 2) | (u32::from(strict) << 1) | u32::from(loose)
}

fn decode_one(word: u32) -> Candidate {
    Candidate {
        pos: (word >> 2) as usize,
        strict: word & 2 != 0,
        loose: word & 1 != 0,
    }
}

/// The scan kernel run on the CPU, thread by thread, with the kernel's arithmetic:
/// the executable twin that `decode` and the stretch decomposition are tested on.
pub fn emulate_scan(data: &[u8], layout: &ScanLayout, masks: (u64, u64)) -> ScanOutput {
    let (mask_s, mask_l) = masks;
    let threads = layout.threads();
    let mut out = ScanOutput {
        counts: vec![0; threads],
        found: vec![0; threads * layout.slots],
    };
    for t in 0..threads {
        let range = layout.stretch_of(t);
        let mut hash = 0u64;
        for &b in &data[range.start + 1 - WINDOW..range.start] {
            hash = (hash << 1).wrapping_add(larder_chunk::GEAR[usize::from(b)]);
        }
        let slots = &mut out.found[t * layout.slots..(t + 1) * layout.slots];
        let mut count = 0usize;
        for i in range {
            hash = (hash << 1).wrapping_add(larder_chunk::GEAR[usize::from(data[i])]);
            let strict = hash & mask_s == 0;
            let loose = hash & mask_l == 0;
            if strict || loose {
                if count < slots.len() {
                    slots[count] = encode(i, strict, loose);
                }
                count += 1;
            }
        }
        out.counts[t] = count as u32;
    }
    out
}

/// The candidates of the scan, in ascending order, appended to `out`; stretches whose
/// slots overflowed are rescanned from `data` (the buffer that was scanned) on the host.
/// Returns how many stretches were rescanned.
pub fn decode(
    data: &[u8],
    layout: &ScanLayout,
    chunker: &CandidateChunker,
    output: &ScanOutput,
    out: &mut Vec<Candidate>,
) -> usize {
    let mut rescanned = 0;
    for (t, &count) in output.counts.iter().enumerate() {
        let count = count as usize;
        if count > layout.slots {
            chunker.scan(data, layout.stretch_of(t), out);
            rescanned += 1;
        } else {
            let slots = &output.found[t * layout.slots..t * layout.slots + count];
            out.extend(slots.iter().map(|&w| decode_one(w)));
        }
    }
    rescanned
}
