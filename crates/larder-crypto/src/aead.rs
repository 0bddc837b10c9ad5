//! The two AEADs a repository can use, behind one key type, with the counter nonces of
//! docs/design/crypto.md ("Primitives", "Nonces: why none repeats").
//!
//! Every key larder makes seals one object, so nonces are counters within that object:
//! `nonce(n)` is `n` as 8 little-endian bytes, then zeros up to the AEAD's nonce length.
//! All sealing here is in place: the tag is appended to (or read from the end of) the
//! caller's buffer, so the container writer and readers never copy a chunk.

use aes_gcm::aead::{AeadInOut, KeyInit};
use aes_gcm::Aes256Gcm;
use chacha20poly1305::XChaCha20Poly1305;
use serde::{Deserialize, Serialize};

use crate::{CryptoError, Result};

/// Bytes of every AEAD key.
pub const KEY_LEN: usize = 32;
/// Bytes of the tag both AEADs append.
pub const TAG_LEN: usize = 16;
/// The longest message either AEAD seals: AES-256-GCM's limit, 2^36 - 32 bytes
/// (XChaCha20-Poly1305's is 256 GiB). No larder object comes near it.
pub const MAX_MESSAGE_LEN: u64 = (1 << 36) - 32;

/// The authenticated encryption of a repository, chosen at `init`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum AeadKind {
    /// The default: AES-NI and carry-less multiplication make it the faster of the two
    /// on x86-64 (benches/aead.rs; figures in docs/design/crypto.md).
    #[serde(rename = "aes-256-gcm")]
    Aes256Gcm,
    /// For machines without AES instructions, where it is the faster one; its 24-byte
    /// nonce is used as a counter like AES-GCM's 12-byte one.
    #[serde(rename = "xchacha20-poly1305")]
    XChaCha20Poly1305,
}

impl AeadKind {
    pub const ALL: [AeadKind; 2] = [Self::Aes256Gcm, Self::XChaCha20Poly1305];

    /// The code stored in envelope and container headers.
    pub fn code(self) -> u8 {
        match self {
            Self::Aes256Gcm => 1,
            Self::XChaCha20Poly1305 => 2,
        }
    }

    pub fn from_code(code: u8) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.code() == code)
    }

    /// The name in configs, key slots and `init --encryption`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Aes256Gcm => "aes-256-gcm",
            Self::XChaCha20Poly1305 => "xchacha20-poly1305",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.name() == name)
    }

    pub fn nonce_len(self) -> usize {
        match self {
            Self::Aes256Gcm => 12,
            Self::XChaCha20Poly1305 => 24,
        }
    }

    /// `nonce(n)`: `n` as 8 little-endian bytes, then zeros up to `nonce_len()`.
    pub fn nonce(self, n: u64) -> Vec<u8> {
        nonce24(n)[..self.nonce_len()].to_vec()
    }
}

impl std::fmt::Display for AeadKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.name())
    }
}

fn nonce24(n: u64) -> [u8; 24] {
    let mut nonce = [0u8; 24];
    nonce[..8].copy_from_slice(&n.to_le_bytes());
    nonce
}

enum Cipher {
    Aes(Box<Aes256Gcm>),
    XChaCha(Box<XChaCha20Poly1305>),
}

/// One AEAD key. Both ciphers wipe their key schedules when dropped (their `zeroize`
/// features).
pub struct AeadKey(Cipher);

impl AeadKey {
    pub fn new(kind: AeadKind, key: &[u8; KEY_LEN]) -> Self {
        let key = key.into();
        Self(match kind {
            AeadKind::Aes256Gcm => Cipher::Aes(Box::new(Aes256Gcm::new(key))),
            AeadKind::XChaCha20Poly1305 => Cipher::XChaCha(Box::new(XChaCha20Poly1305::new(key))),
        })
    }

