//! Round trips and tampering: every single bit flip of an envelope, a key slot or any
//! part of a container fails to open; objects moved to another name, kind, place,
//! container or repository fail; a write-only key opens metadata envelopes and tables
//! and nothing else; a disk index page moved to another page, file, build or
//! repository fails.

use larder_crypto::container::KEY_BLOCK_LEN;
use larder_crypto::index_page::{INDEX_PAGE_LEN, SEALED_PAGE_LEN};
use larder_crypto::{
    AeadKind, ContainerFooter, CryptoError, FingerprintKind, IndexPart, KdfParams, KeyKind,
    KeySlot, ObjectKind, RepoKeys,
};

/// Full keys from fixed bytes: `repo` fills the repository id, `seed` the four keys.
fn keys(aead: AeadKind, repo: u8, seed: u8) -> RepoKeys {
    let mut material = vec![1, aead.code(), FingerprintKind::KeyedBlake3.code()];
    material.extend_from_slice(&[repo; 16]);
    material.extend((0..128).map(|i: u8| i.wrapping_mul(31) ^ seed));
    RepoKeys::from_material(&material).unwrap()
}

/// Calls `opens` on every single-bit flip of `bytes`; each must fail.
fn every_flip_fails(what: &str, bytes: &[u8], opens: impl Fn(&[u8]) -> bool) {
    assert!(opens(bytes), "{what}: the untouched bytes do not open");
    let mut flipped = bytes.to_vec();
    for at in 0..bytes.len() {
        for bit in 0..8 {
            flipped[at] ^= 1 << bit;
            assert!(
                !opens(&flipped),
                "{what}: flipping bit {bit} of byte {at} still opens"
            );
            flipped[at] ^= 1 << bit;
        }
    }
}

#[test]
fn every_bit_flip_of_an_envelope_fails() {
    for aead in AeadKind::ALL {
        let k = keys(aead, 1, 1);
        let name = 9u64.to_le_bytes();
        let sealed = k.seal_object(ObjectKind::IndexSegment, &name, b"an index segment");
        every_flip_fails("metadata envelope", &sealed, |b| {
            k.open_object(ObjectKind::IndexSegment, &name, b).is_ok()
        });
        let sealed = k.seal_sealed(ObjectKind::Snapshot, b"", b"a snapshot");
        every_flip_fails("sealed envelope", &sealed, |b| {
            k.open_sealed(ObjectKind::Snapshot, b"", b).is_ok()
        });
    }
}

#[test]
fn envelopes_are_bound_to_name_kind_and_repository() {
    let k = keys(AeadKind::Aes256Gcm, 1, 1);
    let same_keys_other_repo = keys(AeadKind::Aes256Gcm, 2, 1);
    let other_keys = keys(AeadKind::Aes256Gcm, 1, 2);
    let name = 9u64.to_le_bytes();
    let sealed = k.seal_object(ObjectKind::IndexSegment, &name, b"segment");
    assert!(k
        .open_object(ObjectKind::IndexSegment, &10u64.to_le_bytes(), &sealed)
        .is_err());
    assert!(k
        .open_object(ObjectKind::IndexSegment, b"", &sealed)
        .is_err());
    assert!(same_keys_other_repo
        .open_object(ObjectKind::IndexSegment, &name, &sealed)
        .is_err());
    assert!(other_keys
        .open_object(ObjectKind::IndexSegment, &name, &sealed)
        .is_err());
    // The kind byte rewritten to another metadata kind: the header check passes, the
    // associated data does not.
    let mut as_plan = sealed.clone();
    as_plan[8] = ObjectKind::GcPlan.code();
    let e = k
        .open_object(ObjectKind::GcPlan, &name, &as_plan)
        .unwrap_err();
    assert!(matches!(e, CryptoError::Authentication(_)), "{e}");
    assert!(
        e.to_string().contains("gc plan failed authentication"),
        "{e}"
    );

    let snap = k.seal_sealed(ObjectKind::Snapshot, b"", b"snapshot");
    assert!(k.open_sealed(ObjectKind::Snapshot, b"x", &snap).is_err());
    assert!(same_keys_other_repo
        .open_sealed(ObjectKind::Snapshot, b"", &snap)
        .is_err());
    assert!(other_keys
        .open_sealed(ObjectKind::Snapshot, b"", &snap)
        .is_err());
}

