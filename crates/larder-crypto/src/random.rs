//! Randomness: the operating system's generator, behind a trait so that tests can
//! fix it (golden bytes), and the random passwords and identifiers larder draws.

use crate::hex;

/// Where salts, nonces, ephemeral keys and data keys come from.
pub(crate) trait RandomSource {
    fn fill(&mut self, out: &mut [u8]);

    fn array<const N: usize>(&mut self) -> [u8; N]
    where
        Self: Sized,
    {
        let mut out = [0u8; N];
        self.fill(&mut out);
        out
    }
}

/// The operating system's generator (`getrandom`).
///
/// It fails only where the system has no generator at all (on Linux, `getrandom(2)`
/// blocks until the pool is seeded and then never fails), so a failure is a broken
/// platform, not an error to handle: it panics, as `rand`'s `OsRng` does.
pub(crate) struct OsRandom;

impl RandomSource for OsRandom {
    fn fill(&mut self, out: &mut [u8]) {
        if let Err(e) = getrandom::fill(out) {
            panic!("the operating system's random generator failed: {e}");
        }
    }
}

/// 32 random bytes as 64 lower-case hex digits: the password of a generated key slot
/// (docs/design/crypto.md, "The embedded default repository").
pub fn random_password() -> String {
    let bytes = zeroize::Zeroizing::new(OsRandom.array::<32>());
    hex::encode(&bytes[..])
}

/// `bytes` random bytes as lower-case hex: a key slot's id is `random_id_hex(8)`.
pub fn random_id_hex(bytes: usize) -> String {
    let mut buf = vec![0u8; bytes];
    OsRandom.fill(&mut buf);
    hex::encode(&buf)
}

/// A deterministic stream for tests: BLAKE3's output from a seed.
#[cfg(test)]
pub(crate) struct SeededRandom(blake3::OutputReader);

#[cfg(test)]
impl SeededRandom {
    pub(crate) fn new(seed: &str) -> Self {
        Self(blake3::Hasher::new().update(seed.as_bytes()).finalize_xof())
    }
}

#[cfg(test)]
impl RandomSource for SeededRandom {
    fn fill(&mut self, out: &mut [u8]) {
        self.0.fill(out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_password_is_64_hex_digits_and_fresh() {
        let a = random_password();
        assert_eq!(a.len(), 64);
        assert!(a
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
        assert_ne!(a, random_password());
        assert_eq!(random_id_hex(8).len(), 16);
    }
}
