//! The `config` decoder and the inputs the fuzz targets (docs/design/fuzzing.md) found,
//! each kept as a regression test named after what broke.

use larder_chunk::{ChunkerConfig, ChunkerKind};
use larder_hash::HashAlgo;
use larder_store::{Compression, RepoConfig, StoreError};
use proptest::prelude::*;

/// The config of the version 1 repository in `testdata/repo-v1`.
const V1_CONFIG: &[u8] = include_bytes!("../../../testdata/repo-v1/repo/config");

/// A config of every kind larder can store: all but the keyed chunker, which needs an
/// encrypted repository.
fn configs() -> Vec<RepoConfig> {
    let mut out = Vec::new();
    for kind in ChunkerKind::ALL.into_iter().filter(|k| !k.needs_key()) {
        for hash in [HashAlgo::Blake3, HashAlgo::Sha256, HashAlgo::Sha1] {
            for compression in [
                Compression::None,
                Compression::Zstd {
                    level: 19,
                    unit_chunks: 1,
                },
                Compression::DEFAULT,
            ] {
                let chunker = ChunkerConfig {
                    kind,
                    ..ChunkerConfig::default()
                };
                out.push(RepoConfig::new(chunker, hash).with_compression(compression));
            }
        }
    }
    out
}

#[test]
fn every_valid_config_decodes_to_itself() {
    for config in configs() {
        let bytes = serde_json::to_vec_pretty(&config).unwrap();
        assert_eq!(RepoConfig::decode(&bytes, "config").unwrap(), config);
    }
    let v1 = RepoConfig::decode(V1_CONFIG, "config").unwrap();
    assert_eq!(v1.version, 1);
    assert_eq!(v1.compression, Compression::None);
}

#[test]
fn configs_larder_cannot_use_are_refused_with_the_reason() {
    let base = serde_json::to_value(&configs()[0]).unwrap();
    let with = |field: &str, value: serde_json::Value| {
        let mut v = base.clone();
        v[field] = value;
        serde_json::to_vec(&v).unwrap()
    };
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (b"not json".to_vec(), "is not a larder config"),
        (b"[1, 2]".to_vec(), "is not a larder config"),
        (with("version", 5.into()), "version 5 is not supported"),
        (
            with("version", 3.into()),
            "format version 3 is for encrypted repositories",
        ),
        (with("hash", "md5".into()), "unknown variant"),
        (
            with("container_size", 0.into()),
            "container size 0 is outside",
        ),
        (
            with("container_size", (u64::MAX).into()),
            "is outside 4096..=1073741824",
        ),
        (
            with(
                "compression",
                serde_json::json!({"kind": "zstd", "level": 0}),
            ),
            "zstd level 0 is outside",
        ),
        (
            with(
                "compression",
                serde_json::json!({"kind": "zstd", "level": 3, "unit_chunks": 8}),
            ),
            "format version 1 cannot use compression zstd:3:8; it needs version 4",
        ),
        (
            with(
                "compression",
                serde_json::json!({"kind": "zstd", "level": 3, "unit_chunks": 256}),
            ),
            "a compression unit of 256 chunks is outside 1..=255",
        ),
        (
            with("compression", serde_json::json!({"kind": "lz4"})),
            "unknown variant",
        ),
        (
            with(
                "chunker",
                serde_json::to_value(ChunkerConfig {
                    kind: ChunkerKind::Keyed,
                    ..ChunkerConfig::default()
                })
                .unwrap(),
            ),
            "the keyed chunker needs a secret key",
        ),
    ];
    for (bytes, needle) in cases {
        let err = RepoConfig::decode(&bytes, "config").unwrap_err();
        assert!(
            matches!(
                err,
                StoreError::Config(_) | StoreError::UnsupportedVersion { .. }
            ),
            "{err:?}"
        );
        assert!(err.to_string().contains(needle), "{err} lacks {needle:?}");
    }
}

/// Any container size was accepted: one past 4 GiB lets a container grow past the
/// 32-bit offsets of its table, and near `usize::MAX` the backup's container buffer
/// size (`container_size` plus the largest chunk) overflows.
#[test]
fn config_with_a_container_size_past_the_table_offsets_is_refused() {
    for size in [(1 << 30) + 1, u32::MAX as usize, usize::MAX] {
        let mut config = configs()[0].clone();
        config.container_size = size;
        let bytes = serde_json::to_vec(&config).unwrap();
        assert!(RepoConfig::decode(&bytes, "config").is_err(), "{size}");
    }
}

proptest! {
    /// The in-CI twin of the `config` fuzz target: any bytes, no panic; what is
    /// accepted decodes back to itself.
    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
        if let Ok(config) = RepoConfig::decode(&bytes, "config") {
            let again = serde_json::to_vec(&config).unwrap();
            prop_assert_eq!(RepoConfig::decode(&again, "again").unwrap(), config);
        }
    }

    /// Real configs with bytes replaced: no panic, and an accepted one is valid.
    #[test]
    fn damaged_real_configs_never_panic(
        flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..6),
    ) {
        let mut bytes = V1_CONFIG.to_vec();
        for (at, byte) in flips {
            let at = at % bytes.len();
            bytes[at] = byte;
        }
        if let Ok(config) = RepoConfig::decode(&bytes, "config") {
            prop_assert!(config.validate().is_ok());
        }
    }
}
