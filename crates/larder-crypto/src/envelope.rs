//! Envelopes (docs/design/crypto.md, "Envelopes"): every stored object except chunks.
//!
//! A metadata envelope (`LARDERE1`) is sealed under a subkey of `meta_key` and a fresh
//! salt: full and write-only keys open it. A sealed envelope (`LARDERP1`) is sealed
//! under a key from a fresh ephemeral X25519 key and `read_public`: any key seals one,
//! only a full key opens it. Both bind repository, kind and name in their associated
//! data, with the header.

use crate::aead::TAG_LEN;
use crate::keys::RepoKeys;
use crate::random::{OsRandom, RandomSource};
use crate::{CryptoError, Result};

/// The kinds of stored object, with the codes their associated data binds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ObjectKind {
    /// Name: empty.
    Config,
    /// Name: sequence number (u64).
    IndexSegment,
    /// Inside a container (`container.rs`). Name: container id (u64).
    ContainerTable,
    /// Name: plan id (u64).
    GcPlan,
    /// Name: partition number (u32) ‖ version (u64).
    PartitionObject,
    /// Sealed. Name: empty (bound by its file name, the BLAKE3 of its bytes).
    Snapshot,
    /// Inside a container (`container.rs`). Name: container id (u64) ‖ index (u32) ‖
    /// fingerprint (32).
    Chunk,
    /// Inside a container (`container.rs`). Name: container id (u64).
    ContainerDataKey,
    /// A disk index page, build header or record (`index_page.rs`). Name: file code
    /// ([`crate::IndexPart`], one byte) ‖ page number (u64).
    DiskIndexPage,
    /// A repository's lock object (docs/design/remote.md, "Lock objects"). Name: its
    /// name, 16 hex digits, as a u64.
    LockObject,
}

/// Which envelope an object kind is stored in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Envelope {
    Metadata,
    Sealed,
    /// Parts of a container, sealed by `container.rs`, never as an envelope.
    Container,
}

impl ObjectKind {
    pub const ALL: [ObjectKind; 10] = [
        Self::Config,
        Self::IndexSegment,
        Self::ContainerTable,
        Self::GcPlan,
        Self::PartitionObject,
        Self::Snapshot,
        Self::Chunk,
        Self::ContainerDataKey,
        Self::DiskIndexPage,
        Self::LockObject,
    ];

    pub fn code(self) -> u8 {
        match self {
            Self::Config => 1,
            Self::IndexSegment => 2,
            Self::ContainerTable => 3,
            Self::GcPlan => 4,
            Self::PartitionObject => 5,
            Self::Snapshot => 6,
            Self::Chunk => 7,
            Self::ContainerDataKey => 8,
            Self::DiskIndexPage => 9,
            Self::LockObject => 10,
        }
    }

    pub fn from_code(code: u8) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.code() == code)
    }

    /// In words, for messages.
    pub fn name(self) -> &'static str {
        match self {
            Self::Config => "config",
            Self::IndexSegment => "index segment",
            Self::ContainerTable => "container table",
            Self::GcPlan => "gc plan",
            Self::PartitionObject => "partition object",
            Self::Snapshot => "snapshot",
            Self::Chunk => "chunk",
            Self::ContainerDataKey => "container data key",
            Self::DiskIndexPage => "disk index page",
            Self::LockObject => "lock object",
        }
    }

    fn envelope(self) -> Envelope {
        match self {
            Self::Snapshot => Envelope::Sealed,
            Self::ContainerTable | Self::Chunk | Self::ContainerDataKey => Envelope::Container,
            _ => Envelope::Metadata,
        }
    }
}

/// Magic of a metadata envelope.
pub const METADATA_MAGIC: &[u8; 8] = b"LARDERE1";
/// Magic of a sealed envelope.
pub const SEALED_MAGIC: &[u8; 8] = b"LARDERP1";
/// Header bytes of either envelope.
pub const ENVELOPE_HEADER_LEN: usize = 48;
/// An envelope's length beyond its plaintext: header and tag.
pub const ENVELOPE_OVERHEAD: usize = ENVELOPE_HEADER_LEN + TAG_LEN;

impl RepoKeys {
    /// Seals `plaintext` in a metadata envelope.
    ///
    /// # Panics
    /// If `kind` is not stored in a metadata envelope (snapshots are sealed; chunks,
    /// tables and data keys are container parts).
    pub fn seal_object(&self, kind: ObjectKind, name: &[u8], plaintext: &[u8]) -> Vec<u8> {
        self.seal_object_with(&mut OsRandom, kind, name, plaintext)
    }

    pub(crate) fn seal_object_with(
        &self,
        rng: &mut impl RandomSource,
        kind: ObjectKind,
        name: &[u8],
        plaintext: &[u8],
    ) -> Vec<u8> {
        expect_envelope(kind, Envelope::Metadata);
        let salt = rng.array::<32>();
        let mut out = self.envelope_header(METADATA_MAGIC, kind, &salt, plaintext.len());
        let key = self.metadata_key(&salt);
        self.seal_body(&key, kind, name, &mut out, plaintext);
        out
    }

