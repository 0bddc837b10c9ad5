//! Stage 3 with the disk index (docs/design/pipeline.md, "Stage 3 with the disk
//! index"): every fingerprint met for the first time in this backup is submitted to the
//! disk index; eager answers come at once, lazy ones late and out of order. Batches
//! wait here until every chunk of theirs is decided, and leave for stage 4 in stream
//! order.
//!
//! Exactness across copies is the engine's own: a fingerprint is submitted at most once
//! per backup. A later copy of one already answered `New` (in `new_chunks`) or still
//! unanswered (in `in_flight`) is decided at once: not new, since the first copy is
//! either stored by this backup or already in the repository. So the first copy in
//! stream order is the one stored, as with the memory index, and the disk index sees
//! no second copy; the fingerprints it answered `New` get their insert at the commit,
//! once their containers and segment are durable.
//!
//! Memory: a batch that cannot leave at once is held within the held share of
//! `--index-memory` ([`DiskState::held_chunk_bytes`]). When at most half of its bytes
//! are of chunks new or undecided it is compacted to those (each copied on its own,
//! dropped as soon as it is decided not new); otherwise it is held whole, its block
//! buffers counted in full (the copy would cost more than it frees). A batch that
//! would take stage 3 past the share makes it look everything buffered up first
//! (`finish`): measured faster than spooling the bytes to a file (docs/performance.md,
//! "Backups with the disk index").

use std::collections::{HashSet, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use crossbeam_channel::Receiver;
use larder_hash::Fingerprint;
use larder_index::disk::{Answer, DiskIndexMetrics, FingerprintHasher};
use larder_store::{DiskState, RepoDiskIndex, StoreError};

use super::gate::SerialGate;
use super::index_stage::{Indexer, NewChunk, PieceInfo, StageOut, WriteBatch};
use super::read_stage::{recycle, Batch, Piece};
use crate::error::{Result, Warning};
use crate::Progress;

/// Bytes of bookkeeping counted for each chunk of a compacted batch, whatever its
/// bytes: its fingerprint (32), its `Kept` (32) and decision (1), its length (4), its
/// entry in `in_flight` while undecided (about 40), the allocator's header of its kept
/// bytes (16). Counted, not measured; rounded up.
const HELD_CHUNK_COST: usize = 128;

/// What stage 3 knows of one chunk of a held batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Decision {
    Undecided,
    New,
    /// In the repository, or a later copy of a chunk met earlier in this backup.
    Old,
}

/// A held batch's bytes.
enum Data {
    /// As stage 2 sent it, block buffers and all.
    Whole(Vec<Piece>),
    /// Compacted: the pieces without their bytes, and each chunk's bytes by chunk
    /// number in the batch (`None` once the chunk is decided old).
    Compact {
        pieces: Vec<PieceInfo>,
        chunks: Vec<Option<Vec<u8>>>,
    },
}

/// A batch waiting for the answers of its chunks.
struct Held {
    data: Data,
    fps: Vec<Fingerprint>,
    /// Chunk `i` has token `first + i`.
    first: u64,
    decisions: Vec<Decision>,
    unresolved: usize,
    /// Whether it counts in `Waiting`'s `memory` and `bookkeeping` (every held batch
    /// but the one being taken in).
    placed: bool,
}

impl Held {
    /// The fingerprint of its first chunk still waiting for an answer.
    fn first_undecided(&self) -> Option<Fingerprint> {
        let i = self
            .decisions
            .iter()
            .position(|d| matches!(d, Decision::Undecided))?;
        Some(self.fps[i])
    }

    /// The bytes of its pieces.
    fn whole_bytes(&self) -> usize {
        match &self.data {
            Data::Whole(pieces) => pieces.iter().map(|p| p.data.len()).sum(),
            Data::Compact { pieces, .. } => pieces.iter().map(|p| p.len).sum(),
        }
    }

    /// The bytes of its chunks that are new or undecided.
    fn kept_bytes(&self) -> usize {
        let Data::Whole(pieces) = &self.data else {
            unreachable!("asked of a whole batch only")
        };
        let lens = pieces
            .iter()
            .flat_map(|p| p.lens.iter().map(|&l| l as usize));
        lens.zip(&self.decisions)
            .filter(|(_, d)| **d != Decision::Old)
            .map(|(l, _)| l)
            .sum()
    }

