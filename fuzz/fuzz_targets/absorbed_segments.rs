//! Parsing the disk index's record of absorbed segments (`index/disk/segments`,
//! docs/design/format.md "Disk index") must refuse or accept any bytes without
//! panicking, and whatever it accepts must encode back to the same bytes but for the
//! checksum (which fuzzing builds do not check).
#![no_main]
use larder_store::AbsorbedSegments;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(record) = AbsorbedSegments::decode(data) {
        let again = record.encode();
        assert_eq!(again[..again.len() - 8], data[..data.len() - 8]);
        assert_eq!(AbsorbedSegments::decode(&again).ok(), Some(record));
    }
});