    /// Opens a metadata envelope of `kind` and `name`.
    pub fn open_object(&self, kind: ObjectKind, name: &[u8], bytes: &[u8]) -> Result<Vec<u8>> {
        if kind.envelope() != Envelope::Metadata {
            return Err(wrong_envelope(kind));
        }
        let salt = self.check_header(METADATA_MAGIC, kind, bytes)?;
        let key = self.metadata_key(&salt);
        self.open_body(&key, kind, name, bytes)
    }

    /// Seals `plaintext` in a sealed envelope: write-only keys can, so that a
    /// write-only machine seals its snapshots.
    ///
    /// # Panics
    /// If `kind` is not stored in a sealed envelope (only snapshots are).
    pub fn seal_sealed(&self, kind: ObjectKind, name: &[u8], plaintext: &[u8]) -> Vec<u8> {
        self.seal_sealed_with(&mut OsRandom, kind, name, plaintext)
    }

    pub(crate) fn seal_sealed_with(
        &self,
        rng: &mut impl RandomSource,
        kind: ObjectKind,
        name: &[u8],
        plaintext: &[u8],
    ) -> Vec<u8> {
        expect_envelope(kind, Envelope::Sealed);
        let (ephemeral, key) = self.sealing_key(rng);
        let mut out = self.envelope_header(SEALED_MAGIC, kind, &ephemeral, plaintext.len());
        self.seal_body(&key, kind, name, &mut out, plaintext);
        out
    }

    /// Opens a sealed envelope of `kind` and `name`: full keys only (a write-only key
    /// gets [`CryptoError::WriteOnly`] before anything is read).
    pub fn open_sealed(&self, kind: ObjectKind, name: &[u8], bytes: &[u8]) -> Result<Vec<u8>> {
        if kind.envelope() != Envelope::Sealed {
            return Err(wrong_envelope(kind));
        }
        if !self.is_full() {
            return Err(CryptoError::WriteOnly { what: plural(kind) });
        }
        let ephemeral = self.check_header(SEALED_MAGIC, kind, bytes)?;
        let key = self.opening_key(&ephemeral, plural(kind))?;
        self.open_body(&key, kind, name, bytes)
    }

    /// Magic, kind, AEAD code, six zeros, then the 32-byte salt or ephemeral key.
    fn envelope_header(
        &self,
        magic: &[u8; 8],
        kind: ObjectKind,
        field: &[u8; 32],
        plaintext_len: usize,
    ) -> Vec<u8> {
        let mut out = Vec::with_capacity(ENVELOPE_OVERHEAD + plaintext_len);
        out.extend_from_slice(magic);
        out.push(kind.code());
        out.push(self.aead().code());
        out.extend_from_slice(&[0; 6]);
        out.extend_from_slice(field);
        out
    }

    /// Appends `plaintext` to `out` (which holds the header), encrypts it in place and
    /// appends the tag.
    fn seal_body(
        &self,
        key: &crate::AeadKey,
        kind: ObjectKind,
        name: &[u8],
        out: &mut Vec<u8>,
        plaintext: &[u8],
    ) {
        let aad = self.object_aad(kind, name, &out[..ENVELOPE_HEADER_LEN]);
        out.extend_from_slice(plaintext);
        let tag = key.seal_detached(0, &aad, &mut out[ENVELOPE_HEADER_LEN..]);
        out.extend_from_slice(&tag);
    }

    fn open_body(
        &self,
        key: &crate::AeadKey,
        kind: ObjectKind,
        name: &[u8],
        bytes: &[u8],
    ) -> Result<Vec<u8>> {
        let aad = self.object_aad(kind, name, &bytes[..ENVELOPE_HEADER_LEN]);
        let mut body = bytes[ENVELOPE_HEADER_LEN..].to_vec();
        key.open_in_place(0, &aad, &mut body).map_err(|_| {
            CryptoError::Authentication(format!(
                "the {} failed authentication: damaged or tampered with, stored under \
                 another name, or from another repository",
                kind.name()
            ))
        })?;
        Ok(body)
    }

    /// Checks an envelope's header and returns its 32-byte salt or ephemeral key.
    fn check_header(&self, magic: &[u8; 8], kind: ObjectKind, bytes: &[u8]) -> Result<[u8; 32]> {
        let what = if magic == METADATA_MAGIC {
            "metadata envelope"
        } else {
            "sealed envelope"
        };
        let bad = |detail: String| CryptoError::malformed(what, detail);
        if bytes.len() < ENVELOPE_OVERHEAD {
            return Err(bad(format!(
                "{} bytes, shorter than its header and tag ({ENVELOPE_OVERHEAD})",
                bytes.len()
            )));
        }
        if &bytes[..8] != magic {
            return Err(bad(format!(
                "the magic is not {}",
                String::from_utf8_lossy(magic)
            )));
        }
        if bytes[8] != kind.code() {
            let held = ObjectKind::from_code(bytes[8]).map_or("an unknown kind", |k| k.name());
            return Err(bad(format!("it holds {held}, not a {}", kind.name())));
        }
        if bytes[9] != self.aead().code() {
            return Err(bad(format!(
                "AEAD code {}, but this repository uses {} (code {})",
                bytes[9],
                self.aead(),
                self.aead().code()
            )));
        }
        if bytes[10..16] != [0; 6] {
            return Err(bad("reserved bytes 10..16 are not zero".into()));
        }
        let mut field = [0u8; 32];
        field.copy_from_slice(&bytes[16..48]);
        Ok(field)
    }
}

