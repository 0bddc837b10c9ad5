//! Golden bytes: fixed key material and fixed randomness give exactly these envelopes,
//! container parts, disk index build header, page and `held` record, and key slot, so
//! that any change to a format (a byte moved, a context string, the associated data)
//! fails here before it reaches a repository.
//! `scripts/crypto-crosscheck` recomputes these bytes from docs/design/crypto.md
//! with Python's `cryptography` package, independently of this crate.
//!
//! A deliberate format change updates these vectors, the cross-check and the doc's
//! version log together.

use crate::container::ContainerFooter;
use crate::hex;
use crate::index_page::{IndexPart, INDEX_PAGE_LEN, SEALED_PAGE_LEN};
use crate::keyfile::{KdfParams, KeySlot};
use crate::keys::{KeyKind, RepoKeys};
use crate::random::SeededRandom;
use crate::{AeadKind, FingerprintKind, ObjectKind};

fn keys(aead: AeadKind) -> RepoKeys {
    let mut rng = SeededRandom::new("larder golden keys");
    RepoKeys::generate_with(&mut rng, [0x11; 16], aead, FingerprintKind::KeyedBlake3)
}

/// Compares hex, printing the actual value in full on a mismatch.
fn check(what: &str, actual: &[u8], expected: &str) {
    let actual = hex::encode(actual);
    assert!(actual == expected, "{what} changed; it is now\n{actual}");
}

#[test]
fn golden_key_material() {
    check(
        "key material",
        &keys(AeadKind::Aes256Gcm).material()[..],
        GOLDEN_MATERIAL,
    );
}

#[test]
fn golden_metadata_envelopes() {
    for (aead, expected) in [
        (AeadKind::Aes256Gcm, GOLDEN_METADATA_AES),
        (AeadKind::XChaCha20Poly1305, GOLDEN_METADATA_XCHACHA),
    ] {
        let k = keys(aead);
        let mut rng = SeededRandom::new("golden metadata envelope");
        let name = 7u64.to_le_bytes();
        let sealed = k.seal_object_with(
            &mut rng,
            ObjectKind::IndexSegment,
            &name,
            b"golden plaintext",
        );
        check(aead.name(), &sealed, expected);
        let opened = k
            .write_only()
            .open_object(ObjectKind::IndexSegment, &name, &sealed);
        assert_eq!(opened.unwrap(), b"golden plaintext");
    }
}

#[test]
fn golden_sealed_envelope() {
    let k = keys(AeadKind::Aes256Gcm);
    let mut rng = SeededRandom::new("golden sealed envelope");
    let sealed =
        k.write_only()
            .seal_sealed_with(&mut rng, ObjectKind::Snapshot, b"", b"golden snapshot");
    check("sealed envelope", &sealed, GOLDEN_SEALED);
    assert_eq!(
        k.open_sealed(ObjectKind::Snapshot, b"", &sealed).unwrap(),
        b"golden snapshot"
    );
}

#[test]
fn golden_container_parts() {
    let k = keys(AeadKind::Aes256Gcm);
    let mut header = [0u8; 32];
    header[..8].copy_from_slice(b"LARDERC2");
    header[8..12].copy_from_slice(&2u32.to_le_bytes());
    header[12] = FingerprintKind::KeyedBlake3.code();
    header[13] = AeadKind::Aes256Gcm.code();
    header[16..24].copy_from_slice(&3u64.to_le_bytes());
    let mut rng = SeededRandom::new("golden container");
    let sealer = k.write_only().container_sealer_with(&mut rng, 3, &header);
    let mut parts = sealer.key_block().to_vec();
    parts.extend_from_slice(sealer.table_salt());
    let mut chunk = b"golden chunk".to_vec();
    let fingerprint = k.fingerprint(&chunk);
    sealer.seal_chunk(1, &fingerprint, &mut chunk);
    parts.extend_from_slice(&chunk);
    let mut table = vec![0x5a; 48];
    sealer.seal_table(&mut table);
    parts.extend_from_slice(&table);
    parts.extend_from_slice(&sealer.seal_footer(ContainerFooter {
        table_offset: 172,
        entry_count: 1,
    }));
    check("container parts", &parts, GOLDEN_CONTAINER);
    let opener = k.chunk_opener(3, &header, sealer.key_block()).unwrap();
    opener.open_chunk(1, &fingerprint, &mut chunk).unwrap();
    assert_eq!(chunk, b"golden chunk");
}

#[test]
fn golden_key_slot() {
    let k = keys(AeadKind::Aes256Gcm);
    let mut rng = SeededRandom::new("golden key slot");
    let params = KdfParams {
        memory_kib: 64,
        iterations: 2,
        parallelism: 1,
    };
    let slot = KeySlot::create_with(
        &mut rng,
        &k,
        KeyKind::Full,
        b"golden password",
        params,
        "host".into(),
        "user".into(),
        "2026-11-28T00:00:00Z".into(),
    )
    .unwrap();
    let bytes = slot.to_bytes();
    assert!(
        String::from_utf8_lossy(&bytes) == GOLDEN_SLOT,
        "key slot changed; it is now\n{}",
        String::from_utf8_lossy(&bytes)
    );
    let unlocked = KeySlot::parse(GOLDEN_SLOT.as_bytes())
        .unwrap()
        .unlock(b"golden password", None);
    assert_eq!(unlocked.unwrap().material(), k.material());
}

