//! Key slots, `keys/<id>.key` (docs/design/crypto.md, "Key slots"): one copy of the key
//! material wrapped under a password, as JSON whose plain fields `key list` shows.

use argon2::{Algorithm, Argon2, Params, Version};
use serde::{Deserialize, Serialize};
use zeroize::Zeroizing;

use crate::aead::{AeadKey, AeadKind, TAG_LEN};
use crate::hex;
use crate::keys::{KeyKind, RepoKeys, KEY_MATERIAL_LEN};
use crate::random::{OsRandom, RandomSource};
use crate::{CryptoError, Result};

/// First bytes of a key slot's associated data.
const SLOT_AAD: &[u8] = b"larder key slot v1";
/// The one key slot format this larder reads and writes.
const SLOT_VERSION: u64 = 1;
/// Key slots are always sealed with XChaCha20-Poly1305 (random 24-byte nonce).
const SLOT_AEAD: AeadKind = AeadKind::XChaCha20Poly1305;
const SEALED_LEN: usize = KEY_MATERIAL_LEN + TAG_LEN;

/// Argon2id's cost parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KdfParams {
    pub memory_kib: u32,
    pub iterations: u32,
    pub parallelism: u32,
}

impl KdfParams {
    /// For passwords people choose: 64 MiB, 3 passes, 4 lanes (RFC 9106's second
    /// recommended option), the lanes hashed in parallel: about 0.11 s on two cores
    /// against 0.16 s with one lane, at the same cost to a guesser
    /// (docs/design/crypto.md).
    pub const DEFAULT: KdfParams = KdfParams {
        memory_kib: 65536,
        iterations: 3,
        parallelism: 4,
    };
    /// For generated 256-bit passwords, which hashing cannot weaken: 8 MiB, 1 pass.
    pub const GENERATED: KdfParams = KdfParams {
        memory_kib: 8192,
        iterations: 1,
        parallelism: 1,
    };
    /// The most memory a slot may ask for: 4 GiB.
    pub const MAX_MEMORY_KIB: u32 = 4 << 20;
    pub const MAX_ITERATIONS: u32 = 100;
    pub const MAX_PARALLELISM: u32 = 16;
    /// The most work a slot may ask for, memory times passes: 16 GiB of blocks filled
    /// (4 GiB × 4, 1 GiB × 16, 64 MiB × 100), so that a hostile slot cannot make
    /// unlocking take more than about 85 times the default's 0.16 s of one-lane work.
    pub const MAX_WORK_KIB: u64 = 16 << 20;

    /// Refuses parameters outside the bounds above, or below Argon2's minimums (8 KiB
    /// of memory per lane, one pass, one lane).
    pub fn check(&self) -> Result<()> {
        let bad = |detail: String| Err(CryptoError::malformed("key slot's KDF parameters", detail));
        if self.parallelism == 0 || self.parallelism > Self::MAX_PARALLELISM {
            return bad(format!(
                "parallelism {} is not 1 to {}",
                self.parallelism,
                Self::MAX_PARALLELISM
            ));
        }
        if self.iterations == 0 || self.iterations > Self::MAX_ITERATIONS {
            return bad(format!(
                "iterations {} is not 1 to {}",
                self.iterations,
                Self::MAX_ITERATIONS
            ));
        }
        let least = 8 * self.parallelism;
        if self.memory_kib < least || self.memory_kib > Self::MAX_MEMORY_KIB {
            return bad(format!(
                "memory {} KiB is not {least} to {} KiB",
                self.memory_kib,
                Self::MAX_MEMORY_KIB
            ));
        }
        let work = u64::from(self.memory_kib) * u64::from(self.iterations);
        if work > Self::MAX_WORK_KIB {
            return bad(format!(
                "memory × iterations is {work} KiB, more than {} KiB",
                Self::MAX_WORK_KIB
            ));
        }
        Ok(())
    }
}

/// The JSON of a key slot, field for field.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct SlotJson {
    version: u64,
    kind: KeyKind,
    created: String,
    hostname: String,
    username: String,
    kdf: KdfJson,
    aead: String,
    nonce: String,
    sealed: String,
}

/// The `kdf` object.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct KdfJson {
    algorithm: String,
    version: u32,
    memory_kib: u32,
    iterations: u32,
    parallelism: u32,
    salt: String,
}

