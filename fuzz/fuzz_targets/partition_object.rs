//! Partition object decoding (a cluster partition's full or delta object on object
//! storage) must never panic, whatever the bytes; an object that decodes encodes back
//! to the same bytes.
#![no_main]
use larder_store::PartitionObject;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(object) = PartitionObject::decode(data, "0000000000000001-00000000.delta") {
        assert_eq!(object.encode(), data);
    }
});
