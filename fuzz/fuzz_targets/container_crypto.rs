//! Opening an encrypted container's parts (docs/design/crypto.md, "Containers,
//! encrypted (`LARDERC2`)") from any bytes with a fixed key must fail or succeed
//! without panicking: the data key from the key block, chunk 0 (fingerprint 32 bytes of
//! 0x11), the table and the footer. Input: the container's first 144 bytes (bytes 0..32,
//! key block, table salt; the container id at 16..24), the chunk's sealed length (u32),
//! the chunk, the table, then the 32-byte footer. The key is the one `larder-crypto`'s
//! tests/fuzz_seeds.rs seals the seed with.
#![no_main]
use larder_crypto::aead::TAG_LEN;

use libfuzzer_sys::fuzz_target;

#[path = "common/keys.rs"]
mod keys;
use keys::fuzz_keys;

fuzz_target!(|data: &[u8]| {
    if data.len() < 144 + 4 + 32 {
        return;
    }
    let (head, rest) = data.split_at(144);
    let header: &[u8; 32] = head[..32].try_into().unwrap();
    let key_block = head[32..112].try_into().unwrap();
    let salt = head[112..].try_into().unwrap();
    let id = u64::from_le_bytes(header[16..24].try_into().unwrap());
    let chunk_len = u32::from_le_bytes(rest[..4].try_into().unwrap()) as usize;
    let Some(chunk) = rest[4..rest.len() - 32].get(..chunk_len) else {
        return;
    };
    let table = &rest[4 + chunk_len..rest.len() - 32];
    let footer = rest[rest.len() - 32..].try_into().unwrap();
    let (keys, write_only) = fuzz_keys();

    let tables = keys.table_opener(id, header, salt);
    let mut buf = table.to_vec();
    if tables.open_table(&mut buf).is_ok() {
        assert_eq!(buf.len() + TAG_LEN, table.len());
    }
    let _ = tables.open_footer(footer);
    if let Ok(chunks) = keys.chunk_opener(id, header, key_block) {
        let mut buf = chunk.to_vec();
        if chunks.open_chunk(0, &[0x11; 32], &mut buf).is_ok() {
            assert_eq!(buf.len() + TAG_LEN, chunk.len());
        }
    }
    assert!(write_only.chunk_opener(id, header, key_block).is_err());
});
