//! The figures of docs/design/crypto.md ("AEAD speed") on a busy machine: each AEAD
//! seals and opens 4 MiB in 8 KiB or 64 KiB messages, 300 rounds with the AEADs
//! interleaved, and the fastest round counts (on the shared 2-core machine other
//! builds take a core at random moments, which criterion's means in benches/aead.rs
//! include). Then the disk index's sealed pages ("Disk index pages": 4 MiB sealed in
//! one write of 1024 pages, each under its own salt's key, and opened page by page),
//! the keyed fingerprints likewise, and the median and fastest of 15 key slot unlocks
//! with each KDF setting.
//!
//! `cargo run --release -p larder-crypto --example speed`

use std::hint::black_box;
use std::time::{Duration, Instant};

use larder_crypto::aead::TAG_LEN;
use larder_crypto::index_page::{INDEX_PAGE_LEN, SEALED_PAGE_LEN};
use larder_crypto::{
    AeadKey, AeadKind, FingerprintKind, IndexPart, KdfParams, KeyKind, KeySlot, RepoKeys,
};

const ROUND_BYTES: usize = 4 << 20;
const ROUNDS: usize = 300;
const SIZES: [usize; 2] = [8 << 10, 64 << 10];
/// A chunk's associated data is 111 bytes.
const AAD: [u8; 111] = [7; 111];

fn gb_per_s(bytes: usize, time: Duration) -> f64 {
    bytes as f64 / time.as_secs_f64() / 1e9
}

fn fastest(best: &mut Duration, round: impl FnOnce()) {
    let start = Instant::now();
    round();
    *best = (*best).min(start.elapsed());
}

fn main() {
    let keys: Vec<AeadKey> = AeadKind::ALL
        .iter()
        .map(|&k| AeadKey::new(k, &[0x42; 32]))
        .collect();
    for size in SIZES {
        let count = ROUND_BYTES / size;
        let mut best = [[Duration::MAX; 2]; 2];
        for _ in 0..ROUNDS {
            for (key, best) in keys.iter().zip(&mut best) {
                let mut buf = vec![0x5a; size + TAG_LEN];
                fastest(&mut best[0], || {
                    for _ in 0..count {
                        buf.truncate(size);
                        key.seal_in_place(3, &AAD, &mut buf);
                    }
                });
                let sealed = buf.clone();
                fastest(&mut best[1], || {
                    for _ in 0..count {
                        buf.clear();
                        buf.extend_from_slice(&sealed);
                        key.open_in_place(3, &AAD, &mut buf).expect("opens");
                    }
                });
            }
        }
        for (kind, [seal, open]) in AeadKind::ALL.iter().zip(best) {
            println!(
                "{kind:<20} {:>3} KiB: seal {:.2} GB/s, open {:.2} GB/s",
                size >> 10,
                gb_per_s(ROUND_BYTES, seal),
                gb_per_s(ROUND_BYTES, open)
            );
        }
    }
    for kind in AeadKind::ALL {
        let sealer =
            RepoKeys::generate([1; 16], kind, FingerprintKind::KeyedBlake3).new_index_build();
        let pages = ROUND_BYTES / INDEX_PAGE_LEN;
        let plain = vec![0x5a; ROUND_BYTES];
        let mut sealed = vec![0; pages * SEALED_PAGE_LEN];
        let mut out = vec![0; INDEX_PAGE_LEN];
        let mut best = [Duration::MAX; 2];
        for _ in 0..ROUNDS {
            fastest(&mut best[0], || {
                sealer.seal_pages(IndexPart::Table, 1, &plain, &mut sealed);
            });
            fastest(&mut best[1], || {
                for (i, page) in sealed.chunks_exact(SEALED_PAGE_LEN).enumerate() {
                    sealer
                        .open_page(IndexPart::Table, 1 + i as u64, page, &mut out)
                        .expect("opens");
                }
            });
        }
        println!(
            "{kind:<20} index pages: seal {:.2} GB/s, open {:.2} GB/s",
            gb_per_s(ROUND_BYTES, best[0]),
            gb_per_s(ROUND_BYTES, best[1])
        );
    }
    for kind in FingerprintKind::ALL {
        let keys = RepoKeys::generate([1; 16], AeadKind::Aes256Gcm, kind);
        for size in SIZES {
            let data = vec![0x5a; size];
            let mut best = Duration::MAX;
            for _ in 0..ROUNDS {
                fastest(&mut best, || {
                    for _ in 0..ROUND_BYTES / size {
                        black_box(keys.fingerprint(&data));
                    }
                });
            }
            let name = kind.name();
            println!(
                "{name:<20} {:>3} KiB: {:.2} GB/s",
                size >> 10,
                gb_per_s(ROUND_BYTES, best)
            );
        }
    }
    let keys = RepoKeys::generate([1; 16], AeadKind::Aes256Gcm, FingerprintKind::KeyedBlake3);
    for (name, params) in [
        ("default", KdfParams::DEFAULT),
        ("generated", KdfParams::GENERATED),
    ] {
        let slot = KeySlot::create(
            &keys,
            KeyKind::Full,
            b"pw",
            params,
            "h".into(),
            "u".into(),
            "t".into(),
        )
        .expect("slot");
        let mut times: Vec<Duration> = (0..15)
            .map(|_| {
                let start = Instant::now();
                slot.unlock(b"pw", None).expect("unlocks");
                start.elapsed()
            })
            .collect();
        times.sort();
        println!(
            "unlock, {name} KDF: median {:.3} s, fastest {:.3} s",
            times[7].as_secs_f64(),
            times[0].as_secs_f64()
        );
    }
}
