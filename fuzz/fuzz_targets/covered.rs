//! Decoding a partition's `covered.json` (docs/design/cluster.md, "Shared storage
//! layout"), read back from shared storage at every takeover and checkpoint, must
//! refuse or accept any bytes without panicking, and whatever it accepts must encode
//! and decode back to itself.
#![no_main]
use larder_cluster::partitions::Covered;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(covered) = Covered::decode(data) {
        let again = covered.encode();
        assert_eq!(Covered::decode(&again).ok(), Some(covered));
    }
});
