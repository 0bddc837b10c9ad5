//! Index segment decoding must never panic, whatever the bytes.
#![no_main]
use larder_hash::HashAlgo;
use larder_store::decode_segment;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = decode_segment(data, "fuzz", HashAlgo::Blake3);
});
