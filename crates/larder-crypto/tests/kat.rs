//! Known-answer tests: published vectors through larder-crypto's own wrappers where the
//! wrapper takes the vector's inputs (the AEADs, the keyed fingerprints), and through
//! the crates it uses where it does not (Argon2id with a secret and associated data,
//! X25519 on given scalars).

use larder_crypto::{AeadKey, AeadKind, FingerprintKind, RepoKeys};

fn h(hex: &str) -> Vec<u8> {
    let hex: String = hex.split_whitespace().collect();
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
        .collect()
}

fn key32(hex: &str) -> [u8; 32] {
    h(hex).try_into().unwrap()
}

/// Seals `plain` through `AeadKey`, checks ciphertext ‖ tag, opens it back, and checks
/// that a changed tag, ciphertext or associated data fails.
fn check_aead(kind: AeadKind, key: &str, nonce: &str, aad: &str, plain: &[u8], sealed: &str) {
    let key = AeadKey::new(kind, &key32(key));
    let (nonce, aad) = (h(nonce), h(aad));
    let mut buf = plain.to_vec();
    key.seal_in_place_with_nonce(&nonce, &aad, &mut buf);
    assert_eq!(buf, h(sealed), "{kind} seal");
    let mut opened = buf.clone();
    key.open_in_place_with_nonce(&nonce, &aad, &mut opened)
        .unwrap();
    assert_eq!(opened, plain, "{kind} open");
    for at in [0, buf.len() - 1] {
        let mut bad = buf.clone();
        bad[at] ^= 1;
        assert!(key
            .open_in_place_with_nonce(&nonce, &aad, &mut bad)
            .is_err());
    }
    let mut more_aad = aad.clone();
    more_aad.push(0);
    assert!(key
        .open_in_place_with_nonce(&nonce, &more_aad, &mut buf.clone())
        .is_err());
}

/// McGrew and Viega, "The Galois/Counter Mode of Operation (GCM)", test cases 13 to 16
/// (the 256-bit keys), as in NIST's GCM validation suite.
#[test]
fn aes_256_gcm_test_cases_13_to_16() {
    let zero_key = "00".repeat(32);
    check_aead(
        AeadKind::Aes256Gcm,
        &zero_key,
        &"00".repeat(12),
        "",
        b"",
        "530f8afbc74536b9a963b4f1c4cb738b",
    );
    check_aead(
        AeadKind::Aes256Gcm,
        &zero_key,
        &"00".repeat(12),
        "",
        &[0; 16],
        "cea7403d4d606b6e074ec5d3baf39d18 d0d1c8a799996bf0265b98b5d48ab919",
    );
    let key = "feffe9928665731c6d6a8f9467308308feffe9928665731c6d6a8f9467308308";
    let plain = h(
        "d9313225f88406e5a55909c5aff5269a86a7a9531534f7da2e4c303d8a318a72
                   1c3c0c95956809532fcf0e2449a6b525b16aedf5aa0de657ba637b391aafd255",
    );
    let cipher = "522dc1f099567d07f47f37a32a84427d643a8cdcbfe5c0c97598a2bd2555d1aa
                  8cb08e48590dbb3da7b08b1056828838c5f61e6393ba7a0abcc9f662898015ad";
    let iv = "cafebabefacedbaddecaf888";
    check_aead(
        AeadKind::Aes256Gcm,
        key,
        iv,
        "",
        &plain,
        &format!("{cipher} b094dac5d93471bdec1a502270e3cc6c"),
    );
    let cipher60: String = cipher.split_whitespace().collect::<String>()[..120].into();
    check_aead(
        AeadKind::Aes256Gcm,
        key,
        iv,
        "feedfacedeadbeeffeedfacedeadbeefabaddad2",
        &plain[..60],
        &format!("{cipher60} 76fc6ece0f4e1768cddf8853bb2d551b"),
    );
}

