//! Which chunker a repository uses, with its parameters; stored in the repository config.

use std::sync::Arc;

use larder_crypto::WindowPrf;
use serde::{Deserialize, Serialize};

use crate::{
    AdlerCdc, AsymmetricExtremum, Chunker, FastCdc2016, FastCdc2020, FixedSize, GearCdc, KeyedCdc,
    RabinCdc, KEYED_MIN_SIZE,
};

/// The chunking algorithms larder offers. `docs/design/chunking.md` specifies each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ChunkerKind {
    /// FastCDC, 2016 form: one byte per step.
    Fastcdc2016,
    /// FastCDC, 2020 form: two bytes per step, same cut points as 2016 (see its docs).
    Fastcdc2020,
    /// Fixed-size chunks of `avg_size` bytes.
    Fixed,
    /// Rabin fingerprints over a 48-byte window, as in LBFS.
    Rabin,
    /// An Adler-style rolling checksum over a 48-byte window, as in P-Dedupe's Table 4.
    Adler,
    /// The plain Gear hash with a low-bit mask (Ddelta), FastCDC's baseline.
    Gear,
    /// Asymmetric Extremum: a cut a fixed distance after a local maximum.
    Ae,
    /// Cut decisions by a keyed pseudo-random function (AES) of a 16-byte window, with
    /// FastCDC's normalized probabilities: for encrypted repositories. Needs the
    /// chunker secret: built by [`ChunkerConfig::build_keyed`] only.
    Keyed,
}

impl ChunkerKind {
    /// Every kind, for help texts and tests.
    pub const ALL: [ChunkerKind; 8] = [
        Self::Fastcdc2016,
        Self::Fastcdc2020,
        Self::Fixed,
        Self::Rabin,
        Self::Adler,
        Self::Gear,
        Self::Ae,
        Self::Keyed,
    ];

    /// The name used on the command line and in the repository config.
    pub fn name(self) -> &'static str {
        match self {
            Self::Fastcdc2016 => "fastcdc2016",
            Self::Fastcdc2020 => "fastcdc2020",
            Self::Fixed => "fixed",
            Self::Rabin => "rabin",
            Self::Adler => "adler",
            Self::Gear => "gear",
            Self::Ae => "ae",
            Self::Keyed => "keyed",
        }
    }

    /// Parses a command-line name, ignoring case; `fastcdc` means the 2020 form, and
    /// the papers' other names are aliases.
    pub fn from_name(name: &str) -> Option<Self> {
        match name.to_ascii_lowercase().as_str() {
            "fastcdc" | "fastcdc2020" => Some(Self::Fastcdc2020),
            "fastcdc2016" => Some(Self::Fastcdc2016),
            "fixed" | "fsc" => Some(Self::Fixed),
            "rabin" | "lbfs" => Some(Self::Rabin),
            "adler" | "adler32" => Some(Self::Adler),
            "gear" | "ddelta" => Some(Self::Gear),
            "ae" | "asymmetric-extremum" => Some(Self::Ae),
            "keyed" => Some(Self::Keyed),
            _ => None,
        }
    }

    /// The kinds that read the normalization level: FastCDC in either form, and the
    /// keyed chunker, which takes FastCDC's normalized probabilities.
    pub fn reads_level(self) -> bool {
        matches!(self, Self::Fastcdc2016 | Self::Fastcdc2020 | Self::Keyed)
    }

    /// The kinds that read the seed of the Gear table: FastCDC in either form.
    pub fn reads_seed(self) -> bool {
        matches!(self, Self::Fastcdc2016 | Self::Fastcdc2020)
    }

    /// Whether the chunker needs a secret key ([`ChunkerConfig::build_keyed`]).
    pub fn needs_key(self) -> bool {
        self == Self::Keyed
    }
}

