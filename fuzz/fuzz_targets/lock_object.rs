//! Decoding a lock object (docs/design/remote.md, "Lock objects") of any bytes must
//! fail or succeed without panicking, plaintext or sealed with a fixed key (full and
//! write-only keys agree); what decodes encodes to bytes that decode to the same
//! object. The local lock note (format.md, "Locking") is the same JSON's holder part.
//! Input: the lock object's bytes, read under the name `00000000000000d1`.
#![no_main]
use larder_store::{LockHolder, LockObject};

use libfuzzer_sys::fuzz_target;

#[path = "common/keys.rs"]
mod keys;
use keys::fuzz_keys;

const NAME: &str = "00000000000000d1";

fuzz_target!(|data: &[u8]| {
    let (full, write_only) = fuzz_keys();
    let _ = serde_json::from_slice::<LockHolder>(data);
    let plain = LockObject::decode(NAME, data, None);
    if let Ok(object) = &plain {
        let again = LockObject::decode(NAME, &object.encode(NAME, None), None);
        assert_eq!(again.as_ref(), Ok(object));
    }
    let sealed = LockObject::decode(NAME, data, Some(full));
    assert_eq!(
        sealed.is_ok(),
        LockObject::decode(NAME, data, Some(write_only)).is_ok()
    );
    if let Ok(object) = &sealed {
        let again = LockObject::decode(NAME, &object.encode(NAME, Some(full)), Some(full));
        assert_eq!(again.as_ref(), Ok(object));
    }
});
