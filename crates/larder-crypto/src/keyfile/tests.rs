//! Unit tests of `keyfile.rs`.

use super::*;
use crate::random::SeededRandom;
use crate::FingerprintKind;

const TINY: KdfParams = KdfParams {
    memory_kib: 8,
    iterations: 1,
    parallelism: 1,
};

fn keys() -> RepoKeys {
    let mut rng = SeededRandom::new("key slot unit tests");
    RepoKeys::generate_with(
        &mut rng,
        [4; 16],
        AeadKind::Aes256Gcm,
        FingerprintKind::HmacSha256,
    )
}

fn slot(kind: KeyKind) -> KeySlot {
    KeySlot::create(
        &keys(),
        kind,
        b"pw",
        TINY,
        "host".into(),
        "user".into(),
        "2026-11-28T00:00:00Z".into(),
    )
    .unwrap()
}

/// A change to a slot's JSON.
type Edit = fn(&mut serde_json::Value);

/// The slot's JSON as a value, changed by `edit`, back to bytes.
fn edited(edit: impl FnOnce(&mut serde_json::Value)) -> Vec<u8> {
    let mut v: serde_json::Value = serde_json::from_slice(&slot(KeyKind::Full).to_bytes()).unwrap();
    edit(&mut v);
    serde_json::to_vec(&v).unwrap()
}

#[test]
fn slots_round_trip_and_unlock() {
    for kind in [KeyKind::Full, KeyKind::WriteOnly] {
        let s = slot(kind);
        let parsed = KeySlot::parse(&s.to_bytes()).unwrap();
        assert_eq!(parsed, s);
        assert_eq!(parsed.to_bytes(), s.to_bytes());
        let k = parsed.unlock(b"pw", Some([4; 16])).unwrap();
        assert_eq!(k.kind(), kind);
        assert_eq!(k.fingerprint(b"x"), keys().fingerprint(b"x"));
        assert_eq!(
            (s.kind(), s.hostname(), s.username()),
            (kind, "host", "user")
        );
        assert_eq!((s.created(), s.kdf()), ("2026-11-28T00:00:00Z", TINY));
    }
}

#[test]
fn a_wrong_password_is_wrong_password_or_no_matching_key() {
    let e = slot(KeyKind::Full).unlock(b"pW", None).unwrap_err();
    assert!(matches!(e, CryptoError::Authentication(_)));
    assert_eq!(e.to_string(), "wrong password or no matching key");
}

#[test]
fn another_repositorys_slot_is_refused() {
    let e = slot(KeyKind::Full)
        .unlock(b"pw", Some([5; 16]))
        .unwrap_err();
    assert!(e.to_string().contains("belongs to repository 0404"), "{e}");
}

#[test]
fn a_full_slot_needs_a_full_key() {
    let wo = keys().write_only();
    let e = KeySlot::create(
        &wo,
        KeyKind::Full,
        b"pw",
        TINY,
        "h".into(),
        "u".into(),
        "t".into(),
    );
    assert!(matches!(e, Err(CryptoError::WriteOnly { .. })));
}

#[test]
fn changed_plain_fields_fail_to_unlock() {
    let cases: [(&str, Edit); 6] = [
        ("kind", |v| v["kind"] = "write-only".into()),
        ("hostname", |v| v["hostname"] = "other".into()),
        ("username", |v| v["username"] = "other".into()),
        ("created", |v| v["created"] = "2027-01-01T00:00:00Z".into()),
        ("iterations", |v| v["kdf"]["iterations"] = 2.into()),
        ("memory", |v| v["kdf"]["memory_kib"] = 16.into()),
    ];
    for (what, edit) in cases {
        let s = KeySlot::parse(&edited(edit)).unwrap();
        assert!(s.unlock(b"pw", None).is_err(), "{what}");
    }
}

#[test]
fn strict_parsing_names_what_is_wrong() {
    let cases: [(&str, Edit); 14] = [
        ("version 2 is not supported", |v| v["version"] = 2.into()),
        ("version \"1\" is not supported", |v| {
            v["version"] = "1".into()
        }),
        ("missing field `version`", |v| {
            v.as_object_mut().unwrap().remove("version");
        }),
        ("unknown field `extra`", |v| v["extra"] = 1.into()),
        ("unknown field `pepper`", |v| v["kdf"]["pepper"] = 1.into()),
        ("not argon2id", |v| v["kdf"]["algorithm"] = "argon2i".into()),
        ("not argon2id", |v| v["kdf"]["version"] = 16.into()),
        ("is not xchacha20-poly1305", |v| {
            v["aead"] = "aes-256-gcm".into()
        }),
        ("salt is not 64", |v| v["kdf"]["salt"] = "00".into()),
        ("nonce is not 48", |v| {
            let upper = v["nonce"].as_str().unwrap().to_uppercase();
            v["nonce"] = upper.into();
        }),
        ("sealed is not 326", |v| {
            let short = v["sealed"].as_str().unwrap()[2..].to_string();
            v["sealed"] = short.into();
        }),
        ("memory 4194305 KiB is not 8 to 4194304", |v| {
            v["kdf"]["memory_kib"] = (4194305).into()
        }),
        ("iterations 101 is not 1 to 100", |v| {
            v["kdf"]["iterations"] = 101.into()
        }),
        ("more than 16777216 KiB", |v| {
            v["kdf"]["memory_kib"] = (1 << 20).into();
            v["kdf"]["iterations"] = 17.into();
        }),
    ];
    for (expected, edit) in cases {
        let e = KeySlot::parse(&edited(edit)).unwrap_err();
        assert!(matches!(e, CryptoError::Malformed { .. }), "{e}");
        assert!(e.to_string().contains(expected), "{expected}: {e}");
    }
    for bytes in [&b""[..], b"{", b"[]", b"null", &[0xff; 10]] {
        assert!(KeySlot::parse(bytes).is_err());
    }
}

#[test]
fn kdf_bounds() {
    for ok in [KdfParams::DEFAULT, KdfParams::GENERATED, TINY] {
        ok.check().unwrap();
    }
    for bad in [
        KdfParams {
            parallelism: 0,
            ..TINY
        },
        KdfParams {
            parallelism: 17,
            memory_kib: 1024,
            ..TINY
        },
        KdfParams {
            memory_kib: 15,
            parallelism: 2,
            ..TINY
        },
        KdfParams {
            iterations: 0,
            ..TINY
        },
        KdfParams {
            memory_kib: u32::MAX,
            ..TINY
        },
    ] {
        assert!(bad.check().is_err(), "{bad:?}");
    }
}