    fn new_flags(&self) -> Vec<bool> {
        self.decisions.iter().map(|d| *d == Decision::New).collect()
    }
}

/// The batches waiting, in stream order, and the fingerprints submitted and not
/// answered yet. Invariants: every fingerprint of `in_flight` was submitted with the
/// token of exactly one `Undecided` chunk of `held`, and every `Undecided` chunk's
/// fingerprint is in `in_flight`; only the back of `held` may be unplaced, and only
/// while it is taken in; in a `Compact` batch a chunk keeps no bytes exactly when it
/// is `Old`; `memory` is the bytes of the placed `Whole` batches plus the kept bytes
/// of the `Compact` ones, at most `limit - limit / 4`; `bookkeeping` is
/// [`HELD_CHUNK_COST`] times the chunks of placed batches, at most `limit / 4` (the
/// held share, `limit`, is split so).
struct Waiting {
    held: VecDeque<Held>,
    in_flight: HashSet<Fingerprint, FingerprintHasher>,
    next_token: u64,
    memory: usize,
    bookkeeping: usize,
    limit: usize,
    /// Block buffers freed by compaction, for stage 1.
    freed: Vec<Vec<u8>>,
}

impl Waiting {
    fn new(limit: usize) -> Self {
        Self {
            held: VecDeque::new(),
            in_flight: HashSet::with_hasher(FingerprintHasher),
            next_token: 0,
            memory: 0,
            bookkeeping: 0,
            limit,
            freed: Vec::new(),
        }
    }

    /// Takes in the next batch in stream order: decides what it can at once, submits
    /// the rest, takes in the answers, returns the batches now decided at the front
    /// (for stage 4, in stream order), and compacts the new batch if it waits.
    fn take(
        &mut self,
        indexer: &mut Indexer,
        index: &mut RepoDiskIndex,
        batch: Batch,
        progress: &dyn Progress,
        warnings: &Mutex<Vec<Warning>>,
    ) -> Result<Vec<WriteBatch>> {
        self.push(indexer, index, batch)?;
        self.collect(indexer, index);
        let mut ready = self.emit_ready(indexer, progress, warnings);
        if self.back_overflows() {
            self.make_room(indexer, index, progress, warnings, &mut ready)?;
        }
        if self.held.back().is_some_and(|h| !h.placed) {
            self.place_back();
        }
        Ok(ready)
    }

    /// Frees the held share for the batch just taken in: the oldest held batch's first
    /// undecided chunk has its lazy bucket looked up now (`hasten`, which answers the
    /// bucket's other fingerprints too), the decided batches at the front leave, and so
    /// on until the new batch fits. When that cannot free enough (the new batch is the
    /// only one held, or a lookup answered nothing: an eager index), everything
    /// buffered is looked up (`finish`) and every held batch leaves.
    fn make_room(
        &mut self,
        indexer: &mut Indexer,
        index: &mut RepoDiskIndex,
        progress: &dyn Progress,
        warnings: &Mutex<Vec<Warning>>,
        ready: &mut Vec<WriteBatch>,
    ) -> Result<()> {
        while self.back_overflows() {
            let oldest = self
                .held
                .front()
                .filter(|h| h.placed)
                .and_then(|h| h.first_undecided());
            let before = self.in_flight.len();
            if let Some(fp) = oldest {
                index.hasten(&fp).map_err(StoreError::from)?;
                self.collect(indexer, index);
            }
            if self.in_flight.len() == before {
                index.finish().map_err(StoreError::from)?;
                self.collect(indexer, index);
            }
            ready.extend(self.emit_ready(indexer, progress, warnings));
        }
        Ok(())
    }

    /// The decided batches at the front, in stream order, for stage 4.
    fn emit_ready(
        &mut self,
        indexer: &mut Indexer,
        progress: &dyn Progress,
        warnings: &Mutex<Vec<Warning>>,
    ) -> Vec<WriteBatch> {
        let mut ready = Vec::new();
        while let Some(held) = self.pop_ready() {
            ready.push(self.emit(indexer, held, progress, warnings));
        }
        ready
    }

