//! Unlocking a key slot (Argon2id, then XChaCha20-Poly1305 over 147 bytes) with the
//! default parameters (64 MiB, 3 passes, 1 lane) and the generated passwords' (8 MiB,
//! 1 pass): the time every command pays before it opens a repository. Figures in
//! docs/design/crypto.md ("Key slots").
//!
//! `cargo bench -p larder-crypto --bench unlock`

use criterion::{criterion_group, criterion_main, Criterion};
use larder_crypto::{AeadKind, FingerprintKind, KdfParams, KeyKind, KeySlot, RepoKeys};

fn unlock(c: &mut Criterion) {
    let keys = RepoKeys::generate([1; 16], AeadKind::Aes256Gcm, FingerprintKind::KeyedBlake3);
    let mut group = c.benchmark_group("unlock");
    group.sample_size(10);
    for (name, params) in [
        ("default", KdfParams::DEFAULT),
        ("generated", KdfParams::GENERATED),
    ] {
        let slot = KeySlot::create(
            &keys,
            KeyKind::Full,
            b"password",
            params,
            "h".into(),
            "u".into(),
            "t".into(),
        )
        .unwrap();
        group.bench_function(name, |b| b.iter(|| slot.unlock(b"password", None).unwrap()));
    }
    group.finish();
}

criterion_group!(benches, unlock);
criterion_main!(benches);
