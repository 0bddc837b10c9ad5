//! Containers written into a cluster's shared storage the way a node's stage 4
//! writes them, for tests of acknowledgement and replay.

use larder_cluster::ids::first_container;
use larder_cluster::partitions::node_dir;
use larder_cluster::NodeId;
use larder_hash::{Fingerprint, HashAlgo};
use larder_index::ChunkLocation;
use larder_store::{Backend, ChunkCodec, Compression, ContainerBuilder, FileKind, LocalBackend};

/// The chunk numbered `i`: 128 bytes of it.
pub fn chunk(i: u64) -> Vec<u8> {
    i.to_le_bytes().repeat(16)
}

pub fn chunk_fp(i: u64) -> Fingerprint {
    HashAlgo::Blake3.fingerprint(&chunk(i))
}

/// Writes container `seq` of `node` holding chunks `ids` into the shared directory, and
/// returns where each chunk is.
pub fn write_container(
    root: &std::path::Path,
    node: NodeId,
    seq: u64,
    ids: std::ops::Range<u64>,
) -> Vec<(Fingerprint, ChunkLocation)> {
    for sub in ["containers", "tmp"] {
        std::fs::create_dir_all(node_dir(root, node).join(sub)).unwrap();
    }
    write_container_to(&LocalBackend::new(node_dir(root, node)), node, seq, ids)
}

/// Writes container `seq` of `node` holding chunks `ids` through `backend` (the node's
/// repository), and returns where each chunk is.
pub fn write_container_to(
    backend: &dyn Backend,
    node: NodeId,
    seq: u64,
    ids: std::ops::Range<u64>,
) -> Vec<(Fingerprint, ChunkLocation)> {
    let codec = ChunkCodec::new(Compression::None, HashAlgo::Blake3);
    write_container_with(backend, &codec, node, seq, ids)
}

/// Like [`write_container_to`], as a repository with `codec` writes it: sealed, its
/// chunks named by keyed fingerprints, when the codec is an encrypted repository's.
pub fn write_container_with(
    backend: &dyn Backend,
    codec: &ChunkCodec,
    node: NodeId,
    seq: u64,
    ids: std::ops::Range<u64>,
) -> Vec<(Fingerprint, ChunkLocation)> {
    let id = first_container(node) + seq;
    let mut builder = ContainerBuilder::for_codec(id, codec, 1 << 16, 1 << 20);
    let mut out = Vec::new();
    for i in ids {
        let data = chunk(i);
        let fp = codec.fingerprint(&data);
        let entry = builder.push(fp, &data);
        out.push((
            fp,
            ChunkLocation {
                container: id,
                offset: entry.offset,
                length: entry.stored_len,
            },
        ));
    }
    let (bytes, _) = builder.seal();
    backend
        .write(FileKind::Container, &format!("{id:016x}"), &bytes)
        .unwrap();
    out
}
