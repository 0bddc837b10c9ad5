//! Opening a disk index's sealed build header, pages and `held` record
//! (docs/design/crypto.md, "Disk index pages") from any bytes with a fixed key must
//! fail or succeed without panicking, and a full and a write-only key must agree.
//! Input: file code (1 byte), page number (u64), the 112-byte build header, then a
//! sealed page (or a `held` envelope). The key is the one `larder-crypto`'s
//! tests/fuzz_seeds.rs seals the seeds with.
#![no_main]
use larder_crypto::index_page::{INDEX_HEADER_LEN, PAGE_OVERHEAD};
use larder_crypto::IndexPart;

use libfuzzer_sys::fuzz_target;

#[path = "common/keys.rs"]
mod keys;
use keys::fuzz_keys;

fuzz_target!(|data: &[u8]| {
    if data.len() < 9 + INDEX_HEADER_LEN {
        return;
    }
    let Some(part) = IndexPart::from_code(data[0]) else {
        return;
    };
    let page = u64::from_le_bytes(data[1..9].try_into().unwrap());
    let (header, sealed) = data[9..].split_at(INDEX_HEADER_LEN);
    let (keys, write_only) = fuzz_keys();
    let (Ok(sealer), Ok(reader)) = (
        keys.open_index_build(header),
        write_only.open_index_build(header),
    ) else {
        assert!(keys.open_index_build(header).is_err());
        assert!(write_only.open_index_build(header).is_err());
        return;
    };
    if let Some(len) = sealed.len().checked_sub(PAGE_OVERHEAD) {
        let (mut a, mut b) = (vec![0u8; len], vec![0u8; len]);
        let opened = sealer.open_page(part, page, sealed, &mut a);
        assert_eq!(opened.is_ok(), reader.open_page(part, page, sealed, &mut b).is_ok());
        if opened.is_ok() {
            assert_eq!(a, b);
        }
    }
    let held = sealer.open_held(sealed);
    assert_eq!(held.is_ok(), reader.open_held(sealed).is_ok());
});
