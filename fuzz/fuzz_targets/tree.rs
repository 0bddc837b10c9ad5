//! Tree stream decoding must never panic, and every path it yields must be safe to join
//! onto a restore target.
#![no_main]
use larder_store::{is_safe_relative_path, TreeDecoder};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(decoder) = TreeDecoder::new(data) {
        for entry in decoder.flatten() {
            assert!(is_safe_relative_path(&entry.path));
        }
    }
});