/// A chunker and its parameters. Sizes are in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkerConfig {
    pub kind: ChunkerKind,
    pub min_size: usize,
    pub avg_size: usize,
    pub max_size: usize,
    /// Normalization level, 0 to 3: FastCDC and keyed only; the other kinds ignore it.
    pub level: u8,
    /// XORed into every entry of the Gear table (FastCDC only): the `fastcdc` crate's
    /// `with_level_and_seed`, the Remote Execution API's FastCDC seed. Absent from a
    /// stored config when 0, so configs without it read as seed 0.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub seed: u64,
}

fn is_zero(seed: &u64) -> bool {
    *seed == 0
}

impl Default for ChunkerConfig {
    /// The papers' setting: FastCDC, 2/8/64 KiB, normalization level 2.
    fn default() -> Self {
        Self {
            kind: ChunkerKind::Fastcdc2020,
            min_size: 2 * 1024,
            avg_size: 8 * 1024,
            max_size: 64 * 1024,
            level: 2,
            seed: 0,
        }
    }
}

/// Parameters that no chunker accepts.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    #[error("{name} size {value} is outside {low}..={high} bytes")]
    OutOfRange {
        name: &'static str,
        value: usize,
        low: usize,
        high: usize,
    },
    #[error("sizes must satisfy min <= avg <= max (got {min}/{avg}/{max})")]
    Unordered { min: usize, avg: usize, max: usize },
    #[error("{kind} has no Gear table to seed: --seed is for fastcdc2016 and fastcdc2020")]
    SeedUnused { kind: &'static str },
    #[error("normalization level {0} is not in 0..=3")]
    Level(u8),
    #[error(
        "{kind} needs a power-of-two average size (got {avg}): it judges the lowest \
         log2(avg) bits of its hash"
    )]
    AvgNotPowerOfTwo { kind: &'static str, avg: usize },
    #[error(
        "the {kind} chunker needs a secret key, which only an encrypted repository \
         holds; build it with its key (ChunkerConfig::build_keyed)"
    )]
    KeyRequired { kind: &'static str },
}

/// The average and maximum bounds are the `fastcdc` crate's (FastCDC's mask table
/// covers averages of 256 B to 4 MiB), so that FastCDC can be differentially tested
/// against it. The minimum goes down to 0, below that crate's 64, for the FastCDC
/// paper's study of minimum sizes from 0 to 8 KiB (Fig. 11).
const MIN_RANGE: (usize, usize) = (0, 1 << 20);
const AVG_RANGE: (usize, usize) = (256, 4 << 20);
const MAX_RANGE: (usize, usize) = (1024, 16 << 20);

fn check_range(
    name: &'static str,
    value: usize,
    (low, high): (usize, usize),
) -> Result<(), ConfigError> {
    if (low..=high).contains(&value) {
        Ok(())
    } else {
        Err(ConfigError::OutOfRange {
            name,
            value,
            low,
            high,
        })
    }
}

