//! The key of the keyed chunker in experiments without a repository (`larder chunk`,
//! `larder bench`): random for each process unless a secret is given before the first
//! chunker is built, so that every chunker one process builds cuts alike (the
//! experiments compare configurations by their cuts).

use std::sync::{Arc, OnceLock};

use larder_chunk::{Chunker, ChunkerConfig};
use larder_crypto::WindowPrf;

use crate::BenchError;

/// Where the experiments' key came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum KeySource {
    /// Drawn from the operating system for this process: cut points differ between
    /// runs (by chance only; the statistics do not).
    Random,
    /// Given with [`use_secret`]: cut points are reproducible.
    Given,
}

static KEY: OnceLock<(Arc<WindowPrf>, KeySource)> = OnceLock::new();

/// Makes `secret` the experiments' chunker secret. Fails if a key is already in use
/// (a chunker was built, or a secret given, before).
pub fn use_secret(secret: &[u8; 32]) -> Result<(), BenchError> {
    let mut fresh = false;
    KEY.get_or_init(|| {
        fresh = true;
        (Arc::new(WindowPrf::from_secret(secret)), KeySource::Given)
    });
    if fresh {
        Ok(())
    } else {
        Err(BenchError::KeyInUse)
    }
}

fn key() -> &'static (Arc<WindowPrf>, KeySource) {
    KEY.get_or_init(|| (Arc::new(WindowPrf::random()), KeySource::Random))
}

/// The experiments' PRF.
pub fn experiment_prf() -> Arc<WindowPrf> {
    key().0.clone()
}

/// Where the experiments' key comes from (choosing a random one if none was given).
pub fn key_source() -> KeySource {
    key().1
}

/// The configured chunker of any kind, the keyed one under the experiments' key.
///
/// # Panics
/// On an invalid config: validate first.
pub fn build_chunker(config: &ChunkerConfig) -> Box<dyn Chunker> {
    if config.kind.needs_key() {
        config.build_keyed(experiment_prf())
    } else {
        config.build()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use larder_chunk::ChunkerKind;

    #[test]
    fn every_keyed_chunker_of_a_process_cuts_alike_and_a_late_secret_is_refused() {
        let config = ChunkerConfig {
            kind: ChunkerKind::Keyed,
            min_size: 256,
            avg_size: 1024,
            max_size: 8192,
            level: 2,
            seed: 0,
        };
        let data = crate::seeded::xorshift_bytes(5, 200_000);
        let a = build_chunker(&config).chunk_lengths(&data);
        let b = build_chunker(&config).chunk_lengths(&data);
        assert_eq!(a, b);
        assert!(matches!(use_secret(&[1; 32]), Err(BenchError::KeyInUse)));
    }
}