/// draft-irtf-cfrg-xchacha-03, appendix A.3.1 (AEAD_XChaCha20_Poly1305).
#[test]
fn xchacha20_poly1305_draft_irtf_cfrg_xchacha_a_3_1() {
    let plain = b"Ladies and Gentlemen of the class of '99: If I could offer you only one tip \
                  for the future, sunscreen would be it.";
    check_aead(
        AeadKind::XChaCha20Poly1305,
        "808182838485868788898a8b8c8d8e8f909192939495969798999a9b9c9d9e9f",
        "404142434445464748494a4b4c4d4e4f5051525354555657",
        "50515253c0c1c2c3c4c5c6c7",
        plain,
        "bd6d179d3e83d43b9576579493c0e939572a1700252bfaccbed2902c21396cbb
         731c7f1b0b4aa6440bf3a82f4eda7e39ae64c6708c54c216cb96b72e1213b452
         2f8c9ba40db5d945b11b69b982c1bb9e3f3fac2bc369488f76b2383565d3fff9
         21f9664c97637da9768812f615c68b13b52e
         c0875924c1c7987947deafd8780acf49",
    );
}

#[test]
fn counter_nonces_are_little_endian_then_zeros() {
    assert_eq!(
        AeadKind::Aes256Gcm.nonce(0x0102),
        h("0201000000000000 00000000")
    );
    assert_eq!(
        AeadKind::XChaCha20Poly1305.nonce(u64::MAX),
        h("ffffffffffffffff 0000000000000000 0000000000000000")
    );
    // seal_in_place(n) is seal_in_place_with_nonce(nonce(n)).
    for kind in AeadKind::ALL {
        let key = AeadKey::new(kind, &[9; 32]);
        let (mut a, mut b) = (b"counter".to_vec(), b"counter".to_vec());
        key.seal_in_place(7, b"ad", &mut a);
        key.seal_in_place_with_nonce(&kind.nonce(7), b"ad", &mut b);
        assert_eq!(a, b);
    }
}

/// Keys whose `id_key` is `id_key` (the other keys arbitrary), through key material.
fn keys_with_id_key(fingerprint: FingerprintKind, id_key: &[u8; 32]) -> RepoKeys {
    let mut material = vec![1, AeadKind::Aes256Gcm.code(), fingerprint.code()];
    material.extend_from_slice(&[0; 16]);
    material.extend_from_slice(id_key);
    material.extend_from_slice(&[0x42; 4 * 32 - 32]);
    RepoKeys::from_material(&material).unwrap()
}

/// BLAKE3's official test vectors (test_vectors/test_vectors.json of the BLAKE3
/// repository): `keyed_hash` of inputs 0, 1, 2, ..., 250, 0, 1, ... with the key "whats
/// the Elvish word for friend"; the first 32 bytes of each extended output.
#[test]
fn keyed_blake3_official_vectors() {
    let keys = keys_with_id_key(
        FingerprintKind::KeyedBlake3,
        b"whats the Elvish word for friend",
    );
    for (len, expected) in [
        (
            0,
            "92b2b75604ed3c761f9d6f62392c8a9227ad0ea3f09573e783f1498a4ed60d26",
        ),
        (
            1,
            "6d7878dfff2f485635d39013278ae14f1454b8c0a3a2d34bc1ab38228a80c95b",
        ),
        (
            1023,
            "c951ecdf03288d0fcc96ee3413563d8a6d3589547f2c2fb36d9786470f1b9d6e",
        ),
        (
            1024,
            "75c46f6f3d9eb4f55ecaaee480db732e6c2105546f1e675003687c31719c7ba4",
        ),
        (
            1025,
            "357dc55de0c7e382c900fd6e320acc04146be01db6a8ce7210b7189bd664ea69",
        ),
        (
            2049,
            "9f29700902f7c86e514ddc4df1e3049f258b2472b6dd5267f61bf13983b78dd5",
        ),
        (
            4097,
            "00df940cd36bb9fa7cbbc3556744e0dbc8191401afe70520ba292ee3ca80abbc",
        ),
    ] {
        let input: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        assert_eq!(
            keys.fingerprint(&input).to_vec(),
            h(expected),
            "length {len}"
        );
        assert_eq!(keys.fingerprint_batch(&[&input])[0].to_vec(), h(expected));
    }
}

