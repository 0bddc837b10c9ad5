//! The re-chunking path: the destination fingerprints or cuts differently, so every
//! file of the snapshot is read back from the source and backed up into the
//! destination through the backup pipeline (`backup/round.rs`), with a stage 1 of its
//! own: it reads each file's recipe from the source, chunk by chunk (each decoded and
//! verified), and cuts the bytes with the destination's chunker. Small files are read
//! whole and cut in parallel across files; a large file streams block by block, as
//! stage 1 reads a large file from disk, so memory stays bounded whatever its size.
//! The round then stores a new tree stream: the source's entries, metadata unchanged,
//! with the new recipes.

use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use larder_hash::Fingerprint;
use larder_store::{error_chain, Compression, EntryKind, Repository, TreeEntry, TreeRef};
use rayon::prelude::*;

use super::Sent;
use crate::backup::{
    thread_count, thread_pool, Batch, BlockSource, BusySpan, FileEnd, Indexer, Item, Piece,
    PieceEnd, Pipeline, Reader, SerialGate, StageTimes, GROUP_BYTES, GROUP_FILES, SMALL_FILE,
};
use crate::error::{Result, Warning};
use crate::tree_io::ChunkReader;
use crate::Progress;

/// Cuts, fingerprints and stores every file of `entries` (a source snapshot's tree)
/// into `dst`, and stores the new tree stream. Nothing is committed here.
pub(super) fn send(
    src: &Repository,
    dst: &mut Repository,
    entries: Vec<TreeEntry>,
    threads: usize,
    progress: &dyn Progress,
) -> Result<Sent> {
    let items: Vec<Item> = entries
        .into_iter()
        .map(|entry| Item {
            // Names the file in warnings, which escape it when shown.
            abs: PathBuf::from(OsStr::from_bytes(&[b"/", entry.path.as_slice()].concat())),
            entry,
        })
        .collect();
    let files: Vec<usize> = (0..items.len())
        .filter(|&i| items[i].entry.kind == EntryKind::File)
        .collect();
    progress.set_total(files.iter().map(|&i| items[i].entry.size).sum());
    let threads = thread_count(threads);
    let chunker = dst.chunker();
    let warnings = Mutex::new(Vec::new());
    let pipeline = Pipeline {
        items: &items,
        chunker: chunker.as_ref(),
        codec: dst.codec(),
        threads,
        chunk_threads: thread_pool(threads, "larder-chunk")?,
        compress_threads: match dst.config().compression {
            Compression::None => None,
            Compression::Zstd { .. } => Some(thread_pool(threads, "larder-compress")?),
        },
        gate: SerialGate::new(false),
        progress,
        warnings: &warnings,
        remote: None,
        device: None,
    };
    let sizes = items.iter().map(|i| i.entry.size).collect();
    let mut indexer = Indexer::new(dst, sizes, vec![None; items.len()], None);
    let read = |reader: &Reader<'_, '_>| read_recipes(src, &items, &files, reader);
    let every_item = |_| items.len();
    let mut stages = StageTimes::default();
    let out = dst.lend_index(|dst, index| {
        pipeline.run_round(dst, &mut indexer, index, &read, &every_item, &mut stages)
    })?;
    drop(pipeline);
    let chunks = indexer.recipes.iter().flatten().map(|r| r.len() as u64);
    Ok(Sent {
        written: out.written,
        tree: TreeRef {
            size: out.tree.size,
            chunks: out.tree.fps.iter().map(Fingerprint::to_hex).collect(),
        },
        chunks: chunks.sum::<u64>() + out.tree.fps.len() as u64,
        chunks_sent: indexer.chunks_new,
        bytes_sent: indexer.bytes_new,
        bytes_stored: out.bytes_new_stored,
        bytes_rechunked: indexer.bytes_read,
        warnings: warnings.into_inner().unwrap_or_else(|p| p.into_inner()),
    })
}

