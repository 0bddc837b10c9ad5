//! The backup pipeline (docs/design/pipeline.md).
//!
//! ```text
//! walk ─▶ [1 chunk] ─▶ [2 fingerprint × N] ─▶ [3 index] ─▶ [4 compress × N, write] ─▶ syncers
//! ```
//! Stage 1 reads files and finds cut points (small files in parallel across files);
//! stage 2 fingerprints batches on N threads; stage 3 restores stream order by batch
//! sequence number, looks every fingerprint up, marks new chunks and builds file
//! recipes; stage 4 compresses a batch's new chunks on N threads, then places them in
//! containers by their stored sizes and hands sealed containers to syncer threads that
//! write them durably. Queues are bounded, so memory stays bounded whatever the input
//! size.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::fs::File;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use crossbeam_channel::{bounded, unbounded, Receiver, Sender};
use larder_chunk::{Chunker, ParallelChunker};
use larder_hash::{Fingerprint, HashAlgo};
use larder_index::disk::{DiskIndexMetrics, FingerprintHasher};
use larder_index::{ChunkLocation, CuckooIndex, FingerprintIndex};
use larder_store::{
    encode_tree_header, Backend, ChunkCompressor, ChunkEncoding, Compression, ContainerBuilder,
    EntryKind, FileKind, RepoIndex, Repository, SegmentContainer, Snapshot, SnapshotSummary,
    TreeRef,
};
use rayon::prelude::*;
use serde::Serialize;

use crate::block_buf::{block_buffer, read_append};
use crate::error::{EngineError, Result, Warning};
use crate::pattern::PatternList;
use crate::time::rfc3339;
use crate::walk::{walk, Item, Walked};
use crate::Progress;

mod disk_stage;

/// Files smaller than this are read whole and chunked in parallel across files.
const SMALL_FILE: u64 = 1 << 20;
/// Bytes a large file is read in; one batch each.
const BLOCK: usize = 8 << 20;
/// Small files are grouped into batches of at most this many bytes and files.
const GROUP_BYTES: u64 = 8 << 20;
const GROUP_FILES: usize = 512;
/// Batches in flight between two stages.
const QUEUE_DEPTH: usize = 4;
/// Threads writing sealed containers; fsyncs overlap (see docs/performance.md).
const SYNC_THREADS: usize = 4;

pub struct BackupOptions {
    /// Fingerprinting threads; 0 means one per core.
    pub threads: usize,
    pub hostname: String,
    pub username: String,
    /// Patterns matched against snapshot paths; what they select is not backed up
    /// (docs/design/patterns.md). `.larderignore` files are honoured as well.
    pub exclude: PatternList,
    pub progress: Arc<dyn Progress>,
    /// The stages take turns instead of overlapping: at most one stage works at any
    /// moment, each batch passing through chunk, fingerprint, index and write in turn.
    /// With `threads` 1 this is P-Dedupe's serial baseline, which `larder bench
    /// report` measures against the pipeline; it only ever slows a backup down. The
    /// queue to the container syncers is then unbounded (a bounded one could fill
    /// while the writer holds the turn the syncers wait for), so memory is bounded by
    /// the backup's new data rather than by the queue depths. Off by default.
    pub serial: bool,
    /// The index of a cluster (docs/design/cluster.md): fingerprints that neither this
    /// repository nor this backup holds are asked there, and this backup's new chunks
    /// are acknowledged to it once the commit made them durable. `None`: this
    /// repository's own index decides alone.
    pub remote: Option<Arc<dyn RemoteIndex>>,
}

/// A chunk index shared with other repositories: a cluster's partition owners.
pub trait RemoteIndex: Send + Sync {
    /// For each of `fps`, in order: where it is stored, or `None` if nowhere. A `None`
    /// is a promise to store the chunk and [`RemoteIndex::acknowledge`] it: other
    /// askers wait for that (the cluster's lock on new).
    fn lookup(
        &self,
        fps: &[Fingerprint],
    ) -> std::result::Result<Vec<Option<ChunkLocation>>, String>;

    /// Where this repository stored chunks `lookup` answered `None` for, once they are
    /// durable (committed).
    fn acknowledge(
        &self,
        entries: &[(Fingerprint, ChunkLocation)],
    ) -> std::result::Result<(), String>;
}

/// Whether stages take turns ([`BackupOptions::serial`]): a stage takes the turn before
/// it works and gives it back before it waits on a queue, so no stage ever waits on a
/// queue while holding it. Without turns, beginning a spell only reads the clock.
struct Turns(Option<Mutex<()>>);

/// A stage's spell of work: the turn it holds (serial mode) and when it began, after
/// the turn was taken.
struct Spell<'t> {
    _turn: Option<std::sync::MutexGuard<'t, ()>>,
    started: Instant,
}

impl Turns {
    fn begin(&self) -> Spell<'_> {
        // Fields are evaluated in order: the clock starts once the turn is held.
        Spell {
            _turn: self.0.as_ref().map(lock),
            started: Instant::now(),
        }
    }
}

impl Spell<'_> {
    /// Ends the spell, giving the turn back; returns how long it worked.
    fn end(self) -> Duration {
        self.started.elapsed()
    }
}

/// Time each stage spent working (not waiting on its queues).
#[derive(Debug, Clone, Default, Serialize)]
pub struct StageTimes {
    pub walk: Duration,
    pub chunk: Duration,
    /// Summed over the fingerprinting threads.
    pub fingerprint: Duration,
    pub index: Duration,
    /// Compressing new chunks, summed over the compression threads.
    pub compress: Duration,
    /// Placing new chunks in containers and copying them in (compression excluded).
    pub write: Duration,
    /// Container writes and fsyncs, summed over syncer threads, plus the commit.
    pub sync: Duration,
}

