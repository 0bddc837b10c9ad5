//! Opening metadata (`LARDERE1`) and sealed (`LARDERP1`) envelopes
//! (docs/design/crypto.md, "Envelopes") of any bytes with a fixed key must fail or
//! succeed without panicking; what opens is exactly the envelope minus its header and
//! tag. Input: kind code (1 byte), name length (1 byte), the name, the envelope. The
//! key is the one `larder-crypto`'s tests/fuzz_seeds.rs seals the seeds with.
#![no_main]
use larder_crypto::envelope::ENVELOPE_OVERHEAD;
use larder_crypto::{ObjectKind, RepoKeys};
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;

/// Made once: deriving `read_public` (an X25519 multiplication) per input would be
/// most of a run.
fn fuzz_keys() -> &'static (RepoKeys, RepoKeys) {
    static KEYS: OnceLock<(RepoKeys, RepoKeys)> = OnceLock::new();
    KEYS.get_or_init(|| {
        let mut material = vec![1, 1, 4];
        material.extend_from_slice(&[0x46; 16]);
        material.extend(0..128u8);
        let full = RepoKeys::from_material(&material).expect("fixed key material");
        let write_only = full.write_only();
        (full, write_only)
    })
}

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
