//! Stage 3: puts batches back in stream order, looks every fingerprint up, marks new
//! chunks and builds the files' recipes. This module holds the memory index's stage
//! and what both index kinds share; `disk_stage` holds the disk index's.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender};
use larder_hash::Fingerprint;
use larder_index::disk::FingerprintHasher;
use larder_index::{ChunkLocation, CuckooIndex, FingerprintIndex};
use larder_store::{RepoIndex, Repository};

use super::disk_stage;
use super::gate::SerialGate;
use super::read_stage::{recycle, Batch, PieceEnd};
use super::remote::{RemoteAnswers, RemoteIndex, RemoteLookup};
use super::{lock, remote_stage};
use crate::error::{EngineError, Result, Warning};
use crate::Progress;

/// What stage 3 keeps of a piece besides its bytes.
pub(super) struct PieceInfo {
    pub item: usize,
    pub lens: Vec<u32>,
    pub end: PieceEnd,
    /// The piece's length in bytes.
    pub len: usize,
}

/// What stage 1 found of a file, besides its bytes, that its tree entry records.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct ReadMarks {
    pub attr_flags: u32,
    pub changed_while_read: bool,
}

/// A chunk stage 3 found new, at `data[start..start + len]` of piece `piece`.
pub(crate) struct NewChunk {
    pub piece: usize,
    pub start: usize,
    pub len: usize,
    pub fp: Fingerprint,
    /// The chunk's zstd frame, when compression made it shorter; set in stage 4.
    pub compressed: Option<Vec<u8>>,
}

/// What [`Indexer::ask`] decided of a batch without the remote index.
pub(super) struct Asked {
    /// Whether each chunk is new, as far as decided.
    pub new: Vec<bool>,
    /// The positions of the chunks asked of the remote index, in order.
    pub ask: Vec<usize>,
}

/// New chunks for stage 4, in stream order; `NewChunk::piece` indexes `buffers`.
pub(super) struct WriteBatch {
    pub buffers: Vec<Vec<u8>>,
    pub chunks: Vec<NewChunk>,
    /// Seal the open container once these chunks are in it: a backup waiting long on a
    /// remote index has its new chunks written and acknowledged (`remote_stage`).
    pub seal: bool,
}

/// Stage 3's state for the whole backup: this round's new chunks, and every file's
/// recipe.
pub(crate) struct Indexer {
    /// Fingerprints this round has sent to be written. They enter the repository's
    /// index with their locations at the round's commit
    /// ([`larder_store::Repository::commit`]): a location is known only once stage 4
    /// has placed the chunk by its compressed size. Fingerprints are uniform, so
    /// their first bytes hash them (no SipHash).
    pub new_chunks: HashSet<Fingerprint, FingerprintHasher>,
    /// A cluster's index, asked about what neither the index nor `new_chunks` holds.
    pub remote: Option<Arc<dyn RemoteIndex>>,
    /// Fingerprints in a lookup of `remote` whose answers are not applied yet.
    pub in_flight: HashSet<Fingerprint, FingerprintHasher>,
    /// The zero chunk (a chunk of the chunker's largest size, all zeros), which long
    /// runs of zeros cut into over and over: with a remote index it is decided here
    /// alone and never asked nor acknowledged (the dedup-cluster paper's special
    /// case), so each repository stores it once and no request carries it.
    pub zero_chunk: Fingerprint,
    /// Per walk item: its recipe, once read (or reused) completely; `None` for
    /// entries that are not files, files not read yet, and files that failed.
    pub recipes: Vec<Option<Vec<Fingerprint>>>,
    /// Per walk item: the size of the file as read.
    pub sizes: Vec<u64>,
    /// Per walk item: how many of the chunks this backup stored were first met in it
    /// (a subset of its recipe's), so that a snapshot counts as new only the chunks it
    /// holds ([`super::BackupSummary::chunks_new`]).
    pub chunks_new_by_item: Vec<u64>,
    /// The files read to their end with attribute flags, or that changed while they
    /// were read, by walk item: what their entries record besides size and recipe.
    /// Sparse, as few files have either.
    pub read_marks: HashMap<usize, ReadMarks>,
    pub chunks: u64,
    /// Every chunk stored so far: file data, failed files' and every round's tree.
    pub chunks_new: u64,
    pub bytes_new: u64,
    /// Bytes of file content read.
    pub bytes_read: u64,
}

