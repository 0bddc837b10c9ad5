//! Decoding one stored chunk through the chunk codec: any stored bytes and any claimed
//! raw length give exactly that many verified bytes or an error, never a panic, and the
//! output is left alone on error. The first four input bytes are the raw length (taken
//! modulo 1 MiB); the rest are the stored bytes, decoded as zstd.
#![no_main]
use larder_hash::{Fingerprint, HashAlgo};
use larder_store::{ChunkCodec, ChunkEncoding, Compression, StoredChunk};
use libfuzzer_sys::fuzz_target;

const CODEC: ChunkCodec = ChunkCodec::new(Compression::None, HashAlgo::Blake3);

fuzz_target!(|data: &[u8]| {
    if data.len() < 4 {
        return;
    }
    let raw_len = u32::from_le_bytes([data[0], data[1], data[2], data[3]]) % (1 << 20);
    let chunk = StoredChunk {
        fingerprint: Fingerprint([0; 32]),
        encoding: ChunkEncoding::Zstd,
        bytes: &data[4..],
        seal: None,
    };
    let mut out = b"kept".to_vec();
    match CODEC.decode_into(chunk, raw_len, &mut out) {
        Ok(()) => assert_eq!(out.len(), 4 + raw_len as usize),
        Err(_) => assert_eq!(out, b"kept"),
    }
});
