//! The fast path: the destination fingerprints and cuts as the source does, so a
//! snapshot's chunks keep their fingerprints and its tree stream and recipes are used
//! as they are. The chunks the destination lacks are read from the source container
//! by container (each container once); each chunk is decoded and verified, and
//! compressed for the destination (or its source frame kept, when both compress
//! alike), in one parallel pass, then sealed into the destination's containers.

use std::collections::BTreeMap;

use crossbeam_channel::bounded;
use larder_hash::Fingerprint;
use larder_index::ChunkLocation;
use larder_store::{
    stored_form, ChunkEncoding, Repository, SegmentContainer, StoreError, TreeEntry, TreeRef,
};
use rayon::prelude::*;

use super::Sent;
use crate::backup::{
    collect, spawn_syncers, thread_count, thread_pool, ContainerWriter, Indexer, NewChunk,
    SerialGate, StageTimes, SYNC_THREADS,
};
use crate::error::Result;
use crate::Progress;

/// Fingerprints decided against the destination's index at a time: bounds what a
/// disk index holds waiting for its answers.
const DECIDE_BATCH: usize = 1 << 16;

/// What one source container gives: its id and the missing chunks it holds.
type ContainerChunks = (u64, Vec<(ChunkLocation, Fingerprint)>);

/// Sends the chunks of the snapshot whose tree is `tree` (its entries `entries`)
/// that `dst` lacks. Nothing is committed here.
pub(super) fn send(
    src: &Repository,
    dst: &mut Repository,
    tree: &TreeRef,
    entries: &[TreeEntry],
    threads: usize,
    progress: &dyn Progress,
) -> Result<Sent> {
    let tree_fps = tree.fingerprints()?;
    let reached = tree_fps
        .iter()
        .chain(entries.iter().flat_map(|e| &e.chunks));
    let threads = thread_pool(thread_count(threads), "larder-copy")?;
    dst.lend_index(|dst, index| {
        // Rule 4 of the commit order: only what the destination's index lacks, each
        // chunk once (the indexer's new chunks answer later copies of it).
        let mut indexer = Indexer::new(dst, Vec::new(), Vec::new(), None);
        let mut missing = Vec::new();
        let mut batch = Vec::with_capacity(DECIDE_BATCH);
        let mut chunks = 0;
        let mut decide = |batch: &mut Vec<Fingerprint>| -> Result<()> {
            let new = indexer.decide_now(index, batch)?;
            let decided = batch.drain(..).zip(new);
            missing.extend(decided.filter(|(_, new)| *new).map(|(fp, _)| fp));
            Ok(())
        };
        for fp in reached {
            chunks += 1;
            batch.push(*fp);
            if batch.len() == DECIDE_BATCH {
                decide(&mut batch)?;
            }
        }
        decide(&mut batch)?;
        let by_container = locate(src, &missing)?;
        let bytes: u64 = by_container
            .iter()
            .flat_map(|(_, chunks)| chunks)
            .map(|(loc, _)| u64::from(loc.length))
            .sum();
        progress.set_total(bytes);
        let (written, bytes_sent, bytes_stored) =
            write_chunks(src, dst, by_container, &threads, progress)?;
        Ok(Sent {
            written,
            tree: tree.clone(),
            chunks,
            chunks_sent: missing.len() as u64,
            bytes_sent,
            bytes_stored,
            bytes_rechunked: 0,
            warnings: Vec::new(),
        })
    })
}

/// Where the source holds each of `fps`, grouped by container in ascending order,
/// each container's chunks in file order.
fn locate(src: &Repository, fps: &[Fingerprint]) -> Result<Vec<ContainerChunks>> {
    let mut by_container: BTreeMap<u64, Vec<(ChunkLocation, Fingerprint)>> = BTreeMap::new();
    for part in fps.chunks(DECIDE_BATCH) {
        for (fp, loc) in part.iter().zip(src.index().get_batch(part)?) {
            let loc = loc.ok_or(StoreError::MissingChunk(*fp))?;
            by_container
                .entry(loc.container)
                .or_default()
                .push((loc, *fp));
        }
    }
    for chunks in by_container.values_mut() {
        chunks.sort_by_key(|(loc, _)| loc.offset);
    }
    Ok(by_container.into_iter().collect())
}

