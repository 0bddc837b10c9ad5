//! The committed seeds of the fuzz targets `key_slot`, `envelope`, `container_crypto`
//! and `index_page` (fuzz/seeds/, copied by scripts/fuzz-smoke): written by
//! `cargo test -p larder-crypto --test fuzz_seeds -- --ignored write_the_fuzz_seeds`,
//! with the fixed key the targets use, and checked here to open as the targets read
//! them.

use std::path::PathBuf;

use larder_crypto::index_page::{INDEX_HEADER_LEN, INDEX_PAGE_LEN, SEALED_PAGE_LEN};
use larder_crypto::{
    ContainerFooter, IndexPart, KdfParams, KeyKind, KeySlot, ObjectKind, RepoKeys,
};

/// The targets' fixed key (fuzz/fuzz_targets/envelope.rs, container_crypto.rs,
/// index_page.rs).
fn fuzz_keys() -> RepoKeys {
    let mut material = vec![1, 1, 4];
    material.extend_from_slice(&[0x46; 16]);
    material.extend(0..128u8);
    RepoKeys::from_material(&material).unwrap()
}

const PASSWORD: &[u8] = b"fuzz password";
const TINY: KdfParams = KdfParams {
    memory_kib: 8,
    iterations: 1,
    parallelism: 1,
};
const CHUNK_FINGERPRINT: [u8; 32] = [0x11; 32];

fn seeds(target: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/seeds")
        .join(target)
}

fn envelope_input(kind: ObjectKind, name: &[u8], envelope: &[u8]) -> Vec<u8> {
    let mut input = vec![kind.code(), name.len() as u8];
    input.extend_from_slice(name);
    input.extend_from_slice(envelope);
    input
}

fn container_input(keys: &RepoKeys) -> Vec<u8> {
    let mut header = [0u8; 32];
    header[..8].copy_from_slice(b"LARDERC2");
    header[8..12].copy_from_slice(&2u32.to_le_bytes());
    header[12] = keys.fingerprint_kind().code();
    header[13] = keys.aead().code();
    header[16..24].copy_from_slice(&12u64.to_le_bytes());
    let sealer = keys.container_sealer(12, &header);
    let mut chunk = b"a chunk of a fuzz seed".to_vec();
    sealer.seal_chunk(0, &CHUNK_FINGERPRINT, &mut chunk);
    let mut table = vec![0x22; 48];
    sealer.seal_table(&mut table);
    let mut input = header.to_vec();
    input.extend_from_slice(sealer.key_block());
    input.extend_from_slice(sealer.table_salt());
    input.extend_from_slice(&(chunk.len() as u32).to_le_bytes());
    input.extend_from_slice(&chunk);
    input.extend_from_slice(&table);
    input.extend_from_slice(&sealer.seal_footer(ContainerFooter {
        table_offset: 144 + chunk.len() as u64,
        entry_count: 1,
    }));
    input
}

/// The `index_page` target's inputs: page 1 of `table` (byte i is i mod 256) and a
/// `held` record, each after the file code, the page number and the build header.
fn index_inputs(keys: &RepoKeys) -> [Vec<u8>; 2] {
    let sealer = keys.new_index_build();
    let plain: Vec<u8> = (0..INDEX_PAGE_LEN).map(|i| i as u8).collect();
    let mut page = vec![0u8; SEALED_PAGE_LEN];
    sealer.seal_pages(IndexPart::Table, 1, &plain, &mut page);
    let input = |part: IndexPart, number: u64, body: &[u8]| {
        let mut input = vec![part.code()];
        input.extend_from_slice(&number.to_le_bytes());
        input.extend_from_slice(sealer.header());
        input.extend_from_slice(body);
        input
    };
    [
        input(IndexPart::Table, 1, &page),
        input(
            IndexPart::Held,
            0,
            &sealer.seal_held(b"LDXHELD1 of a fuzz seed"),
        ),
    ]
}

