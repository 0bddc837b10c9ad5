//! The cryptography of encrypted containers (docs/design/crypto.md, "Containers,
//! encrypted (`LARDERC2`)"). larder-store lays out the file; this module gives it the
//! pieces: the key block (`E` ‖ the sealed data key, bytes 32..112), the table salt
//! (bytes 112..144), chunks sealed in place, the sealed table and footer, and their
//! openers.
//!
//! Every associated data ends with the container's bytes 0..32 (`header32`: magic,
//! version, fingerprint and AEAD codes, container id), which the caller passes.

use std::sync::Arc;

use crate::aead::{AeadKey, TAG_LEN};
use crate::envelope::ObjectKind;
use crate::keys::RepoKeys;
use crate::random::{OsRandom, RandomSource};
use crate::{CryptoError, Result};

/// Bytes of `E` ‖ the sealed data key (32 + 32 + tag), at container offset 32.
pub const KEY_BLOCK_LEN: usize = 80;
/// Bytes of the sealed footer (16 + tag), at the container's end - 48.
pub const SEALED_FOOTER_LEN: usize = 32;

/// What the footer says: where the table starts and how many 48-byte entries it has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ContainerFooter {
    pub table_offset: u64,
    pub entry_count: u32,
}

/// A chunk's associated data: `"larder object v1" ‖ repository id ‖ 7 ‖ 44u16 ‖
/// container id ‖ index ‖ fingerprint ‖ header32`, built from a template with the
/// index and fingerprint filled in per chunk.
const CHUNK_AAD_LEN: usize = 16 + 16 + 1 + 2 + 44 + 32;
const CHUNK_AAD_INDEX: usize = 16 + 16 + 1 + 2 + 8;
const CHUNK_AAD_FINGERPRINT: usize = CHUNK_AAD_INDEX + 4;

#[derive(Clone)]
struct ChunkAad([u8; CHUNK_AAD_LEN]);

impl ChunkAad {
    fn new(keys: &RepoKeys, container_id: u64, header32: &[u8; 32]) -> Self {
        let mut name = [0u8; 44];
        name[..8].copy_from_slice(&container_id.to_le_bytes());
        let template = keys.object_aad(ObjectKind::Chunk, &name, header32);
        let mut aad = [0u8; CHUNK_AAD_LEN];
        aad.copy_from_slice(&template);
        Self(aad)
    }

    fn of(&self, index: u32, fingerprint: &[u8; 32]) -> [u8; CHUNK_AAD_LEN] {
        let mut aad = self.0;
        aad[CHUNK_AAD_INDEX..CHUNK_AAD_FINGERPRINT].copy_from_slice(&index.to_le_bytes());
        aad[CHUNK_AAD_FINGERPRINT..CHUNK_AAD_FINGERPRINT + 32].copy_from_slice(fingerprint);
        aad
    }
}

/// Seals one new container: made by [`RepoKeys::container_sealer`] with a fresh data
/// key, ephemeral key and table salt; full and write-only keys alike.
pub struct ContainerSealer {
    data: AeadKey,
    chunk_aad: ChunkAad,
    table: AeadKey,
    table_aad: Vec<u8>,
    key_block: [u8; KEY_BLOCK_LEN],
    table_salt: [u8; 32],
}

impl ContainerSealer {
    /// Bytes 32..112 of the container: `E` ‖ the data key sealed to `read_public`.
    pub fn key_block(&self) -> &[u8; KEY_BLOCK_LEN] {
        &self.key_block
    }

    /// Bytes 112..144 of the container.
    pub fn table_salt(&self) -> &[u8; 32] {
        &self.table_salt
    }

    /// Seals the stored bytes of chunk `index` (its table position) in place and
    /// appends the tag: the chunk's stored length grows by 16.
    pub fn seal_chunk(&self, index: u32, fingerprint: &[u8; 32], buf: &mut Vec<u8>) {
        self.data.seal_in_place(
            u64::from(index),
            &self.chunk_aad.of(index, fingerprint),
            buf,
        );
    }

