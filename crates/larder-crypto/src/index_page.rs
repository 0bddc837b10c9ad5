//! The disk index of an encrypted repository (docs/design/crypto.md, "Disk index
//! pages"): a build's header, its pages sealed one at a time, and its `held` record.
//!
//! Every write of a page draws a fresh salt, whose metadata subkey seals that one page
//! at `nonce(0)`: pages are rewritten in place, so no key ever seals two messages. The
//! associated data binds the file, the page number and the build, so a page moved to
//! another place or left from an earlier build fails to open. Only `meta_key` is
//! needed, so write-only keys read and write the index too.

use crate::aead::TAG_LEN;
use crate::envelope::{ObjectKind, ENVELOPE_OVERHEAD};
use crate::keys::RepoKeys;
use crate::random::{OsRandom, RandomSource};
use crate::{CryptoError, Result};

/// Bytes of a logical page, which the build header records.
pub const INDEX_PAGE_LEN: usize = 4096;
/// Bytes of a page's salt, in front of its ciphertext.
pub const PAGE_SALT_LEN: usize = 32;
/// What sealing adds to a page: the salt and the tag.
pub const PAGE_OVERHEAD: usize = PAGE_SALT_LEN + TAG_LEN;
/// Bytes of a sealed page: salt ‖ ciphertext ‖ tag.
pub const SEALED_PAGE_LEN: usize = INDEX_PAGE_LEN + PAGE_OVERHEAD;
/// Bytes of the header's plaintext: magic, version, page size, build id.
const HEADER_PLAIN_LEN: usize = 48;
/// Bytes of a build header (a metadata envelope), at the start of every file.
pub const INDEX_HEADER_LEN: usize = ENVELOPE_OVERHEAD + HEADER_PLAIN_LEN;
const HEADER_MAGIC: &[u8; 8] = b"LDXSEAL1";
const HEADER_VERSION: u32 = 1;

/// What the first byte of a kind 9 name names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IndexPart {
    /// The build header (page number 0).
    Header,
    Table,
    Meta,
    Bloom,
    /// The `held` record (page number 0).
    Held,
    Runs,
    /// The last backup's counters (page number 0).
    LastBackup,
}

impl IndexPart {
    pub const ALL: [IndexPart; 7] = [
        Self::Header,
        Self::Table,
        Self::Meta,
        Self::Bloom,
        Self::Held,
        Self::Runs,
        Self::LastBackup,
    ];

    pub fn code(self) -> u8 {
        match self {
            Self::Header => 0,
            Self::Table => 1,
            Self::Meta => 2,
            Self::Bloom => 3,
            Self::Held => 4,
            Self::Runs => 5,
            Self::LastBackup => 6,
        }
    }

    pub fn from_code(code: u8) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.code() == code)
    }

    /// Whether the part is stored as sealed pages (the four files), not as an
    /// envelope.
    pub fn is_paged(self) -> bool {
        matches!(self, Self::Table | Self::Meta | Self::Bloom | Self::Runs)
    }

    /// The kind 9 name: file code ‖ page number (u64).
    pub fn name(self, page: u64) -> [u8; 9] {
        let mut name = [0u8; 9];
        name[0] = self.code();
        name[1..].copy_from_slice(&page.to_le_bytes());
        name
    }
}

/// A page's associated data: `"larder object v1" ‖ repository id ‖ 9 ‖ 9u16 ‖ file
/// code ‖ page number ‖ build id`, from a template with the name filled in per page.
const PAGE_AAD_LEN: usize = 16 + 16 + 1 + 2 + 9 + 32;
const PAGE_AAD_NAME: usize = 16 + 16 + 1 + 2;

/// Seals and opens the pages of one build of a disk index: made by
/// [`RepoKeys::new_index_build`] (a new build) or [`RepoKeys::open_index_build`] (a
/// stored header), with a full or a write-only key.
pub struct PageSealer {
    /// A write-only copy: pages need `meta_key` only.
    keys: RepoKeys,
    build_id: [u8; 32],
    header: [u8; INDEX_HEADER_LEN],
    aad: [u8; PAGE_AAD_LEN],
}

