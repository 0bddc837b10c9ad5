//! A repository's keys (docs/design/crypto.md, "Keys"): the full key or its write-only
//! half, the keyed chunk fingerprints, and the derivations every envelope and container
//! uses. Key bytes never leave this module except through those derivations and the
//! key material a key slot wraps.

use hmac::{Hmac, KeyInit, Mac};
use larder_hash::Blake3Batch;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use sha2::Sha256;
use x25519_dalek::{PublicKey, StaticSecret};
use zeroize::{Zeroize, Zeroizing};

use crate::aead::{AeadKey, AeadKind};
use crate::envelope::ObjectKind;
use crate::hex;
use crate::random::{OsRandom, RandomSource};
use crate::{CryptoError, Result};

/// BLAKE3-keyed context of a metadata envelope's (and a container table's) subkey.
const METADATA_SUBKEY: &[u8] = b"larder 2026-11-28 metadata subkey";
/// BLAKE3-keyed context of a sealed envelope's (and a container data key's) key.
const SEALED_OBJECT_KEY: &[u8] = b"larder 2026-11-28 sealed object key";
/// BLAKE3 `derive_key` contexts under which two keys' secrets are compared.
const COMPARE_ID_KEY: &str = "larder 2026-11-28 compare id key";
const COMPARE_CHUNKER: &str = "larder 2026-11-28 compare chunker secret";
/// First bytes of every object's associated data.
const OBJECT_AAD: &[u8] = b"larder object v1";

/// How a repository's chunk fingerprints are keyed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum FingerprintKind {
    /// BLAKE3 in keyed mode with `id_key` (BLAKE3 repositories).
    #[serde(rename = "keyed-blake3")]
    KeyedBlake3,
    /// HMAC-SHA-256 with `id_key` (SHA-256 repositories).
    #[serde(rename = "hmac-sha256")]
    HmacSha256,
}

impl FingerprintKind {
    pub const ALL: [FingerprintKind; 2] = [Self::KeyedBlake3, Self::HmacSha256];

    /// The code in container and index headers; 1 to 3 are the unkeyed hashes of
    /// plaintext repositories (docs/design/format.md).
    pub fn code(self) -> u8 {
        match self {
            Self::KeyedBlake3 => 4,
            Self::HmacSha256 => 5,
        }
    }

    pub fn from_code(code: u8) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.code() == code)
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::KeyedBlake3 => "keyed-blake3",
            Self::HmacSha256 => "hmac-sha256",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.name() == name)
    }
}

/// Full (reads and writes everything) or write-only (docs/design/crypto.md,
/// "Write-only keys").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum KeyKind {
    #[serde(rename = "full")]
    Full,
    #[serde(rename = "write-only")]
    WriteOnly,
}

impl KeyKind {
    /// The byte in key material and in a key slot's associated data.
    pub fn code(self) -> u8 {
        match self {
            Self::Full => 1,
            Self::WriteOnly => 2,
        }
    }

    pub fn from_code(code: u8) -> Option<Self> {
        [Self::Full, Self::WriteOnly]
            .into_iter()
            .find(|k| k.code() == code)
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Full => "full",
            Self::WriteOnly => "write-only",
        }
    }
}

/// Bytes of key material (docs/design/crypto.md, "Key material").
pub const KEY_MATERIAL_LEN: usize = 147;

/// A repository's keys: full, or write-only (no `read_secret`). Key bytes are wiped
/// when it is dropped, and `Debug` prints none of them.
#[derive(Clone)]
pub struct RepoKeys {
    repo_id: [u8; 16],
    aead: AeadKind,
    fingerprint: FingerprintKind,
    id_key: [u8; 32],
    chunker_secret: [u8; 32],
    meta_key: [u8; 32],
    read_public: [u8; 32],
    /// `None` in a write-only key.
    read_secret: Option<[u8; 32]>,
    /// HMAC-SHA-256 keyed with `id_key`, its key blocks already absorbed, cloned for
    /// each fingerprint (HMAC-SHA-256 repositories only).
    hmac: Option<Hmac<Sha256>>,
}