    /// Fills `padding` with the container's padding: zeros encrypted under the data
    /// key at nonce [`PADDING_NONCE`] (above every chunk's), so that it looks like the
    /// ciphertext around it and a full key can check it ([`ChunkOpener::padding_is`]).
    pub fn fill_padding(&self, padding: &mut [u8]) {
        padding.fill(0);
        self.data.seal_detached(PADDING_NONCE, PADDING_AAD, padding);
    }

    /// As [`Self::seal_chunk`], for stored bytes already in place inside the
    /// container's buffer: encrypts `chunk` and returns the tag to append after it.
    pub fn seal_chunk_detached(
        &self,
        index: u32,
        fingerprint: &[u8; 32],
        chunk: &mut [u8],
    ) -> [u8; TAG_LEN] {
        self.data.seal_detached(
            u64::from(index),
            &self.chunk_aad.of(index, fingerprint),
            chunk,
        )
    }

    /// Seals the table's 48-byte entries in place and appends the tag (`nonce(0)`).
    pub fn seal_table(&self, entries: &mut Vec<u8>) {
        self.table.seal_in_place(0, &self.table_aad, entries);
    }

    /// The footer's 32 sealed bytes (`nonce(1)`), at the container's end - 48.
    pub fn seal_footer(&self, footer: ContainerFooter) -> [u8; SEALED_FOOTER_LEN] {
        let mut out = [0u8; SEALED_FOOTER_LEN];
        out[..8].copy_from_slice(&footer.table_offset.to_le_bytes());
        out[8..12].copy_from_slice(&footer.entry_count.to_le_bytes());
        let tag = self.table.seal_detached(1, &self.table_aad, &mut out[..16]);
        out[16..].copy_from_slice(&tag);
        out
    }
}

/// Opens a container's table and footer: full and write-only keys alike.
pub struct TableOpener {
    table: AeadKey,
    table_aad: Vec<u8>,
}

impl TableOpener {
    /// Opens the sealed table (entries ‖ tag) in place; `buf` is left holding the
    /// entries.
    pub fn open_table(&self, buf: &mut Vec<u8>) -> Result<()> {
        self.table
            .open_in_place(0, &self.table_aad, buf)
            .map_err(|_| unauthentic("table"))
    }

    /// Opens the footer's 32 sealed bytes.
    pub fn open_footer(&self, sealed: &[u8; SEALED_FOOTER_LEN]) -> Result<ContainerFooter> {
        let mut plain = [0u8; 16];
        plain.copy_from_slice(&sealed[..16]);
        let tag: &[u8; TAG_LEN] = sealed[16..].try_into().map_err(|_| unauthentic("footer"))?;
        self.table
            .open_detached(1, &self.table_aad, &mut plain, tag)
            .map_err(|_| unauthentic("footer"))?;
        if plain[12..] != [0; 4] {
            return Err(CryptoError::malformed(
                "container footer",
                "its reserved bytes are not zero",
            ));
        }
        Ok(ContainerFooter {
            table_offset: u64::from_le_bytes(plain[..8].try_into().unwrap_or_default()),
            entry_count: u32::from_le_bytes(plain[8..12].try_into().unwrap_or_default()),
        })
    }
}

/// Opens one container's chunks: full keys only. Cheap to clone (one `Arc`), so that
/// readers cache one per container and share it between threads.
#[derive(Clone)]
pub struct ChunkOpener(Arc<ChunkOpenerInner>);

struct ChunkOpenerInner {
    data: AeadKey,
    chunk_aad: ChunkAad,
}

/// The nonce of a container's padding: chunk nonces are table indices, below 2^32.
pub const PADDING_NONCE: u64 = u64::MAX;
/// The padding's associated data (its tag is discarded; only the keystream is used).
const PADDING_AAD: &[u8] = b"larder container padding v1";

impl ChunkOpener {
    /// Whether `padding` is exactly what [`ContainerSealer::fill_padding`] wrote.
    pub fn padding_is(&self, padding: &[u8]) -> bool {
        let mut expected = vec![0u8; padding.len()];
        self.0
            .data
            .seal_detached(PADDING_NONCE, PADDING_AAD, &mut expected);
        expected == padding
    }