#[derive(Debug, Clone, Serialize)]
pub struct BackupSummary {
    pub snapshot_id: String,
    pub files: u64,
    pub dirs: u64,
    pub symlinks: u64,
    /// Bytes of file content read.
    pub bytes_in: u64,
    /// Raw bytes of the new chunks (file data and tree): what is left after dedup.
    pub bytes_new: u64,
    /// Stored bytes of the new chunks: after compression, without metadata.
    pub bytes_new_stored: u64,
    /// Bytes the repository grew by: containers, index segment and snapshot.
    pub bytes_stored: u64,
    pub chunks: u64,
    pub chunks_new: u64,
    pub containers_written: u64,
    /// Entries left out by exclude patterns or `.larderignore` files, unread; an
    /// excluded directory counts once, whatever it holds.
    pub excluded: u64,
    pub elapsed: Duration,
    pub stages: StageTimes,
    pub warnings: Vec<Warning>,
    /// What the disk index did during this backup (`None` for a memory index); the
    /// CLI writes it into `--json` itself.
    #[serde(skip)]
    pub disk_index: Option<DiskIndexMetrics>,
}

impl BackupSummary {
    /// Input bytes per byte left after dedup (`bytes_in / bytes_new`).
    pub fn dedup_ratio(&self) -> f64 {
        self.bytes_in as f64 / self.bytes_new.max(1) as f64
    }

    /// Bytes left after dedup per byte stored for them (`bytes_new /
    /// bytes_new_stored`); 1 without compression, or when nothing was new.
    pub fn compression_ratio(&self) -> f64 {
        match self.bytes_new_stored {
            0 => 1.0,
            stored => self.bytes_new as f64 / stored as f64,
        }
    }

    /// Input bytes per byte the repository grew by, metadata included.
    pub fn overall_ratio(&self) -> f64 {
        self.bytes_in as f64 / self.bytes_stored.max(1) as f64
    }

    pub fn mb_per_sec(&self) -> f64 {
        self.bytes_in as f64 / 1e6 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// Whether some source could not be read completely.
    pub fn is_partial(&self) -> bool {
        self.warnings.iter().any(|w| w.is_error)
    }
}

/// How a piece of a file ends.
enum PieceEnd {
    More,
    Done { size: u64 },
    Failed(Warning),
}

/// Consecutive bytes of one file, cut into chunks.
struct Piece {
    /// Index into the walk's items.
    item: usize,
    data: Vec<u8>,
    lens: Vec<u32>,
    end: PieceEnd,
}

/// What stage 3 keeps of a piece besides its bytes.
struct PieceInfo {
    item: usize,
    lens: Vec<u32>,
    end: PieceEnd,
    /// The piece's length in bytes.
    len: usize,
}

struct Batch {
    seq: u64,
    pieces: Vec<Piece>,
    /// One per chunk of `pieces`, in order; filled by stage 2.
    fps: Vec<Fingerprint>,
}

/// A chunk stage 3 found new, at `data[start..start + len]` of piece `piece`.
struct NewChunk {
    piece: usize,
    start: usize,
    len: usize,
    fp: Fingerprint,
    /// The chunk's zstd frame, when compression made it shorter; set in stage 4.
    compressed: Option<Vec<u8>>,
}

/// New chunks for stage 4, in stream order; `NewChunk::piece` indexes `buffers`.
struct WriteBatch {
    buffers: Vec<Vec<u8>>,
    chunks: Vec<NewChunk>,
}

/// Stage 3's state: the index, this backup's new chunks and every file's recipe.
struct Indexer {
    index: RepoIndex,
    /// Fingerprints this backup has sent to be written. They enter `index` with their
    /// locations at the commit ([`Repository::commit`]): a location is known only once
    /// stage 4 has placed the chunk by its compressed size. Fingerprints are uniform,
    /// so their first bytes hash them (no SipHash).
    new_chunks: HashSet<Fingerprint, FingerprintHasher>,
    /// A cluster's index, asked about what neither `index` nor `new_chunks` holds.
    remote: Option<Arc<dyn RemoteIndex>>,
    /// The zero chunk (a chunk of the chunker's largest size, all zeros), which long
    /// runs of zeros cut into over and over: with a remote index it is decided here
    /// alone and never asked nor acknowledged (the dedup-cluster paper's special
    /// case), so each repository stores it once and no request carries it.
    zero_chunk: Fingerprint,
    recipes: Vec<Option<Vec<Fingerprint>>>,
    sizes: Vec<u64>,
    chunks: u64,
    chunks_new: u64,
    bytes_new: u64,
    bytes_in: u64,
}

impl Indexer {
    /// Whether each of `fps` is new: neither in the repository (`index`) nor met
    /// earlier in this backup (rule 4 of the commit order: written once), nor, in a
    /// cluster, stored by another node (asked in one request for the batch).
    fn decide(&mut self, index: &CuckooIndex, fps: &[Fingerprint]) -> Result<Vec<bool>> {
        // One batch lookup for all chunks: it overlaps the cache misses of the lookups.
        let known = index.get_batch(fps);
        let Some(remote) = self.remote.clone() else {
            return Ok(fps
                .iter()
                .zip(known)
                .map(|(fp, known)| known.is_none() && self.new_chunks.insert(*fp))
                .collect());
        };
        let mut new = vec![false; fps.len()];
        let mut asked: HashSet<Fingerprint, FingerprintHasher> =
            HashSet::with_hasher(FingerprintHasher);
        let mut ask = Vec::new();
        for (i, (fp, known)) in fps.iter().zip(known).enumerate() {
            if known.is_some() || self.new_chunks.contains(fp) {
                continue;
            }
            if *fp == self.zero_chunk {
                new[i] = self.new_chunks.insert(*fp);
            } else if asked.insert(*fp) {
                ask.push(i);
            }
        }
        if ask.is_empty() {
            return Ok(new);
        }
        let ask_fps: Vec<Fingerprint> = ask.iter().map(|&i| fps[i]).collect();
        let answers = remote
            .lookup(&ask_fps)
            .map_err(|e| EngineError::Pipeline(format!("the cluster's index: {e}")))?;
        for (&i, answer) in ask.iter().zip(answers) {
            new[i] = answer.is_none() && self.new_chunks.insert(fps[i]);
        }
        Ok(new)
    }

