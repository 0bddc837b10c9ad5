//! Chunk fingerprints: the identity of a chunk in the index and the containers.
//!
//! Every fingerprint is stored in 32 bytes; SHA-1's 20-byte digest is padded with
//! zeros, so that all on-disk records have one size whatever the algorithm.

mod many;

use std::fmt;

pub use many::Blake3Batch;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use sha1::Digest as _;

/// The fingerprint algorithms a repository can be created with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum HashAlgo {
    /// The default: fastest, and collision resistant.
    Blake3,
    Sha256,
    /// Broken against chosen collisions; offered only to reproduce the papers.
    Sha1,
}

impl HashAlgo {
    pub const ALL: [HashAlgo; 3] = [Self::Blake3, Self::Sha256, Self::Sha1];

    pub fn name(self) -> &'static str {
        match self {
            Self::Blake3 => "blake3",
            Self::Sha256 => "sha256",
            Self::Sha1 => "sha1",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|a| a.name() == name.to_ascii_lowercase())
    }

    /// The code stored in container and index headers (see docs/design/format.md).
    pub fn code(self) -> u8 {
        match self {
            Self::Blake3 => 1,
            Self::Sha256 => 2,
            Self::Sha1 => 3,
        }
    }

    pub fn from_code(code: u8) -> Option<Self> {
        Self::ALL.into_iter().find(|a| a.code() == code)
    }

    /// Digest length before padding to 32 bytes.
    pub fn digest_len(self) -> usize {
        match self {
            Self::Sha1 => 20,
            _ => 32,
        }
    }

    /// Fingerprints one chunk.
    pub fn fingerprint(self, data: &[u8]) -> Fingerprint {
        let mut out = [0u8; 32];
        match self {
            Self::Blake3 => out = *blake3::hash(data).as_bytes(),
            Self::Sha256 => out.copy_from_slice(&sha2::Sha256::digest(data)),
            Self::Sha1 => out[..20].copy_from_slice(&sha1::Sha1::digest(data)),
        }
        Fingerprint(out)
    }

    /// Fingerprints many chunks on this thread; `out[i]` is the fingerprint of
    /// `chunks[i]`. BLAKE3 hashes them across SIMD lanes ([`Blake3Batch`]); the SHA
    /// families one at a time.
    pub fn fingerprint_many(self, chunks: &[&[u8]]) -> Vec<Fingerprint> {
        match self {
            Self::Blake3 => Blake3Batch::new()
                .hash(chunks)
                .into_iter()
                .map(Fingerprint)
                .collect(),
            _ => chunks.iter().map(|c| self.fingerprint(c)).collect(),
        }
    }

    /// Fingerprints many chunks on the rayon pool, [`HashAlgo::fingerprint_many`] on
    /// each slice of [`BATCH_SLICE`]; `out[i]` is the fingerprint of `chunks[i]`, so
    /// stream order is kept whatever the thread count.
    pub fn fingerprint_batch(self, chunks: &[&[u8]]) -> Vec<Fingerprint> {
        chunks
            .par_chunks(BATCH_SLICE)
            .flat_map_iter(|slice| self.fingerprint_many(slice))
            .collect()
    }
}

/// Chunks a thread takes at a time in [`HashAlgo::fingerprint_batch`]: enough that
/// every chunk index fills the SIMD lanes of [`Blake3Batch`] many times over.
pub const BATCH_SLICE: usize = 256;

/// A chunk fingerprint, 32 bytes (SHA-1 zero-padded).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Fingerprint(pub [u8; 32]);

impl Fingerprint {
    pub const LEN: usize = 32;

    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// Lower-case hex of all 32 bytes.
    pub fn to_hex(&self) -> String {
        let mut s = String::with_capacity(64);
        for b in self.0 {
            s.push_str(&format!("{b:02x}"));
        }
        s
    }

    /// Parses 64 hex digits.
    pub fn from_hex(hex: &str) -> Option<Self> {
        if hex.len() != 64 {
            return None;
        }
        let mut out = [0u8; 32];
        for (i, byte) in out.iter_mut().enumerate() {
            *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
        }
        Some(Self(out))
    }

    /// The first 8 bytes as a little-endian integer: uniformly distributed, used for
    /// hash-table placement.
    pub fn prefix_u64(&self) -> u64 {
        let mut b = [0u8; 8];
        b.copy_from_slice(&self.0[..8]);
        u64::from_le_bytes(b)
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint({})", &self.to_hex()[..16])
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn known_answers() {
        assert_eq!(
            HashAlgo::Blake3.fingerprint(b"abc").to_hex(),
            "6437b3ac38465133ffb63b75273a8db548c558465d79db03fd359c6cd5bd9d85"
        );
        assert_eq!(
            HashAlgo::Sha256.fingerprint(b"abc").to_hex(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(
            HashAlgo::Sha1.fingerprint(b"abc").to_hex(),
            format!("a9993e364706816aba3e25717850c26c9cd0d89d{}", "0".repeat(24))
        );
    }

    #[test]
    fn codes_and_names_round_trip() {
        for a in HashAlgo::ALL {
            assert_eq!(HashAlgo::from_code(a.code()), Some(a));
            assert_eq!(HashAlgo::from_name(a.name()), Some(a));
        }
        assert_eq!(HashAlgo::from_code(0), None);
    }

    proptest! {
        #[test]
        fn batch_keeps_stream_order(chunks in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..300), 0..40)) {
            let refs: Vec<&[u8]> = chunks.iter().map(|c| c.as_slice()).collect();
            for algo in HashAlgo::ALL {
                let batch = algo.fingerprint_batch(&refs);
                let one_by_one: Vec<_> = refs.iter().map(|c| algo.fingerprint(c)).collect();
                prop_assert_eq!(batch, one_by_one);
            }
        }

        #[test]
        fn hex_round_trips(bytes in any::<[u8; 32]>()) {
            let fp = Fingerprint(bytes);
            prop_assert_eq!(Fingerprint::from_hex(&fp.to_hex()), Some(fp));
        }
    }
}
