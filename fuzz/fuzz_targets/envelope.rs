//! Opening metadata (`LARDERE1`) and sealed (`LARDERP1`) envelopes
//! (docs/design/crypto.md, "Envelopes") of any bytes with a fixed key must fail or
//! succeed without panicking; what opens is exactly the envelope minus its header and
//! tag. Input: kind code (1 byte), name length (1 byte), the name, the envelope. The
//! key is the one `larder-crypto`'s tests/fuzz_seeds.rs seals the seeds with.
#![no_main]
use larder_crypto::envelope::ENVELOPE_OVERHEAD;
use larder_crypto::ObjectKind;

use libfuzzer_sys::fuzz_target;

#[path = "common/keys.rs"]
mod keys;
use keys::fuzz_keys;

fuzz_target!(|data: &[u8]| {
    let [kind, name_len, rest @ ..] = data else {
        return;
    };
    let (Some(kind), Some(name), Some(bytes)) = (
        ObjectKind::from_code(*kind),
        rest.get(..usize::from(*name_len)),
        rest.get(usize::from(*name_len)..),
    ) else {
        return;
    };
    let (keys, write_only) = fuzz_keys();
    let opened = [
        keys.open_object(kind, name, bytes),
        keys.open_sealed(kind, name, bytes),
        write_only.open_object(kind, name, bytes),
    ];
    for plain in opened.into_iter().flatten() {
        assert_eq!(plain.len() + ENVELOPE_OVERHEAD, bytes.len());
    }
    assert!(write_only.open_sealed(kind, name, bytes).is_err());
});
