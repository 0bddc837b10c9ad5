//! All of larder's cryptography, and the only code that touches key bytes
//! (docs/design/crypto.md): the repository's keys and their password-wrapped key
//! slots, the authenticated envelopes of stored objects, the crypto of encrypted
//! containers and of the disk index's pages, keyed chunk fingerprints, and the
//! pseudo-random function of the keyed chunker's cut decisions.
//!
//! Randomness comes from the operating system's generator; if the system has none,
//! sealing panics (see `random.rs`) rather than returning an error every caller would
//! have to carry for a platform that cannot run larder anyway.

pub mod aead;
pub mod container;
pub mod envelope;
mod error;
#[cfg(test)]
mod golden;
mod hex;
pub mod index_page;
pub mod keyfile;
pub mod keys;
mod random;
mod window_prf;

pub use aead::{AeadKey, AeadKind};
pub use container::{ChunkOpener, ContainerFooter, ContainerSealer, TableOpener};
pub use envelope::{ObjectKind, ENVELOPE_OVERHEAD};
pub use error::{CryptoError, Result};
pub use index_page::{IndexPart, PageSealer};
pub use keyfile::{KdfParams, KeySlot};
pub use keys::{FingerprintKind, KeyKind, RepoKeys};
pub use random::{random_id_hex, random_password};
pub use window_prf::{AesBackend, WindowPrf};
