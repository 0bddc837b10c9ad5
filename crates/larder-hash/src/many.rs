//! BLAKE3 of many messages at once: the SIMD lanes that `blake3::hash` fills with the
//! 1 KiB chunks of one long input are filled here with the chunks of many short ones.
//!
//! A chunk of 8 KiB on average holds 8 BLAKE3 chunks, so hashing chunks one at a time
//! leaves lanes idle for every message whose length is not a multiple of the SIMD
//! degree times 1 KiB, and its parent nodes (4, then 2, then 1) fill a vector less and
//! less. BLAKE3's tree (the spec, section 2.1) makes every compression of one message
//! independent of every other message's, so this module batches them across messages:
//!
//! - **Full chunks.** Chunk `j` of every message that has a full chunk `j`, in one
//!   `hash_many` call: all share the counter `j`. A message longer than one chunk is
//!   never its own root chunk, so no chunk in these calls carries `ROOT`.
//! - **The partial last chunk** of each message (1 to 1023 bytes): compressed block by
//!   block, as `blake3::Hasher` does.
//! - **Parents, level by level.** Within each message, pairs of nodes from the left,
//!   an odd last node carried up unchanged: this gives BLAKE3's tree, whose left
//!   subtree always holds the largest power of two of chunks below the total. Each
//!   level of all messages is one `hash_many` call; the pair that leaves a message one
//!   node is its root, in a second call with `ROOT`.
//! - **Messages of at most 1 KiB** are a single root chunk: `blake3::hash`.
//!
//! The compression functions and their SIMD kernels are the `blake3` crate's own,
//! through its `platform` module (hidden from its docs and outside its semver
//! promise; the workspace pins `blake3` to 1.8.x for it). Only the tree mode is
//! composed here. `tests/many.rs` checks every length class against `blake3::hash`
//! and `blake3::keyed_hash`, on the detected platform and on the portable one.

use blake3::platform::Platform;
use blake3::{IncrementCounter, BLOCK_LEN, CHUNK_LEN, OUT_LEN};
use zeroize::Zeroize;

/// BLAKE3's initial chaining value, the key of unkeyed hashing (the spec, table 1).
const IV: [u32; 8] = [
    0x6A09E667, 0xBB67AE85, 0x3C6EF372, 0xA54FF53A, 0x510E527F, 0x9B05688C, 0x1F83D9AB, 0x5BE0CD19,
];

// Domain flags (the spec, table 3).
const CHUNK_START: u8 = 1 << 0;
const CHUNK_END: u8 = 1 << 1;
const PARENT: u8 = 1 << 2;
const ROOT: u8 = 1 << 3;
const KEYED_HASH: u8 = 1 << 4;

type Cv = [u8; OUT_LEN];

/// Hashes batches of messages with BLAKE3, unkeyed or keyed; the result for each
/// message equals `blake3::hash` (or `blake3::keyed_hash`) of it. A key is wiped when
/// the batch is dropped.
#[derive(Clone)]
pub struct Blake3Batch {
    platform: Platform,
    key: Option<[u8; 32]>,
    /// The key as words: [`IV`] when unkeyed.
    key_words: [u32; 8],
}

impl std::fmt::Debug for Blake3Batch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key.
        f.debug_struct("Blake3Batch")
            .field("keyed", &self.key.is_some())
            .finish_non_exhaustive()
    }
}

/// Where one message longer than a chunk keeps its nodes in the shared list.
#[derive(Clone, Copy)]
struct Tree {
    /// Index of the message (and of its result).
    message: usize,
    /// First of its nodes in the node list.
    start: usize,
    /// Nodes at the current level.
    nodes: usize,
}

impl Blake3Batch {
    /// Unkeyed BLAKE3, on the best SIMD the machine has.
    pub fn new() -> Self {
        Self::with(None, Platform::detect())
    }

    /// Keyed BLAKE3 (`blake3::keyed_hash`).
    pub fn keyed(key: &[u8; 32]) -> Self {
        Self::with(Some(*key), Platform::detect())
    }

    /// The same hashing on the portable compression function: the twin the SIMD
    /// kernels are checked against.
    pub fn portable(mut self) -> Self {
        self.platform = Platform::portable();
        self
    }

    fn with(key: Option<[u8; 32]>, platform: Platform) -> Self {
        let key_words = key.map_or(IV, |k| {
            std::array::from_fn(|i| u32::from_le_bytes(k[4 * i..4 * i + 4].try_into().unwrap()))
        });
        Self {
            platform,
            key,
            key_words,
        }
    }

    /// The flags every compression carries: [`KEYED_HASH`] when keyed.
    fn flags(&self) -> u8 {
        if self.key.is_some() {
            KEYED_HASH
        } else {
            0
        }
    }

    /// The hash of every message, in order.
    pub fn hash(&self, messages: &[&[u8]]) -> Vec<Cv> {
        let mut out = vec![[0u8; OUT_LEN]; messages.len()];
        let mut trees = Vec::new();
        let mut total_nodes = 0;
        for (message, data) in messages.iter().enumerate() {
            if data.len() <= CHUNK_LEN {
                out[message] = self.single_chunk(data);
            } else {
                let nodes = data.len().div_ceil(CHUNK_LEN);
                trees.push(Tree {
                    message,
                    start: total_nodes,
                    nodes,
                });
                total_nodes += nodes;
            }
        }
        let mut nodes = vec![[0u8; OUT_LEN]; total_nodes];
        self.full_chunks(messages, &trees, &mut nodes);
        for tree in &trees {
            let data = messages[tree.message];
            if !data.len().is_multiple_of(CHUNK_LEN) {
                let last = tree.nodes - 1;
                nodes[tree.start + last] = self.last_chunk(&data[last * CHUNK_LEN..], last as u64);
            }
        }
        self.parents(trees, &mut nodes, &mut out);
        out
    }

