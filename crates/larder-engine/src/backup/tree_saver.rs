//! The tree saver: serializes the walked entries with their recipes into the tree
//! stream, and stores it through the same index and writer as file data, so that an
//! unchanged part of the tree deduplicates against earlier trees.

use larder_chunk::Chunker;
use larder_hash::Fingerprint;
use larder_store::{encode_tree_header, ChunkCodec, EntryKind, FileAsRead, RepoIndex};

use super::index_stage::{Indexer, NewChunk, ReadMarks};
use super::walk::Item;
use super::write_stage::ContainerWriter;
use crate::error::Result;

/// A stream stored by [`store_stream`]: its length, its chunks, and those of them
/// that were new (stored now).
pub(crate) struct StoredStream {
    pub size: u64,
    pub fps: Vec<Fingerprint>,
    pub new: Vec<Fingerprint>,
}

/// About what one entry takes in a tree stream, to size its buffer once.
const ENTRY_BYTES: usize = 320;

/// Serializes `items` (a prefix of the walk, in tree order): every entry but the
/// files without a recipe (not read yet, or failed). A file stage 1 read records its
/// size as read, and the flags and mark stage 1 found (`indexer.read_marks`), in place
/// of the walk's; a file not read, those of its entry.
pub(super) fn build_tree(items: &[Item], indexer: &Indexer) -> Vec<u8> {
    let mut out = Vec::with_capacity(ENTRY_BYTES * items.len());
    encode_tree_header(&mut out);
    for (i, item) in items.iter().enumerate() {
        if item.entry.kind == EntryKind::File {
            let Some(recipe) = &indexer.recipes[i] else {
                continue;
            };
            let marks = indexer.read_marks.get(&i).copied().unwrap_or(ReadMarks {
                attr_flags: item.entry.attr_flags,
                changed_while_read: item.entry.changed_while_read,
            });
            let read = FileAsRead {
                size: indexer.sizes[i],
                chunks: recipe,
                attr_flags: marks.attr_flags,
                changed_while_read: marks.changed_while_read,
            };
            item.entry.encode_as(&read, &mut out);
        } else {
            item.entry.encode(&mut out);
        }
    }
    out.push(0);
    out
}

/// Chunks, fingerprints, indexes and writes one in-memory stream after a round's
/// pipeline has finished (new chunks are compressed on the compression threads all
/// the same).
pub(super) fn store_stream(
    data: &[u8],
    chunker: &dyn Chunker,
    codec: &ChunkCodec,
    indexer: &mut Indexer,
    index: &mut RepoIndex,
    writer: &mut ContainerWriter<'_>,
) -> Result<StoredStream> {
    let lens = chunker.chunk_lengths(data);
    let mut fps = Vec::with_capacity(lens.len());
    let mut start = 0;
    for &len in &lens {
        fps.push(codec.fingerprint(&data[start..start + len]));
        start += len;
    }
    let is_new = indexer.decide_now(index, &fps)?;
    let mut new = Vec::new();
    let mut start = 0;
    for ((&len, &fp), is_new) in lens.iter().zip(&fps).zip(is_new) {
        if is_new {
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
    indexer.chunks_new += new.len() as u64;
    let stored = StoredStream {
        size: data.len() as u64,
        new: new.iter().map(|c| c.fp).collect(),
        fps,
    };
    writer.store(&new, &[data])?;
    Ok(stored)
}