    /// Decides what it can of `batch` at once and submits the rest.
    fn push(&mut self, indexer: &Indexer, index: &mut RepoDiskIndex, batch: Batch) -> Result<()> {
        let first = self.next_token;
        self.next_token += batch.fps.len() as u64;
        let mut decisions = vec![Decision::Old; batch.fps.len()];
        let mut unresolved = 0;
        for (i, fp) in batch.fps.iter().enumerate() {
            if indexer.new_chunks.contains(fp) || self.in_flight.contains(fp) {
                // A later copy: the first one is stored by this backup or indexed.
                continue;
            }
            index
                .submit(*fp, first + i as u64)
                .map_err(StoreError::from)?;
            self.in_flight.insert(*fp);
            decisions[i] = Decision::Undecided;
            unresolved += 1;
        }
        self.held.push_back(Held {
            data: Data::Whole(batch.pieces),
            fps: batch.fps,
            first,
            decisions,
            unresolved,
            placed: false,
        });
        Ok(())
    }

    /// Takes in every answer the index has, dropping the bytes of chunks answered not
    /// new.
    fn collect(&mut self, indexer: &mut Indexer, index: &mut RepoDiskIndex) {
        while let Some(r) = index.poll() {
            self.in_flight.remove(&r.fp);
            let at = self
                .held
                .partition_point(|h| h.first + h.decisions.len() as u64 <= r.token);
            let held = &mut self.held[at];
            let i = (r.token - held.first) as usize;
            held.unresolved -= 1;
            if r.answer == Answer::New {
                indexer.new_chunks.insert(r.fp);
                held.decisions[i] = Decision::New;
                continue;
            }
            held.decisions[i] = Decision::Old;
            if let Data::Compact { chunks, .. } = &mut held.data {
                let bytes = chunks[i]
                    .take()
                    .expect("an undecided chunk keeps its bytes");
                self.memory -= bytes.len();
            }
        }
    }

    /// Whether the unplaced batch at the back is compacted rather than held whole: when
    /// at most half of its bytes are kept.
    fn compacts(held: &Held) -> bool {
        2 * held.kept_bytes() <= held.whole_bytes()
    }

    /// Places the batch at the back, which the caller has made sure fits
    /// ([`Waiting::back_overflows`]): compacted, or counted whole.
    fn place_back(&mut self) {
        let Some(mut held) = self.held.pop_back() else {
            return;
        };
        debug_assert!(!held.placed);
        held.placed = true;
        self.bookkeeping += HELD_CHUNK_COST * held.decisions.len();
        if !Self::compacts(&held) {
            self.memory += held.whole_bytes();
        } else {
            self.compact(&mut held);
        }
        debug_assert!(self.memory <= self.limit - self.limit / 4);
        debug_assert!(self.bookkeeping <= self.limit / 4);
        self.held.push_back(held);
    }

    /// Keeps a copy of the bytes of `held`'s chunks that are new or undecided and
    /// frees its block buffers.
    fn compact(&mut self, held: &mut Held) {
        let Data::Whole(whole) = std::mem::replace(&mut held.data, Data::Whole(Vec::new())) else {
            unreachable!("compacted once")
        };
        let mut pieces = Vec::with_capacity(whole.len());
        let mut chunks = Vec::with_capacity(held.decisions.len());
        for piece in whole {
            let mut start = 0;
            for &len in &piece.lens {
                let bytes = &piece.data[start..start + len as usize];
                start += len as usize;
                chunks.push(if held.decisions[chunks.len()] == Decision::Old {
                    None
                } else {
                    self.memory += bytes.len();
                    Some(bytes.to_vec())
                });
            }
            pieces.push(PieceInfo {
                item: piece.item,
                lens: piece.lens,
                end: piece.end,
                len: piece.data.len(),
            });
            self.freed.push(piece.data);
        }
        held.data = Data::Compact { pieces, chunks };
    }

    /// Whether the unplaced batch at the back would take stage 3 past the held share
    /// if placed: its bytes (kept, or whole) past three quarters of it, or its chunks'
    /// bookkeeping past the last quarter.
    fn back_overflows(&self) -> bool {
        let Some(held) = self.held.back().filter(|h| !h.placed) else {
            return false;
        };
        let bytes = if Self::compacts(held) {
            held.kept_bytes()
        } else {
            held.whole_bytes()
        };
        self.memory + bytes > self.limit - self.limit / 4
            || self.bookkeeping + HELD_CHUNK_COST * held.decisions.len() > self.limit / 4
    }

