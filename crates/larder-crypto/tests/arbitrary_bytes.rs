//! The proptest twins of the fuzz targets `key_slot`, `envelope` and
//! `container_crypto` (docs/design/fuzzing.md): arbitrary bytes never panic, and the
//! few that open are exactly as long as they should be.

use larder_crypto::aead::TAG_LEN;
use larder_crypto::envelope::ENVELOPE_OVERHEAD;
use larder_crypto::{KeySlot, ObjectKind, RepoKeys};
use proptest::prelude::*;

fn keys() -> RepoKeys {
    let mut material = vec![1, 2, 5];
    material.extend_from_slice(&[0x46; 16]);
    material.extend(0..128u8);
    RepoKeys::from_material(&material).unwrap()
}

/// JSON-shaped text, so that parsing gets past the first byte.
fn slot_like() -> impl Strategy<Value = String> {
    let field = prop_oneof![
        Just("\"version\":1".to_string()),
        Just("\"kind\":\"full\"".to_string()),
        "\"kdf\":\\{\"memory_kib\":[0-9]{1,12}\\}",
        "\"[a-z]{1,9}\":\"[0-9a-f]{0,80}\"",
    ];
    proptest::collection::vec(field, 0..10).prop_map(|fields| format!("{{{}}}", fields.join(",")))
}

proptest! {
    #[test]
    fn key_slot_parsing_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..600), text in slot_like()) {
        for input in [&bytes[..], text.as_bytes()] {
            if let Ok(slot) = KeySlot::parse(input) {
                prop_assert_eq!(KeySlot::parse(&slot.to_bytes()).unwrap(), slot);
            }
        }
    }

    #[test]
    fn opening_arbitrary_envelopes_never_panics(kind in 0u8..12, bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
        let keys = keys();
        if let Some(kind) = ObjectKind::from_code(kind) {
            let opened = [keys.open_object(kind, b"", &bytes), keys.open_sealed(kind, b"", &bytes)];
            for plain in opened.into_iter().flatten() {
                prop_assert_eq!(plain.len() + ENVELOPE_OVERHEAD, bytes.len());
            }
        }
    }

    #[test]
    fn opening_arbitrary_container_parts_never_panics(
        head in proptest::collection::vec(any::<u8>(), 144),
        body in proptest::collection::vec(any::<u8>(), 0..200),
        footer in any::<[u8; 32]>(),
    ) {
        let keys = keys();
        let header: &[u8; 32] = head[..32].try_into().unwrap();
        let tables = keys.table_opener(7, header, head[112..].try_into().unwrap());
        let mut table = body.clone();
        prop_assert!(tables.open_table(&mut table).is_err() || table.len() + TAG_LEN == body.len());
        prop_assert!(tables.open_footer(&footer).is_err());
        if let Ok(chunks) = keys.chunk_opener(7, header, head[32..112].try_into().unwrap()) {
            prop_assert!(chunks.open_chunk(0, &[0; 32], &mut body.clone()).is_err());
        }
    }
}