/// "snapshots", for the write-only error.
fn plural(kind: ObjectKind) -> &'static str {
    match kind {
        ObjectKind::Snapshot => "snapshots",
        ObjectKind::Chunk => "chunks (file data and trees)",
        _ => kind.name(),
    }
}

fn expect_envelope(kind: ObjectKind, envelope: Envelope) {
    assert!(
        kind.envelope() == envelope,
        "a {} is not stored in a {envelope:?} envelope",
        kind.name()
    );
}

fn wrong_envelope(kind: ObjectKind) -> CryptoError {
    CryptoError::malformed(
        "envelope request",
        format!("a {} is not stored in this kind of envelope", kind.name()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::random::SeededRandom;
    use crate::{AeadKind, FingerprintKind};

    fn keys(aead: AeadKind) -> RepoKeys {
        let mut rng = SeededRandom::new("envelope unit tests");
        RepoKeys::generate_with(&mut rng, [3; 16], aead, FingerprintKind::KeyedBlake3)
    }

    #[test]
    fn kinds_round_trip_through_their_codes() {
        for kind in ObjectKind::ALL {
            assert_eq!(ObjectKind::from_code(kind.code()), Some(kind));
        }
        assert_eq!(ObjectKind::from_code(0), None);
        assert_eq!(ObjectKind::from_code(11), None);
    }

    #[test]
    fn envelopes_round_trip_and_have_the_documented_layout() {
        for aead in AeadKind::ALL {
            let k = keys(aead);
            for len in [0, 1, 15, 16, 17, 1000] {
                let plain: Vec<u8> = (0..len).map(|i| i as u8).collect();
                let sealed = k.seal_object(ObjectKind::IndexSegment, &5u64.to_le_bytes(), &plain);
                assert_eq!(sealed.len(), len + ENVELOPE_OVERHEAD);
                assert_eq!(&sealed[..8], METADATA_MAGIC);
                assert_eq!(sealed[8..16], [2, aead.code(), 0, 0, 0, 0, 0, 0]);
                let back = k.open_object(ObjectKind::IndexSegment, &5u64.to_le_bytes(), &sealed);
                assert_eq!(back.unwrap(), plain);
                let sealed = k.seal_sealed(ObjectKind::Snapshot, b"", &plain);
                assert_eq!(sealed.len(), len + ENVELOPE_OVERHEAD);
                assert_eq!(&sealed[..8], SEALED_MAGIC);
                assert_eq!(sealed[8..16], [6, aead.code(), 0, 0, 0, 0, 0, 0]);
                let back = k.open_sealed(ObjectKind::Snapshot, b"", &sealed);
                assert_eq!(back.unwrap(), plain);
            }
        }
    }

    #[test]
    fn requests_for_the_wrong_envelope_are_refused() {
        let k = keys(AeadKind::Aes256Gcm);
        let snap = k.seal_sealed(ObjectKind::Snapshot, b"", b"x");
        assert!(k.open_object(ObjectKind::Snapshot, b"", &snap).is_err());
        let cfg = k.seal_object(ObjectKind::Config, b"", b"x");
        assert!(k.open_sealed(ObjectKind::Config, b"", &cfg).is_err());
        assert!(k.open_object(ObjectKind::Chunk, b"", &cfg).is_err());
        let result = std::panic::catch_unwind(|| k.seal_object(ObjectKind::Snapshot, b"", b"x"));
        assert!(result.is_err());
    }

    #[test]
    fn header_errors_say_what_is_wrong() {
        let k = keys(AeadKind::Aes256Gcm);
        let cfg = k.seal_object(ObjectKind::Config, b"", b"x");
        let other = keys(AeadKind::XChaCha20Poly1305);
        let e = other
            .open_object(ObjectKind::Config, b"", &cfg)
            .unwrap_err();
        assert!(
            e.to_string()
                .contains("this repository uses xchacha20-poly1305"),
            "{e}"
        );
        let e = k.open_object(ObjectKind::GcPlan, b"", &cfg).unwrap_err();
        assert!(
            e.to_string().contains("it holds config, not a gc plan"),
            "{e}"
        );
        let e = k
            .open_object(ObjectKind::Config, b"", &cfg[..63])
            .unwrap_err();
        assert!(e.to_string().contains("shorter than its header"), "{e}");
    }
}