    /// Whether each chunk of a stream stored after the pipeline (the tree) is new.
    fn decide_now(&mut self, fps: &[Fingerprint]) -> Result<Vec<bool>> {
        match std::mem::take(&mut self.index) {
            RepoIndex::Memory(index) => {
                let new = self.decide(&index, fps);
                self.index = RepoIndex::Memory(index);
                new
            }
            RepoIndex::Disk(mut state) => {
                let result = disk_stage::decide_now(
                    self,
                    state
                        .get_mut()
                        .unwrap_or_else(|poisoned| poisoned.into_inner()),
                    fps,
                );
                self.index = RepoIndex::Disk(state);
                result
            }
        }
    }

    /// Counts the chunks of `batch`, `new[i]` telling whether its `i`-th chunk is new,
    /// builds the recipes, and hands the new chunks on to stage 4.
    fn emit(
        &mut self,
        batch: Batch,
        new: &[bool],
        progress: &dyn Progress,
        warnings: &Mutex<Vec<Warning>>,
    ) -> WriteBatch {
        let mut chunks = Vec::new();
        let mut buffers = Vec::with_capacity(batch.pieces.len());
        let mut fps = batch.fps.into_iter().zip(new.iter().copied()).enumerate();
        for (p, piece) in batch.pieces.into_iter().enumerate() {
            let info = PieceInfo {
                item: piece.item,
                lens: piece.lens,
                end: piece.end,
                len: piece.data.len(),
            };
            self.account(&info, &mut fps, progress, warnings, |_, start, len, fp| {
                chunks.push(NewChunk {
                    piece: p,
                    start,
                    len,
                    fp,
                    compressed: None,
                });
            });
            buffers.push(piece.data);
        }
        WriteBatch { buffers, chunks }
    }

