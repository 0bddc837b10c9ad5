//! Stage 4: compresses a batch's new chunks on several threads, then places them in
//! containers by their stored sizes and hands sealed containers to syncer threads that
//! write them durably.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use larder_hash::Fingerprint;
use larder_store::{
    create_file, Backend, ChunkCodec, ChunkEntry, ContainerBuilder, FileKind, Repository,
    SegmentContainer, UNIT_RAW_TARGET,
};
use rayon::prelude::*;

use super::gate::SerialGate;
use super::index_stage::{to_acknowledge, NewChunk, WriteBatch};
use super::read_stage::recycle;
use super::RemoteIndex;
use crate::error::{EngineError, Result};

/// Threads writing sealed containers; fsyncs overlap (see docs/performance.md).
pub(crate) const SYNC_THREADS: usize = 4;

/// A sealed container on its way to a syncer: id, bytes and table.
pub(crate) type Sealed = (u64, Vec<u8>, Vec<ChunkEntry>);

/// Stage 4's state: how new chunks are compressed, the open container and the syncer
/// threads' queue.
pub(crate) struct ContainerWriter<'r> {
    pub repo: &'r Repository,
    /// Every new chunk is encoded through it.
    pub codec: ChunkCodec,
    /// The threads that compress, if the repository compresses.
    pub compress_threads: Option<&'r rayon::ThreadPool>,
    /// Stored bytes a container is filled to (header included); one chunk never spans
    /// two containers, so the last chunk may take it past this.
    pub container_size: usize,
    pub capacity: usize,
    pub open: Option<ContainerBuilder>,
    pub to_sync: Sender<Sealed>,
    /// Buffers of containers the syncers have written, for reuse.
    pub reuse: Receiver<Vec<u8>>,
    pub written: u64,
    pub bytes_stored: u64,
    /// Compression time summed over the compression threads, and the wall time the
    /// writer waited for it.
    pub compress_time: Duration,
    pub compress_wall: Duration,
}

impl<'r> ContainerWriter<'r> {
    /// A writer into `repo` with its codec and container size, whose sealed containers
    /// go to `to_sync`; `max_chunk` is the largest chunk it may be given.
    pub fn new(
        repo: &'r Repository,
        compress_threads: Option<&'r rayon::ThreadPool>,
        max_chunk: usize,
        to_sync: Sender<Sealed>,
        reuse: Receiver<Vec<u8>>,
    ) -> Self {
        let container_size = repo.config().container_size;
        Self {
            repo,
            codec: repo.codec(),
            compress_threads,
            container_size,
            capacity: container_size + max_chunk,
            open: None,
            to_sync,
            reuse,
            written: 0,
            bytes_stored: 0,
            compress_time: Duration::ZERO,
            compress_wall: Duration::ZERO,
        }
    }