impl RepoKeys {
    /// Starts a new build: draws its id and seals its header.
    pub fn new_index_build(&self) -> PageSealer {
        self.new_index_build_with(&mut OsRandom)
    }

    pub(crate) fn new_index_build_with(&self, rng: &mut impl RandomSource) -> PageSealer {
        let build_id = rng.array::<32>();
        let mut plain = [0u8; HEADER_PLAIN_LEN];
        plain[..8].copy_from_slice(HEADER_MAGIC);
        plain[8..12].copy_from_slice(&HEADER_VERSION.to_le_bytes());
        plain[12..16].copy_from_slice(&(INDEX_PAGE_LEN as u32).to_le_bytes());
        plain[16..].copy_from_slice(&build_id);
        let sealed = self.seal_object_with(
            rng,
            ObjectKind::DiskIndexPage,
            &IndexPart::Header.name(0),
            &plain,
        );
        let mut header = [0u8; INDEX_HEADER_LEN];
        header.copy_from_slice(&sealed);
        self.page_sealer(build_id, header)
    }

    /// Opens a stored build header (the first [`INDEX_HEADER_LEN`] bytes of a file).
    pub fn open_index_build(&self, header: &[u8]) -> Result<PageSealer> {
        let bad = |detail: &str| CryptoError::malformed("disk index header", detail);
        let stored: [u8; INDEX_HEADER_LEN] = header
            .try_into()
            .map_err(|_| bad(&format!("{} bytes, not {INDEX_HEADER_LEN}", header.len())))?;
        let plain = self.open_object(
            ObjectKind::DiskIndexPage,
            &IndexPart::Header.name(0),
            &stored,
        )?;
        if &plain[..8] != HEADER_MAGIC {
            return Err(bad("the magic is not LDXSEAL1"));
        }
        let word = |at: usize| {
            u32::from_le_bytes([plain[at], plain[at + 1], plain[at + 2], plain[at + 3]])
        };
        if word(8) != HEADER_VERSION {
            return Err(bad(&format!("version {}, not {HEADER_VERSION}", word(8))));
        }
        if word(12) != INDEX_PAGE_LEN as u32 {
            return Err(bad(&format!(
                "pages of {} bytes, not {INDEX_PAGE_LEN}",
                word(12)
            )));
        }
        let mut build_id = [0u8; 32];
        build_id.copy_from_slice(&plain[16..]);
        Ok(self.page_sealer(build_id, stored))
    }

    fn page_sealer(&self, build_id: [u8; 32], header: [u8; INDEX_HEADER_LEN]) -> PageSealer {
        let template = self.object_aad(ObjectKind::DiskIndexPage, &[0; 9], &build_id);
        let mut aad = [0u8; PAGE_AAD_LEN];
        aad.copy_from_slice(&template);
        PageSealer {
            keys: self.write_only(),
            build_id,
            header,
            aad,
        }
    }
}

impl PageSealer {
    /// The build's header: the first bytes of each of its files.
    pub fn header(&self) -> &[u8; INDEX_HEADER_LEN] {
        &self.header
    }

    fn page_aad(&self, part: IndexPart, page: u64) -> [u8; PAGE_AAD_LEN] {
        let mut aad = self.aad;
        aad[PAGE_AAD_NAME..PAGE_AAD_NAME + 9].copy_from_slice(&part.name(page));
        aad
    }

    /// Seals the logical pages `plain` (pages `first_page ..` of `part`, each
    /// [`INDEX_PAGE_LEN`] bytes) into `out` ([`SEALED_PAGE_LEN`] bytes each), every
    /// page under a fresh salt.
    ///
    /// # Panics
    /// If `part` is not paged, or the lengths are not whole pages that agree: bugs of
    /// the caller.
    pub fn seal_pages(&self, part: IndexPart, first_page: u64, plain: &[u8], out: &mut [u8]) {
        self.seal_pages_with(&mut OsRandom, part, first_page, plain, out);
    }