#[test]
fn every_bit_flip_of_a_key_slot_fails() {
    let k = keys(AeadKind::XChaCha20Poly1305, 1, 1);
    let tiny = KdfParams {
        memory_kib: 8,
        iterations: 1,
        parallelism: 1,
    };
    for kind in [KeyKind::Full, KeyKind::WriteOnly] {
        let slot = KeySlot::create(
            &k,
            kind,
            b"pw",
            tiny,
            "host".into(),
            "me".into(),
            "2026-11-28T00:00:00Z".into(),
        )
        .unwrap()
        .to_bytes();
        every_flip_fails("key slot", &slot, |b| {
            KeySlot::parse(b).is_ok_and(|s| s.unlock(b"pw", Some([1; 16])).is_ok())
        });
    }
}

/// A container's bytes 0..32 as larder-store lays them out.
fn header32(id: u64) -> [u8; 32] {
    let mut h = [0u8; 32];
    h[..8].copy_from_slice(b"LARDERC2");
    h[8..12].copy_from_slice(&2u32.to_le_bytes());
    h[12] = FingerprintKind::KeyedBlake3.code();
    h[13] = AeadKind::Aes256Gcm.code();
    h[16..24].copy_from_slice(&id.to_le_bytes());
    h
}

/// One container's sealed pieces.
struct Sealed {
    header: [u8; 32],
    key_block: [u8; KEY_BLOCK_LEN],
    salt: [u8; 32],
    chunks: Vec<(Vec<u8>, [u8; 32])>,
    table: Vec<u8>,
    footer: [u8; 32],
}

fn seal_container(k: &RepoKeys, id: u64, chunks: &[&[u8]]) -> Sealed {
    let header = header32(id);
    let sealer = k.container_sealer(id, &header);
    let sealed_chunks = chunks
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let fingerprint = k.fingerprint(c);
            let mut buf = c.to_vec();
            sealer.seal_chunk(i as u32, &fingerprint, &mut buf);
            (buf, fingerprint)
        })
        .collect();
    let mut table = vec![0x33; 48 * chunks.len()];
    sealer.seal_table(&mut table);
    Sealed {
        header,
        key_block: *sealer.key_block(),
        salt: *sealer.table_salt(),
        chunks: sealed_chunks,
        table,
        footer: sealer.seal_footer(ContainerFooter {
            table_offset: 1000,
            entry_count: chunks.len() as u32,
        }),
    }
}

#[test]
fn every_bit_flip_of_a_container_part_fails() {
    let k = keys(AeadKind::Aes256Gcm, 1, 1);
    let c = seal_container(&k, 5, &[b"first chunk", b"second chunk"]);
    let chunk_opens = |header: &[u8], block: &[u8], chunk: &[u8]| {
        let (header, block) = (header.try_into().unwrap(), block.try_into().unwrap());
        k.chunk_opener(5, header, block)
            .and_then(|o| o.open_chunk(1, &c.chunks[1].1, &mut chunk.to_vec()))
            .is_ok()
    };
    let table_opens = |header: &[u8], salt: &[u8], table: &[u8], footer: &[u8]| {
        let opener = k.table_opener(5, header.try_into().unwrap(), salt.try_into().unwrap());
        opener.open_table(&mut table.to_vec()).is_ok()
            && opener.open_footer(footer.try_into().unwrap()).is_ok()
    };
    let (h, kb, s) = (&c.header[..], &c.key_block[..], &c.salt[..]);
    let (chunk, table, footer) = (&c.chunks[1].0[..], &c.table[..], &c.footer[..]);
    every_flip_fails("chunk", chunk, |b| chunk_opens(h, kb, b));
    every_flip_fails("key block", kb, |b| chunk_opens(h, b, chunk));
    every_flip_fails("header, for a chunk", h, |b| chunk_opens(b, kb, chunk));
    every_flip_fails("table", table, |b| table_opens(h, s, b, footer));
    every_flip_fails("footer", footer, |b| table_opens(h, s, table, b));
    every_flip_fails("table salt", s, |b| table_opens(h, b, table, footer));
    every_flip_fails("header, for the table", h, |b| {
        table_opens(b, s, table, footer)
    });
}

