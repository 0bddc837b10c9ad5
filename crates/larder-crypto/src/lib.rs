//! All of larder's cryptography, and the only code that touches key bytes
//! (docs/design/crypto.md): the repository's keys and their password-wrapped key
//! slots, the authenticated envelopes of stored objects, keyed chunk fingerprints, and
//! the pseudo-random function of the keyed chunker's cut decisions.

mod error;
mod window_prf;

pub use error::{CryptoError, Result};
pub use window_prf::{AesBackend, WindowPrf};
