//! Decoding one stored chunk through the chunk codec: any stored bytes and any claimed
//! raw length give exactly that many verified bytes or an error, never a panic, and the
//! output is left alone on error. The first four input bytes `h` (little-endian) give
//! the raw length, `h` modulo 1 MiB; the rest are the stored bytes, decoded as zstd. With
//! bit 31 of `h` set the chunk is a compression unit's member at offset `k` = bits 20 to
//! 30 of `h`, in a unit of raw length + `k` bytes, and the stored bytes are the unit's.
#![no_main]
use larder_hash::{Fingerprint, HashAlgo};
use larder_store::{ChunkCodec, ChunkEncoding, Compression, StoredChunk, UnitPlace};
use libfuzzer_sys::fuzz_target;

const CODEC: ChunkCodec = ChunkCodec::new(Compression::None, HashAlgo::Blake3);

fuzz_target!(|data: &[u8]| {
    if data.len() < 4 {
        return;
    }
    let h = u32::from_le_bytes([data[0], data[1], data[2], data[3]]);
    let raw_len = h % (1 << 20);
    let k = (h >> 20) & 0x7ff;
    let encoding = if h >> 31 == 1 {
        ChunkEncoding::Member(UnitPlace {
            raw_offset: k,
            unit_len: raw_len + k,
            first: Fingerprint([1; 32]),
        })
    } else {
        ChunkEncoding::Zstd
    };
    let chunk = StoredChunk {
        fingerprint: Fingerprint([0; 32]),
        encoding,
        bytes: &data[4..],
        seal: None,
    };
    let mut out = b"kept".to_vec();
    match CODEC.decode_into(chunk, raw_len, &mut out) {
        Ok(()) => assert_eq!(out.len(), 4 + raw_len as usize),
        Err(_) => assert_eq!(out, b"kept"),
    }
});
