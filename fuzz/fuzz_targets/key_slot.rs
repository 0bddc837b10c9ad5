//! Parsing a key slot (`keys/<id>.key`, docs/design/crypto.md, "Key slots"), the first
//! bytes larder reads from a repository, must refuse or accept any bytes without
//! panicking; an accepted slot writes back to a slot that parses to itself, and is
//! unlocked with the seeds' password (`fuzz password`) when its Argon2id parameters are
//! tiny, as the seeds' are (8 KiB, 1 pass): the parser bounds them, and the target
//! skips the rest so that one input costs little.
#![no_main]
use larder_crypto::KeySlot;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(slot) = KeySlot::parse(data) else {
        return;
    };
    assert_eq!(KeySlot::parse(&slot.to_bytes()).ok().as_ref(), Some(&slot));
    let kdf = slot.kdf();
    if kdf.memory_kib <= 64 && kdf.iterations <= 2 {
        if let Ok(keys) = slot.unlock(b"fuzz password", None) {
            assert_eq!(keys.kind(), slot.kind());
        }
    }
});