#[test]
fn chunks_are_bound_to_their_place_container_and_repository() {
    let k = keys(AeadKind::Aes256Gcm, 1, 1);
    let a = seal_container(&k, 5, &[b"first chunk", b"second chunk"]);
    let b = seal_container(&k, 6, &[b"first chunk", b"second chunk"]);
    let opener = k.chunk_opener(5, &a.header, &a.key_block).unwrap();
    let (first, fp0) = &a.chunks[0];
    let (second, fp1) = &a.chunks[1];
    opener.open_chunk(0, fp0, &mut first.clone()).unwrap();
    // Swapped index, another fingerprint, another container's chunk.
    assert!(opener.open_chunk(1, fp0, &mut first.clone()).is_err());
    assert!(opener.open_chunk(0, fp1, &mut first.clone()).is_err());
    assert!(opener
        .open_chunk(1, fp1, &mut b.chunks[1].0.clone())
        .is_err());
    assert!(opener.open_chunk(1, fp1, &mut second.clone()).is_ok());
    // Another container's key block, or this one's under another id.
    assert!(k.chunk_opener(5, &a.header, &b.key_block).is_err());
    assert!(k.chunk_opener(6, &a.header, &a.key_block).is_err());
    assert!(k.chunk_opener(5, &header32(6), &a.key_block).is_err());
    // Another repository's keys (same key bytes, other id), or other key bytes.
    assert!(keys(AeadKind::Aes256Gcm, 2, 1)
        .chunk_opener(5, &a.header, &a.key_block)
        .is_err());
    assert!(keys(AeadKind::Aes256Gcm, 1, 2)
        .chunk_opener(5, &a.header, &a.key_block)
        .is_err());
    // The table and footer under another container id, or with another's salt.
    assert!(k
        .table_opener(6, &a.header, &a.salt)
        .open_table(&mut a.table.clone())
        .is_err());
    assert!(k
        .table_opener(5, &a.header, &b.salt)
        .open_table(&mut a.table.clone())
        .is_err());
    assert!(k
        .table_opener(5, &a.header, &a.salt)
        .open_footer(&b.footer)
        .is_err());
    // The footer's nonce is not the table's: a table of 16 entry bytes does not open as
    // a footer, nor the footer as a table.
    let mut footer_as_table = a.footer.to_vec();
    assert!(k
        .table_opener(5, &a.header, &a.salt)
        .open_table(&mut footer_as_table)
        .is_err());
}

#[test]
fn a_write_only_key_opens_metadata_and_tables_only() {
    let full = keys(AeadKind::XChaCha20Poly1305, 1, 1);
    let wo = full.write_only();
    assert!(!wo.is_full());
    let meta = wo.seal_object(ObjectKind::Config, b"", b"config");
    assert_eq!(
        full.open_object(ObjectKind::Config, b"", &meta).unwrap(),
        b"config"
    );
    assert_eq!(
        wo.open_object(ObjectKind::Config, b"", &meta).unwrap(),
        b"config"
    );

    let snap = wo.seal_sealed(ObjectKind::Snapshot, b"", b"snapshot");
    assert_eq!(
        full.open_sealed(ObjectKind::Snapshot, b"", &snap).unwrap(),
        b"snapshot"
    );
    let e = wo
        .open_sealed(ObjectKind::Snapshot, b"", &snap)
        .unwrap_err();
    assert!(matches!(e, CryptoError::WriteOnly { .. }));
    assert_eq!(
        e.to_string(),
        "this key is write-only: it cannot read snapshots; unlock the repository with a full key"
    );

    let c = seal_container(&wo, 3, &[b"chunk"]);
    let tables = wo.table_opener(3, &c.header, &c.salt);
    tables.open_table(&mut c.table.clone()).unwrap();
    assert_eq!(tables.open_footer(&c.footer).unwrap().entry_count, 1);
    let e = wo.chunk_opener(3, &c.header, &c.key_block).unwrap_err();
    assert!(e.to_string().contains("cannot read chunks"), "{e}");
    let mut chunk = c.chunks[0].0.clone();
    full.chunk_opener(3, &c.header, &c.key_block)
        .unwrap()
        .open_chunk(0, &c.chunks[0].1, &mut chunk)
        .unwrap();
    assert_eq!(chunk, b"chunk");
}

#[test]
fn a_chunk_opener_is_shared_between_threads() {
    let k = keys(AeadKind::Aes256Gcm, 1, 1);
    let chunks: Vec<Vec<u8>> = (0..64).map(|i| vec![i as u8; 1000 + i]).collect();
    let refs: Vec<&[u8]> = chunks.iter().map(|c| &c[..]).collect();
    let c = seal_container(&k, 8, &refs);
    let opener = k.chunk_opener(8, &c.header, &c.key_block).unwrap();
    std::thread::scope(|s| {
        for t in 0..4 {
            let (opener, c, chunks) = (opener.clone(), &c, &chunks);
            s.spawn(move || {
                for i in (t..64).step_by(4) {
                    let mut buf = c.chunks[i].0.clone();
                    opener
                        .open_chunk(i as u32, &c.chunks[i].1, &mut buf)
                        .unwrap();
                    assert_eq!(buf, chunks[i]);
                }
            });
        }
    });
    // In a slice of a larger buffer, as a reader holding a whole container.
    let mut whole = c.chunks[3].0.clone();
    whole.extend_from_slice(b"the next chunk");
    let sealed_len = c.chunks[3].0.len();
    let len = opener
        .open_chunk_in_slice(3, &c.chunks[3].1, &mut whole[..sealed_len])
        .unwrap();
    assert_eq!(&whole[..len], &chunks[3][..]);
}