    /// Counts the chunks of one piece, taking their fingerprints and whether each is
    /// new from `fps` (numbered within the batch), extends the file's recipe, notes
    /// the file's end or failure, and calls `new_chunk(number, start, len, fp)` for
    /// each new chunk (`start` within the piece).
    fn account(
        &mut self,
        piece: &PieceInfo,
        fps: &mut impl Iterator<Item = (usize, (Fingerprint, bool))>,
        progress: &dyn Progress,
        warnings: &Mutex<Vec<Warning>>,
        mut new_chunk: impl FnMut(usize, usize, usize, Fingerprint),
    ) {
        let recipe = self.recipes[piece.item].get_or_insert_with(Vec::new);
        recipe.reserve(piece.lens.len());
        let mut start = 0;
        for &len in &piece.lens {
            let (i, (fp, new)) = fps.next().expect("stage 2 gives one fingerprint per chunk");
            let len = len as usize;
            self.chunks += 1;
            if new {
                self.chunks_new += 1;
                self.bytes_new += len as u64;
                new_chunk(i, start, len, fp);
            }
            self.recipes[piece.item]
                .get_or_insert_with(Vec::new)
                .push(fp);
            start += len;
        }
        self.bytes_in += piece.len as u64;
        progress.advance(piece.len as u64);
        match &piece.end {
            PieceEnd::More => {}
            PieceEnd::Done { size } => self.sizes[piece.item] = *size,
            PieceEnd::Failed(w) => {
                self.recipes[piece.item] = None;
                progress.warn(w);
                lock(warnings).push(w.clone());
            }
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Stage 4's state: how new chunks are compressed, the open container and the syncer
/// threads' queue.
struct ContainerWriter<'r> {
    repo: &'r Repository,
    algo: HashAlgo,
    /// The zstd level and the threads that compress, if compression is on.
    compression: Option<(i32, rayon::ThreadPool)>,
    /// Stored bytes a container is filled to (header included); one chunk never spans
    /// two containers, so the last chunk may take it past this.
    container_size: usize,
    capacity: usize,
    open: Option<ContainerBuilder>,
    to_sync: Sender<(u64, Vec<u8>, Vec<larder_store::ChunkEntry>)>,
    /// Buffers of containers the syncers have written, for reuse.
    reuse: Receiver<Vec<u8>>,
    written: u64,
    bytes_stored: u64,
    /// Compression time summed over the compression threads, and the wall time the
    /// writer waited for it.
    compress_time: Duration,
    compress_wall: Duration,
}

thread_local! {
    /// A compression thread's zstd context, made on its first chunk.
    static COMPRESSOR: RefCell<Option<ChunkCompressor>> = const { RefCell::new(None) };
}

/// The zstd frame of `raw` if it is shorter, with this thread's context at `level`.
fn compress_chunk(level: i32, raw: &[u8]) -> Result<Option<Vec<u8>>> {
    COMPRESSOR.with(|cell| {
        let mut slot = cell.borrow_mut();
        let compressor = match &mut *slot {
            Some(c) if c.level() == level => c,
            other => other.insert(ChunkCompressor::new(level)?),
        };
        Ok(compressor.compress(raw)?.map(<[u8]>::to_vec))
    })
}

impl ContainerWriter<'_> {
    /// Compresses `chunks` (if compression is on; on the compression threads), then
    /// appends them in order. `data[p]` is the bytes of piece `p`.
    fn store(&mut self, chunks: &mut [NewChunk], data: &[&[u8]]) -> Result<()> {
        if let Some((level, threads)) = &self.compression {
            let started = Instant::now();
            let level = *level;
            // Each chunk is timed on its thread, so the sum is CPU time across threads.
            self.compress_time += threads.install(|| {
                chunks
                    .par_iter_mut()
                    .map(|c| {
                        let started = Instant::now();
                        c.compressed = compress_chunk(level, &data[c.piece][c.start..][..c.len])?;
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
            .is_some_and(|b| b.is_empty() || b.data_end() + stored.len() <= self.container_size);
        if !fits {
            self.seal()?;
            let id = self.repo.allocate_container_id();
            self.open = Some(match self.reuse.try_recv() {
                Ok(buf) => ContainerBuilder::with_buffer(id, self.algo, buf),
                Err(_) => ContainerBuilder::new(id, self.algo, self.capacity),
            });
        }
        if let Some(b) = self.open.as_mut() {
            b.push_stored(fp, stored, raw_len, encoding);
            self.bytes_stored += stored.len() as u64;
        }
        Ok(())
    }

    fn seal(&mut self) -> Result<()> {
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

/// Reads and chunks one small file whole.
fn read_small(item: usize, path: &Path, chunker: &dyn Chunker) -> Piece {
    let read = (|| {
        let mut f = File::open(path)?;
        let before = f.metadata()?;
        let mut data = Vec::with_capacity(before.len() as usize);
        f.read_to_end(&mut data)?;
        let after = f.metadata()?;
        Ok::<_, std::io::Error>((data, changed(&before, &after)))
    })();
    match read {
        Ok((data, changed)) => {
            let lens = chunker
                .chunk_lengths(&data)
                .into_iter()
                .map(|l| l as u32)
                .collect();
            let size = data.len() as u64;
            let end = match changed {
                true => PieceEnd::Failed(Warning::error(
                    path,
                    "file changed while it was read; not backed up",
                )),
                false => PieceEnd::Done { size },
            };
            Piece {
                item,
                data,
                lens,
                end,
            }
        }
        Err(e) => Piece {
            item,
            data: Vec::new(),
            lens: Vec::new(),
            end: PieceEnd::Failed(Warning::error(path, format!("cannot read file: {e}"))),
        },
    }
}

fn changed(before: &std::fs::Metadata, after: &std::fs::Metadata) -> bool {
    before.len() != after.len()
        || before.mtime() != after.mtime()
        || before.mtime_nsec() != after.mtime_nsec()
}

/// Block buffers travel from stage 1 down the pipeline and back here, so that large
/// files are read without fresh allocations (page faults) or zero-filling.
struct BufferPool {
    free: Receiver<Vec<u8>>,
    size: usize,
}

impl BufferPool {
    /// An empty buffer with room for `size` bytes.
    fn get(&self) -> Vec<u8> {
        let mut buf = self
            .free
            .try_recv()
            .unwrap_or_else(|_| block_buffer(self.size));
        buf.clear();
        buf
    }
}

/// Hands block buffers back to stage 1; dropped if the pool is full or they are not
/// block buffers.
fn recycle(pool: &Sender<Vec<u8>>, buffers: impl IntoIterator<Item = Vec<u8>>) {
    for data in buffers {
        if data.capacity() >= BLOCK {
            let _ = pool.try_send(data);
        }
    }
}

/// Stage 1: reads every file, cuts it into chunks and sends batches in stream order.
fn chunk_stage<'t>(
    items: &[Item],
    chunker: &dyn Chunker,
    threads: &rayon::ThreadPool,
    pool: &BufferPool,
    turns: &'t Turns,
    tx: &Sender<Batch>,
) -> Duration {
    let mut busy = Duration::ZERO;
    let mut seq = 0u64;
    let mut send = |pieces: Vec<Piece>, spell: Spell<'t>, busy: &mut Duration| -> bool {
        *busy += spell.end();
        let ok = tx
            .send(Batch {
                seq,
                pieces,
                fps: Vec::new(),
            })
            .is_ok();
        seq += 1;
        ok
    };
    let mut group: Vec<usize> = Vec::new();
    let mut group_bytes = 0u64;
    let files = items
        .iter()
        .enumerate()
        .filter(|(_, it)| it.entry.kind == EntryKind::File);
    // Small files are read and chunked on the stage's own threads, so that `threads`
    // bounds stage 1 as it bounds the others.
    let flush = |group: &mut Vec<usize>| -> Vec<Piece> {
        let pieces = threads.install(|| {
            group
                .par_iter()
                .map(|&i| read_small(i, &items[i].abs, chunker))
                .collect()
        });
        group.clear();
        pieces
    };
    for (i, item) in files {
        if item.entry.size < SMALL_FILE {
            group.push(i);
            group_bytes += item.entry.size;
            if group.len() >= GROUP_FILES || group_bytes >= GROUP_BYTES {
                let spell = turns.begin();
                let pieces = flush(&mut group);
                group_bytes = 0;
                if !send(pieces, spell, &mut busy) {
                    return busy;
                }
            }
            continue;
        }
        if !group.is_empty() {
            let spell = turns.begin();
            let pieces = flush(&mut group);
            group_bytes = 0;
            if !send(pieces, spell, &mut busy) {
                return busy;
            }
        }
        if !chunk_large(
            i,
            &item.abs,
            &ParallelChunker::new(chunker, threads),
            pool,
            turns,
            &mut |piece, spell, busy| send(vec![piece], spell, busy),
            &mut busy,
        ) {
            return busy;
        }
    }
    if !group.is_empty() {
        let spell = turns.begin();
        let pieces = flush(&mut group);
        send(pieces, spell, &mut busy);
    }
    busy
}

/// Reads a large file block by block. A chunk is cut only when at least `max_size`
/// bytes follow its start or the file has ended, so cut points equal those of chunking
/// the whole file at once; the uncut tail is carried into the next block. Each block
/// is chunked on several threads with exactly the sequential cut points
/// (docs/design/chunking-parallel.md).
fn chunk_large<'t>(
    item: usize,
    path: &Path,
    chunker: &ParallelChunker<'_, dyn Chunker + '_>,
    pool: &BufferPool,
    turns: &'t Turns,
    send: &mut dyn FnMut(Piece, Spell<'t>, &mut Duration) -> bool,
    busy: &mut Duration,
) -> bool {
    let mut spell = turns.begin();
    let fail = |e: std::io::Error| Piece {
        item,
        data: Vec::new(),
        lens: Vec::new(),
        end: PieceEnd::Failed(Warning::error(path, format!("cannot read file: {e}"))),
    };
    let (mut file, before) = match File::open(path).and_then(|f| f.metadata().map(|m| (f, m))) {
        Ok(x) => x,
        Err(e) => return send(fail(e), spell, busy),
    };
    // `carry` holds the uncut tail of the previous block, less than `max_size` bytes.
    let mut carry: Vec<u8> = Vec::new();
    let mut total = 0u64;
    loop {
        let mut buf = pool.get();
        buf.extend_from_slice(&carry);
        let mut eof = false;
        while buf.len() < BLOCK {
            let room = BLOCK - buf.len();
            match read_append(&mut file, &mut buf, room) {
                Ok(0) => {
                    eof = true;
                    break;
                }
                Ok(_) => {}
                Err(e) => return send(fail(e), spell, busy),
            }
        }
        let block = chunker.chunk_block(&buf, eof);
        // A chunk is at most 16 MiB (`ChunkerConfig`'s largest maximum).
        let lens = block.lengths.iter().map(|&len| len as u32).collect();
        let pos = block.consumed;
        carry.clear();
        carry.extend_from_slice(&buf[pos..]);
        buf.truncate(pos);
        total += buf.len() as u64;
        let end = if eof {
            match file.metadata() {
                Ok(after) if changed(&before, &after) => PieceEnd::Failed(Warning::error(
                    path,
                    "file changed while it was read; not backed up",
                )),
                Ok(_) => PieceEnd::Done { size: total },
                Err(e) => PieceEnd::Failed(Warning::error(path, e)),
            }
        } else {
            PieceEnd::More
        };
        if !send(
            Piece {
                item,
                data: buf,
                lens,
                end,
            },
            spell,
            busy,
        ) {
            return false;
        }
        if eof {
            return true;
        }
        spell = turns.begin();
    }
}

/// Stage 2: fingerprints every chunk of a batch.
fn fingerprint_stage(
    algo: HashAlgo,
    turns: &Turns,
    rx: &Receiver<Batch>,
    tx: &Sender<Batch>,
) -> Duration {
    let mut busy = Duration::ZERO;
    for mut batch in rx {
        let spell = turns.begin();
        let mut fps = Vec::with_capacity(batch.pieces.iter().map(|p| p.lens.len()).sum());
        for piece in &batch.pieces {
            let mut start = 0;
            for &len in &piece.lens {
                let end = start + len as usize;
                fps.push(algo.fingerprint(&piece.data[start..end]));
                start = end;
            }
        }
        batch.fps = fps;
        busy += spell.end();
        if tx.send(batch).is_err() {
            break;
        }
    }
    busy
}

/// Stage 3: puts batches back in stream order and indexes them.
fn index_stage(
    indexer: &mut Indexer,
    rx: &Receiver<Batch>,
    tx: &Sender<WriteBatch>,
    pool: &Sender<Vec<u8>>,
    progress: &dyn Progress,
    warnings: &Mutex<Vec<Warning>>,
    turns: &Turns,
) -> Result<Duration> {
    let index = std::mem::take(&mut indexer.index);
    let out = StageOut {
        tx,
        pool,
        progress,
        warnings,
    };
    match index {
        RepoIndex::Memory(index) => {
            let busy = memory_index_stage(indexer, &index, rx, &out, turns);
            indexer.index = RepoIndex::Memory(index);
            busy
        }
        RepoIndex::Disk(mut state) => {
            let disk = state
                .get_mut()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            let busy = disk_stage::run(indexer, disk, rx, &out, turns);
            indexer.index = RepoIndex::Disk(state);
            busy
        }
    }
}

/// Where stage 3 sends what it found.
struct StageOut<'a> {
    tx: &'a Sender<WriteBatch>,
    pool: &'a Sender<Vec<u8>>,
    progress: &'a dyn Progress,
    warnings: &'a Mutex<Vec<Warning>>,
}

impl StageOut<'_> {
    /// Sends what [`Indexer::emit`] made of a batch to stage 4 (or its buffers back to
    /// stage 1 when it holds no new chunk); `false` once stage 4 has stopped. Called
    /// outside a spell: it may wait on the queue.
    fn send(&self, out: WriteBatch) -> bool {
        if out.chunks.is_empty() {
            recycle(self.pool, out.buffers);
            true
        } else {
            self.tx.send(out).is_ok()
        }
    }
}

/// Stage 3 with the memory index: restores stream order, then decides each batch at
/// once.
fn memory_index_stage(
    indexer: &mut Indexer,
    index: &CuckooIndex,
    rx: &Receiver<Batch>,
    out: &StageOut<'_>,
    turns: &Turns,
) -> Result<Duration> {
    let mut busy = Duration::ZERO;
    let mut waiting = BTreeMap::new();
    let mut next = 0u64;
    for batch in rx {
        waiting.insert(batch.seq, batch);
        while let Some(batch) = waiting.remove(&next) {
            next += 1;
            let spell = turns.begin();
            let new = indexer.decide(index, &batch.fps)?;
            let write = indexer.emit(batch, &new, out.progress, out.warnings);
            busy += spell.end();
            if !out.send(write) {
                return Ok(busy);
            }
        }
    }
    Ok(busy)
}

/// Stage 4: compresses new chunks and copies them into containers. Returns the time
/// spent, compression's wall time included (the writer counts compression apart).
fn write_stage(
    writer: &mut ContainerWriter<'_>,
    rx: &Receiver<WriteBatch>,
    pool: &Sender<Vec<u8>>,
    turns: &Turns,
) -> Result<Duration> {
    let mut busy = Duration::ZERO;
    for mut batch in rx {
        let spell = turns.begin();
        let data: Vec<&[u8]> = batch.buffers.iter().map(Vec::as_slice).collect();
        writer.store(&mut batch.chunks, &data)?;
        recycle(pool, batch.buffers);
        busy += spell.end();
    }
    Ok(busy)
}

/// What a syncer wrote, its busy time, its error, and the containers it acknowledged to
/// the remote index itself.
type SyncResult = (
    Vec<SegmentContainer>,
    Duration,
    Option<EngineError>,
    Vec<u64>,
);

/// What a remote index is told of a written container: where its chunks are, all but
/// the zero chunk, which each repository keeps to itself ([`Indexer::zero_chunk`]).
fn to_acknowledge(
    c: &SegmentContainer,
    zero_chunk: &Fingerprint,
) -> Vec<(Fingerprint, ChunkLocation)> {
    c.locations().filter(|(fp, _)| fp != zero_chunk).collect()
}

/// The syncers: write each sealed container durably. With a remote index, each also
/// makes the container's name durable and acknowledges its chunks at once, so that
/// other nodes waiting on them wait for one container, not for the whole backup; an
/// acknowledgement that fails is sent again at the commit.
fn spawn_syncers<'s>(
    scope: &'s std::thread::Scope<'s, '_>,
    backend: Arc<dyn Backend>,
    rx: Receiver<(u64, Vec<u8>, Vec<larder_store::ChunkEntry>)>,
    reuse: Sender<Vec<u8>>,
    turns: &'s Turns,
    remote: Option<Arc<dyn RemoteIndex>>,
    zero_chunk: Fingerprint,
) -> Vec<std::thread::ScopedJoinHandle<'s, SyncResult>> {
    (0..SYNC_THREADS)
        .map(|_| {
            let rx = rx.clone();
            let backend = backend.clone();
            let reuse = reuse.clone();
            let remote = remote.clone();
            scope.spawn(move || {
                let mut done = Vec::new();
                let mut acked = Vec::new();
                let mut busy = Duration::ZERO;
                for (id, bytes, entries) in rx {
                    let spell = turns.begin();
                    let mut result =
                        backend.write(FileKind::Container, &format!("{id:016x}"), &bytes);
                    if result.is_ok() && remote.is_some() {
                        result = backend.sync(FileKind::Container);
                    }
                    busy += spell.end();
                    if let Err(e) = result {
                        return (done, busy, Some(e.into()), acked);
                    }
                    let _ = reuse.try_send(bytes);
                    let written = SegmentContainer { id, entries };
                    if let Some(remote) = &remote {
                        if remote
                            .acknowledge(&to_acknowledge(&written, &zero_chunk))
                            .is_ok()
                        {
                            acked.push(id);
                        }
                    }
                    done.push(written);
                }
                (done, busy, None, acked)
            })
        })
        .collect()
}

fn join<T>(h: std::thread::ScopedJoinHandle<'_, T>, stage: &str) -> Result<T> {
    h.join()
        .map_err(|_| EngineError::Pipeline(format!("the {stage} stage panicked")))
}

/// Backs up `paths` into `repo` and commits a snapshot.
///
/// Problems with single files become warnings in the summary; anything that puts the
/// repository at risk (a failed write, a full disk) stops the backup with an error,
/// and no snapshot is written. Chunks already written are reused by the next backup.
pub fn backup(
    repo: &mut Repository,
    paths: &[PathBuf],
    opts: &BackupOptions,
) -> Result<BackupSummary> {
    let started = Instant::now();
    let mut stages = StageTimes::default();
    let mut warnings = Vec::new();
    let Walked { items, excluded } = walk(paths, &opts.exclude, &mut warnings)?;
    stages.walk = started.elapsed();
    for w in &warnings {
        opts.progress.warn(w);
    }
    let total: u64 = items
        .iter()
        .filter(|i| i.entry.kind == EntryKind::File)
        .map(|i| i.entry.size)
        .sum();
    opts.progress.set_total(total);

    let config = repo.config().clone();
    let algo = config.hash;
    let chunker = config.chunker.build();
    let threads = match opts.threads {
        0 => std::thread::available_parallelism().map_or(2, |n| n.get()),
        n => n,
    };
    let index = repo.take_index();
    let disk_before = index.disk_metrics();
    // Block buffers stage 3 may hold whole while lazy answers wait: the pool keeps
    // room for them, so that they are reused rather than freed and faulted in again.
    let held_blocks = match &index {
        RepoIndex::Disk(state) => lock(state).held_chunk_bytes() as usize / BLOCK,
        RepoIndex::Memory(_) => 0,
    };
    let backend = repo.backend();
    let warnings = Mutex::new(warnings);
    let mut indexer = Indexer {
        index,
        new_chunks: HashSet::with_hasher(FingerprintHasher),
        remote: opts.remote.clone(),
        zero_chunk: algo.fingerprint(&vec![0; config.chunker.max_chunk_size()]),
        recipes: vec![None; items.len()],
        sizes: vec![0; items.len()],
        chunks: 0,
        chunks_new: 0,
        bytes_new: 0,
        bytes_in: 0,
    };
    // Stage 4's threads for compressing new chunks, as many as fingerprinting threads.
    let compression = match config.compression {
        Compression::None => None,
        Compression::Zstd { level } => {
            let threads = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .thread_name(|i| format!("larder-compress-{i}"))
                .build()
                .map_err(|e| {
                    EngineError::Pipeline(format!("cannot start compression threads: {e}"))
                })?;
            Some((level, threads))
        }
    };
    let turns = Turns(opts.serial.then(|| Mutex::new(())));
    let (sync_tx, sync_rx) = if opts.serial {
        unbounded()
    } else {
        bounded(SYNC_THREADS)
    };
    let (reuse_tx, reuse_rx) = bounded(SYNC_THREADS);
    let mut writer = ContainerWriter {
        repo,
        algo,
        compression,
        container_size: config.container_size,
        capacity: config.container_size + config.chunker.max_chunk_size(),
        open: None,
        to_sync: sync_tx,
        reuse: reuse_rx,
        written: 0,
        bytes_stored: 0,
        compress_time: Duration::ZERO,
        compress_wall: Duration::ZERO,
    };

    // Stage 1's threads for chunking large files, as many as fingerprinting threads.
    let chunk_threads = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(|i| format!("larder-chunk-{i}"))
        .build()
        .map_err(|e| EngineError::Pipeline(format!("cannot start chunking threads: {e}")))?;
    let outcome = std::thread::scope(|s| -> Result<_> {
        let turns = &turns;
        let syncers = spawn_syncers(
            s,
            backend.clone(),
            sync_rx,
            reuse_tx,
            turns,
            opts.remote.clone(),
            indexer.zero_chunk,
        );
        let (chunk_tx, chunk_rx) = bounded::<Batch>(QUEUE_DEPTH);
        let (fp_tx, fp_rx) = bounded::<Batch>(QUEUE_DEPTH + threads);
        let (write_tx, write_rx) = bounded::<WriteBatch>(QUEUE_DEPTH);
        let items = &items;
        let chunker = chunker.as_ref();
        let (pool_tx, pool_rx) = bounded::<Vec<u8>>(2 * QUEUE_DEPTH + threads + 2 + held_blocks);
        let pool = BufferPool {
            free: pool_rx,
            size: BLOCK + chunker.max_size(),
        };
        let chunk_threads = &chunk_threads;
        let chunk =
            s.spawn(move || chunk_stage(items, chunker, chunk_threads, &pool, turns, &chunk_tx));
        let hashers: Vec<_> = (0..threads)
            .map(|_| {
                let (rx, tx) = (chunk_rx.clone(), fp_tx.clone());
                s.spawn(move || fingerprint_stage(algo, turns, &rx, &tx))
            })
            .collect();
        drop((chunk_rx, fp_tx));
        let progress = opts.progress.as_ref();
        let warnings = &warnings;
        let index_pool = pool_tx.clone();
        let index = s.spawn(move || {
            let result = index_stage(
                &mut indexer,
                &fp_rx,
                &write_tx,
                &index_pool,
                progress,
                warnings,
                turns,
            );
            (indexer, result)
        });
        let write = s.spawn(move || {
            let result = write_stage(&mut writer, &write_rx, &pool_tx, turns);
            (writer, result)
        });

        let (mut writer, write_result) = join(write, "write")?;
        let (mut indexer, index_result) = join(index, "index")?;
        // A disk index error stopped stage 3; stage 4 then stopped on its closed queue.
        stages.index = index_result?;
        stages.chunk = join(chunk, "chunk")?;
        for h in hashers {
            stages.fingerprint += join(h, "fingerprint")?;
        }
        // On an error, closing the writer's queue stops the syncers after what they hold.
        let tree_result = write_result.and_then(|busy| {
            // The tree stream goes through the same index and writer, after every file.
            let tree = build_tree(items, &indexer.recipes, &indexer.sizes);
            // In serial mode this takes the turn too: the syncers may still be writing.
            let spell = turns.begin();
            let stream = store_stream(tree, chunker, algo, &mut indexer, &mut writer)?;
            writer.seal()?;
            // `compress_wall` was measured inside the intervals summed here.
            stages.write = (busy + spell.end()).saturating_sub(writer.compress_wall);
            stages.compress = writer.compress_time;
            Ok(stream)
        });
        let bytes_new_stored = writer.bytes_stored;
        drop(writer);
        let mut written = Vec::new();
        let mut acked = BTreeSet::new();
        let mut first_error = None;
        for h in syncers {
            let (done, busy, err, acks) = join(h, "sync")?;
            written.extend(done);
            acked.extend(acks);
            stages.sync += busy;
            first_error = first_error.or(err);
        }
        // A syncer's error (a full disk) is the cause of the writer's "syncers stopped".
        if let Some(e) = first_error {
            return Err(e);
        }
        Ok((indexer, written, acked, tree_result?, bytes_new_stored))
    });
    let (indexer, written, acked, tree, bytes_new_stored) = outcome?;
    let Indexer {
        index,
        chunks,
        chunks_new,
        bytes_new,
        bytes_in,
        recipes,
        zero_chunk,
        ..
    } = indexer;
    repo.put_index(index);

    let commit_started = Instant::now();
    let container_bytes: u64 = written
        .iter()
        .map(|c| {
            c.entries
                .iter()
                .map(|e| u64::from(e.stored_len))
                .sum::<u64>()
                + (larder_store::CONTAINER_OVERHEAD + 48 * c.entries.len()) as u64
        })
        .sum();
    let segment_bytes = written
        .iter()
        .map(|c| 16 + 48 * c.entries.len() as u64)
        .sum::<u64>()
        + 56;
    let containers_written = written.len() as u64;
    // What the syncers could not acknowledge (the remote index failed them): again.
    let acknowledgements: Vec<(Fingerprint, ChunkLocation)> = match &opts.remote {
        Some(_) => written
            .iter()
            .filter(|c| !acked.contains(&c.id))
            .flat_map(|c| to_acknowledge(c, &zero_chunk))
            .collect(),
        None => Vec::new(),
    };
    repo.commit(written)?;
    if let Some(remote) = &opts.remote {
        // Durable now (rules 1 and 2): the cluster may hand these locations out. On a
        // failure the owners' locks expire and later copies are stored again; nothing
        // committed is lost.
        if let Err(e) = remote.acknowledge(&acknowledgements) {
            let w = Warning::error(
                repo.root(),
                format!("acknowledging new chunks to the cluster: {e}"),
            );
            opts.progress.warn(&w);
            warnings.lock().unwrap_or_else(|p| p.into_inner()).push(w);
        }
    }
    // The backup's lookups and the commit's inserts.
    let disk_index = repo
        .index()
        .disk_metrics()
        .zip(disk_before)
        .map(|(after, before)| disk_stage::metrics_since(&after, &before));

    let warnings = warnings.into_inner().unwrap_or_else(|p| p.into_inner());
    let count = |k: EntryKind| items.iter().filter(|i| i.entry.kind == k).count() as u64;
    let files_ok = items
        .iter()
        .zip(&recipes)
        .filter(|(i, r)| i.entry.kind == EntryKind::File && r.is_some())
        .count() as u64;
    let summary = SnapshotSummary {
        files: files_ok,
        dirs: count(EntryKind::Dir),
        symlinks: count(EntryKind::Symlink),
        bytes_in,
        bytes_new,
        chunks,
        chunks_new,
        errors: warnings.iter().filter(|w| w.is_error).count() as u64,
    };
    let snapshot = Snapshot {
        version: 1,
        time: rfc3339(SystemTime::now()),
        hostname: opts.hostname.clone(),
        username: opts.username.clone(),
        paths: paths
            .iter()
            .map(|p| {
                std::path::absolute(p)
                    .unwrap_or_else(|_| p.clone())
                    .display()
                    .to_string()
            })
            .collect(),
        tree: TreeRef {
            size: tree.size,
            chunks: tree.fps.iter().map(|f| f.to_hex()).collect(),
        },
        summary: summary.clone(),
    };
    let (snap_bytes, _) = snapshot.encode();
    let snapshot_id = repo.save_snapshot(&snapshot)?;
    stages.sync += commit_started.elapsed();
    Ok(BackupSummary {
        snapshot_id,
        files: summary.files,
        dirs: summary.dirs,
        symlinks: summary.symlinks,
        bytes_in,
        bytes_new,
        bytes_new_stored,
        bytes_stored: container_bytes + segment_bytes + snap_bytes.len() as u64,
        chunks,
        chunks_new,
        containers_written,
        excluded,
        elapsed: started.elapsed(),
        stages,
        warnings,
        disk_index,
    })
}

/// A stream stored by [`store_stream`]: its length and its chunks.
struct StoredStream {
    size: u64,
    fps: Vec<Fingerprint>,
}

/// Serializes the tree: every walked entry whose content was read completely.
fn build_tree(items: &[Item], recipes: &[Option<Vec<Fingerprint>>], sizes: &[u64]) -> Vec<u8> {
    let mut out = Vec::new();
    encode_tree_header(&mut out);
    for (i, item) in items.iter().enumerate() {
        if item.entry.kind == EntryKind::File {
            let Some(recipe) = &recipes[i] else { continue };
            let mut entry = item.entry.clone();
            entry.chunks = recipe.clone();
            entry.size = sizes[i];
            entry.encode(&mut out);
        } else {
            item.entry.encode(&mut out);
        }
    }
    out.push(0);
    out
}

/// Chunks, fingerprints, indexes and writes one in-memory stream, after the pipeline
/// has finished (new chunks are compressed on the compression threads all the same).
fn store_stream(
    data: Vec<u8>,
    chunker: &dyn Chunker,
    algo: HashAlgo,
    indexer: &mut Indexer,
    writer: &mut ContainerWriter<'_>,
) -> Result<StoredStream> {
    let lens = chunker.chunk_lengths(&data);
    let mut fps = Vec::with_capacity(lens.len());
    let mut start = 0;
    for &len in &lens {
        fps.push(algo.fingerprint(&data[start..start + len]));
        start += len;
    }
    let is_new = indexer.decide_now(&fps)?;
    let mut new = Vec::new();
    let mut start = 0;
    for ((&len, &fp), is_new) in lens.iter().zip(&fps).zip(is_new) {
        indexer.chunks += 1;
        if is_new {
            indexer.chunks_new += 1;
            indexer.bytes_new += len as u64;
            new.push(NewChunk {
                piece: 0,
                start,
                len,
                fp,
                compressed: None,
            });
        }
        start += len;
    }
    writer.store(&mut new, &[&data])?;
    Ok(StoredStream {
        size: data.len() as u64,
        fps,
    })
}