impl Indexer {
    /// The indexer of a backup into `repo` whose walk items have `sizes` and the
    /// `recipes` reused so far (`None` for the rest), with no chunk decided yet.
    pub fn new(
        repo: &Repository,
        sizes: Vec<u64>,
        recipes: Vec<Option<Vec<Fingerprint>>>,
        remote: Option<Arc<dyn RemoteIndex>>,
    ) -> Self {
        Self {
            new_chunks: HashSet::with_hasher(FingerprintHasher),
            remote,
            in_flight: HashSet::with_hasher(FingerprintHasher),
            zero_chunk: super::round::zero_chunk(
                &repo.codec(),
                repo.config().chunker.max_chunk_size(),
            ),
            recipes,
            chunks_new_by_item: vec![0; sizes.len()],
            sizes,
            read_marks: HashMap::new(),
            chunks: 0,
            chunks_new: 0,
            bytes_new: 0,
            bytes_read: 0,
        }
    }

    /// Whether each of `fps` is new: neither in the repository (`index`) nor met
    /// earlier in this round (rule 4 of the commit order: written once), nor, in a
    /// cluster, stored by another node (asked in one request for the batch).
    pub fn decide(&mut self, index: &CuckooIndex, fps: &[Fingerprint]) -> Result<Vec<bool>> {
        let Some(remote) = self.remote.clone() else {
            // One batch lookup for all chunks: it overlaps the cache misses of the lookups.
            let known = index.get_batch(fps);
            return Ok(fps
                .iter()
                .zip(known)
                .map(|(fp, known)| known.is_none() && self.new_chunks.insert(*fp))
                .collect());
        };
        let (asked, lookup) = self.ask(index, remote.as_ref(), fps);
        self.answered(fps, asked, lookup.wait())
    }

    /// Decides what it can of `fps` without the remote index, and sends it the lookup
    /// of the rest: the fingerprints neither in the repository (`index`) nor met
    /// earlier in this round, nor the zero chunk, each once. A fingerprint is in one
    /// lookup in flight at most: a later copy of one in flight is decided not new at
    /// once (its first copy is either stored by this backup or stored already), and
    /// asking it again would wait on the lock its first copy took for this backup.
    pub(super) fn ask(
        &mut self,
        index: &CuckooIndex,
        remote: &dyn RemoteIndex,
        fps: &[Fingerprint],
    ) -> (Asked, RemoteLookup) {
        // One batch lookup for all chunks: it overlaps the cache misses of the lookups.
        let known = index.get_batch(fps);
        let mut asked = Asked {
            new: vec![false; fps.len()],
            ask: Vec::new(),
        };
        for (i, (fp, known)) in fps.iter().zip(known).enumerate() {
            if known.is_some() || self.new_chunks.contains(fp) {
                continue;
            }
            if *fp == self.zero_chunk {
                asked.new[i] = self.new_chunks.insert(*fp);
            } else if self.in_flight.insert(*fp) {
                asked.ask.push(i);
            }
        }
        if asked.ask.is_empty() {
            return (asked, RemoteLookup::answered(Ok(Vec::new())));
        }
        let lookup = remote.lookup(asked.ask.iter().map(|&i| fps[i]).collect());
        (asked, lookup)
    }

    /// Completes the decisions of `fps` with the remote index's `answers` to what
    /// [`Indexer::ask`] asked: a fingerprint it answered `None` for is new.
    pub(super) fn answered(
        &mut self,
        fps: &[Fingerprint],
        asked: Asked,
        answers: RemoteAnswers,
    ) -> Result<Vec<bool>> {
        for &i in &asked.ask {
            self.in_flight.remove(&fps[i]);
        }
        let answers = answers?;
        if answers.len() != asked.ask.len() {
            return Err(EngineError::Remote {
                message: format!(
                    "{} answers to {} fingerprints",
                    answers.len(),
                    asked.ask.len()
                ),
                retryable: false,
            });
        }
        let mut new = asked.new;
        for (&i, answer) in asked.ask.iter().zip(answers) {
            new[i] = answer.is_none() && self.new_chunks.insert(fps[i]);
        }
        Ok(new)
    }

    /// Whether each chunk of a stream stored after the pipeline (the tree) is new.
    pub fn decide_now(&mut self, index: &mut RepoIndex, fps: &[Fingerprint]) -> Result<Vec<bool>> {
        match index {
            RepoIndex::Memory(index) => self.decide(index, fps),
            RepoIndex::Disk(state) => disk_stage::decide_now(
                self,
                state
                    .get_mut()
                    .unwrap_or_else(|poisoned| poisoned.into_inner()),
                fps,
            ),
        }
    }

    /// Counts the chunks of `batch`, `new[i]` telling whether its `i`-th chunk is new,
    /// builds the recipes, and hands the new chunks on to stage 4.
    pub(super) fn emit(
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
        WriteBatch {
            buffers,
            chunks,
            seal: false,
        }
    }