    /// Compresses `chunks` (if compression is on; on the compression threads), in
    /// units of consecutive chunks when the repository uses them, then appends them in
    /// order. `data[p]` is the bytes of piece `p`. Without compression threads a chunk
    /// that comes with its frame (`copy` keeping a source frame) is appended as it is.
    pub fn store(&mut self, chunks: &[NewChunk], data: &[&[u8]]) -> Result<()> {
        let raw = |c: &NewChunk| &data[c.piece][c.start..][..c.len];
        let mut frames = Vec::new();
        let units = match self.compress_threads {
            Some(threads) => {
                let per_unit = self.codec.compression().unit_chunks();
                let units = unit_bounds(chunks.iter().map(|c| c.len), per_unit);
                let started = Instant::now();
                let codec = &self.codec;
                // Each unit is timed on its thread, so the sum is CPU time across threads.
                let compressed = threads.install(|| {
                    units
                        .par_iter()
                        .map(|u| {
                            let started = Instant::now();
                            let frame = match &chunks[u.clone()] {
                                [one] => codec.compress(raw(one))?,
                                many => {
                                    let raws: Vec<&[u8]> = many.iter().map(raw).collect();
                                    codec.compress_unit(&raws)?
                                }
                            };
                            Ok::<_, EngineError>((frame, started.elapsed()))
                        })
                        .collect::<Result<Vec<_>>>()
                })?;
                self.compress_wall += started.elapsed();
                for (frame, spent) in compressed {
                    self.compress_time += spent;
                    frames.push(frame);
                }
                units
            }
            None => {
                frames.resize(chunks.len(), None);
                (0..chunks.len()).map(|i| i..i + 1).collect()
            }
        };
        for (unit, frame) in units.into_iter().zip(frames) {
            let members = &chunks[unit];
            match frame {
                Some(frame) if members.len() > 1 => self.append_unit(&frame, members)?,
                Some(frame) => self.append(members[0].fp, &frame, members[0].len as u32, true)?,
                // A unit that does not compress: its chunks are stored raw.
                None => {
                    for c in members {
                        match &c.compressed {
                            Some(frame) => self.append(c.fp, frame, c.len as u32, true)?,
                            None => self.append(c.fp, raw(c), c.len as u32, false)?,
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// Appends a unit's frame and its members' entries, as [`Self::append`] does a
    /// chunk.
    fn append_unit(&mut self, frame: &[u8], members: &[NewChunk]) -> Result<()> {
        let builder = self.builder_for(frame.len(), members.len())?;
        let list: Vec<_> = members.iter().map(|c| (c.fp, c.len as u32)).collect();
        builder.push_unit(frame, &list);
        self.bytes_stored += frame.len() as u64;
        Ok(())
    }

    /// Appends one chunk's stored bytes (`compressed`: a zstd frame of it) to the open
    /// container.
    fn append(
        &mut self,
        fp: Fingerprint,
        stored: &[u8],
        raw_len: u32,
        compressed: bool,
    ) -> Result<()> {
        let builder = self.builder_for(stored.len(), 1)?;
        builder.push_stored(fp, stored, raw_len, compressed);
        self.bytes_stored += stored.len() as u64;
        Ok(())
    }

    /// The open container if `stored_len` more bytes with `entries` table entries fit
    /// in it, else a new one (the open one sealed): bytes that would take a non-empty
    /// container past `container_size` go to the next.
    fn builder_for(&mut self, stored_len: usize, entries: usize) -> Result<&mut ContainerBuilder> {
        let fits = self
            .open
            .as_ref()
            .is_some_and(|b| b.fits(stored_len, entries, self.container_size));
        if !fits {
            self.seal()?;
            let id = self.repo.allocate_container_id();
            let buf = self
                .reuse
                .try_recv()
                .unwrap_or_else(|_| Vec::with_capacity(self.capacity));
            self.open = Some(ContainerBuilder::with_buffer(
                id,
                &self.codec,
                buf,
                self.container_size,
            ));
        }
        Ok(self.open.as_mut().expect("opened above"))
    }

    /// Hands the open container, if it holds anything, to the syncers.
    pub fn seal(&mut self) -> Result<()> {
        if let Some(b) = self.open.take().filter(|b| !b.is_empty()) {
            let id = b.id();
            let (bytes, entries) = b.seal();
            self.written += 1;
            self.to_sync
                .send((id, bytes, entries))
                .map_err(|_| EngineError::Pipeline("container syncers stopped".into()))?;
        }
        Ok(())
    }
}

/// Stage 4: compresses new chunks and copies them into containers. Returns the time
/// spent, compression's wall time included (the writer counts compression apart).
pub(super) fn run(
    writer: &mut ContainerWriter<'_>,
    rx: &Receiver<WriteBatch>,
    pool: &Sender<Vec<u8>>,
    gate: &SerialGate,
) -> Result<Duration> {
    let mut busy = Duration::ZERO;
    for batch in rx {
        let span = gate.begin();
        let data: Vec<&[u8]> = batch.buffers.iter().map(Vec::as_slice).collect();
        writer.store(&batch.chunks, &data)?;
        if batch.seal {
            writer.seal()?;
        }
        recycle(pool, batch.buffers);
        busy += span.end();
    }
    Ok(busy)
}

/// Cuts chunks of raw lengths `lens` into compression units of consecutive chunks:
/// each at most `per_unit` chunks, and closed before its raw bytes would pass
/// [`UNIT_RAW_TARGET`] (a larger chunk is a unit alone).
fn unit_bounds(lens: impl Iterator<Item = usize>, per_unit: usize) -> Vec<std::ops::Range<usize>> {
    let mut units: Vec<std::ops::Range<usize>> = Vec::new();
    let mut raw = 0;
    for (i, len) in lens.enumerate() {
        match units.last_mut() {
            Some(u) if u.len() < per_unit && raw + len <= UNIT_RAW_TARGET => {
                u.end = i + 1;
                raw += len;
            }
            _ => {
                units.push(i..i + 1);
                raw = len;
            }
        }
    }
    units
}

/// What a syncer wrote, its busy time, its error, and the containers it acknowledged
/// to the remote index itself.
pub(crate) struct Synced {
    pub written: Vec<SegmentContainer>,
    /// The bytes of the container files written: padding and headers included.
    pub file_bytes: u64,
    pub busy: Duration,
    pub error: Option<EngineError>,
    pub acked: Vec<u64>,
}

/// The syncers: write each sealed container durably. With a remote index, each also
/// makes the container's name durable and acknowledges its chunks at once, so that
/// other nodes waiting on them wait for one container, not for the whole backup; an
/// acknowledgement that fails is sent again at the commit.
pub(crate) fn spawn_syncers<'s>(
    scope: &'s std::thread::Scope<'s, '_>,
    backend: Arc<dyn Backend>,
    rx: Receiver<Sealed>,
    reuse: Sender<Vec<u8>>,
    gate: &'s SerialGate,
    remote: Option<Arc<dyn RemoteIndex>>,
    zero_chunk: Fingerprint,
) -> Vec<std::thread::ScopedJoinHandle<'s, Synced>> {
    (0..SYNC_THREADS)
        .map(|_| {
            let rx = rx.clone();
            let backend = backend.clone();
            let reuse = reuse.clone();
            let remote = remote.clone();
            scope.spawn(move || {
                let mut out = Synced {
                    written: Vec::new(),
                    file_bytes: 0,
                    busy: Duration::ZERO,
                    error: None,
                    acked: Vec::new(),
                };
                for (id, bytes, entries) in rx {
                    let span = gate.begin();
                    let mut result = create_file(
                        &*backend,
                        FileKind::Container,
                        &format!("{id:016x}"),
                        &bytes,
                        "container",
                    );
                    if result.is_ok() && remote.is_some() {
                        result = backend.sync(FileKind::Container);
                    }
                    out.busy += span.end();
                    if let Err(e) = result {
                        out.error = Some(e.into());
                        return out;
                    }
                    out.file_bytes += bytes.len() as u64;
                    let _ = reuse.try_send(bytes);
                    let written = SegmentContainer { id, entries };
                    if let Some(remote) = &remote {
                        if remote
                            .acknowledge(&to_acknowledge(&written, &zero_chunk))
                            .is_ok()
                        {
                            out.acked.push(id);
                        }
                    }
                    out.written.push(written);
                }
                out
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_hold_consecutive_chunks_up_to_their_count_and_raw_size() {
        let lens = [10, 10, 10, 10, 10];
        assert_eq!(
            unit_bounds(lens.into_iter(), 1),
            [0..1, 1..2, 2..3, 3..4, 4..5]
        );
        assert_eq!(unit_bounds(lens.into_iter(), 2), [0..2, 2..4, 4..5]);
        assert_eq!(unit_bounds(lens.into_iter(), 8), vec![0..5]);
        let big = UNIT_RAW_TARGET;
        let lens = [100, big, 100, big - 100, 1, big + 1];
        assert_eq!(
            unit_bounds(lens.into_iter(), 8),
            [0..1, 1..2, 2..4, 4..5, 5..6]
        );
        assert!(unit_bounds(std::iter::empty(), 8).is_empty());
    }
}