    pub fn kind(&self) -> AeadKind {
        match self.0 {
            Cipher::Aes(_) => AeadKind::Aes256Gcm,
            Cipher::XChaCha(_) => AeadKind::XChaCha20Poly1305,
        }
    }

    /// Encrypts `msg` in place under `nonce(n)` and returns the tag.
    ///
    /// # Panics
    /// If `msg` is longer than [`MAX_MESSAGE_LEN`].
    pub fn seal_detached(&self, n: u64, aad: &[u8], msg: &mut [u8]) -> [u8; TAG_LEN] {
        self.seal_raw(&nonce24(n)[..self.kind().nonce_len()], aad, msg)
    }

    /// Encrypts `buf` in place under `nonce(n)` and appends the tag.
    ///
    /// # Panics
    /// If `buf` is longer than [`MAX_MESSAGE_LEN`].
    pub fn seal_in_place(&self, n: u64, aad: &[u8], buf: &mut Vec<u8>) {
        buf.reserve(TAG_LEN);
        let tag = self.seal_detached(n, aad, buf);
        buf.extend_from_slice(&tag);
    }

    /// Checks `tag` and decrypts `msg` in place under `nonce(n)`. On failure `msg`
    /// holds neither the plaintext nor, necessarily, the ciphertext: callers discard it.
    pub fn open_detached(
        &self,
        n: u64,
        aad: &[u8],
        msg: &mut [u8],
        tag: &[u8; TAG_LEN],
    ) -> Result<()> {
        self.open_raw(&nonce24(n)[..self.kind().nonce_len()], aad, msg, tag)
    }

    /// Opens ciphertext ‖ tag held in `buf` in place: the plaintext is left in
    /// `buf[..len]`, and `len` (`buf.len() - TAG_LEN`) is returned. For readers that hold
    /// many sealed messages in one buffer (a whole container).
    pub fn open_in_slice(&self, n: u64, aad: &[u8], buf: &mut [u8]) -> Result<usize> {
        let (msg, tag) = split_tag(buf)?;
        self.open_detached(n, aad, msg, &tag)?;
        Ok(msg.len())
    }

    /// Opens ciphertext ‖ tag in place and truncates `buf` to the plaintext.
    pub fn open_in_place(&self, n: u64, aad: &[u8], buf: &mut Vec<u8>) -> Result<()> {
        let len = self.open_in_slice(n, aad, buf)?;
        buf.truncate(len);
        Ok(())
    }

    /// As [`Self::seal_in_place`] with an arbitrary nonce of `kind().nonce_len()`
    /// bytes: for key slots' random nonces and for known-answer tests. Everything else
    /// uses counter nonces.
    ///
    /// # Panics
    /// If the nonce has the wrong length, or `buf` is longer than [`MAX_MESSAGE_LEN`].
    pub fn seal_in_place_with_nonce(&self, nonce: &[u8], aad: &[u8], buf: &mut Vec<u8>) {
        buf.reserve(TAG_LEN);
        let tag = self.seal_raw(nonce, aad, buf);
        buf.extend_from_slice(&tag);
    }

    /// As [`Self::open_in_place`] with an arbitrary nonce (see
    /// [`Self::seal_in_place_with_nonce`]); a nonce of the wrong length fails to open.
    pub fn open_in_place_with_nonce(
        &self,
        nonce: &[u8],
        aad: &[u8],
        buf: &mut Vec<u8>,
    ) -> Result<()> {
        if nonce.len() != self.kind().nonce_len() {
            return Err(unauthentic());
        }
        let (msg, tag) = split_tag(buf)?;
        self.open_raw(nonce, aad, msg, &tag)?;
        let len = msg.len();
        buf.truncate(len);
        Ok(())
    }