/// RFC 4231 test cases 1 to 4 through the fingerprint: HMAC pads a key shorter than
/// SHA-256's 64-byte block with zeros, so each key padded with zeros to 32 bytes gives
/// the RFC's value. Case 6 (a 131-byte key, hashed first) goes to the `hmac` crate.
#[test]
fn hmac_sha256_rfc_4231() {
    let cases: [(Vec<u8>, Vec<u8>, &str); 4] = [
        (
            vec![0x0b; 20],
            b"Hi There".to_vec(),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7",
        ),
        (
            b"Jefe".to_vec(),
            b"what do ya want for nothing?".to_vec(),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843",
        ),
        (
            vec![0xaa; 20],
            vec![0xdd; 50],
            "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe",
        ),
        (
            (1..=25).collect(),
            vec![0xcd; 50],
            "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b",
        ),
    ];
    for (key, data, expected) in cases {
        let mut padded = [0u8; 32];
        padded[..key.len()].copy_from_slice(&key);
        let keys = keys_with_id_key(FingerprintKind::HmacSha256, &padded);
        assert_eq!(keys.fingerprint(&data).to_vec(), h(expected));
    }
    use hmac::{KeyInit, Mac};
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(&[0xaa; 131]).unwrap();
    mac.update(b"Test Using Larger Than Block-Size Key - Hash Key First");
    assert_eq!(
        mac.finalize().into_bytes().to_vec(),
        h("60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54")
    );
}

/// RFC 9106, section 5.3 (Argon2id, version 0x13, with secret and associated data).
#[test]
fn argon2id_rfc_9106() {
    use argon2::{Algorithm, Argon2, AssociatedData, ParamsBuilder, Version};
    let params = ParamsBuilder::new()
        .m_cost(32)
        .t_cost(3)
        .p_cost(4)
        .output_len(32)
        .data(AssociatedData::new(&[0x04; 12]).unwrap())
        .build()
        .unwrap();
    let secret = [0x03; 8];
    let argon =
        Argon2::new_with_secret(&secret, Algorithm::Argon2id, Version::V0x13, params).unwrap();
    let mut out = [0u8; 32];
    argon
        .hash_password_into(&[0x01; 32], &[0x02; 16], &mut out)
        .unwrap();
    assert_eq!(
        out.to_vec(),
        h("0d640df58d78766c08c037a34a8b53c9d01ef0452d75b65eb52520e96b01e659")
    );
}

/// RFC 7748, section 5.2 (the function on given scalars and u-coordinates) and 6.1
/// (Diffie-Hellman as larder uses it: static secrets, public keys, shared secret).
#[test]
fn x25519_rfc_7748() {
    use x25519_dalek::{x25519, PublicKey, StaticSecret};
    for (k, u, out) in [
        (
            "a546e36bf0527c9d3b16154b82465edd62144c0ac1fc5a18506a2244ba449ac4",
            "e6db6867583030db3594c1a424b15f7c726624ec26b3353b10a903a6d0ab1c4c",
            "c3da55379de9c6908e94ea4df28d084f32eccf03491c71f754b4075577a28552",
        ),
        (
            "4b66e9d4d1b4673c5ad22691957d6af5c11b6421e0ea01d42ca4169e7918ba0d",
            "e5210f12786811d3f4b7959d0538ae2c31dbe7106fc03c3efc4cd549c715a493",
            "95cbde9476e8907d7aade45cb4b873f88b595a68799fa152e6f8f7647aac7957",
        ),
    ] {
        assert_eq!(x25519(key32(k), key32(u)).to_vec(), h(out));
    }
    let a = StaticSecret::from(key32(
        "77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a",
    ));
    let b = StaticSecret::from(key32(
        "5dab087e624a8a4b79e17f8b83800ee66f3bb1292618b6fd1c2f8b27ff88e0eb",
    ));
    let (pa, pb) = (PublicKey::from(&a), PublicKey::from(&b));
    assert_eq!(
        pa.as_bytes().to_vec(),
        h("8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a")
    );
    assert_eq!(
        pb.as_bytes().to_vec(),
        h("de9edb7d7b7dc1b4d35b61c2ece435373f8343c85b78674dadfc7e146f882b4f")
    );
    let shared = "4a5d9d5ba4ce2de1728e3bf480350f25e07e21c947d19e3376f09b3c1e161742";
    assert_eq!(a.diffie_hellman(&pb).as_bytes().to_vec(), h(shared));
    assert_eq!(b.diffie_hellman(&pa).as_bytes().to_vec(), h(shared));
    assert!(!a
        .diffie_hellman(&PublicKey::from([0; 32]))
        .was_contributory());
}
