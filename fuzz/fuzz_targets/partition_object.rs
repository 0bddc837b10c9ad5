//! Partition object decoding (a cluster partition's full or delta object on object
//! storage) must never panic, whatever the bytes; an object that decodes encodes back
//! to the same bytes, but for the trailing checksum, which fuzzing builds do not check
//! (docs/design/fuzzing.md).
#![no_main]
use larder_store::PartitionObject;
use libfuzzer_sys::fuzz_target;

/// The trailing BLAKE3 checksum's length.
const SUM_LEN: usize = 32;

fuzz_target!(|data: &[u8]| {
    if let Ok(object) = PartitionObject::decode(data, "0000000000000001-00000000.delta") {
        let encoded = object.encode();
        assert_eq!(encoded.len(), data.len());
        let body = data.len() - SUM_LEN;
        assert_eq!(encoded[..body], data[..body]);
    }
});