    fn seal_raw(&self, nonce: &[u8], aad: &[u8], msg: &mut [u8]) -> [u8; TAG_LEN] {
        assert!(
            msg.len() as u64 <= MAX_MESSAGE_LEN,
            "an AEAD message of {} bytes is longer than {MAX_MESSAGE_LEN}",
            msg.len()
        );
        let tag = match &self.0 {
            Cipher::Aes(c) => c.encrypt_inout_detached(nonce_of(nonce), aad, msg.into()),
            Cipher::XChaCha(c) => c.encrypt_inout_detached(nonce_of(nonce), aad, msg.into()),
        };
        match tag {
            Ok(tag) => tag.into(),
            // Both refuse only messages longer than their limits, checked above.
            Err(_) => unreachable!("AEAD message length checked above"),
        }
    }

    fn open_raw(
        &self,
        nonce: &[u8],
        aad: &[u8],
        msg: &mut [u8],
        tag: &[u8; TAG_LEN],
    ) -> Result<()> {
        let ok = match &self.0 {
            Cipher::Aes(c) => {
                c.decrypt_inout_detached(nonce_of(nonce), aad, msg.into(), tag.into())
            }
            Cipher::XChaCha(c) => {
                c.decrypt_inout_detached(nonce_of(nonce), aad, msg.into(), tag.into())
            }
        };
        ok.map_err(|_| unauthentic())
    }
}

/// A nonce slice as the cipher's nonce array.
///
/// # Panics
/// If its length is not the cipher's nonce length (callers slice it to that length).
fn nonce_of<N: aes_gcm::aead::array::ArraySize>(
    nonce: &[u8],
) -> &aes_gcm::aead::array::Array<u8, N> {
    match nonce.try_into() {
        Ok(nonce) => nonce,
        Err(_) => panic!("a nonce of {} bytes is the wrong length", nonce.len()),
    }
}

/// Splits ciphertext ‖ tag.
fn split_tag(buf: &mut [u8]) -> Result<(&mut [u8], [u8; TAG_LEN])> {
    let len = buf.len().checked_sub(TAG_LEN).ok_or_else(unauthentic)?;
    let (msg, tag) = buf.split_at_mut(len);
    let mut out = [0u8; TAG_LEN];
    out.copy_from_slice(tag);
    Ok((msg, out))
}

impl std::fmt::Debug for AeadKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AeadKey({}, ..)", self.kind())
    }
}

/// The error of a failed open; callers that know what they opened replace it with
/// one that names the object.
fn unauthentic() -> CryptoError {
    CryptoError::Authentication(
        "a message failed authentication: the wrong key, or damaged or tampered bytes".into(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_names_and_serde_agree() {
        for kind in AeadKind::ALL {
            assert_eq!(AeadKind::from_code(kind.code()), Some(kind));
            assert_eq!(AeadKind::from_name(kind.name()), Some(kind));
            let json = serde_json::to_string(&kind).unwrap();
            assert_eq!(json, format!("\"{}\"", kind.name()));
            assert_eq!(serde_json::from_str::<AeadKind>(&json).unwrap(), kind);
            assert_eq!(kind.nonce(1).len(), kind.nonce_len());
        }
        assert_eq!(AeadKind::from_code(0), None);
        assert_eq!(AeadKind::from_name("aes-128-gcm"), None);
    }

    #[test]
    fn short_messages_and_wrong_nonces_fail_to_open() {
        for kind in AeadKind::ALL {
            let key = AeadKey::new(kind, &[1; 32]);
            for len in 0..TAG_LEN {
                assert!(key.open_in_place(0, b"", &mut vec![0; len]).is_err());
            }
            let mut sealed = b"message".to_vec();
            key.seal_in_place(5, b"ad", &mut sealed);
            assert!(key.open_in_place(4, b"ad", &mut sealed.clone()).is_err());
            assert!(key
                .open_in_place_with_nonce(&[0; 16], b"ad", &mut sealed.clone())
                .is_err());
            key.open_in_place(5, b"ad", &mut sealed).unwrap();
            assert_eq!(sealed, b"message");
        }
    }
}