    /// Counts the chunks of one piece, taking their fingerprints and whether each is
    /// new from `fps` (numbered within the batch), extends the file's recipe, notes
    /// the file's end or failure, and calls `new_chunk(number, start, len, fp)` for
    /// each new chunk (`start` within the piece).
    pub(super) fn account(
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
                self.chunks_new_by_item[piece.item] += 1;
                self.bytes_new += len as u64;
                new_chunk(i, start, len, fp);
            }
            self.recipes[piece.item]
                .get_or_insert_with(Vec::new)
                .push(fp);
            start += len;
        }
        self.bytes_read += piece.len as u64;
        progress.advance(piece.len as u64);
        match &piece.end {
            PieceEnd::More => {}
            PieceEnd::Done(end) => {
                self.sizes[piece.item] = end.size;
                let marks = ReadMarks {
                    attr_flags: end.attr_flags.unwrap_or(0),
                    changed_while_read: end.changed.is_some(),
                };
                if marks != ReadMarks::default() {
                    self.read_marks.insert(piece.item, marks);
                }
                if let Some(w) = &end.changed {
                    progress.warn(w);
                    lock(warnings).push(w.clone());
                }
            }
            PieceEnd::Failed(w) => {
                self.recipes[piece.item] = None;
                progress.warn(w);
                lock(warnings).push(w.clone());
            }
        }
    }
}

/// Where stage 3 sends what it found.
pub(super) struct StageOut<'a> {
    pub tx: &'a Sender<WriteBatch>,
    pub pool: &'a Sender<Vec<u8>>,
    pub progress: &'a dyn Progress,
    pub warnings: &'a Mutex<Vec<Warning>>,
}

impl StageOut<'_> {
    /// Sends what [`Indexer::emit`] made of a batch to stage 4 (or its buffers back to
    /// stage 1 when it holds no new chunk); `false` once stage 4 has stopped. Called
    /// outside a busy span: it may wait on the queue.
    pub fn send(&self, out: WriteBatch) -> bool {
        if out.chunks.is_empty() {
            recycle(self.pool, out.buffers);
            true
        } else {
            self.tx.send(out).is_ok()
        }
    }

    /// Asks stage 4 to seal its open container after the chunks sent so far; `false`
    /// once stage 4 has stopped. Called outside a busy span, as `send`.
    pub fn seal(&self) -> bool {
        let seal = WriteBatch {
            buffers: Vec::new(),
            chunks: Vec::new(),
            seal: true,
        };
        self.tx.send(seal).is_ok()
    }
}

/// Runs stage 3 over the batches of `rx` with the repository's index.
pub(super) fn run(
    indexer: &mut Indexer,
    index: &mut RepoIndex,
    rx: &Receiver<Batch>,
    out: &StageOut<'_>,
    gate: &SerialGate,
) -> Result<Duration> {
    match index {
        RepoIndex::Memory(index) => match indexer.remote.clone() {
            Some(remote) => remote_stage::run(indexer, index, remote.as_ref(), rx, out, gate),
            None => memory_stage(indexer, index, rx, out, gate),
        },
        RepoIndex::Disk(state) => {
            let disk = state
                .get_mut()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            disk_stage::run(indexer, disk, rx, out, gate)
        }
    }
}

/// Stage 3 with the memory index: restores stream order, then decides each batch at
/// once.
fn memory_stage(
    indexer: &mut Indexer,
    index: &CuckooIndex,
    rx: &Receiver<Batch>,
    out: &StageOut<'_>,
    gate: &SerialGate,
) -> Result<Duration> {
    let mut busy = Duration::ZERO;
    let mut waiting = BTreeMap::new();
    let mut next = 0u64;
    for batch in rx {
        waiting.insert(batch.seq, batch);
        while let Some(batch) = waiting.remove(&next) {
            next += 1;
            let span = gate.begin();
            let new = indexer.decide(index, &batch.fps)?;
            let write = indexer.emit(batch, &new, out.progress, out.warnings);
            busy += span.end();
            if !out.send(write) {
                return Ok(busy);
            }
        }
    }
    Ok(busy)
}

/// What a remote index is told of a written container: where its chunks are, all but
/// the zero chunk, which each repository keeps to itself ([`Indexer::zero_chunk`]).
pub(super) fn to_acknowledge(
    c: &larder_store::SegmentContainer,
    zero_chunk: &Fingerprint,
) -> Vec<(Fingerprint, ChunkLocation)> {
    c.locations().filter(|(fp, _)| fp != zero_chunk).collect()
}