    /// Opens chunk `index`'s sealed bytes (ciphertext ‖ tag) in place; `buf` is left
    /// holding its stored bytes (raw, or one zstd frame).
    pub fn open_chunk(&self, index: u32, fingerprint: &[u8; 32], buf: &mut Vec<u8>) -> Result<()> {
        let len = self.open_chunk_in_slice(index, fingerprint, buf)?;
        buf.truncate(len);
        Ok(())
    }

    /// As [`Self::open_chunk`], for a chunk inside a larger buffer (a whole container
    /// read at once): the stored bytes are left in `buf[..len]` and `len` returned.
    pub fn open_chunk_in_slice(
        &self,
        index: u32,
        fingerprint: &[u8; 32],
        buf: &mut [u8],
    ) -> Result<usize> {
        let aad = self.0.chunk_aad.of(index, fingerprint);
        self.0
            .data
            .open_in_slice(u64::from(index), &aad, buf)
            .map_err(|_| unauthentic("chunk"))
    }
}

impl std::fmt::Debug for ContainerSealer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ContainerSealer")
            .field("aead", &self.data.kind())
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for TableOpener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TableOpener")
            .field("aead", &self.table.kind())
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for ChunkOpener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChunkOpener")
            .field("aead", &self.0.data.kind())
            .finish_non_exhaustive()
    }
}

fn unauthentic(part: &str) -> CryptoError {
    CryptoError::Authentication(format!(
        "a container's {part} failed authentication: damaged or tampered with, moved to \
         another place or container, or from another repository"
    ))
}

impl RepoKeys {
    /// Starts a new container: draws its data key, ephemeral key and table salt.
    /// `header32` is the container's bytes 0..32.
    pub fn container_sealer(&self, container_id: u64, header32: &[u8; 32]) -> ContainerSealer {
        self.container_sealer_with(&mut OsRandom, container_id, header32)
    }

    pub(crate) fn container_sealer_with(
        &self,
        rng: &mut impl RandomSource,
        container_id: u64,
        header32: &[u8; 32],
    ) -> ContainerSealer {
        let data_key = zeroize::Zeroizing::new(rng.array::<32>());
        let (ephemeral, wrap) = self.sealing_key(rng);
        let mut key_block = [0u8; KEY_BLOCK_LEN];
        key_block[..32].copy_from_slice(&ephemeral);
        key_block[32..64].copy_from_slice(&data_key[..]);
        let aad = self.data_key_aad(container_id, header32);
        let tag = wrap.seal_detached(0, &aad, &mut key_block[32..64]);
        key_block[64..].copy_from_slice(&tag);
        let table_salt = rng.array::<32>();
        let TableOpener { table, table_aad } =
            self.table_opener(container_id, header32, &table_salt);
        ContainerSealer {
            data: AeadKey::new(self.aead(), &data_key),
            chunk_aad: ChunkAad::new(self, container_id, header32),
            table,
            table_aad,
            key_block,
            table_salt,
        }
    }

    /// The opener of a container's table and footer, from its bytes 0..32 and its
    /// table salt (bytes 112..144).
    pub fn table_opener(
        &self,
        container_id: u64,
        header32: &[u8; 32],
        table_salt: &[u8; 32],
    ) -> TableOpener {
        TableOpener {
            table: self.metadata_key(table_salt),
            table_aad: self.object_aad(
                ObjectKind::ContainerTable,
                &container_id.to_le_bytes(),
                header32,
            ),
        }
    }

