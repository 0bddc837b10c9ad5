//! Unit tests of `keys.rs`.

use super::*;
use crate::random::SeededRandom;

fn keys(fingerprint: FingerprintKind) -> RepoKeys {
    let mut rng = SeededRandom::new("keys unit tests");
    RepoKeys::generate_with(&mut rng, [7; 16], AeadKind::Aes256Gcm, fingerprint)
}

#[test]
fn material_round_trips_for_full_and_write_only_keys() {
    for fp in FingerprintKind::ALL {
        let full = keys(fp);
        let back = RepoKeys::from_material(&full.material()[..]).unwrap();
        assert_eq!(back.material(), full.material());
        assert!(back.is_full());
        let wo = full.write_only();
        assert!(!wo.is_full());
        assert_eq!(wo.kind(), KeyKind::WriteOnly);
        let back = RepoKeys::from_material(&wo.material()[..]).unwrap();
        assert_eq!(back.material(), wo.material());
        assert_eq!(back.read_public, full.read_public);
        assert_eq!(wo.material()[115..], full.read_public);
    }
}

#[test]
fn fingerprints_are_keyed_and_batches_agree() {
    for fp in FingerprintKind::ALL {
        let a = keys(fp);
        let b = RepoKeys::generate([7; 16], AeadKind::Aes256Gcm, fp);
        assert_ne!(a.fingerprint(b"chunk"), b.fingerprint(b"chunk"));
        assert_eq!(
            a.fingerprint(b"chunk"),
            a.write_only().fingerprint(b"chunk")
        );
        let chunks: Vec<Vec<u8>> = (0..100).map(|i| vec![i as u8; i * 37]).collect();
        let refs: Vec<&[u8]> = chunks.iter().map(|c| &c[..]).collect();
        let batch = a.fingerprint_batch(&refs);
        for (c, f) in refs.iter().zip(&batch) {
            assert_eq!(&a.fingerprint(c), f);
        }
    }
    let k = keys(FingerprintKind::KeyedBlake3);
    assert_eq!(
        k.fingerprint(b"x"),
        *blake3::keyed_hash(&k.id_key, b"x").as_bytes()
    );
    let k = keys(FingerprintKind::HmacSha256);
    let mut mac = Hmac::<Sha256>::new_from_slice(&k.id_key).unwrap();
    mac.update(b"x");
    assert_eq!(k.fingerprint(b"x")[..], mac.finalize().into_bytes()[..]);
}

#[test]
fn keys_compare_alike_only_with_the_same_secrets() {
    let a = keys(FingerprintKind::KeyedBlake3);
    let other = RepoKeys::generate([7; 16], AeadKind::Aes256Gcm, FingerprintKind::KeyedBlake3);
    assert!(a.same_fingerprints(&a.write_only()) && a.same_chunker_secret(&a.write_only()));
    assert!(!a.same_fingerprints(&other) && !a.same_chunker_secret(&other));
    // The same id key under another fingerprint kind fingerprints differently.
    let mut material = a.material();
    material[2] = FingerprintKind::HmacSha256.code();
    let hmac = RepoKeys::from_material(&material[..]).unwrap();
    assert!(!a.same_fingerprints(&hmac) && a.same_chunker_secret(&hmac));
}

#[test]
fn debug_prints_no_key_bytes() {
    let k = keys(FingerprintKind::KeyedBlake3);
    let shown = format!("{k:?}");
    assert!(shown.contains(&hex::encode(&[7; 16])));
    for secret in [k.id_key, k.chunker_secret, k.meta_key, k.read_public] {
        assert!(!shown.contains(&hex::encode(&secret[..4])), "{shown}");
        assert!(!shown.contains(format!("{:?}", &secret[..4]).trim_end_matches(']')));
    }
}

#[test]
fn malformed_material_is_refused() {
    let good = keys(FingerprintKind::KeyedBlake3).material();
    assert!(RepoKeys::from_material(&good[..146]).is_err());
    for (at, value) in [(0, 0), (0, 3), (1, 0), (1, 3), (2, 1), (2, 6)] {
        let mut m = *good;
        m[at] = value;
        assert!(RepoKeys::from_material(&m).is_err(), "byte {at} = {value}");
    }
    // A write-only key whose read_public is a small-order point (0 and 1 are).
    for small in [[0u8; 32], {
        let mut one = [0u8; 32];
        one[0] = 1;
        one
    }] {
        let mut m = *good;
        m[0] = KeyKind::WriteOnly.code();
        m[115..].copy_from_slice(&small);
        assert!(RepoKeys::from_material(&m).is_err());
    }
}
