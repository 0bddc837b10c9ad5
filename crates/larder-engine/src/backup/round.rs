//! One round of the pipeline: stage 1 takes files until the round's end, every stage
//! drains, and the tree of the walk's prefix covered so far is stored after the
//! files. A backup is one round, or several with a checkpoint after each but the last
//! (docs/design/nightly.md, "Checkpoints").

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crossbeam_channel::{bounded, unbounded};
use larder_chunk::Chunker;
use larder_hash::Fingerprint;
use larder_store::{ChunkCodec, RepoIndex, Repository, SegmentContainer};

use super::device::ChunkDevice;
use super::gate::SerialGate;
use super::index_stage::{self, Indexer, StageOut, WriteBatch};
use super::read_stage::{Batch, BufferPool, FileToRead, Reader, RoundEnd, BLOCK};
use super::remote::RemoteIndex;
use super::tree_saver::{build_tree, store_stream, StoredStream};
use super::walk::Item;
use super::write_stage::{self, ContainerWriter, SYNC_THREADS};
use super::StageTimes;
use crate::error::{EngineError, Result, Warning};
use crate::Progress;

/// Batches in flight between two stages.
const QUEUE_DEPTH: usize = 4;

/// What stays the same from round to round of one backup (or of one snapshot's copy).
pub(crate) struct Pipeline<'a> {
    pub items: &'a [Item],
    pub chunker: &'a dyn Chunker,
    /// How chunks are fingerprinted and stored: the repository's.
    pub codec: ChunkCodec,
    /// Fingerprinting threads (and chunking and compression threads).
    pub threads: usize,
    pub chunk_threads: rayon::ThreadPool,
    /// The threads that compress new chunks, if the repository compresses.
    pub compress_threads: Option<rayon::ThreadPool>,
    pub gate: SerialGate,
    pub progress: &'a dyn Progress,
    pub warnings: &'a Mutex<Vec<Warning>>,
    pub remote: Option<Arc<dyn RemoteIndex>>,
    /// Chunks and fingerprints large files' blocks instead of the CPU, if set.
    pub device: Option<&'a Mutex<Box<dyn ChunkDevice>>>,
}

/// What one round stored.
pub(crate) struct RoundOutput {
    pub written: Vec<SegmentContainer>,
    /// The bytes of the container files written.
    pub container_bytes: u64,
    /// Containers the syncers acknowledged to the remote index themselves.
    pub acked: BTreeSet<u64>,
    /// The tree of the walk's items before `upto`.
    pub tree: StoredStream,
    pub upto: usize,
    /// How many of the round's files stage 1 took (each read to its end).
    pub taken: usize,
    pub bytes_new_stored: u64,
}

fn join<T>(h: std::thread::ScopedJoinHandle<'_, T>, stage: &str) -> Result<T> {
    h.join()
        .map_err(|_| EngineError::Pipeline(format!("the {stage} stage panicked")))
}