    pub(crate) fn seal_pages_with(
        &self,
        rng: &mut impl RandomSource,
        part: IndexPart,
        first_page: u64,
        plain: &[u8],
        out: &mut [u8],
    ) {
        assert!(part.is_paged(), "{part:?} is not stored in pages");
        let pages = plain.len() / INDEX_PAGE_LEN;
        assert!(
            plain.len() == pages * INDEX_PAGE_LEN && out.len() == pages * SEALED_PAGE_LEN,
            "{} plaintext bytes and {} sealed bytes are not the same whole pages",
            plain.len(),
            out.len()
        );
        // One draw for every salt of the write.
        let mut salts = vec![0u8; pages * PAGE_SALT_LEN];
        rng.fill(&mut salts);
        let pieces = plain
            .chunks_exact(INDEX_PAGE_LEN)
            .zip(out.chunks_exact_mut(SEALED_PAGE_LEN))
            .zip(salts.chunks_exact(PAGE_SALT_LEN));
        for (i, ((page, sealed), salt)) in pieces.enumerate() {
            let salt: &[u8; PAGE_SALT_LEN] = salt.try_into().expect("salt-sized chunks");
            let (head, rest) = sealed.split_at_mut(PAGE_SALT_LEN);
            let (body, tag) = rest.split_at_mut(INDEX_PAGE_LEN);
            head.copy_from_slice(salt);
            body.copy_from_slice(page);
            let aad = self.page_aad(part, first_page + i as u64);
            tag.copy_from_slice(&self.keys.metadata_key(salt).seal_detached(0, &aad, body));
        }
    }

    /// Opens page `page` of `part` from its sealed bytes into `out`, which receives
    /// the logical page (`sealed` is [`PAGE_OVERHEAD`] bytes longer). On an error
    /// `out` holds nothing of use.
    pub fn open_page(
        &self,
        part: IndexPart,
        page: u64,
        sealed: &[u8],
        out: &mut [u8],
    ) -> Result<()> {
        if sealed.len() != out.len() + PAGE_OVERHEAD || !part.is_paged() {
            return Err(CryptoError::malformed(
                "sealed disk index page",
                format!(
                    "{} bytes of {part:?} for a page of {}",
                    sealed.len(),
                    out.len()
                ),
            ));
        }
        let (salt, rest) = sealed.split_at(PAGE_SALT_LEN);
        let (body, tag) = rest.split_at(out.len());
        let salt: &[u8; PAGE_SALT_LEN] = salt.try_into().expect("split at the salt's length");
        let tag: &[u8; TAG_LEN] = tag.try_into().expect("the rest is the tag");
        out.copy_from_slice(body);
        self.keys
            .metadata_key(salt)
            .open_detached(0, &self.page_aad(part, page), out, tag)
            .map_err(|_| {
                CryptoError::Authentication(
                    "a disk index page failed authentication: damaged or tampered with, \
                     moved from another page or file, left from an earlier build of the \
                     index, or from another repository"
                        .into(),
                )
            })
    }

    /// Seals the `held` record of this build: its bytes after the build id.
    pub fn seal_held(&self, held: &[u8]) -> Vec<u8> {
        self.seal_held_with(&mut OsRandom, held)
    }

    pub(crate) fn seal_held_with(&self, rng: &mut impl RandomSource, held: &[u8]) -> Vec<u8> {
        let mut plain = Vec::with_capacity(32 + held.len());
        plain.extend_from_slice(&self.build_id);
        plain.extend_from_slice(held);
        self.keys.seal_object_with(
            rng,
            ObjectKind::DiskIndexPage,
            &IndexPart::Held.name(0),
            &plain,
        )
    }

    /// Opens a `held` record: it must be this build's.
    pub fn open_held(&self, bytes: &[u8]) -> Result<Vec<u8>> {
        let mut plain =
            self.keys
                .open_object(ObjectKind::DiskIndexPage, &IndexPart::Held.name(0), bytes)?;
        if plain.get(..32) != Some(&self.build_id[..]) {
            return Err(CryptoError::Authentication(
                "the disk index's held record belongs to another build of the index".into(),
            ));
        }
        plain.drain(..32);
        Ok(plain)
    }
}

