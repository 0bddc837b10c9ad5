//! Snapshot decoding must never panic, whatever the bytes and the claimed id.
#![no_main]
use larder_store::Snapshot;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let id = blake3::hash(data).to_hex();
    let _ = Snapshot::decode(data, id.as_str());
    let _ = Snapshot::decode(data, "00");
});
