//! Restore reads a container in pieces: footer, table, header (`TableLocation` and
//! `parse_container_table`), then chunk ranges. On any bytes that must not panic, and
//! must accept exactly what the whole-file parse accepts, with the same entries.
#![no_main]
use larder_hash::HashAlgo;
use larder_store::{
    parse_container_table, ParsedContainer, TableLocation, CONTAINER_HEADER_LEN,
    CONTAINER_TAIL_LEN,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let split = TableLocation::parse(
        &data[data.len().saturating_sub(CONTAINER_TAIL_LEN)..],
        data.len() as u64,
        1,
    )
    .and_then(|loc| {
        parse_container_table(
            &data[..CONTAINER_HEADER_LEN],
            &data[loc.table_offset as usize..],
            loc,
            1,
            HashAlgo::Blake3,
        )
    });
    let whole = ParsedContainer::parse(data.to_vec(), 1, HashAlgo::Blake3).map(|c| c.entries);
    match (split, whole) {
        (Ok(a), Ok(b)) => assert_eq!(a, b),
        (Err(_), Err(_)) => {}
        (a, b) => panic!("split parse {:?} but whole parse {:?}", a.is_ok(), b.is_ok()),
    }
});
