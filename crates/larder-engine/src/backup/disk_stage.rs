//! Stage 3 with the disk index (docs/design/pipeline.md, "Stage 3 with the disk
//! index"): every fingerprint met for the first time in this backup is submitted to the
//! disk index; eager answers come at once, lazy ones late and out of order. Batches
//! wait here, with their chunk data, until every chunk of theirs is decided, and leave
//! for stage 4 in stream order.
//!
//! Exactness across copies is the engine's own: a fingerprint is submitted at most once
//! per backup. A later copy of one already answered `New` (in `new_chunks`) or still
//! unanswered (in `in_flight`) is decided at once: not new, since the first copy is
//! either stored by this backup or already in the repository. So the first copy in
//! stream order is the one stored, as with the memory index, and the disk index sees
//! no second copy; the fingerprints it answered `New` get their insert at the commit,
//! once their containers and segment are durable.

use std::collections::{HashSet, VecDeque};
use std::time::Duration;

use crossbeam_channel::Receiver;
use larder_hash::Fingerprint;
use larder_index::disk::{Answer, DiskIndexMetrics, FingerprintHasher};
use larder_store::{DiskState, RepoDiskIndex, StoreError};

use super::{Batch, Indexer, StageOut, Turns, WriteBatch, BLOCK};
use crate::error::Result;

/// A batch waiting for the answers of its chunks.
struct Held {
    batch: Batch,
    /// The token of its first chunk: chunk `i` is token `first + i`.
    first: u64,
    new: Vec<bool>,
    unresolved: usize,
    bytes: usize,
}

/// The batches waiting, in stream order, and the fingerprints submitted and not
/// answered yet. Invariant: every fingerprint of `in_flight` was submitted with the
/// token of exactly one unresolved chunk of `held`, and every unresolved chunk's
/// fingerprint is in `in_flight`.
struct Waiting {
    held: VecDeque<Held>,
    in_flight: HashSet<Fingerprint, FingerprintHasher>,
    next_token: u64,
    bytes: usize,
}

impl Waiting {
    fn new() -> Self {
        Self {
            held: VecDeque::new(),
            in_flight: HashSet::with_hasher(FingerprintHasher),
            next_token: 0,
            bytes: 0,
        }
    }

    /// Decides what it can of `batch` at once and submits the rest.
    fn push(&mut self, indexer: &Indexer, index: &mut RepoDiskIndex, batch: Batch) -> Result<()> {
        let first = self.next_token;
        self.next_token += batch.fps.len() as u64;
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
            unresolved += 1;
        }
        let bytes = batch.pieces.iter().map(|p| p.data.len()).sum();
        self.bytes += bytes;
        self.held.push_back(Held {
            new: vec![false; batch.fps.len()],
            batch,
            first,
            unresolved,
            bytes,
        });
        Ok(())
    }

    /// Takes in every answer the index has.
    fn collect(&mut self, indexer: &mut Indexer, index: &mut RepoDiskIndex) {
        while let Some(r) = index.poll() {
            self.in_flight.remove(&r.fp);
            let at = self
                .held
                .partition_point(|h| h.first + h.new.len() as u64 <= r.token);
            let held = &mut self.held[at];
            if r.answer == Answer::New {
                indexer.new_chunks.insert(r.fp);
                held.new[(r.token - held.first) as usize] = true;
            }
            held.unresolved -= 1;
        }
    }

    /// The decided batches at the front, in stream order.
    fn pop_ready(&mut self) -> Option<Held> {
        if self.held.front()?.unresolved > 0 {
            return None;
        }
        let held = self.held.pop_front()?;
        self.bytes -= held.bytes;
        Some(held)
    }
}

/// Chunk bytes stage 3 may hold while lazy answers are outstanding: the lazy buffer's
/// share of the budget (its buckets times BFT chunks of the average size), and at
/// least two batches so that it makes progress. Past it, everything is looked up.
fn held_limit(index: &RepoDiskIndex) -> usize {
    let config = index.config();
    let share = index.buckets().1 * config.bft as u64 * config.buffered_chunk_bytes;
    (share as usize).max(2 * BLOCK)
}