/// Reads each container of `by_container` from `src` once, decodes and verifies the
/// chunks named and compresses them for `dst` on `threads` (one pass per chunk), and
/// writes them into `dst`'s containers, durably. Returns the containers written, the
/// chunks' raw bytes and what the containers hold for them.
fn write_chunks(
    src: &Repository,
    dst: &Repository,
    by_container: Vec<ContainerChunks>,
    threads: &rayon::ThreadPool,
    progress: &dyn Progress,
) -> Result<(Vec<SegmentContainer>, u64, u64)> {
    let gate = SerialGate::new(false);
    std::thread::scope(|s| {
        let (sync_tx, sync_rx) = bounded(SYNC_THREADS);
        let (reuse_tx, reuse_rx) = bounded(SYNC_THREADS);
        // No remote index: the zero chunk is never asked about.
        let syncers = spawn_syncers(
            s,
            dst.backend(),
            sync_rx,
            reuse_tx,
            &gate,
            None,
            Fingerprint::default(),
        );
        let max_chunk = dst.config().chunker.max_chunk_size();
        // The chunks come compressed already, and the writer only places and seals
        // them, unless the destination compresses in units: then the writer makes them.
        let units = dst.config().compression.unit_chunks() > 1;
        let compress = units.then_some(threads);
        let mut writer = ContainerWriter::new(dst, compress, max_chunk, sync_tx, reuse_rx);
        let mut raw = 0;
        let result = by_container.into_iter().try_for_each(|(id, chunks)| {
            let stored: u64 = chunks.iter().map(|(loc, _)| u64::from(loc.length)).sum();
            let (new, data) = recode(src, dst, id, &chunks, threads)?;
            raw += data.iter().map(|d| d.len() as u64).sum::<u64>();
            progress.advance(stored);
            let data: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
            writer.store(&new, &data)
        });
        let result = result.and_then(|()| writer.seal());
        let stored = writer.bytes_stored;
        // Closing the syncers' queue: they finish what they hold and stop.
        drop(writer);
        let (written, _, _) = collect(syncers, &mut StageTimes::default())?;
        result.map(|()| (written, raw, stored))
    })
}

/// The `chunks` of source container `id`, decoded and verified, and compressed as
/// `dst` compresses (their source frames, when both compress alike), in parallel on
/// `threads`: the chunks for the writer (chunk `i` is piece `i`) and their raw bytes.
fn recode(
    src: &Repository,
    dst: &Repository,
    id: u64,
    chunks: &[(ChunkLocation, Fingerprint)],
    threads: &rayon::ThreadPool,
) -> Result<(Vec<NewChunk>, Vec<Vec<u8>>)> {
    let container = src.load_container(id)?;
    let (from, to) = (src.codec(), dst.codec());
    // The same compression makes the same frames: the source's are kept, not remade.
    // A destination with compression units makes its units in the writer.
    let same_frames = src.config().compression == dst.config().compression;
    let in_units = dst.config().compression.unit_chunks() > 1;
    let one = |piece: usize, &(loc, fp): &(ChunkLocation, Fingerprint)| -> Result<_> {
        let i = container
            .position(loc.offset, &fp)
            .filter(|&i| container.entries[i].stored_len == loc.length)
            .ok_or_else(|| StoreError::Corrupt {
                what: "container",
                name: format!("{id:016x}"),
                reason: format!("chunk {fp} is not in its table"),
            })?;
        let mut raw = Vec::new();
        container.read_chunk(&container.entries[i], &from, &mut raw)?;
        let compressed = match (in_units, same_frames, stored_form(&container.entries, i)) {
            (true, _, _) => None,
            (false, true, Some((ChunkEncoding::Zstd, _))) => {
                let mut frame = Vec::new();
                container.encoded_chunk(i, &mut frame)?;
                Some(frame)
            }
            (false, true, Some((ChunkEncoding::Raw, _))) => None,
            (false, _, _) => to.compress(&raw)?,
        };
        let chunk = NewChunk {
            piece,
            start: 0,
            len: raw.len(),
            fp,
            compressed,
        };
        Ok((chunk, raw))
    };
    threads
        .install(|| {
            chunks
                .par_iter()
                .enumerate()
                .map(|(piece, c)| one(piece, c))
                .collect::<Result<Vec<_>>>()
        })
        .map(|decoded| decoded.into_iter().unzip())
}
