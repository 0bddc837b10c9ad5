//! AES-256-GCM against XChaCha20-Poly1305, sealing and opening in place through
//! `AeadKey` (as the container writer and readers do), on 8 KiB (the default average
//! chunk) and 64 KiB (the default largest chunk) messages, and fingerprinting the same
//! sizes (keyed BLAKE3, HMAC-SHA-256) for scale. Chose the default AEAD; figures in
//! docs/design/crypto.md ("AEAD speed").
//!
//! `cargo bench -p larder-crypto --bench aead -- --warm-up-time 1 --measurement-time 3`

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use larder_crypto::aead::TAG_LEN;
use larder_crypto::{AeadKey, AeadKind, FingerprintKind, RepoKeys};

const SIZES: [usize; 2] = [8 << 10, 64 << 10];
/// A chunk's associated data is 111 bytes (docs/design/crypto.md).
const AAD: [u8; 111] = [7; 111];

fn seal_and_open(c: &mut Criterion) {
    for kind in AeadKind::ALL {
        let key = AeadKey::new(kind, &[0x42; 32]);
        let mut group = c.benchmark_group(format!("aead/{kind}"));
        for size in SIZES {
            group.throughput(Throughput::Bytes(size as u64));
            let mut buf = vec![0x5a; size];
            buf.reserve(TAG_LEN);
            group.bench_with_input(BenchmarkId::new("seal", size), &size, |b, &size| {
                b.iter(|| {
                    buf.truncate(size);
                    key.seal_in_place(3, &AAD, &mut buf);
                    black_box(&buf);
                })
            });
            let mut sealed = vec![0x5a; size];
            key.seal_in_place(3, &AAD, &mut sealed);
            let mut work = sealed.clone();
            group.bench_with_input(BenchmarkId::new("open", size), &size, |b, _| {
                b.iter(|| {
                    work.clear();
                    work.extend_from_slice(&sealed);
                    key.open_in_place(3, &AAD, &mut work).unwrap();
                    black_box(&work);
                })
            });
        }
        group.finish();
    }
}

fn fingerprints(c: &mut Criterion) {
    for kind in FingerprintKind::ALL {
        let keys = RepoKeys::generate([1; 16], AeadKind::Aes256Gcm, kind);
        let mut group = c.benchmark_group(format!("fingerprint/{}", kind.name()));
        for size in SIZES {
            group.throughput(Throughput::Bytes(size as u64));
            let data = vec![0x5a; size];
            group.bench_with_input(BenchmarkId::from_parameter(size), &data, |b, data| {
                b.iter(|| black_box(keys.fingerprint(data)))
            });
        }
        group.finish();
    }
}

criterion_group!(benches, seal_and_open, fingerprints);
criterion_main!(benches);