/// Runs stage 3 over the batches of `rx`, in stream order. On an error of the disk
/// index it stops: the batches it holds are dropped with the backup (nothing was
/// committed; containers already written are adopted by the next writer).
pub(super) fn run(
    indexer: &mut Indexer,
    state: &mut DiskState,
    rx: &Receiver<Batch>,
    out: &StageOut<'_>,
    turns: &Turns,
) -> Result<Duration> {
    let index = state.index_mut();
    let limit = held_limit(index);
    let mut busy = Duration::ZERO;
    let mut reorder = std::collections::BTreeMap::new();
    let mut next = 0u64;
    let mut waiting = Waiting::new();
    let result = (|| {
        for batch in rx {
            reorder.insert(batch.seq, batch);
            while let Some(batch) = reorder.remove(&next) {
                next += 1;
                let spell = turns.begin();
                waiting.push(indexer, index, batch)?;
                waiting.collect(indexer, index);
                if waiting.bytes > limit {
                    index.finish().map_err(StoreError::from)?;
                    waiting.collect(indexer, index);
                }
                let ready = emit_ready(indexer, &mut waiting, out);
                busy += spell.end();
                if !ready.into_iter().all(|w| out.send(w)) {
                    return Ok(());
                }
            }
        }
        // The end of the stream: everything still buffered is looked up and sent.
        let spell = turns.begin();
        index.finish().map_err(StoreError::from)?;
        waiting.collect(indexer, index);
        let ready = emit_ready(indexer, &mut waiting, out);
        busy += spell.end();
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

/// Emits the decided batches at the front, in stream order, for sending once the
/// spell has ended.
fn emit_ready(indexer: &mut Indexer, waiting: &mut Waiting, out: &StageOut<'_>) -> Vec<WriteBatch> {
    let mut ready = Vec::new();
    while let Some(held) = waiting.pop_ready() {
        ready.push(indexer.emit(held.batch, &held.new, out.progress, out.warnings));
    }
    ready
}

/// Decides the chunks of one stream at once (the tree, after the pipeline).
pub(super) fn decide_now(
    indexer: &mut Indexer,
    state: &mut DiskState,
    fps: &[Fingerprint],
) -> Result<Vec<bool>> {
    let index = state.index_mut();
    let mut waiting = Waiting::new();
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
    Ok(held.new)
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
    use larder_index::disk::{DirIo, DiskIndex, DiskIndexConfig, Lookup};
    use larder_index::ChunkLocation;
    use proptest::prelude::*;

    use super::*;

    fn fp(i: u64) -> Fingerprint {
        HashAlgo::Blake3.fingerprint(&i.to_le_bytes())
    }

    fn indexer() -> Indexer {
        Indexer {
            index: larder_store::RepoIndex::default(),
            new_chunks: HashSet::new(),
            recipes: Vec::new(),
            sizes: Vec::new(),
            chunks: 0,
            chunks_new: 0,
            bytes_new: 0,
            bytes_in: 0,
        }
    }

    /// A lazy index holding fingerprints `0..old`, reopened so that its cache is
    /// empty (old fingerprints wait in the buffer), with a Bloom filter of one page
    /// that passes some new ones (false positives, answered `New` after a disk lookup).
    fn lazy_index(dir: &std::path::Path, old: u64) -> RepoDiskIndex {
        let config = DiskIndexConfig {
            memory_budget: 1 << 20,
            expected_fingerprints: 2_000,
            bloom_target_rate: 0.5,
            bft: 4,
            prefetch: 16,
            ..DiskIndexConfig::default()
        };
        let mut index = DiskIndex::create(
            DirIo::open(dir, false).unwrap(),
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

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]

        /// Whatever the stream (old and new fingerprints, repeated within and across
        /// batches while their first copy still waits in the lazy buffer), stage 3's
        /// decisions are the in-memory oracle's: new exactly at the first copy of a
        /// fingerprint the index did not hold, and batches leave in stream order.
        #[test]
        fn decisions_match_the_oracle(
            picks in proptest::collection::vec(0u64..6_000, 1..3_000),
            batch in 1usize..80,
        ) {
            let dir = tempfile::tempdir().unwrap();
            let old = 3_000;
            let mut index = lazy_index(dir.path(), old);
            let mut indexer = indexer();
            let mut waiting = Waiting::new();
            let mut decided: Vec<(u64, Vec<bool>)> = Vec::new();
            for (seq, part) in picks.chunks(batch).enumerate() {
                let b = Batch {
                    seq: seq as u64,
                    pieces: Vec::new(),
                    fps: part.iter().map(|&i| fp(i)).collect(),
                };
                waiting.push(&indexer, &mut index, b).unwrap();
                waiting.collect(&mut indexer, &mut index);
                while let Some(h) = waiting.pop_ready() {
                    decided.push((h.batch.seq, h.new));
                }
            }
            index.finish().unwrap();
            waiting.collect(&mut indexer, &mut index);
            while let Some(h) = waiting.pop_ready() {
                decided.push((h.batch.seq, h.new));
            }
            prop_assert!(waiting.held.is_empty() && waiting.in_flight.is_empty());
            let seqs: Vec<u64> = decided.iter().map(|d| d.0).collect();
            prop_assert_eq!(seqs, (0..picks.chunks(batch).len() as u64).collect::<Vec<_>>());
            let mut seen = HashSet::new();
            let oracle: Vec<bool> = picks.iter().map(|&i| i >= old && seen.insert(i)).collect();
            let got: Vec<bool> = decided.into_iter().flat_map(|d| d.1).collect();
            prop_assert_eq!(got, oracle);
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
}
