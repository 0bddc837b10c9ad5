//! Decoding one stored chunk: any stored bytes and any claimed raw length give exactly
//! that many bytes or an error, never a panic, and the output is left alone on error.
//! The first four input bytes are the raw length (taken modulo 1 MiB); the rest are
//! the stored bytes, decoded as zstd.
#![no_main]
use larder_store::{ChunkDecoder, ChunkEncoding};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() < 4 {
        return;
    }
    let raw_len = u32::from_le_bytes([data[0], data[1], data[2], data[3]]) % (1 << 20);
    let mut out = b"kept".to_vec();
    match ChunkDecoder::new().decode_into(ChunkEncoding::Zstd, &data[4..], raw_len, &mut out) {
        Ok(()) => assert_eq!(out.len(), 4 + raw_len as usize),
        Err(_) => assert_eq!(out, b"kept"),
    }
});
