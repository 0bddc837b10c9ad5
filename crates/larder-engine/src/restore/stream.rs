//! The restore stream between the producer, which assembles slices in stream order
//! (`assembly.rs`), and the writers: each slice is shared (`Arc`) by every piece of a
//! file cut from it, and its buffer goes back to the producer when the last piece is
//! written, so the slice buffers in circulation bound the memory whatever the writers
//! hold in their queues.

use std::ops::Range;
use std::sync::{mpsc, Arc};

use larder_store::Repository;

use crate::assembly::{FileData, ReadStats, RestorePlan};

/// A slice the producer assembled: the restore stream's bytes from `start`.
pub(super) struct AssembledSlice {
    start: u64,
    buf: Vec<u8>,
    /// Ranges of `buf` whose chunks failed to read, decode or verify, with the error.
    damaged: Vec<(Range<usize>, String)>,
    /// Where `buf` goes once nothing refers to the slice any more.
    free: mpsc::Sender<Vec<u8>>,
}

impl AssembledSlice {
    fn end(&self) -> u64 {
        self.start + self.buf.len() as u64
    }
}

impl Drop for AssembledSlice {
    fn drop(&mut self) {
        // The producer may be gone (the restore is ending); the buffer is then freed.
        let _ = self.free.send(std::mem::take(&mut self.buf));
    }
}

/// Bytes of one file from one slice, verified.
pub(super) struct Piece {
    slice: Arc<AssembledSlice>,
    range: Range<usize>,
}

impl Piece {
    pub fn bytes(&self) -> &[u8] {
        &self.slice.buf[self.range.clone()]
    }
}

/// Assembles every window of `plan` in slices of at most `slice_size` bytes into
/// `buffers` circulating buffers, sending them in stream order to `full`, until the
/// stream ends or the receiver is gone. Returns what was read.
pub(super) fn produce(
    repo: &Repository,
    plan: &RestorePlan,
    cache_size: u64,
    slice_size: u64,
    buffers: usize,
    full: mpsc::SyncSender<Arc<AssembledSlice>>,
) -> ReadStats {
    let codec = repo.codec();
    let (free_tx, free_rx) = mpsc::channel::<Vec<u8>>();
    for _ in 0..buffers {
        let _ = free_tx.send(Vec::new());
    }
    let mut stats = ReadStats::default();
    let mut start = 0u64;
    for window in plan.windows(cache_size) {
        let data = plan.window_data(window);
        // The reader thread reads the window's containers while this thread assembles
        // slices from those already read.
        let (read, more) = std::thread::scope(|scope| {
            let reader = scope.spawn(|| data.read_all(repo));
            let mut more = true;
            for slice in plan.slices(&data, slice_size) {
                let Ok(mut buf) = free_rx.recv() else {
                    more = false;
                    break;
                };
                let damaged = plan.fill_slice(&data, slice, &codec, &mut buf);
                let len = buf.len() as u64;
                let assembled = AssembledSlice {
                    start,
                    buf,
                    damaged,
                    free: free_tx.clone(),
                };
                if full.send(Arc::new(assembled)).is_err() {
                    more = false;
                    break;
                }
                start += len;
            }
            let read = reader
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            (read, more)
        });
        stats.container_reads += read.container_reads;
        stats.range_reads += read.range_reads;
        stats.bytes_read += read.bytes_read;
        if !more {
            break;
        }
    }
    stats
}

/// The coordinator's side of the restore stream: slices arrive in stream order; the
/// coordinator cuts each file's pieces from them in stream order.
pub(super) struct SliceStream {
    full: mpsc::Receiver<Arc<AssembledSlice>>,
    current: Option<Arc<AssembledSlice>>,
}

impl SliceStream {
    pub fn new(full: mpsc::Receiver<Arc<AssembledSlice>>) -> Self {
        Self {
            full,
            current: None,
        }
    }

    /// Hands the stream's bytes `data` to `sink`, one piece per slice they span.
    /// Fails before handing over a piece that holds a damaged chunk, with that
    /// chunk's error. Calls must come in stream order.
    pub fn pieces(&mut self, data: FileData, mut sink: impl FnMut(Piece)) -> Result<(), String> {
        let end = data.start + data.len;
        let mut pos = data.start;
        while pos < end {
            let slice = self.slice_at(pos)?;
            let range = (pos - slice.start) as usize..(end.min(slice.end()) - slice.start) as usize;
            if let Some((_, reason)) = slice
                .damaged
                .iter()
                .find(|(r, _)| r.start < range.end && range.start < r.end)
            {
                return Err(reason.clone());
            }
            pos += range.len() as u64;
            sink(Piece {
                slice: Arc::clone(slice),
                range,
            });
        }
        Ok(())
    }

    /// The slice holding stream byte `pos`, receiving slices up to it.
    fn slice_at(&mut self, pos: u64) -> Result<&Arc<AssembledSlice>, String> {
        while self.current.as_ref().is_none_or(|a| a.end() <= pos) {
            // The slice left behind goes back to the producer once the writers are
            // done with its pieces.
            self.current = None;
            let next = self
                .full
                .recv()
                .map_err(|_| "the restore stream ended before this file".to_string())?;
            self.current = Some(next);
        }
        match &self.current {
            Some(slice) if slice.start <= pos => Ok(slice),
            _ => Err("the restore stream went past this file".into()),
        }
    }
}
