//! Stage 4: compresses a batch's new chunks on several threads, then places them in
//! containers by their stored sizes and hands sealed containers to syncer threads that
//! write them durably.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use larder_hash::Fingerprint;
use larder_store::{
    Backend, ChunkCodec, ChunkEncoding, ChunkEntry, ContainerBuilder, FileKind, Repository,
    SegmentContainer,
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

    /// Compresses `chunks` (if compression is on; on the compression threads), then
    /// appends them in order. `data[p]` is the bytes of piece `p`.
    pub fn store(&mut self, chunks: &mut [NewChunk], data: &[&[u8]]) -> Result<()> {
        if let Some(threads) = self.compress_threads {
            let started = Instant::now();
            let codec = &self.codec;
            // Each chunk is timed on its thread, so the sum is CPU time across threads.
            self.compress_time += threads.install(|| {
                chunks
                    .par_iter_mut()
                    .map(|c| {
                        let started = Instant::now();
                        c.compressed = codec.compress(&data[c.piece][c.start..][..c.len])?;
                        Ok::<_, EngineError>(started.elapsed())
                    })
                    .try_reduce(|| Duration::ZERO, |a, b| Ok(a + b))
            })?;
            self.compress_wall += started.elapsed();
        }
        for c in chunks.iter() {
            let raw_len = c.len as u32;
            match &c.compressed {
                Some(frame) => self.append(c.fp, frame, raw_len, ChunkEncoding::Zstd)?,
                None => {
                    let raw = &data[c.piece][c.start..][..c.len];
                    self.append(c.fp, raw, raw_len, ChunkEncoding::Raw)?
                }
            }
        }
        Ok(())
    }

    /// Appends one chunk's stored bytes to the open container, or to a new one if
    /// they would take a non-empty container past `container_size`.
    fn append(
        &mut self,
        fp: Fingerprint,
        stored: &[u8],
        raw_len: u32,
        encoding: ChunkEncoding,
    ) -> Result<()> {
        let fits = self
            .open
            .as_ref()
            .is_some_and(|b| b.fits(stored.len(), self.container_size));
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
        if let Some(b) = self.open.as_mut() {
            b.push_stored(fp, stored, raw_len, encoding);
            self.bytes_stored += stored.len() as u64;
        }
        Ok(())
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
    for mut batch in rx {
        let span = gate.begin();
        let data: Vec<&[u8]> = batch.buffers.iter().map(Vec::as_slice).collect();
        writer.store(&mut batch.chunks, &data)?;
        recycle(pool, batch.buffers);
        busy += span.end();
    }
    Ok(busy)
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
                    let mut result =
                        backend.write(FileKind::Container, &format!("{id:016x}"), &bytes);
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