impl ChunkerConfig {
    /// Checks the parameters; [`ChunkerConfig::build`] may only be called on a valid config.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let (min, avg, max) = (self.min_size, self.avg_size, self.max_size);
        if self.seed != 0 && !self.kind.reads_seed() {
            return Err(ConfigError::SeedUnused {
                kind: self.kind.name(),
            });
        }
        if self.kind == ChunkerKind::Fixed {
            return check_range("fixed", avg, (1, MAX_RANGE.1));
        }
        check_range("minimum", min, MIN_RANGE)?;
        check_range("average", avg, AVG_RANGE)?;
        check_range("maximum", max, MAX_RANGE)?;
        if !(min <= avg && avg <= max) {
            return Err(ConfigError::Unordered { min, avg, max });
        }
        if self.kind.reads_level() && self.level > 3 {
            return Err(ConfigError::Level(self.level));
        }
        if self.kind == ChunkerKind::Keyed && min < KEYED_MIN_SIZE {
            return Err(ConfigError::OutOfRange {
                name: "keyed minimum",
                value: min,
                low: KEYED_MIN_SIZE,
                high: MIN_RANGE.1,
            });
        }
        if matches!(self.kind, ChunkerKind::Rabin | ChunkerKind::Gear) && !avg.is_power_of_two() {
            return Err(ConfigError::AvgNotPowerOfTwo {
                kind: self.kind.name(),
                avg,
            });
        }
        Ok(())
    }

    /// The configured chunker, for every kind but [`ChunkerKind::Keyed`].
    ///
    /// # Panics
    /// On an invalid config (validate first), and for the keyed chunker, which needs
    /// its key: use [`ChunkerConfig::try_build`] where the kind comes from a user, and
    /// [`ChunkerConfig::build_keyed`] where a key is at hand.
    pub fn build(&self) -> Box<dyn Chunker> {
        match self.try_build() {
            Ok(chunker) => chunker,
            Err(e) => panic!("cannot build chunker {self:?}: {e}"),
        }
    }

    /// The configured chunker, or why there is none: an invalid config, or
    /// [`ConfigError::KeyRequired`] for the keyed chunker.
    pub fn try_build(&self) -> Result<Box<dyn Chunker>, ConfigError> {
        self.validate()?;
        if self.kind.needs_key() {
            return Err(ConfigError::KeyRequired {
                kind: self.kind.name(),
            });
        }
        Ok(self.build_unchecked(None))
    }

    /// The configured chunker of any kind; only the keyed chunker reads `prf` (the
    /// others ignore it), so a caller that holds a key may build every kind this way.
    ///
    /// # Panics
    /// On an invalid config: validate first.
    pub fn build_keyed(&self, prf: Arc<WindowPrf>) -> Box<dyn Chunker> {
        if let Err(e) = self.validate() {
            panic!("invalid chunker config {self:?}: {e}");
        }
        self.build_unchecked(Some(prf))
    }

    /// `self` is valid, and `prf` is given for a kind that needs a key.
    fn build_unchecked(&self, prf: Option<Arc<WindowPrf>>) -> Box<dyn Chunker> {
        let (min, avg, max) = (self.min_size, self.avg_size, self.max_size);
        match self.kind {
            ChunkerKind::Fastcdc2016 => {
                Box::new(FastCdc2016::with_seed(min, avg, max, self.level, self.seed))
            }
            ChunkerKind::Fastcdc2020 => {
                Box::new(FastCdc2020::with_seed(min, avg, max, self.level, self.seed))
            }
            ChunkerKind::Fixed => Box::new(FixedSize::new(avg)),
            ChunkerKind::Rabin => Box::new(RabinCdc::new(min, avg, max)),
            ChunkerKind::Adler => Box::new(AdlerCdc::new(min, avg, max)),
            ChunkerKind::Gear => Box::new(GearCdc::new(min, avg, max)),
            ChunkerKind::Ae => Box::new(AsymmetricExtremum::new(min, avg, max)),
            ChunkerKind::Keyed => match prf {
                Some(prf) => Box::new(KeyedCdc::new(prf, min, avg, max, self.level)),
                None => unreachable!("try_build refuses the keyed chunker without a key"),
            },
        }
    }

    /// The largest chunk the configured chunker returns.
    pub fn max_chunk_size(&self) -> usize {
        match self.kind {
            ChunkerKind::Fixed => self.avg_size,
            _ => self.max_size,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sized(
        kind: ChunkerKind,
        min_size: usize,
        avg_size: usize,
        max_size: usize,
    ) -> ChunkerConfig {
        ChunkerConfig {
            kind,
            min_size,
            avg_size,
            max_size,
            level: 2,
            seed: 0,
        }
    }

    #[test]
    fn default_is_the_papers_setting_and_valid() {
        let c = ChunkerConfig::default();
        assert_eq!(
            (c.min_size, c.avg_size, c.max_size, c.level),
            (2048, 8192, 65536, 2)
        );
        c.validate().unwrap();
    }

    #[test]
    fn rejects_bad_parameters() {
        let base = ChunkerConfig::default();
        let bad = [
            ChunkerConfig {
                min_size: 2 << 20,
                ..base
            },
            ChunkerConfig {
                avg_size: 1024,
                min_size: 4096,
                ..base
            },
            ChunkerConfig { level: 4, ..base },
            ChunkerConfig {
                max_size: 32 << 20,
                ..base
            },
            ChunkerConfig {
                kind: ChunkerKind::Rabin,
                seed: 1,
                ..base
            },
        ];
        for c in bad {
            assert!(c.validate().is_err(), "{c:?} accepted");
        }
        let odd_2016 = ChunkerConfig {
            kind: ChunkerKind::Fastcdc2016,
            min_size: 2049,
            ..base
        };
        odd_2016.validate().unwrap();
    }

    /// A key for the tests that build every kind.
    fn test_prf() -> Arc<WindowPrf> {
        Arc::new(WindowPrf::from_secret(&[0x42; 32]))
    }

    #[test]
    fn every_content_defined_kind_accepts_min_zero_and_small_mins() {
        for kind in ChunkerKind::ALL {
            for min in [0, 1, 2, 47, 48, 62, 63, 64, 65] {
                let config = sized(kind, min, 8192, 65536);
                if kind == ChunkerKind::Keyed && min < KEYED_MIN_SIZE {
                    assert!(config.validate().is_err(), "{config:?}");
                } else {
                    config.validate().unwrap();
                }
            }
        }
    }

    #[test]
    fn sizes_are_checked_for_every_content_defined_kind() {
        use ConfigError::{OutOfRange, Unordered};
        for kind in ChunkerKind::ALL
            .into_iter()
            .filter(|&k| k != ChunkerKind::Fixed)
        {
            let cases = [
                (sized(kind, 4096, 2048, 65536), "unordered"),
                (sized(kind, 0, 8192, 4096), "unordered"),
                (sized(kind, 2 << 20, 4 << 20, 8 << 20), "min range"),
                (sized(kind, 0, 128, 1024), "avg range"),
                (sized(kind, 0, 8 << 20, 16 << 20), "avg range"),
                (sized(kind, 0, 256, 512), "max range"),
                (sized(kind, 0, 8192, 32 << 20), "max range"),
            ];
            for (config, what) in cases {
                let err = config.validate().unwrap_err();
                assert!(
                    matches!(err, OutOfRange { .. } | Unordered { .. }),
                    "{kind:?} {what}: {err}"
                );
            }
        }
    }

    #[test]
    fn rabin_and_gear_need_a_power_of_two_average() {
        for kind in [ChunkerKind::Rabin, ChunkerKind::Gear] {
            let err = sized(kind, 2048, 10_000, 65536).validate().unwrap_err();
            assert_eq!(
                err,
                ConfigError::AvgNotPowerOfTwo {
                    kind: kind.name(),
                    avg: 10_000
                }
            );
            assert!(err.to_string().contains("power-of-two"), "{err}");
            sized(kind, 2048, 16384, 65536).validate().unwrap();
        }
        for kind in [
            ChunkerKind::Adler,
            ChunkerKind::Ae,
            ChunkerKind::Fastcdc2016,
        ] {
            sized(kind, 2048, 10_000, 65536).validate().unwrap();
        }
    }

    #[test]
    fn keyed_needs_min_64_to_keep_windows_inside_the_chunk() {
        let err = sized(ChunkerKind::Keyed, 63, 8192, 65536)
            .validate()
            .unwrap_err();
        assert!(err.to_string().contains("keyed minimum"), "{err}");
        sized(ChunkerKind::Keyed, 64, 8192, 65536)
            .validate()
            .unwrap();
        // Odd sizes and averages that are not powers of two are fine.
        sized(ChunkerKind::Keyed, 2001, 6001, 24001)
            .validate()
            .unwrap();
    }

    #[test]
    fn build_refuses_keyed_clearly_and_build_keyed_builds_every_kind() {
        let keyed = sized(ChunkerKind::Keyed, 2048, 8192, 65536);
        let err = keyed.try_build().err().unwrap();
        assert_eq!(err, ConfigError::KeyRequired { kind: "keyed" });
        assert!(err.to_string().contains("secret key"), "{err}");
        let panic = std::panic::catch_unwind(|| keyed.build()).err().unwrap();
        let message = panic.downcast_ref::<String>().unwrap();
        assert!(message.contains("needs a secret key"), "{message}");
        let prf = test_prf();
        for kind in ChunkerKind::ALL {
            let config = sized(kind, 2048, 8192, 65536);
            assert_eq!(config.kind.needs_key(), kind == ChunkerKind::Keyed);
            let data = vec![7u8; 100_000];
            let with_key = config.build_keyed(prf.clone()).chunk_lengths(&data);
            if !kind.needs_key() {
                assert_eq!(with_key, config.build().chunk_lengths(&data), "{kind:?}");
            }
        }
    }

    #[test]
    fn only_fastcdc_and_keyed_read_the_level() {
        for kind in ChunkerKind::ALL {
            let config = ChunkerConfig {
                level: 9,
                ..sized(kind, 2048, 8192, 65536)
            };
            let result = config.validate();
            if kind.reads_level() {
                assert_eq!(result, Err(ConfigError::Level(9)));
            } else {
                assert_eq!(result, Ok(()), "{kind:?}");
            }
        }
    }

    #[test]
    fn fastcdc_accepts_odd_sizes_as_the_fastcdc_crate_does() {
        for kind in [ChunkerKind::Fastcdc2016, ChunkerKind::Fastcdc2020] {
            sized(kind, 1, 8192, 65536).validate().unwrap();
            sized(kind, 4095, 16383, 65535).validate().unwrap();
        }
    }

    #[test]
    fn only_fastcdc_reads_the_seed_and_seed_zero_is_not_stored() {
        for kind in ChunkerKind::ALL {
            let config = ChunkerConfig {
                seed: 666,
                ..sized(kind, 2048, 8192, 65536)
            };
            let result = config.validate();
            if kind.reads_seed() {
                result.unwrap();
            } else {
                assert_eq!(result, Err(ConfigError::SeedUnused { kind: kind.name() }));
            }
        }
        let json = serde_json::to_string(&ChunkerConfig::default()).unwrap();
        assert!(!json.contains("seed"), "{json}");
        let seeded = ChunkerConfig {
            seed: 666,
            ..ChunkerConfig::default()
        };
        let json = serde_json::to_string(&seeded).unwrap();
        assert_eq!(
            serde_json::from_str::<ChunkerConfig>(&json).unwrap(),
            seeded
        );
    }

    #[test]
    fn names_round_trip() {
        for kind in ChunkerKind::ALL {
            assert_eq!(ChunkerKind::from_name(kind.name()), Some(kind));
            let serialized = serde_json::to_string(&kind).unwrap();
            assert_eq!(serialized, format!("\"{}\"", kind.name()));
            assert_eq!(
                serde_json::from_str::<ChunkerKind>(&serialized).unwrap(),
                kind
            );
        }
    }

    #[test]
    fn aliases_and_case() {
        let expected = [
            ("fastcdc", ChunkerKind::Fastcdc2020),
            ("FastCDC", ChunkerKind::Fastcdc2020),
            ("fsc", ChunkerKind::Fixed),
            ("lbfs", ChunkerKind::Rabin),
            ("Rabin", ChunkerKind::Rabin),
            ("adler32", ChunkerKind::Adler),
            ("ddelta", ChunkerKind::Gear),
            ("GEAR", ChunkerKind::Gear),
            ("asymmetric-extremum", ChunkerKind::Ae),
            ("Keyed", ChunkerKind::Keyed),
        ];
        for (name, kind) in expected {
            assert_eq!(ChunkerKind::from_name(name), Some(kind), "{name}");
        }
        for name in ["", "fastcdc2017", "rabin64", "ae ", "gear-cdc"] {
            assert_eq!(ChunkerKind::from_name(name), None, "{name:?}");
        }
    }

    #[test]
    fn max_chunk_size_is_what_the_chunker_reports() {
        for kind in ChunkerKind::ALL {
            let config = sized(kind, 64, 8192, 65536);
            assert_eq!(
                config.build_keyed(test_prf()).max_size(),
                config.max_chunk_size(),
                "{kind:?}"
            );
        }
    }
}
