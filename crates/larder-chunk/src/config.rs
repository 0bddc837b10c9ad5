//! Which chunker a repository uses, with its parameters; stored in the repository config.

use serde::{Deserialize, Serialize};

use crate::{Chunker, FastCdc2016, FastCdc2020, FixedSize};

/// The chunking algorithms larder offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ChunkerKind {
    /// FastCDC, 2016 form: one byte per step.
    Fastcdc2016,
    /// FastCDC, 2020 form: two bytes per step, same cut points as 2016 (see its docs).
    Fastcdc2020,
    /// Fixed-size chunks of `avg_size` bytes.
    Fixed,
}

impl ChunkerKind {
    /// Every kind, for help texts and tests.
    pub const ALL: [ChunkerKind; 3] = [Self::Fastcdc2016, Self::Fastcdc2020, Self::Fixed];

    /// The name used on the command line and in the repository config.
    pub fn name(self) -> &'static str {
        match self {
            Self::Fastcdc2016 => "fastcdc2016",
            Self::Fastcdc2020 => "fastcdc2020",
            Self::Fixed => "fixed",
        }
    }

    /// Parses a command-line name; `fastcdc` means the 2020 form.
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "fastcdc" | "fastcdc2020" => Some(Self::Fastcdc2020),
            "fastcdc2016" => Some(Self::Fastcdc2016),
            "fixed" | "fsc" => Some(Self::Fixed),
            _ => None,
        }
    }
}

/// A chunker and its parameters. Sizes are in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkerConfig {
    pub kind: ChunkerKind,
    pub min_size: usize,
    pub avg_size: usize,
    pub max_size: usize,
    /// Normalization level, 0 to 3 (FastCDC only).
    pub level: u8,
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
    #[error("{kind} needs even sizes (got {min}/{avg}/{max})")]
    OddSize {
        kind: &'static str,
        min: usize,
        avg: usize,
        max: usize,
    },
    #[error("normalization level {0} is not in 0..=3")]
    Level(u8),
}

/// Bounds shared with the `fastcdc` crate, so that every accepted configuration can be
/// differentially tested against it.
const MIN_RANGE: (usize, usize) = (64, 1 << 20);
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
        if self.kind == ChunkerKind::Fixed {
            return check_range("fixed", avg, (1, MAX_RANGE.1));
        }
        check_range("minimum", min, MIN_RANGE)?;
        check_range("average", avg, AVG_RANGE)?;
        check_range("maximum", max, MAX_RANGE)?;
        if !(min <= avg && avg <= max) {
            return Err(ConfigError::Unordered { min, avg, max });
        }
        if self.level > 3 {
            return Err(ConfigError::Level(self.level));
        }
        if self.kind == ChunkerKind::Fastcdc2020 && (min % 2 != 0 || avg % 2 != 0 || max % 2 != 0) {
            return Err(ConfigError::OddSize {
                kind: self.kind.name(),
                min,
                avg,
                max,
            });
        }
        Ok(())
    }

    /// The configured chunker. Panics on an invalid config: validate first.
    pub fn build(&self) -> Box<dyn Chunker> {
        assert!(self.validate().is_ok(), "invalid chunker config {self:?}");
        match self.kind {
            ChunkerKind::Fastcdc2016 => Box::new(FastCdc2016::new(
                self.min_size,
                self.avg_size,
                self.max_size,
                self.level,
            )),
            ChunkerKind::Fastcdc2020 => Box::new(FastCdc2020::new(
                self.min_size,
                self.avg_size,
                self.max_size,
                self.level,
            )),
            ChunkerKind::Fixed => Box::new(FixedSize::new(self.avg_size)),
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
                min_size: 16,
                ..base
            },
            ChunkerConfig {
                avg_size: 1024,
                min_size: 4096,
                ..base
            },
            ChunkerConfig { level: 4, ..base },
            ChunkerConfig {
                min_size: 2049,
                ..base
            },
            ChunkerConfig {
                max_size: 32 << 20,
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

    #[test]
    fn names_round_trip() {
        for kind in ChunkerKind::ALL {
            assert_eq!(ChunkerKind::from_name(kind.name()), Some(kind));
        }
    }
}
