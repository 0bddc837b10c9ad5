//! Container parsing must reject or accept any bytes without panicking, and whatever it
//! accepts must have entries that lie inside the file.
#![no_main]
use larder_hash::HashAlgo;
use larder_store::ParsedContainer;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(c) = ParsedContainer::parse(data.to_vec(), 1, HashAlgo::Blake3) {
        for e in &c.entries {
            assert!(c.chunk(e.offset, e.stored_len).is_some());
        }
        let _ = c.verify_chunks(HashAlgo::Blake3);
    }
});