    /// The decided batch at the front, if any.
    fn pop_ready(&mut self) -> Option<Held> {
        if self.held.front()?.unresolved > 0 {
            return None;
        }
        self.held.pop_front()
    }

    /// What stage 4 gets of a decided batch: its new chunks, each in its own buffer
    /// when the batch was compacted.
    fn emit(
        &mut self,
        indexer: &mut Indexer,
        held: Held,
        progress: &dyn Progress,
        warnings: &Mutex<Vec<Warning>>,
    ) -> WriteBatch {
        let new = held.new_flags();
        if held.placed {
            self.bookkeeping -= HELD_CHUNK_COST * held.decisions.len();
            if let Data::Whole(_) = held.data {
                self.memory -= held.whole_bytes();
            }
        }
        let (pieces, chunks) = match held.data {
            Data::Whole(pieces) => {
                let batch = Batch {
                    seq: 0,
                    pieces,
                    fps: held.fps,
                };
                return indexer.emit(batch, &new, progress, warnings);
            }
            Data::Compact { pieces, chunks } => (pieces, chunks),
        };
        let mut bytes = chunks;
        self.memory -= bytes.iter().flatten().map(Vec::len).sum::<usize>();
        let mut out = WriteBatch {
            buffers: Vec::new(),
            chunks: Vec::new(),
            seal: false,
        };
        let mut fps = held.fps.into_iter().zip(new).enumerate();
        for info in &pieces {
            indexer.account(info, &mut fps, progress, warnings, |i, _, len, fp| {
                out.chunks.push(NewChunk {
                    piece: out.buffers.len(),
                    start: 0,
                    len,
                    fp,
                    compressed: None,
                });
                out.buffers
                    .push(bytes[i].take().expect("a new chunk keeps its bytes"));
            });
        }
        out
    }
}

/// Runs stage 3 over the batches of `rx`, in stream order. On an error of the disk
/// index it stops: the batches it holds are dropped with the backup
/// (nothing was committed; containers already written are adopted by the next writer).
pub(super) fn run(
    indexer: &mut Indexer,
    state: &mut DiskState,
    rx: &Receiver<Batch>,
    out: &StageOut<'_>,
    gate: &SerialGate,
) -> Result<Duration> {
    let limit = usize::try_from(state.held_chunk_bytes()).unwrap_or(usize::MAX);
    let index = state.index_mut();
    let mut busy = Duration::ZERO;
    let mut reorder = std::collections::BTreeMap::new();
    let mut next = 0u64;
    let mut waiting = Waiting::new(limit);
    let result = (|| {
        for batch in rx {
            reorder.insert(batch.seq, batch);
            while let Some(batch) = reorder.remove(&next) {
                next += 1;
                let span = gate.begin();
                let ready = waiting.take(indexer, index, batch, out.progress, out.warnings)?;
                recycle(out.pool, waiting.freed.drain(..));
                busy += span.end();
                if !ready.into_iter().all(|w| out.send(w)) {
                    return Ok(());
                }
            }
        }
        // The end of the stream: everything still buffered is looked up and sent.
        let span = gate.begin();
        index.finish().map_err(StoreError::from)?;
        waiting.collect(indexer, index);
        let ready = waiting.emit_ready(indexer, out.progress, out.warnings);
        busy += span.end();
        for w in ready {
            if !out.send(w) {
                break;
            }
        }
        debug_assert!(waiting.held.is_empty() && waiting.in_flight.is_empty());
        Ok(())
    })();
    if result.is_err() {
        state.abandon();
    }
    result.map(|()| busy)
}

/// Decides the chunks of one stream at once (the tree, after the pipeline).
pub(super) fn decide_now(
    indexer: &mut Indexer,
    state: &mut DiskState,
    fps: &[Fingerprint],
) -> Result<Vec<bool>> {
    let index = state.index_mut();
    let mut waiting = Waiting::new(0);
    let batch = Batch {
        seq: 0,
        pieces: Vec::new(),
        fps: fps.to_vec(),
    };
    let result = waiting
        .push(indexer, index, batch)
        .and_then(|()| Ok(index.finish().map_err(StoreError::from)?));
    if let Err(e) = result {
        state.abandon();
        return Err(e);
    }
    waiting.collect(indexer, index);
    let held = waiting
        .pop_ready()
        .expect("finish answers every submitted fingerprint");
    Ok(held.new_flags())
}