/// Stage 1 of the copy: reads the recipes of `files` (indexes into `items`) from
/// `src` in order and sends them cut, in stream order. Returns the time worked and
/// how many files it took: all of them, unless the pipeline stopped.
fn read_recipes(
    src: &Repository,
    items: &[Item],
    files: &[usize],
    reader: &Reader<'_, '_>,
) -> (Duration, usize) {
    let mut chunks = ChunkReader::new(src);
    let mut busy = Duration::ZERO;
    let mut seq = 0u64;
    let mut send = |pieces: Vec<Piece>, span: BusySpan<'_>, busy: &mut Duration| -> bool {
        *busy += span.end();
        let batch = Batch {
            seq,
            pieces,
            fps: Vec::new(),
        };
        seq += 1;
        reader.tx.send(batch).is_ok()
    };
    let mut group: Vec<Piece> = Vec::new();
    let mut group_bytes = 0u64;
    for &item in files {
        let Item { abs, entry } = &items[item];
        if entry.size < SMALL_FILE {
            let span = reader.gate.begin();
            let piece = read_whole(&mut chunks, item, abs, &entry.chunks);
            group_bytes += piece.data.len() as u64;
            group.push(piece);
            if group.len() < GROUP_FILES && group_bytes < GROUP_BYTES {
                busy += span.end();
                continue;
            }
            group_bytes = 0;
            if !send(cut(reader, std::mem::take(&mut group)), span, &mut busy) {
                return (busy, files.len());
            }
            continue;
        }
        if !group.is_empty() {
            group_bytes = 0;
            let span = reader.gate.begin();
            if !send(cut(reader, std::mem::take(&mut group)), span, &mut busy) {
                return (busy, files.len());
            }
        }
        let span = reader.gate.begin();
        let mut stream = RecipeStream {
            chunks: &mut chunks,
            fps: &entry.chunks,
            chunk: Vec::new(),
            pos: 0,
        };
        let mut send_one = |piece, span, busy: &mut Duration| send(vec![piece], span, busy);
        if !reader.read_blocks(item, abs, &mut stream, None, span, &mut send_one, &mut busy) {
            return (busy, files.len());
        }
    }
    if !group.is_empty() {
        let span = reader.gate.begin();
        send(cut(reader, group), span, &mut busy);
    }
    (busy, files.len())
}

/// The bytes of a small file, read whole from its recipe; not cut yet.
fn read_whole(
    chunks: &mut ChunkReader<'_>,
    item: usize,
    path: &Path,
    fps: &[Fingerprint],
) -> Piece {
    let mut data = Vec::new();
    for fp in fps {
        if let Err(e) = chunks.read_into(fp, &mut data) {
            let w = Warning::error(
                path,
                format!("cannot read it from the source: {}", error_chain(&e)),
            );
            return Piece::failed(item, w);
        }
    }
    let size = data.len() as u64;
    Piece {
        item,
        data,
        lens: Vec::new(),
        fps: Vec::new(),
        end: PieceEnd::Done(FileEnd::sized(size)),
    }
}

/// Cuts the pieces of whole small files on stage 1's threads.
fn cut(reader: &Reader<'_, '_>, mut pieces: Vec<Piece>) -> Vec<Piece> {
    reader.threads.install(|| {
        pieces
            .par_iter_mut()
            .filter(|p| matches!(p.end, PieceEnd::Done { .. }))
            .for_each(|p| {
                p.lens = reader
                    .chunker
                    .chunk_lengths(&p.data)
                    .into_iter()
                    .map(|len| len as u32)
                    .collect();
            });
    });
    pieces
}

/// A file's bytes in the source, as a [`BlockSource`]: its recipe's chunks, read one
/// at a time, each decoded and verified.
struct RecipeStream<'c, 'r> {
    chunks: &'c mut ChunkReader<'r>,
    /// The chunks not read yet.
    fps: &'c [Fingerprint],
    /// The chunk being handed out, and how much of it has been.
    chunk: Vec<u8>,
    pos: usize,
}

impl BlockSource for RecipeStream<'_, '_> {
    fn read_append(&mut self, buf: &mut Vec<u8>, max: usize) -> io::Result<usize> {
        while self.pos == self.chunk.len() {
            let Some((fp, rest)) = self.fps.split_first() else {
                return Ok(0);
            };
            self.chunk.clear();
            self.pos = 0;
            self.chunks
                .read_into(fp, &mut self.chunk)
                .map_err(|e| io::Error::other(error_chain(&e)))?;
            self.fps = rest;
        }
        let n = max.min(self.chunk.len() - self.pos);
        buf.extend_from_slice(&self.chunk[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}
