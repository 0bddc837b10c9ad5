//! Container parsing must reject or accept any bytes without panicking; whatever it
//! accepts must have entries that lie inside the file, and decoding any of its chunks
//! must give exactly the entry's raw length, verified, or an error.
#![no_main]
use larder_hash::HashAlgo;
use larder_store::{ChunkCodec, Compression, ParsedContainer};
use libfuzzer_sys::fuzz_target;

const CODEC: ChunkCodec = ChunkCodec::new(Compression::None, HashAlgo::Blake3);

fuzz_target!(|data: &[u8]| {
    if let Ok(c) = ParsedContainer::parse(data.to_vec(), 1, HashAlgo::Blake3) {
        for e in &c.entries {
            assert!(c.chunk(e.offset, e.stored_len).is_some());
            let mut out = Vec::new();
            if c.read_chunk(e, &CODEC, &mut out).is_ok() {
                assert_eq!(out.len(), e.raw_len as usize);
            } else {
                assert!(out.is_empty());
            }
        }
        let _ = c.verify_chunks(&CODEC);
    }
});