/// Page `page` of `part`, sealed: byte i of its plaintext is `i * 7 + page` (mod 256).
fn sealed_page(sealer: &larder_crypto::PageSealer, part: IndexPart, page: u64) -> Vec<u8> {
    let plain: Vec<u8> = (0..INDEX_PAGE_LEN)
        .map(|i| (i as u64 * 7 + page) as u8)
        .collect();
    let mut sealed = vec![0u8; SEALED_PAGE_LEN];
    sealer.seal_pages(part, page, &plain, &mut sealed);
    sealed
}

fn page_opens(sealer: &larder_crypto::PageSealer, part: IndexPart, page: u64, b: &[u8]) -> bool {
    let mut out = vec![0u8; INDEX_PAGE_LEN];
    sealer.open_page(part, page, b, &mut out).is_ok()
}

#[test]
fn every_bit_flip_of_a_disk_index_page_and_header_fails() {
    for aead in AeadKind::ALL {
        let k = keys(aead, 1, 1);
        let sealer = k.new_index_build();
        let sealed = sealed_page(&sealer, IndexPart::Table, 3);
        every_flip_fails("disk index page", &sealed, |b| {
            page_opens(&sealer, IndexPart::Table, 3, b)
        });
        every_flip_fails("disk index header", sealer.header(), |b| {
            k.open_index_build(b).is_ok()
        });
        let held = sealer.seal_held(b"held runs");
        every_flip_fails("held", &held, |b| sealer.open_held(b).is_ok());
    }
}

#[test]
fn disk_index_pages_are_bound_to_page_file_build_and_repository() {
    let k = keys(AeadKind::Aes256Gcm, 1, 1);
    let sealer = k.new_index_build();
    let sealed = sealed_page(&sealer, IndexPart::Meta, 5);
    assert!(page_opens(&sealer, IndexPart::Meta, 5, &sealed));
    // Another page number, another file.
    assert!(!page_opens(&sealer, IndexPart::Meta, 4, &sealed));
    assert!(!page_opens(
        &sealer,
        IndexPart::Meta,
        5 + (1 << 32),
        &sealed
    ));
    for part in [IndexPart::Table, IndexPart::Bloom, IndexPart::Runs] {
        assert!(!page_opens(&sealer, part, 5, &sealed), "{part:?}");
    }
    // A page of an older build of the same repository's index: same keys, new build.
    let newer = k.new_index_build();
    assert!(!page_opens(&newer, IndexPart::Meta, 5, &sealed));
    let err = {
        let mut out = vec![0u8; INDEX_PAGE_LEN];
        newer
            .open_page(IndexPart::Meta, 5, &sealed, &mut out)
            .unwrap_err()
    };
    assert!(err.to_string().contains("earlier build"), "{err}");
    assert!(newer.open_held(&sealer.seal_held(b"held")).is_err());
    // Another repository (same keys, another id) cannot open the header or the page,
    // nor can other keys; a write-only key opens both.
    for other in [
        keys(AeadKind::Aes256Gcm, 2, 1),
        keys(AeadKind::Aes256Gcm, 1, 2),
    ] {
        assert!(other.open_index_build(sealer.header()).is_err());
        let theirs = other.new_index_build();
        assert!(!page_opens(&theirs, IndexPart::Meta, 5, &sealed));
    }
    let write_only = k.write_only().open_index_build(sealer.header()).unwrap();
    assert!(page_opens(&write_only, IndexPart::Meta, 5, &sealed));
    // A header is no other kind 9 object: a `held` of a header's length does not open
    // as one (another name).
    let held = sealer.seal_held(&[0; 16]);
    assert_eq!(held.len(), sealer.header().len());
    assert!(k.open_index_build(&held).is_err());
    // Zeros are no page.
    assert!(!page_opens(
        &sealer,
        IndexPart::Table,
        1,
        &vec![0u8; SEALED_PAGE_LEN]
    ));
}