#[test]
#[ignore = "writes fuzz/seeds/{key_slot,envelope,container_crypto,index_page}"]
fn write_the_fuzz_seeds() {
    let keys = fuzz_keys();
    let write = |target: &str, name: &str, bytes: &[u8]| {
        std::fs::create_dir_all(seeds(target)).unwrap();
        std::fs::write(seeds(target).join(name), bytes).unwrap();
    };
    for (kind, name) in [
        (KeyKind::Full, "seed-full"),
        (KeyKind::WriteOnly, "seed-write-only"),
    ] {
        let slot = KeySlot::create(
            &keys,
            kind,
            PASSWORD,
            TINY,
            "fuzz".into(),
            "seed".into(),
            "2026-11-28T00:00:00Z".into(),
        );
        write("key_slot", name, &slot.unwrap().to_bytes());
    }
    let name = 3u64.to_le_bytes();
    let segment = keys.seal_object(ObjectKind::IndexSegment, &name, b"an index segment");
    write(
        "envelope",
        "seed-metadata",
        &envelope_input(ObjectKind::IndexSegment, &name, &segment),
    );
    let snapshot = keys.seal_sealed(ObjectKind::Snapshot, b"", b"a snapshot");
    write(
        "envelope",
        "seed-sealed",
        &envelope_input(ObjectKind::Snapshot, b"", &snapshot),
    );
    write(
        "container_crypto",
        "seed-container",
        &container_input(&keys),
    );
    let [page, held] = index_inputs(&keys);
    write("index_page", "seed-page", &page);
    write("index_page", "seed-held", &held);
}

#[test]
fn the_fuzz_seeds_open() {
    let keys = fuzz_keys();
    for name in ["seed-full", "seed-write-only"] {
        let slot = KeySlot::parse(&std::fs::read(seeds("key_slot").join(name)).unwrap()).unwrap();
        assert_eq!(slot.kdf(), TINY);
        let unlocked = slot.unlock(PASSWORD, Some(keys.repo_id())).unwrap();
        assert_eq!(unlocked.fingerprint(b"x"), keys.fingerprint(b"x"));
    }
    for (name, kind) in [
        ("seed-metadata", ObjectKind::IndexSegment),
        ("seed-sealed", ObjectKind::Snapshot),
    ] {
        let input = std::fs::read(seeds("envelope").join(name)).unwrap();
        assert_eq!(input[0], kind.code());
        let (name, bytes) = input[2..].split_at(usize::from(input[1]));
        let opened = match kind {
            ObjectKind::Snapshot => keys.open_sealed(kind, name, bytes),
            _ => keys.open_object(kind, name, bytes),
        };
        opened.unwrap();
    }
    let input = std::fs::read(seeds("container_crypto").join("seed-container")).unwrap();
    let header: &[u8; 32] = input[..32].try_into().unwrap();
    let chunk_len = u32::from_le_bytes(input[144..148].try_into().unwrap()) as usize;
    let opener = keys
        .chunk_opener(12, header, input[32..112].try_into().unwrap())
        .unwrap();
    let mut chunk = input[148..148 + chunk_len].to_vec();
    opener
        .open_chunk(0, &CHUNK_FINGERPRINT, &mut chunk)
        .unwrap();
    let tables = keys.table_opener(12, header, input[112..144].try_into().unwrap());
    let mut table = input[148 + chunk_len..input.len() - 32].to_vec();
    tables.open_table(&mut table).unwrap();
    let footer = tables
        .open_footer(input[input.len() - 32..].try_into().unwrap())
        .unwrap();
    assert_eq!(footer.entry_count, 1);
    let page = std::fs::read(seeds("index_page").join("seed-page")).unwrap();
    assert_eq!(page[0], IndexPart::Table.code());
    let (header, sealed) = page[9..].split_at(INDEX_HEADER_LEN);
    let sealer = keys.write_only().open_index_build(header).unwrap();
    let mut plain = vec![0u8; INDEX_PAGE_LEN];
    sealer
        .open_page(IndexPart::Table, 1, sealed, &mut plain)
        .unwrap();
    assert_eq!(plain[255], 255);
    let held = std::fs::read(seeds("index_page").join("seed-held")).unwrap();
    let sealer = keys
        .open_index_build(&held[9..9 + INDEX_HEADER_LEN])
        .unwrap();
    sealer.open_held(&held[9 + INDEX_HEADER_LEN..]).unwrap();
}