    /// A message of at most one chunk is its own root.
    fn single_chunk(&self, data: &[u8]) -> Cv {
        match &self.key {
            Some(key) => *blake3::keyed_hash(key, data).as_bytes(),
            None => *blake3::hash(data).as_bytes(),
        }
    }

    /// The chaining values of every full chunk, chunk index by chunk index.
    fn full_chunks(&self, messages: &[&[u8]], trees: &[Tree], nodes: &mut [Cv]) {
        let most = trees
            .iter()
            .map(|t| messages[t.message].len() / CHUNK_LEN)
            .max()
            .unwrap_or(0);
        let mut inputs: Vec<&[u8; CHUNK_LEN]> = Vec::with_capacity(trees.len());
        let mut targets = Vec::with_capacity(trees.len());
        let mut cvs = Vec::new();
        for index in 0..most {
            inputs.clear();
            targets.clear();
            let range = index * CHUNK_LEN..(index + 1) * CHUNK_LEN;
            for tree in trees {
                if let Some(chunk) = messages[tree.message].get(range.clone()) {
                    inputs.push(chunk.try_into().expect("a range of CHUNK_LEN bytes"));
                    targets.push(tree.start + index);
                }
            }
            cvs.resize(inputs.len() * OUT_LEN, 0);
            self.platform.hash_many(
                &inputs,
                &self.key_words,
                index as u64,
                IncrementCounter::No,
                self.flags(),
                CHUNK_START,
                CHUNK_END,
                &mut cvs,
            );
            for (&target, cv) in targets.iter().zip(cvs.chunks_exact(OUT_LEN)) {
                nodes[target].copy_from_slice(cv);
            }
        }
    }

    /// The chaining value of the last chunk of a message longer than one chunk:
    /// `tail` holds 1 to `CHUNK_LEN - 1` bytes.
    fn last_chunk(&self, tail: &[u8], counter: u64) -> Cv {
        let mut cv = self.key_words;
        let blocks = tail.chunks(BLOCK_LEN);
        let count = blocks.len();
        for (i, piece) in blocks.enumerate() {
            let mut block = [0u8; BLOCK_LEN];
            block[..piece.len()].copy_from_slice(piece);
            let mut flags = self.flags();
            if i == 0 {
                flags |= CHUNK_START;
            }
            if i + 1 == count {
                flags |= CHUNK_END;
            }
            self.platform
                .compress_in_place(&mut cv, &block, piece.len() as u8, counter, flags);
        }
        let mut out = [0u8; OUT_LEN];
        for (bytes, word) in out.chunks_exact_mut(4).zip(cv) {
            bytes.copy_from_slice(&word.to_le_bytes());
        }
        out
    }

    /// Reduces every tree to its root, one level of all trees at a time, and writes
    /// the roots to `out`.
    fn parents(&self, mut trees: Vec<Tree>, nodes: &mut [Cv], out: &mut [Cv]) {
        let mut inner = Vec::new();
        let mut roots = Vec::new();
        let mut cvs = Vec::new();
        while !trees.is_empty() {
            inner.clear();
            roots.clear();
            for tree in &trees {
                let pairs = nodes[tree.start..tree.start + tree.nodes].chunks_exact(2);
                let blocks = pairs.map(|pair| {
                    let mut block = [0u8; BLOCK_LEN];
                    block[..OUT_LEN].copy_from_slice(&pair[0]);
                    block[OUT_LEN..].copy_from_slice(&pair[1]);
                    block
                });
                match tree.nodes {
                    2 => roots.extend(blocks),
                    _ => inner.extend(blocks),
                }
            }
            self.compress_parents(&roots, ROOT, &mut cvs);
            let finished = trees.iter().filter(|t| t.nodes == 2);
            for (tree, root) in finished.zip(cvs.chunks_exact(OUT_LEN)) {
                out[tree.message].copy_from_slice(root);
            }
            self.compress_parents(&inner, 0, &mut cvs);
            let mut next = cvs.chunks_exact(OUT_LEN);
            trees.retain_mut(|tree| {
                if tree.nodes == 2 {
                    return false;
                }
                let level = &mut nodes[tree.start..tree.start + tree.nodes];
                for node in &mut level[..tree.nodes / 2] {
                    node.copy_from_slice(next.next().expect("one parent a pair"));
                }
                if tree.nodes % 2 == 1 {
                    level[tree.nodes / 2] = level[tree.nodes - 1];
                }
                tree.nodes = tree.nodes.div_ceil(2);
                true
            });
        }
    }

    /// Parent nodes from their 64-byte blocks, `extra` (`ROOT` or 0) on each.
    fn compress_parents(&self, blocks: &[[u8; BLOCK_LEN]], extra: u8, cvs: &mut Vec<u8>) {
        let inputs: Vec<&[u8; BLOCK_LEN]> = blocks.iter().collect();
        cvs.resize(inputs.len() * OUT_LEN, 0);
        self.platform.hash_many(
            &inputs,
            &self.key_words,
            0,
            IncrementCounter::No,
            self.flags() | PARENT,
            0,
            extra,
            cvs,
        );
    }
}

impl Drop for Blake3Batch {
    fn drop(&mut self) {
        self.key.zeroize();
        self.key_words.zeroize();
    }
}

impl Default for Blake3Batch {
    fn default() -> Self {
        Self::new()
    }
}