/// The plain fields (all but `nonce` and `sealed`), in the file's order: their
/// canonical form, serde_json's compact serialization of this struct, is the slot's
/// associated data after `"larder key slot v1"`.
#[derive(Serialize)]
struct PlainFieldsJson<'a> {
    version: u64,
    kind: KeyKind,
    created: &'a str,
    hostname: &'a str,
    username: &'a str,
    kdf: KdfJson,
    aead: &'a str,
}

/// Read first, so that a later version's slot is named as such, not as unknown fields.
#[derive(Deserialize)]
struct SlotVersion {
    version: serde_json::Value,
}

/// One parsed key slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeySlot {
    kind: KeyKind,
    created: String,
    hostname: String,
    username: String,
    kdf: KdfParams,
    salt: [u8; 32],
    nonce: [u8; 24],
    sealed: Vec<u8>,
}

impl KeySlot {
    /// Wraps `keys` (or, for a write-only slot, their write-only half) under
    /// `password`. `created` is RFC 3339 in UTC.
    pub fn create(
        keys: &RepoKeys,
        kind: KeyKind,
        password: &[u8],
        params: KdfParams,
        hostname: String,
        username: String,
        created: String,
    ) -> Result<KeySlot> {
        Self::create_with(
            &mut OsRandom,
            keys,
            kind,
            password,
            params,
            hostname,
            username,
            created,
        )
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn create_with(
        rng: &mut impl RandomSource,
        keys: &RepoKeys,
        kind: KeyKind,
        password: &[u8],
        params: KdfParams,
        hostname: String,
        username: String,
        created: String,
    ) -> Result<KeySlot> {
        params.check()?;
        let material = match kind {
            KeyKind::Full if !keys.is_full() => {
                return Err(CryptoError::WriteOnly {
                    what: "the full key that a full key slot wraps",
                })
            }
            KeyKind::Full => keys.material(),
            KeyKind::WriteOnly => keys.write_only().material(),
        };
        let mut slot = KeySlot {
            kind,
            created,
            hostname,
            username,
            kdf: params,
            salt: rng.array(),
            nonce: rng.array(),
            sealed: Vec::with_capacity(SEALED_LEN),
        };
        let key = slot.wrapping_key(password)?;
        slot.sealed.extend_from_slice(&material[..]);
        key.seal_in_place_with_nonce(&slot.nonce, &slot.aad(), &mut slot.sealed);
        Ok(slot)
    }

    /// Parses a slot's JSON, checking every field; decrypts nothing.
    pub fn parse(bytes: &[u8]) -> Result<KeySlot> {
        let bad = |detail: String| CryptoError::malformed("key slot", detail);
        let version: SlotVersion = serde_json::from_slice(bytes).map_err(|e| bad(e.to_string()))?;
        if version.version.as_u64() != Some(SLOT_VERSION) {
            return Err(bad(format!(
                "version {} is not supported by this larder (it reads {SLOT_VERSION})",
                version.version
            )));
        }
        let json: SlotJson = serde_json::from_slice(bytes).map_err(|e| bad(e.to_string()))?;
        if json.kdf.algorithm != "argon2id" || json.kdf.version != 0x13 {
            return Err(bad(format!(
                "KDF {} version {} is not argon2id version 19",
                json.kdf.algorithm, json.kdf.version
            )));
        }
        if json.aead != SLOT_AEAD.name() {
            return Err(bad(format!(
                "AEAD {:?} is not {}",
                json.aead,
                SLOT_AEAD.name()
            )));
        }
        let kdf = KdfParams {
            memory_kib: json.kdf.memory_kib,
            iterations: json.kdf.iterations,
            parallelism: json.kdf.parallelism,
        };
        kdf.check()?;
        let salt = hex::decode_array(&json.kdf.salt)
            .ok_or_else(|| bad("the salt is not 64 lower-case hex digits".into()))?;
        let nonce = hex::decode_array(&json.nonce)
            .ok_or_else(|| bad("the nonce is not 48 lower-case hex digits".into()))?;
        let sealed = hex::decode(&json.sealed)
            .filter(|s| s.len() == SEALED_LEN)
            .ok_or_else(|| {
                bad(format!(
                    "sealed is not {} lower-case hex digits",
                    2 * SEALED_LEN
                ))
            })?;
        Ok(KeySlot {
            kind: json.kind,
            created: json.created,
            hostname: json.hostname,
            username: json.username,
            kdf,
            salt,
            nonce,
            sealed,
        })
    }

    /// The slot's JSON, pretty-printed, with a final newline.
    pub fn to_bytes(&self) -> Vec<u8> {
        let json = SlotJson {
            version: SLOT_VERSION,
            kind: self.kind,
            created: self.created.clone(),
            hostname: self.hostname.clone(),
            username: self.username.clone(),
            kdf: self.kdf_json(),
            aead: SLOT_AEAD.name().into(),
            nonce: hex::encode(&self.nonce),
            sealed: hex::encode(&self.sealed),
        };
        let mut out = serde_json::to_vec_pretty(&json).unwrap_or_default();
        out.push(b'\n');
        out
    }

    /// Unwraps the keys with `password`. A wrong password (or another repository's
    /// slot, or a damaged one) is [`CryptoError::Authentication`] with the message
    /// "wrong password or no matching key"; keys of another repository than
    /// `expected_repo_id` are refused too.
    pub fn unlock(&self, password: &[u8], expected_repo_id: Option<[u8; 16]>) -> Result<RepoKeys> {
        let key = self.wrapping_key(password)?;
        let mut material = Zeroizing::new(self.sealed.clone());
        key.open_in_place_with_nonce(&self.nonce, &self.aad(), &mut material)
            .map_err(|_| CryptoError::Authentication("wrong password or no matching key".into()))?;
        let keys = RepoKeys::from_material(&material)?;
        if keys.kind() != self.kind {
            return Err(CryptoError::malformed(
                "key slot",
                format!(
                    "it says {} but holds a {} key",
                    self.kind.name(),
                    keys.kind().name()
                ),
            ));
        }
        if let Some(expected) = expected_repo_id {
            if keys.repo_id() != expected {
                return Err(CryptoError::Authentication(format!(
                    "this key slot belongs to repository {}, not {}",
                    hex::encode(&keys.repo_id()),
                    hex::encode(&expected)
                )));
            }
        }
        Ok(keys)
    }

    pub fn kind(&self) -> KeyKind {
        self.kind
    }

    pub fn created(&self) -> &str {
        &self.created
    }

    pub fn hostname(&self) -> &str {
        &self.hostname
    }

    pub fn username(&self) -> &str {
        &self.username
    }

    pub fn kdf(&self) -> KdfParams {
        self.kdf
    }

    fn kdf_json(&self) -> KdfJson {
        KdfJson {
            algorithm: "argon2id".into(),
            version: 0x13,
            memory_kib: self.kdf.memory_kib,
            iterations: self.kdf.iterations,
            parallelism: self.kdf.parallelism,
            salt: hex::encode(&self.salt),
        }
    }

    /// `"larder key slot v1" ‖ the canonical JSON of the plain fields`: every plain
    /// field is authenticated, so that `key list` shows what unlocking will check.
    fn aad(&self) -> Vec<u8> {
        let plain = PlainFieldsJson {
            version: SLOT_VERSION,
            kind: self.kind,
            created: &self.created,
            hostname: &self.hostname,
            username: &self.username,
            kdf: self.kdf_json(),
            aead: SLOT_AEAD.name(),
        };
        let mut aad = SLOT_AAD.to_vec();
        // Serializing strings and integers to a Vec cannot fail.
        aad.extend_from_slice(&serde_json::to_vec(&plain).unwrap_or_default());
        aad
    }

    /// Argon2id(password, salt, M, T, P), 32 bytes.
    fn wrapping_key(&self, password: &[u8]) -> Result<AeadKey> {
        self.kdf.check()?;
        let bad =
            |e: argon2::Error| CryptoError::malformed("key slot's KDF parameters", e.to_string());
        let params = Params::new(
            self.kdf.memory_kib,
            self.kdf.iterations,
            self.kdf.parallelism,
            Some(32),
        )
        .map_err(bad)?;
        let mut key = Zeroizing::new([0u8; 32]);
        Argon2::new(Algorithm::Argon2id, Version::V0x13, params)
            .hash_password_into(password, &self.salt, &mut key[..])
            .map_err(bad)?;
        Ok(AeadKey::new(SLOT_AEAD, &key))
    }
}

#[cfg(test)]
mod tests;