impl std::fmt::Debug for PageSealer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PageSealer")
            .field("keys", &self.keys)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::random::SeededRandom;
    use crate::{AeadKind, FingerprintKind};

    fn keys(aead: AeadKind) -> RepoKeys {
        let mut rng = SeededRandom::new("index page unit tests");
        RepoKeys::generate_with(&mut rng, [4; 16], aead, FingerprintKind::KeyedBlake3)
    }

    fn pattern(pages: usize) -> Vec<u8> {
        (0..pages * INDEX_PAGE_LEN)
            .map(|i| (i % 251) as u8)
            .collect()
    }

    #[test]
    fn parts_round_trip_through_their_codes() {
        for part in IndexPart::ALL {
            assert_eq!(IndexPart::from_code(part.code()), Some(part));
            assert_eq!(part.name(7)[1..], 7u64.to_le_bytes());
        }
        assert_eq!(IndexPart::from_code(7), None);
    }

    #[test]
    fn the_page_aad_template_is_the_object_aad() {
        let k = keys(AeadKind::Aes256Gcm);
        let sealer = k.new_index_build();
        let aad = sealer.page_aad(IndexPart::Meta, 12);
        let expected = k.object_aad(
            ObjectKind::DiskIndexPage,
            &IndexPart::Meta.name(12),
            &sealer.build_id,
        );
        assert_eq!(aad[..], expected[..]);
        assert_eq!(sealer.header().len(), 112);
    }

    #[test]
    fn pages_round_trip_with_full_and_write_only_keys() {
        for aead in AeadKind::ALL {
            let k = keys(aead);
            let sealer = k.new_index_build();
            let plain = pattern(3);
            let mut sealed = vec![0u8; 3 * SEALED_PAGE_LEN];
            sealer.seal_pages(IndexPart::Table, 5, &plain, &mut sealed);
            let reader = k.write_only().open_index_build(sealer.header()).unwrap();
            for (i, page) in sealed.chunks_exact(SEALED_PAGE_LEN).enumerate() {
                let mut out = vec![0u8; INDEX_PAGE_LEN];
                reader
                    .open_page(IndexPart::Table, 5 + i as u64, page, &mut out)
                    .unwrap();
                assert_eq!(out, plain[i * INDEX_PAGE_LEN..(i + 1) * INDEX_PAGE_LEN]);
            }
            // Each write draws fresh salts: the same page seals differently.
            let mut again = vec![0u8; 3 * SEALED_PAGE_LEN];
            sealer.seal_pages(IndexPart::Table, 5, &plain, &mut again);
            assert_ne!(again[..PAGE_SALT_LEN], sealed[..PAGE_SALT_LEN]);
            assert_ne!(again, sealed);
        }
    }

    #[test]
    fn held_is_bound_to_its_build() {
        let k = keys(AeadKind::Aes256Gcm);
        let sealer = k.new_index_build();
        let sealed = sealer.seal_held(b"LDXHELD1 and runs");
        let reader = k.write_only().open_index_build(sealer.header()).unwrap();
        assert_eq!(reader.open_held(&sealed).unwrap(), b"LDXHELD1 and runs");
        let e = k.new_index_build().open_held(&sealed).unwrap_err();
        assert!(e.to_string().contains("another build"), "{e}");
    }

    #[test]
    fn wrong_lengths_and_parts_are_refused_not_panics() {
        let k = keys(AeadKind::Aes256Gcm);
        let sealer = k.new_index_build();
        let mut out = vec![0u8; INDEX_PAGE_LEN];
        let short = vec![0u8; SEALED_PAGE_LEN - 1];
        assert!(sealer
            .open_page(IndexPart::Meta, 1, &short, &mut out)
            .is_err());
        let page = vec![0u8; SEALED_PAGE_LEN];
        assert!(sealer
            .open_page(IndexPart::Held, 1, &page, &mut out)
            .is_err());
        assert!(k.open_index_build(&sealer.header()[..111]).is_err());
        let result = std::panic::catch_unwind(|| {
            let mut out = vec![0u8; SEALED_PAGE_LEN];
            sealer.seal_pages(IndexPart::Header, 0, &pattern(1), &mut out);
        });
        assert!(result.is_err());
    }
}