    /// The opener of a container's chunks, from its bytes 0..32 and its key block
    /// (bytes 32..112): opens the data key, so full keys only.
    pub fn chunk_opener(
        &self,
        container_id: u64,
        header32: &[u8; 32],
        key_block: &[u8; KEY_BLOCK_LEN],
    ) -> Result<ChunkOpener> {
        let mut ephemeral = [0u8; 32];
        ephemeral.copy_from_slice(&key_block[..32]);
        let wrap = self.opening_key(&ephemeral, "chunks (file data and trees)")?;
        let mut data_key = zeroize::Zeroizing::new([0u8; 32]);
        data_key.copy_from_slice(&key_block[32..64]);
        let tag: &[u8; TAG_LEN] = key_block[64..]
            .try_into()
            .map_err(|_| unauthentic("data key"))?;
        let aad = self.data_key_aad(container_id, header32);
        wrap.open_detached(0, &aad, &mut data_key[..], tag)
            .map_err(|_| unauthentic("data key"))?;
        Ok(ChunkOpener(Arc::new(ChunkOpenerInner {
            data: AeadKey::new(self.aead(), &data_key),
            chunk_aad: ChunkAad::new(self, container_id, header32),
        })))
    }

    fn data_key_aad(&self, container_id: u64, header32: &[u8; 32]) -> Vec<u8> {
        self.object_aad(
            ObjectKind::ContainerDataKey,
            &container_id.to_le_bytes(),
            header32,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::random::SeededRandom;
    use crate::{AeadKind, FingerprintKind};

    fn keys() -> RepoKeys {
        let mut rng = SeededRandom::new("container unit tests");
        RepoKeys::generate_with(
            &mut rng,
            [9; 16],
            AeadKind::Aes256Gcm,
            FingerprintKind::KeyedBlake3,
        )
    }

    #[test]
    fn the_chunk_aad_template_is_the_object_aad() {
        let k = keys();
        let header = [5u8; 32];
        let mut name = Vec::new();
        name.extend_from_slice(&77u64.to_le_bytes());
        name.extend_from_slice(&3u32.to_le_bytes());
        name.extend_from_slice(&[0xab; 32]);
        let aad = ChunkAad::new(&k, 77, &header).of(3, &[0xab; 32]);
        assert_eq!(aad[..], k.object_aad(ObjectKind::Chunk, &name, &header)[..]);
    }

    #[test]
    fn a_container_round_trips() {
        let k = keys();
        let header = [1u8; 32];
        let sealer = k.container_sealer(42, &header);
        let chunks: Vec<Vec<u8>> = (0..5).map(|i| vec![i as u8; 100 * i]).collect();
        let mut sealed = Vec::new();
        for (i, c) in chunks.iter().enumerate() {
            let mut buf = c.clone();
            sealer.seal_chunk(i as u32, &k.fingerprint(c), &mut buf);
            assert_eq!(buf.len(), c.len() + TAG_LEN);
            sealed.push(buf);
        }
        let mut table = vec![7u8; 48 * 5];
        sealer.seal_table(&mut table);
        let footer = ContainerFooter {
            table_offset: 4096,
            entry_count: 5,
        };
        let sealed_footer = sealer.seal_footer(footer);

        let tables = k
            .write_only()
            .table_opener(42, &header, sealer.table_salt());
        tables.open_table(&mut table).unwrap();
        assert_eq!(table, vec![7u8; 48 * 5]);
        assert_eq!(tables.open_footer(&sealed_footer).unwrap(), footer);

        let opener = k.chunk_opener(42, &header, sealer.key_block()).unwrap();
        let shared = opener.clone();
        for (i, c) in chunks.iter().enumerate() {
            let mut buf = sealed[i].clone();
            shared
                .open_chunk(i as u32, &k.fingerprint(c), &mut buf)
                .unwrap();
            assert_eq!(&buf, c);
        }
        let e = k
            .write_only()
            .chunk_opener(42, &header, sealer.key_block())
            .unwrap_err();
        assert!(matches!(e, CryptoError::WriteOnly { .. }), "{e}");
    }

    #[test]
    fn a_small_order_ephemeral_key_is_refused() {
        let k = keys();
        let header = [1u8; 32];
        let mut block = *k.container_sealer(1, &header).key_block();
        block[..32].copy_from_slice(&[0; 32]);
        let e = k.chunk_opener(1, &header, &block).unwrap_err();
        assert!(e.to_string().contains("small-order"), "{e}");
    }
}