impl RepoKeys {
    /// Draws a new full key from the operating system's generator (`init`).
    pub fn generate(repo_id: [u8; 16], aead: AeadKind, fingerprint: FingerprintKind) -> Self {
        Self::generate_with(&mut OsRandom, repo_id, aead, fingerprint)
    }

    pub(crate) fn generate_with(
        rng: &mut impl RandomSource,
        repo_id: [u8; 16],
        aead: AeadKind,
        fingerprint: FingerprintKind,
    ) -> Self {
        let read_secret = Zeroizing::new(rng.array::<32>());
        Self::assemble(
            repo_id,
            aead,
            fingerprint,
            rng.array(),
            rng.array(),
            rng.array(),
            public_of(&read_secret),
            Some(*read_secret),
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn assemble(
        repo_id: [u8; 16],
        aead: AeadKind,
        fingerprint: FingerprintKind,
        id_key: [u8; 32],
        chunker_secret: [u8; 32],
        meta_key: [u8; 32],
        read_public: [u8; 32],
        read_secret: Option<[u8; 32]>,
    ) -> Self {
        let hmac = (fingerprint == FingerprintKind::HmacSha256)
            .then(|| Hmac::<Sha256>::new_from_slice(&id_key).ok())
            .flatten();
        Self {
            repo_id,
            aead,
            fingerprint,
            id_key,
            chunker_secret,
            meta_key,
            read_public,
            read_secret,
            hmac,
        }
    }

    /// The same keys without `read_secret`: what `key add --write-only` wraps.
    pub fn write_only(&self) -> RepoKeys {
        let mut keys = self.clone();
        keys.read_secret.zeroize();
        keys.read_secret = None;
        keys
    }

    pub fn kind(&self) -> KeyKind {
        if self.read_secret.is_some() {
            KeyKind::Full
        } else {
            KeyKind::WriteOnly
        }
    }

    pub fn is_full(&self) -> bool {
        self.read_secret.is_some()
    }

    pub fn repo_id(&self) -> [u8; 16] {
        self.repo_id
    }

    pub fn aead(&self) -> AeadKind {
        self.aead
    }

    pub fn fingerprint_kind(&self) -> FingerprintKind {
        self.fingerprint
    }

    /// A chunk's keyed fingerprint: BLAKE3-keyed or HMAC-SHA-256 with `id_key`.
    pub fn fingerprint(&self, data: &[u8]) -> [u8; 32] {
        match &self.hmac {
            None => *blake3::keyed_hash(&self.id_key, data).as_bytes(),
            Some(hmac) => {
                let mut mac = hmac.clone();
                mac.update(data);
                mac.finalize().into_bytes().into()
            }
        }
    }

    /// Whether `other` fingerprints chunks exactly as these keys do: the same kind
    /// and `id_key` (keys of one repository, or of repositories sharing a key, as a
    /// cluster's nodes do). `larder copy` then moves chunks without re-hashing them.
    pub fn same_fingerprints(&self, other: &RepoKeys) -> bool {
        self.fingerprint == other.fingerprint
            && same_secret(COMPARE_ID_KEY, &self.id_key, &other.id_key)
    }

    /// Whether `other` holds the same chunker secret: the keyed chunker then cuts
    /// every stream at the same points under both.
    pub fn same_chunker_secret(&self, other: &RepoKeys) -> bool {
        same_secret(COMPARE_CHUNKER, &self.chunker_secret, &other.chunker_secret)
    }

    /// Fingerprints many chunks on this thread; `out[i]` is the fingerprint of
    /// `chunks[i]`. Keyed BLAKE3 hashes them across SIMD lanes
    /// ([`larder_hash::Blake3Batch`]), HMAC-SHA-256 one at a time.
    pub fn fingerprint_many(&self, chunks: &[&[u8]]) -> Vec<[u8; 32]> {
        match &self.hmac {
            None => Blake3Batch::keyed(&self.id_key).hash(chunks),
            Some(_) => chunks.iter().map(|c| self.fingerprint(c)).collect(),
        }
    }

    /// Fingerprints many chunks on the rayon pool, [`RepoKeys::fingerprint_many`] on
    /// each slice, as `larder_hash::HashAlgo::fingerprint_batch`.
    pub fn fingerprint_batch(&self, chunks: &[&[u8]]) -> Vec<[u8; 32]> {
        chunks
            .par_chunks(larder_hash::BATCH_SLICE)
            .flat_map_iter(|slice| self.fingerprint_many(slice))
            .collect()
    }

    /// Rebuilds keys from key material (docs/design/crypto.md, "Key material"): what a
    /// key slot holds, and what tests and fuzz targets use for fixed keys. Every field
    /// is checked; a write-only key's `read_public` must not be a small-order point.
    pub fn from_material(material: &[u8]) -> Result<RepoKeys> {
        let bad = |detail: &str| CryptoError::malformed("key material", detail);
        if material.len() != KEY_MATERIAL_LEN {
            return Err(bad(&format!(
                "{} bytes, not {KEY_MATERIAL_LEN}",
                material.len()
            )));
        }
        let kind = KeyKind::from_code(material[0]).ok_or_else(|| bad("unknown key kind"))?;
        let aead = AeadKind::from_code(material[1]).ok_or_else(|| bad("unknown AEAD"))?;
        let fingerprint = FingerprintKind::from_code(material[2])
            .ok_or_else(|| bad("unknown fingerprint kind"))?;
        let field = |at: usize| -> [u8; 32] {
            let mut out = [0u8; 32];
            out.copy_from_slice(&material[at..at + 32]);
            out
        };
        let mut repo_id = [0u8; 16];
        repo_id.copy_from_slice(&material[3..19]);
        let last = Zeroizing::new(field(115));
        let (read_public, read_secret) = match kind {
            KeyKind::Full => (public_of(&last), Some(*last)),
            KeyKind::WriteOnly => {
                if !is_usable_public(&last) {
                    return Err(bad("read_public is a small-order point"));
                }
                (*last, None)
            }
        };
        Ok(Self::assemble(
            repo_id,
            aead,
            fingerprint,
            field(19),
            field(51),
            field(83),
            read_public,
            read_secret,
        ))
    }

    /// The key material a key slot wraps.
    pub(crate) fn material(&self) -> Zeroizing<[u8; KEY_MATERIAL_LEN]> {
        let mut m = Zeroizing::new([0u8; KEY_MATERIAL_LEN]);
        m[0] = self.kind().code();
        m[1] = self.aead.code();
        m[2] = self.fingerprint.code();
        m[3..19].copy_from_slice(&self.repo_id);
        m[19..51].copy_from_slice(&self.id_key);
        m[51..83].copy_from_slice(&self.chunker_secret);
        m[83..115].copy_from_slice(&self.meta_key);
        m[115..147].copy_from_slice(self.read_secret.as_ref().unwrap_or(&self.read_public));
        m
    }

    /// The keyed chunker's pseudo-random function under this repository's chunker
    /// secret (docs/design/chunking.md, "keyed").
    pub fn window_prf(&self) -> crate::WindowPrf {
        crate::WindowPrf::from_secret(&self.chunker_secret)
    }

    /// The key of a metadata envelope or container table with this salt:
    /// `BLAKE3-keyed(meta_key, "larder 2026-11-28 metadata subkey" ‖ salt)`.
    pub(crate) fn metadata_key(&self, salt: &[u8; 32]) -> AeadKey {
        let mut hasher = blake3::Hasher::new_keyed(&self.meta_key);
        hasher.update(METADATA_SUBKEY).update(salt);
        let key = Zeroizing::new(*hasher.finalize().as_bytes());
        AeadKey::new(self.aead, &key)
    }

    /// A fresh sealing key: the ephemeral public key `E` to store, and the AEAD key
    /// derived from `X25519(e, read_public)` (`e` is wiped on return).
    pub(crate) fn sealing_key(&self, rng: &mut impl RandomSource) -> ([u8; 32], AeadKey) {
        let e = StaticSecret::from(rng.array::<32>());
        let ephemeral = PublicKey::from(&e).to_bytes();
        let shared = e.diffie_hellman(&PublicKey::from(self.read_public));
        // read_public is never small-order (`generate` derives it, `from_material`
        // checks it), so a clamped e gives a non-zero shared secret.
        debug_assert!(shared.was_contributory());
        (
            ephemeral,
            self.sealed_object_key(shared.as_bytes(), &ephemeral),
        )
    }

    /// The AEAD key of a sealed object whose ephemeral public key is `ephemeral`: full
    /// keys only. `what` names what is opened, for the write-only error.
    pub(crate) fn opening_key(&self, ephemeral: &[u8; 32], what: &'static str) -> Result<AeadKey> {
        let secret = self.read_secret.ok_or(CryptoError::WriteOnly { what })?;
        let secret = StaticSecret::from(secret);
        let shared = secret.diffie_hellman(&PublicKey::from(*ephemeral));
        if !shared.was_contributory() {
            return Err(CryptoError::Authentication(format!(
                "{what}: the ephemeral key is a small-order point (all-zero shared secret); refused"
            )));
        }
        Ok(self.sealed_object_key(shared.as_bytes(), ephemeral))
    }

    /// `BLAKE3-keyed(meta_key, "larder 2026-11-28 sealed object key" ‖ shared ‖ E ‖
    /// read_public)`.
    fn sealed_object_key(&self, shared: &[u8; 32], ephemeral: &[u8; 32]) -> AeadKey {
        let mut hasher = blake3::Hasher::new_keyed(&self.meta_key);
        hasher
            .update(SEALED_OBJECT_KEY)
            .update(shared)
            .update(ephemeral)
            .update(&self.read_public);
        let key = Zeroizing::new(*hasher.finalize().as_bytes());
        AeadKey::new(self.aead, &key)
    }

    /// An object's associated data: `"larder object v1" ‖ repository id ‖ kind ‖ name
    /// length (u16) ‖ name ‖ header`.
    ///
    /// # Panics
    /// If `name` is longer than 65535 bytes (every name is at most 44).
    pub(crate) fn object_aad(&self, kind: ObjectKind, name: &[u8], header: &[u8]) -> Vec<u8> {
        let name_len = u16::try_from(name.len()).unwrap_or_else(|_| {
            panic!(
                "an object name of {} bytes is longer than 65535",
                name.len()
            )
        });
        let mut aad = Vec::with_capacity(OBJECT_AAD.len() + 19 + name.len() + header.len());
        aad.extend_from_slice(OBJECT_AAD);
        aad.extend_from_slice(&self.repo_id);
        aad.push(kind.code());
        aad.extend_from_slice(&name_len.to_le_bytes());
        aad.extend_from_slice(name);
        aad.extend_from_slice(header);
        aad
    }
}

/// Whether two secrets are equal, compared through their BLAKE3 derivations under
/// `context`: the comparison's time depends on the digests, never on the secrets'
/// bytes.
fn same_secret(context: &str, a: &[u8; 32], b: &[u8; 32]) -> bool {
    blake3::derive_key(context, a) == blake3::derive_key(context, b)
}

impl Drop for RepoKeys {
    fn drop(&mut self) {
        self.id_key.zeroize();
        self.chunker_secret.zeroize();
        self.meta_key.zeroize();
        self.read_secret.zeroize();
    }
}

impl std::fmt::Debug for RepoKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RepoKeys")
            .field("repo_id", &hex::encode(&self.repo_id))
            .field("kind", &self.kind())
            .field("aead", &self.aead)
            .field("fingerprint", &self.fingerprint)
            .finish_non_exhaustive()
    }
}

fn public_of(secret: &[u8; 32]) -> [u8; 32] {
    PublicKey::from(&StaticSecret::from(*secret)).to_bytes()
}

/// False for the small-order points (and zero), with which every X25519 shared secret
/// is all-zero. A clamped scalar is a multiple of 8 below the group order times 8, so
/// its product with any other point is not zero.
fn is_usable_public(public: &[u8; 32]) -> bool {
    StaticSecret::from([1u8; 32])
        .diffie_hellman(&PublicKey::from(*public))
        .was_contributory()
}

#[cfg(test)]
mod tests;
