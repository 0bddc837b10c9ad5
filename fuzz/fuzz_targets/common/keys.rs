//! The fixed key of the targets that open encrypted bytes: the one `larder-crypto`'s
//! tests/fuzz_seeds.rs seals the seeds with.

use larder_crypto::RepoKeys;
use std::sync::OnceLock;

/// The full key and its write-only half, made once: deriving `read_public` (an X25519
/// multiplication) per input would be most of a run.
pub fn fuzz_keys() -> &'static (RepoKeys, RepoKeys) {
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