/// The counters of a backup: `after` less `before` (the index's counters run from
/// the repository's open, which may have caught the index up).
pub(super) fn metrics_since(
    after: &DiskIndexMetrics,
    before: &DiskIndexMetrics,
) -> DiskIndexMetrics {
    let t = &after.time;
    let b = &before.time;
    DiskIndexMetrics {
        submitted: after.submitted - before.submitted,
        bloom_new: after.bloom_new - before.bloom_new,
        prelookups: after.prelookups - before.prelookups,
        prelookup_hits: after.prelookup_hits - before.prelookup_hits,
        insert_buffer_hits: after.insert_buffer_hits - before.insert_buffer_hits,
        waited: after.waited - before.waited,
        buffered: after.buffered - before.buffered,
        postlookups: after.postlookups - before.postlookups,
        postlookup_hits: after.postlookup_hits - before.postlookup_hits,
        disk_lookups: after.disk_lookups - before.disk_lookups,
        disk_found: after.disk_found - before.disk_found,
        bloom_false_positives: after.bloom_false_positives - before.bloom_false_positives,
        batches: after.batches - before.batches,
        lookup_ios: after.lookup_ios - before.lookup_ios,
        lookup_bytes: after.lookup_bytes - before.lookup_bytes,
        prefetches: after.prefetches - before.prefetches,
        prefetch_ios: after.prefetch_ios - before.prefetch_ios,
        prefetch_bytes: after.prefetch_bytes - before.prefetch_bytes,
        prefetched_records: after.prefetched_records - before.prefetched_records,
        merges: after.merges - before.merges,
        flushes: after.flushes - before.flushes,
        flush_reads: after.flush_reads - before.flush_reads,
        flush_writes: after.flush_writes - before.flush_writes,
        flush_bytes_written: after.flush_bytes_written - before.flush_bytes_written,
        time: larder_index::disk::ComponentTimes {
            bloom: t.bloom.saturating_sub(b.bloom),
            prelookup: t.prelookup.saturating_sub(b.prelookup),
            disk_lookup: t.disk_lookup.saturating_sub(b.disk_lookup),
            prefetch: t.prefetch.saturating_sub(b.prefetch),
            postlookup: t.postlookup.saturating_sub(b.postlookup),
            flush: t.flush.saturating_sub(b.flush),
            total: t.total.saturating_sub(b.total),
        },
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use larder_hash::HashAlgo;
    use larder_index::disk::{DiskIndex, DiskIndexConfig, IndexDir, Lookup};
    use larder_index::ChunkLocation;
    use proptest::prelude::*;

    use super::*;
    use crate::backup::read_stage::{FileEnd, PieceEnd};

    fn fp(i: u64) -> Fingerprint {
        HashAlgo::Blake3.fingerprint(&i.to_le_bytes())
    }

    /// An indexer of a backup of `items` walk items, none read yet.
    fn indexer(items: usize) -> Indexer {
        Indexer {
            new_chunks: HashSet::with_hasher(FingerprintHasher),
            remote: None,
            in_flight: HashSet::with_hasher(FingerprintHasher),
            zero_chunk: Fingerprint([0; 32]),
            recipes: vec![None; items],
            sizes: vec![0; items],
            chunks_new_by_item: vec![0; items],
            read_marks: Default::default(),
            chunks: 0,
            chunks_new: 0,
            bytes_new: 0,
            bytes_read: 0,
        }
    }

    /// A lazy index holding fingerprints `0..old`, reopened so that its cache is
    /// empty (old fingerprints wait in the buffer), with a Bloom filter of one page
    /// that passes some new ones (false positives, answered `New` after a disk lookup).
    fn lazy_index(dir: &std::path::Path, old: u64) -> RepoDiskIndex {
        lazy_index_with(dir, old, DiskIndexConfig::default().buffered_chunk_bytes)
    }

    /// `lazy_index`, its buffer reserving `buffered` bytes per fingerprint (0: one
    /// buffer bucket per table bucket, as a backup configures it).
    fn lazy_index_with(dir: &std::path::Path, old: u64, buffered: u64) -> RepoDiskIndex {
        let config = DiskIndexConfig {
            buffered_chunk_bytes: buffered,
            memory_budget: 1 << 20,
            expected_fingerprints: 2_000,
            bloom_target_rate: 0.5,
            bft: 4,
            prefetch: 16,
            ..DiskIndexConfig::default()
        };
        let mut index = DiskIndex::create(
            IndexDir::open(dir, None).unwrap(),
            config.clone(),
            Lookup::Lazy,
        )
        .unwrap();
        for i in 0..old {
            index.submit(fp(i), i).unwrap();
            index.finish().unwrap();
            while let Some(r) = index.poll() {
                assert_eq!(r.answer, Answer::New);
                let at = ChunkLocation {
                    container: 1 + r.token / 100,
                    offset: (r.token % 100) as u32,
                    length: 1,
                };
                index.insert(r.fp, at).unwrap();
            }
        }
        DiskIndex::open(index.close().unwrap(), config, Lookup::Lazy).unwrap()
    }

    /// Chunk `i`'s bytes: 1 to 3000 bytes that differ from every other chunk's.
    fn chunk_bytes(i: u64) -> Vec<u8> {
        let len = 1 + (i * 7_919 % 3_000) as usize;
        i.to_le_bytes().iter().copied().cycle().take(len).collect()
    }

    /// A batch of one piece (file `seq`, ending with it) holding chunks `ids`.
    fn batch(seq: u64, ids: &[u64]) -> Batch {
        let chunks: Vec<Vec<u8>> = ids.iter().map(|&i| chunk_bytes(i)).collect();
        let data: Vec<u8> = chunks.concat();
        Batch {
            seq,
            pieces: vec![Piece {
                item: seq as usize,
                lens: chunks.iter().map(|c| c.len() as u32).collect(),
                fps: Vec::new(),
                end: PieceEnd::Done(FileEnd::sized(data.len() as u64)),
                data,
            }],
            fps: ids.iter().map(|&i| fp(i)).collect(),
        }
    }

    /// The invariants of `Waiting` on bytes, between two batches: every held batch is
    /// placed; a compact chunk keeps no bytes exactly when it is `Old` (decided
    /// duplicates keep nothing); `memory` counts whole batches in full and compact
    /// ones' kept bytes, `bookkeeping` every held chunk, each within its part of the
    /// limit.
    fn check_bytes(w: &Waiting) -> std::result::Result<(), TestCaseError> {
        let mut memory = 0;
        let mut chunks_held = 0;
        for h in &w.held {
            prop_assert!(h.placed);
            chunks_held += h.decisions.len();
            match &h.data {
                Data::Whole(_) => memory += h.whole_bytes(),
                Data::Compact { chunks, .. } => {
                    for (k, d) in chunks.iter().zip(&h.decisions) {
                        prop_assert_eq!(k.is_none(), *d == Decision::Old);
                        memory += k.as_ref().map_or(0, Vec::len);
                    }
                }
            }
        }
        prop_assert_eq!(memory, w.memory);
        prop_assert_eq!(chunks_held * HELD_CHUNK_COST, w.bookkeeping);
        prop_assert!(w.memory <= w.limit - w.limit / 4);
        prop_assert!(w.bookkeeping <= w.limit / 4);
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]

        /// Whatever the stream (old and new fingerprints, repeated within and across
        /// batches while their first copy still waits in the lazy buffer) and the held
        /// share (none, so that every waiting batch makes stage 3 look everything up,
        /// to unbounded), stage 3's decisions are the in-memory oracle's: new exactly at
        /// the first copy of a fingerprint the index did not hold; batches leave in
        /// stream order; stage 4 gets each new chunk's bytes exactly; the bytes of
        /// chunks decided old are dropped at once; and what is held stays within the
        /// share.
        #[test]
        fn decisions_and_bytes_match_the_oracle(
            picks in proptest::collection::vec(0u64..6_000, 1..3_000),
            batch_len in 1usize..80,
            limit in prop_oneof![Just(0usize), 0usize..200_000, Just(usize::MAX)],
        ) {
            let dir = tempfile::tempdir().unwrap();
            let old = 3_000;
            let mut index = lazy_index(dir.path(), old);
            let batches = picks.chunks(batch_len).len();
            let mut indexer = indexer(batches);
            let mut waiting = Waiting::new(limit);
            let warnings = Mutex::new(Vec::new());
            let mut out: Vec<WriteBatch> = Vec::new();
            for (seq, part) in picks.chunks(batch_len).enumerate() {
                let b = batch(seq as u64, part);
                out.extend(waiting.take(&mut indexer, &mut index, b, &crate::NoProgress, &warnings).unwrap());
                check_bytes(&waiting)?;
            }
            index.finish().unwrap();
            waiting.collect(&mut indexer, &mut index);
            check_bytes(&waiting)?;
            out.extend(waiting.emit_ready(&mut indexer, &crate::NoProgress, &warnings));
            prop_assert!(waiting.held.is_empty() && waiting.in_flight.is_empty());
            prop_assert_eq!((waiting.memory, waiting.bookkeeping), (0, 0));
            // Stream order: each file's recipe, and the new chunks' bytes in order.
            for (seq, part) in picks.chunks(batch_len).enumerate() {
                let want: Vec<Fingerprint> = part.iter().map(|&i| fp(i)).collect();
                prop_assert_eq!(indexer.recipes[seq].as_ref(), Some(&want));
            }
            let mut seen = HashSet::new();
            let oracle: Vec<u64> = picks.iter().copied().filter(|&i| i >= old && seen.insert(i)).collect();
            let got_fps: Vec<Fingerprint> = out.iter().flat_map(|w| w.chunks.iter().map(|c| c.fp)).collect();
            prop_assert_eq!(got_fps, oracle.iter().map(|&i| fp(i)).collect::<Vec<_>>());
            let got_bytes: Vec<u8> = out
                .iter()
                .flat_map(|w| w.chunks.iter().flat_map(|c| w.buffers[c.piece][c.start..][..c.len].to_vec()))
                .collect();
            prop_assert_eq!(got_bytes, oracle.iter().flat_map(|&i| chunk_bytes(i)).collect::<Vec<u8>>());
            prop_assert_eq!(indexer.bytes_read, picks.iter().map(|&i| chunk_bytes(i).len() as u64).sum::<u64>());
            // Every `New` awaits its insert at the commit, once.
            prop_assert_eq!(index.awaiting_insert(), indexer.new_chunks.len());
            // The stream went through the buffer and the disk, and met false positives.
            let m = index.metrics();
            prop_assert!(m.buffered > 0 && m.batches > 0, "{m}");
            if picks.len() > 2_000 {
                prop_assert!(m.bloom_false_positives > 0, "{m}");
            }
        }
    }

    /// A waiting batch that is mostly decided old keeps only its new and undecided
    /// chunks' bytes, and drops a chunk's bytes at the answer that it is old; one that
    /// is mostly undecided is held whole, without a copy; a batch that would not fit
    /// in the held share makes stage 3 answer the held batches first; a batch decided at
    /// push leaves at once, block buffers and all.
    #[test]
    fn held_batches_keep_only_what_stage_4_may_need() {
        let dir = tempfile::tempdir().unwrap();
        let mut index = lazy_index(dir.path(), 3_000);
        let mut indexer = indexer(5);
        let mut waiting = Waiting::new(1 << 20);
        let warnings = Mutex::new(Vec::new());
        let progress = crate::NoProgress;
        let bytes_of = |ids: &mut dyn Iterator<Item = u64>| -> usize {
            ids.map(|i| chunk_bytes(i).len()).sum()
        };
        // Old chunks 0..40 (they wait in the buffer: the cache is cold), new 5000..5010,
        // and two later copies of each (decided old at once: no bytes kept).
        let first: Vec<u64> = (0..40).chain(5_000..5_010).collect();
        let ids: Vec<u64> = first
            .iter()
            .cycle()
            .take(3 * first.len())
            .copied()
            .collect();
        let out = waiting
            .take(
                &mut indexer,
                &mut index,
                batch(0, &ids),
                &progress,
                &warnings,
            )
            .unwrap();
        assert!(out.is_empty(), "old chunks wait");
        let kept = waiting.memory;
        assert!(kept > 0 && kept <= bytes_of(&mut first.iter().copied()));
        assert!(matches!(waiting.held[0].data, Data::Compact { .. }));
        assert_eq!(waiting.freed.len(), 1, "the block buffer is freed");
        // Every answer in: the old chunks' bytes are gone, the new ones' stay.
        index.finish().unwrap();
        waiting.collect(&mut indexer, &mut index);
        let new_bytes = bytes_of(&mut (5_000..5_010));
        assert_eq!(waiting.memory, new_bytes);
        let Data::Compact { chunks, .. } = &waiting.held[0].data else {
            panic!("compacted")
        };
        assert_eq!(chunks.iter().filter(|c| c.is_some()).count(), 10);
        let out = waiting.emit_ready(&mut indexer, &progress, &warnings);
        let got: Vec<Vec<u8>> = out[0]
            .chunks
            .iter()
            .map(|c| out[0].buffers[c.piece].clone())
            .collect();
        assert_eq!(got, (5_000..5_010).map(chunk_bytes).collect::<Vec<_>>());
        assert_eq!((waiting.memory, waiting.bookkeeping), (0, 0));
        // A batch of undecided chunks (too few to fill a buffer bucket) is held whole,
        // counted in full.
        let b = batch(1, &(2_000..2_006).collect::<Vec<_>>());
        let whole = b.pieces[0].data.len();
        let out = waiting
            .take(&mut indexer, &mut index, b, &progress, &warnings)
            .unwrap();
        assert!(out.is_empty());
        assert!(matches!(waiting.held[0].data, Data::Whole(_)));
        assert_eq!(waiting.memory, whole);
        assert_eq!(waiting.freed.len(), 1, "no block buffer freed");
        // Then one that does not fit beside it: everything is looked up, both leave.
        waiting.limit = waiting.memory + waiting.bookkeeping;
        let b = batch(2, &(2_100..2_106).collect::<Vec<_>>());
        let out = waiting
            .take(&mut indexer, &mut index, b, &progress, &warnings)
            .unwrap();
        assert_eq!(out.len(), 2);
        assert_eq!(
            out[0].buffers.len(),
            1,
            "the whole batch leaves with its buffer"
        );
        assert!(waiting.held.is_empty());
        assert_eq!((waiting.memory, waiting.bookkeeping), (0, 0));
        // Chunks now in the cache, or new: decided at push, the batch leaves whole.
        waiting
            .push(&indexer, &mut index, batch(3, &[5_000, 1]))
            .unwrap();
        waiting.collect(&mut indexer, &mut index);
        let held = waiting.pop_ready().expect("decided at once");
        assert!(matches!(held.data, Data::Whole(_)));
    }

    /// A batch that does not fit beside the held ones makes room by answering the
    /// oldest held batch first, one lazy bucket at a time (`hasten`), not the whole
    /// buffer: the next held batch keeps waiting.
    #[test]
    fn room_is_made_from_the_oldest_batch_first() {
        let dir = tempfile::tempdir().unwrap();
        let mut index = lazy_index_with(dir.path(), 3_000, 0);
        let mut indexer = indexer(3);
        let mut waiting = Waiting::new(1 << 20);
        let warnings = Mutex::new(Vec::new());
        let progress = crate::NoProgress;
        let ids = |from: u64| (from..from + 8).map(|i| i * 7).collect::<Vec<_>>();
        for (seq, from) in [(0, 0), (1, 200)] {
            let out = waiting
                .take(
                    &mut indexer,
                    &mut index,
                    batch(seq, &ids(from)),
                    &progress,
                    &warnings,
                )
                .unwrap();
            assert!(out.is_empty(), "old chunks wait in the buffer");
        }
        let first = &waiting.held[0];
        let (m0, k0) = (first.whole_bytes(), HELD_CHUNK_COST * first.decisions.len());
        let (m, k) = (waiting.memory, waiting.bookkeeping);
        let third = batch(2, &ids(400));
        let w2 = third.pieces[0].data.len();
        let n2 = HELD_CHUNK_COST * third.fps.len();
        // A limit the third batch overflows beside both, and fits beside the second.
        let limit = (1..1 << 20)
            .find(|&l: &usize| {
                let overflows = m + w2 > l - l / 4 || k + n2 > l / 4;
                let fits = m - m0 + w2 <= l - l / 4 && k - k0 + n2 <= l / 4;
                overflows && fits
            })
            .expect("such a limit");
        waiting.limit = limit;
        let out = waiting
            .take(&mut indexer, &mut index, third, &progress, &warnings)
            .unwrap();
        assert_eq!(out.len(), 1, "the oldest batch left");
        assert_eq!(waiting.held.len(), 2);
        assert!(
            waiting.held[0].unresolved > 0,
            "the second batch still waits"
        );
        assert!(index.unresolved() > 0, "the buffer was not emptied");
    }
}