impl Pipeline<'_> {
    /// Runs one round over `files` (the files still to read, in walk order) until
    /// `end`, then stores the tree of the items before the first file not taken (all
    /// items when every file was taken). Nothing is committed here.
    pub(super) fn round(
        &self,
        repo: &Repository,
        indexer: &mut Indexer,
        index: &mut RepoIndex,
        files: &[FileToRead<'_>],
        end: &RoundEnd,
        stages: &mut StageTimes,
    ) -> Result<RoundOutput> {
        let read = |reader: &Reader<'_, '_>| reader.run(files, end);
        let upto = |taken: usize| files.get(taken).map_or(self.items.len(), |next| next.item);
        self.run_round(repo, indexer, index, &read, &upto, stages)
    }

    /// Runs one round whose stage 1 is `read`: it sends batches in stream order down
    /// the reader's queue and returns its busy time and how many files it took. Then
    /// stores the tree of the items before `upto(taken)`. Nothing is committed here.
    pub fn run_round(
        &self,
        repo: &Repository,
        indexer: &mut Indexer,
        index: &mut RepoIndex,
        read: &(dyn Fn(&Reader<'_, '_>) -> (Duration, usize) + Sync),
        upto: &dyn Fn(usize) -> usize,
        stages: &mut StageTimes,
    ) -> Result<RoundOutput> {
        // Block buffers stage 3 may hold whole while lazy or remote answers wait: the
        // pool keeps room for them, so that they are reused rather than freed and
        // faulted in again.
        let held_blocks = match &*index {
            RepoIndex::Disk(state) => super::lock(state).held_chunk_bytes() as usize / BLOCK,
            RepoIndex::Memory(_) if self.remote.is_some() => super::remote_stage::LOOKUPS_AHEAD,
            RepoIndex::Memory(_) => 0,
        };
        let gate = &self.gate;
        let (sync_tx, sync_rx) = if gate.is_serial() {
            // A bounded queue could fill while the writer holds the gate the syncers
            // wait for; memory is then bounded by the backup's new data.
            unbounded()
        } else {
            bounded(SYNC_THREADS)
        };
        let (reuse_tx, reuse_rx) = bounded(SYNC_THREADS);
        let mut writer = ContainerWriter::new(
            repo,
            self.compress_threads.as_ref(),
            self.chunker.max_size(),
            sync_tx,
            reuse_rx,
        );
        std::thread::scope(|s| {
            let syncers = write_stage::spawn_syncers(
                s,
                repo.backend(),
                sync_rx,
                reuse_tx,
                gate,
                self.remote.clone(),
                indexer.zero_chunk,
            );
            let (chunk_tx, chunk_rx) = bounded::<Batch>(QUEUE_DEPTH);
            let (fp_tx, fp_rx) = bounded::<Batch>(QUEUE_DEPTH + self.threads);
            let (write_tx, write_rx) = bounded::<WriteBatch>(QUEUE_DEPTH);
            let (pool_tx, pool_rx) =
                bounded::<Vec<u8>>(2 * QUEUE_DEPTH + self.threads + 2 + held_blocks);
            let pool = BufferPool {
                free: pool_rx,
                size: BLOCK + self.chunker.max_size(),
            };
            let chunk = s.spawn(move || {
                read(&Reader {
                    chunker: self.chunker,
                    device: self.device,
                    threads: &self.chunk_threads,
                    pool: &pool,
                    gate,
                    tx: &chunk_tx,
                })
            });
            let codec = &self.codec;
            let hashers: Vec<_> = (0..self.threads)
                .map(|_| {
                    let (rx, tx) = (chunk_rx.clone(), fp_tx.clone());
                    s.spawn(move || super::fingerprint_stage::run(codec, gate, &rx, &tx))
                })
                .collect();
            drop((chunk_rx, fp_tx));
            let index_pool = pool_tx.clone();
            let write = s.spawn(move || {
                let result = write_stage::run(&mut writer, &write_rx, &pool_tx, gate);
                (writer, result)
            });
            // Stage 3 runs on this thread. When it stops (at the end, or on an error),
            // closing its queues stops the stages before and after it.
            let out = StageOut {
                tx: &write_tx,
                pool: &index_pool,
                progress: self.progress,
                warnings: self.warnings,
            };
            let index_result = index_stage::run(indexer, index, &fp_rx, &out, gate);
            drop((write_tx, fp_rx));
            let (mut writer, write_result) = join(write, "write")?;
            let (chunk_busy, taken) = join(chunk, "chunk")?;
            stages.chunk += chunk_busy;
            for h in hashers {
                stages.fingerprint += join(h, "fingerprint")?;
            }
            let upto = upto(taken);
            // A disk index error stopped stage 3; stage 4 then stopped on its closed
            // queue. Either way the tree is not stored.
            let tree = index_result.and_then(|busy| {
                stages.index += busy;
                self.store_tree(write_result?, upto, indexer, index, &mut writer, stages)
            });
            let bytes_new_stored = writer.bytes_stored;
            // Closing the syncers' queue: they finish what they hold and stop.
            drop(writer);
            let (written, container_bytes, acked) = collect(syncers, stages)?;
            Ok(RoundOutput {
                written,
                container_bytes,
                acked,
                tree: tree?,
                upto,
                taken,
                bytes_new_stored,
            })
        })
    }

    /// Stores the tree of the items before `upto` after stage 4 has drained (its
    /// busy time `write_busy`), and seals the last container.
    fn store_tree(
        &self,
        write_busy: Duration,
        upto: usize,
        indexer: &mut Indexer,
        index: &mut RepoIndex,
        writer: &mut ContainerWriter<'_>,
        stages: &mut StageTimes,
    ) -> Result<StoredStream> {
        let tree = build_tree(&self.items[..upto], indexer);
        // In serial mode this takes the gate too: the syncers may still be writing.
        let span = self.gate.begin();
        let stream = store_stream(&tree, self.chunker, &self.codec, indexer, index, writer)?;
        writer.seal()?;
        // `compress_wall` was measured inside the intervals summed here.
        stages.write += (write_busy + span.end()).saturating_sub(writer.compress_wall);
        stages.compress += writer.compress_time;
        Ok(stream)
    }
}

/// What the syncers wrote (the containers and their files' bytes) and acknowledged.
/// A syncer's error (a full disk) is the cause of the writer's "syncers stopped", so
/// it is the one returned.
pub(crate) fn collect(
    syncers: Vec<std::thread::ScopedJoinHandle<'_, write_stage::Synced>>,
    stages: &mut StageTimes,
) -> Result<(Vec<SegmentContainer>, u64, BTreeSet<u64>)> {
    let mut written = Vec::new();
    let mut file_bytes = 0;
    let mut acked = BTreeSet::new();
    let mut first_error = None;
    for h in syncers {
        let synced = join(h, "sync")?;
        written.extend(synced.written);
        file_bytes += synced.file_bytes;
        acked.extend(synced.acked);
        stages.sync += synced.busy;
        first_error = first_error.or(synced.error);
    }
    match first_error {
        Some(e) => Err(e),
        None => Ok((written, file_bytes, acked)),
    }
}

/// The zero chunk of `chunker`: a chunk of its largest size, all zeros.
pub(crate) fn zero_chunk(codec: &ChunkCodec, max_chunk_size: usize) -> Fingerprint {
    codec.fingerprint(&vec![0; max_chunk_size])
}