#[test]
fn golden_index_build() {
    let k = keys(AeadKind::Aes256Gcm);
    let mut rng = SeededRandom::new("golden index build");
    let sealer = k.write_only().new_index_build_with(&mut rng);
    check("index build header", sealer.header(), GOLDEN_INDEX_HEADER);
    // Page 3 of `meta`: byte i is i mod 251.
    let plain: Vec<u8> = (0..INDEX_PAGE_LEN).map(|i| (i % 251) as u8).collect();
    let mut sealed = vec![0u8; SEALED_PAGE_LEN];
    let mut rng = SeededRandom::new("golden index page");
    sealer.seal_pages_with(&mut rng, IndexPart::Meta, 3, &plain, &mut sealed);
    // The page's salt and tag in full, and the BLAKE3 of all its bytes.
    let mut ends = sealed[..32].to_vec();
    ends.extend_from_slice(&sealed[SEALED_PAGE_LEN - 16..]);
    ends.extend_from_slice(blake3::hash(&sealed).as_bytes());
    check("index page", &ends, GOLDEN_INDEX_PAGE);
    let mut rng = SeededRandom::new("golden held");
    let held = sealer.seal_held_with(&mut rng, b"golden held");
    check("held", &held, GOLDEN_HELD);
    let reader = k.open_index_build(sealer.header()).unwrap();
    let mut out = vec![0u8; INDEX_PAGE_LEN];
    reader
        .open_page(IndexPart::Meta, 3, &sealed, &mut out)
        .unwrap();
    assert_eq!(out, plain);
    assert_eq!(reader.open_held(&held).unwrap(), b"golden held");
}

const GOLDEN_MATERIAL: &str = "0101041111111111111111111111111111111163f02c21b9f5146d85ae837ed26202d29c2533260569b8f2680e3474376a62fa64a56c36e0335449b853556f93181862a2fbad41051e50888dbcb721770eeada5e256c17f6d60eca33a96de76d376795300866e1f1ac3aa3a08edf6893ed548d63d0d8b4b2097e2d51b2dfd05e403bc8d315f7b5f6eeee553dc5a328fb8b6ae9";
const GOLDEN_METADATA_AES: &str = "4c415244455245310201000000000000faa7a21c7897dbcadad5a4cce85db0e2f4f513c592c242efef0da10feb162e8d5a9694d3efeeb0e981533affe1444e6aad7c4c637d491ff6529eb6c8115b662e";
const GOLDEN_METADATA_XCHACHA: &str = "4c415244455245310202000000000000faa7a21c7897dbcadad5a4cce85db0e2f4f513c592c242efef0da10feb162e8d98c596c3583487d37a27829c86e6abf35ab7c6f69595696d1894aa5c854fc327";
const GOLDEN_SEALED: &str = "4c415244455250310601000000000000eb6703abf62c921acdb32cdd6bef91d16de242db6e048869b3952bc7b653e67565f795c4e2169caf9161f236ac92e896a45a0768f7c2d809df06e80058cf17";
const GOLDEN_CONTAINER: &str = "c9586cc08eed6922801e1d19288cd7a1c8eac2e6c4bc094957835063612f7c1fface34ad85111c33f13148d0216828cd8ea7a828f4abd66ccd8fc314a14cb53f88cf7f5f1e7207849f63d45fd8ccd273b80688509b73d12107ef62963d6164bdbd8985f88988d848993c9252ef26c46bba723bba2ef2a5b4bc6c2c9420e200117e6f02eb0ff193c82eeefd0e21441f6bf29c472626a1158a2faee6413e4a1c70f0c448d021743a159fd1ae06bda634fe855cad31d0aa104b30449b5596d2e7d22c78a936dda2c5083dea59affb6a3f6a31a1ef3ec05ef8497faa934bf8abd71931f7acd5dbc8fdfa569f73e1";
const GOLDEN_INDEX_HEADER: &str = "4c415244455245310901000000000000aefcde2d03c25803e98d82d3d322e4085bb8113e1b45fe63d58d79d993895e3f78314584c8668e87003fdb75175abf09b958e54d21162065177beaf369c8efe80e7a0b7690d1e6b51fa77e68d489048ef3ada1dacc5c5c91da910fc86a9ef9bd";
const GOLDEN_INDEX_PAGE: &str = "589925e80f30fafbb1dbdc8edd3018c2dca608ab476a278e565adee339e8e5b37c6620ffc80b76951fafc55e9f9e0cf3a6bd8a6073bede545bbba161527e7a75644869d6240cf16686975a766d2a70cf";
const GOLDEN_HELD: &str = "4c415244455245310901000000000000016b9cf5582c5ddfdcf1f5570c58024e80098e4c81d231ce9b3a260ecc15a376929528e7efa09376e00ad8deb7cc966c5b5fac41d6fff12a0434afa627e34897097863bfc03b655bafc3f21ea940d62dd3ec7e620d586fb29d93b9";
const GOLDEN_SLOT: &str = r#"{
  "version": 1,
  "kind": "full",
  "created": "2026-11-28T00:00:00Z",
  "hostname": "host",
  "username": "user",
  "kdf": {
    "algorithm": "argon2id",
    "version": 19,
    "memory_kib": 64,
    "iterations": 2,
    "parallelism": 1,
    "salt": "56d2743d096cfd46fcb87da3990a55d39d58b546e5429a0d45db91b53a94ce83"
  },
  "aead": "xchacha20-poly1305",
  "nonce": "3ab150df3741c8bd9b26a842c65580e67855f38c83d615d9",
  "sealed": "df9fd9819b74dfa2971195c0e2933c1a8c9af439a45c31d041c538c0bc488f745c9a3802462168b3cb282e361fa58030f8e694a9f773b0784dfb46788676a6f38b76426b03ad3593ba609486994a37c0398f9361f24225f339a08b41804fbc4898dd46246ffab76f1e38e93f0e5400747006126d646ad1da9fa560ad84f07a88989097f230392983abb296f13845b6bac13d0e20eab14658f9605ade5de9ebebb9f1f6"
}
"#;
