//! Partition object decoding (a cluster partition's full or delta object on object
//! storage) must never panic, whatever the bytes; an object that decodes encodes back
//! to the same bytes, but for the trailing checksum, which fuzzing builds do not check
//! (docs/design/fuzzing.md). Read as a plaintext cluster's takeover reads it
//! (`PartitionObject::from_stored`), it opens exactly when it decodes and is the object
//! its name and partition say. (An encrypted cluster's objects are metadata envelopes,
//! the `envelope` target's.)
#![no_main]
use larder_store::PartitionObject;
use libfuzzer_sys::fuzz_target;

/// The trailing BLAKE3 checksum's length.
const SUM_LEN: usize = 32;
const NAME: &str = "0000000000000001-00000000.delta";

fuzz_target!(|data: &[u8]| {
    let decoded = PartitionObject::decode(data, NAME);
    if let Ok(object) = &decoded {
        let encoded = object.encode();
        assert_eq!(encoded.len(), data.len());
        let body = data.len() - SUM_LEN;
        assert_eq!(encoded[..body], data[..body]);
    }
    for partition in [0, 1] {
        let stored = PartitionObject::from_stored(data, partition, NAME, None);
        let expected = decoded.as_ref().ok().filter(|o| {
            o.partition == partition && o.name() == NAME
        });
        assert_eq!(stored.ok().as_ref(), expected);
    }
});
