//! Compression (docs/design/format.md, "config" and "Container"; units in
//! docs/design/compression-units.md): the repository's setting, the encodings a
//! container table entry can name, and the zstd encoder and decoder of single frames.

use serde::{Deserialize, Serialize};
use zstd::bulk::{Compressor, Decompressor};

use crate::error::{Result, StoreError};

/// zstd levels a repository may use: zstd's ordinary levels. The "ultra" levels 20 to
/// 22 only widen the match window, which chunks of at most 16 MiB cannot use.
pub const ZSTD_LEVELS: std::ops::RangeInclusive<i32> = 1..=19;

/// `larder init`'s level: zstd's own default.
pub const DEFAULT_ZSTD_LEVEL: i32 = 3;

/// The frame header descriptor's unused bit (RFC 8878, 3.1.1.1.1): encoders set it to
/// zero and decoders ignore it, so larder refuses it set, or flipping it would damage a
/// container without changing any chunk's raw bytes and `check` would not see it.
const FRAME_HEADER_UNUSED_BIT: u8 = 0x10;
/// Offset of the frame header descriptor: after the 4-byte magic number.
const FRAME_HEADER_DESCRIPTOR: usize = 4;

/// Consecutive new chunks `larder init` compresses together as one zstd frame.
pub const DEFAULT_UNIT_CHUNKS: u32 = 16;

/// The most chunks one compression unit may hold.
pub const MAX_UNIT_CHUNKS: u32 = 255;

/// A unit closes before its raw bytes pass this: a read of one member decodes at most
/// this much more than the member (besides the member itself, whatever its size).
pub const UNIT_RAW_TARGET: usize = 256 << 10;

/// The largest raw length a compressed chunk may claim: the largest maximum chunk size
/// a chunker config allows. Bounds what decoding one chunk allocates.
pub const MAX_COMPRESSED_RAW_LEN: u32 = 16 << 20;

/// How a repository stores the new chunks of its backups (config field `compression`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Compression {
    /// Every chunk stored raw; what repositories of format version 1 do.
    #[default]
    None,
    /// zstd at `level` (in [`ZSTD_LEVELS`]), each frame holding up to `unit_chunks`
    /// consecutive new chunks (1 to [`MAX_UNIT_CHUNKS`]; 1, each chunk alone, is what a
    /// config without the field means).
    Zstd {
        level: i32,
        #[serde(default = "one", skip_serializing_if = "is_one")]
        unit_chunks: u32,
    },
}

fn one() -> u32 {
    1
}

fn is_one(n: &u32) -> bool {
    *n == 1
}

impl Compression {
    /// What `larder init` uses unless told otherwise.
    pub const DEFAULT: Self = Self::Zstd {
        level: DEFAULT_ZSTD_LEVEL,
        unit_chunks: DEFAULT_UNIT_CHUNKS,
    };

    /// Parses `none`, `zstd` (the default level and unit), `zstd:LEVEL` (the default
    /// unit) or `zstd:LEVEL:UNIT` (UNIT chunks a frame; 1 compresses each alone).
    pub fn parse(text: &str) -> std::result::Result<Self, String> {
        let invalid = || {
            format!(
                "invalid compression {text:?}: use none, zstd, zstd:LEVEL or zstd:LEVEL:UNIT \
                 with LEVEL from {} to {} and UNIT (chunks compressed together) from 1 to \
                 {MAX_UNIT_CHUNKS}",
                ZSTD_LEVELS.start(),
                ZSTD_LEVELS.end()
            )
        };
        let lower = text.to_ascii_lowercase();
        let parsed = match lower.as_str() {
            "none" => Self::None,
            "zstd" => Self::DEFAULT,
            other => {
                let rest = other.strip_prefix("zstd:").ok_or_else(invalid)?;
                let (level, unit) = match rest.split_once(':') {
                    Some((level, unit)) => (level, Some(unit)),
                    None => (rest, None),
                };
                let level = level.parse::<i32>().map_err(|_| invalid())?;
                let unit_chunks = match unit {
                    Some(unit) => unit.parse::<u32>().map_err(|_| invalid())?,
                    None => DEFAULT_UNIT_CHUNKS,
                };
                Self::Zstd { level, unit_chunks }
            }
        };
        parsed.validate().map_err(|_| invalid())?;
        Ok(parsed)
    }

    /// Checks the level and the unit.
    pub fn validate(&self) -> Result<()> {
        match *self {
            Self::Zstd { level, .. } if !ZSTD_LEVELS.contains(&level) => {
                Err(StoreError::Config(format!(
                    "zstd level {level} is outside {}..={}",
                    ZSTD_LEVELS.start(),
                    ZSTD_LEVELS.end()
                )))
            }
            Self::Zstd { unit_chunks, .. } if !(1..=MAX_UNIT_CHUNKS).contains(&unit_chunks) => {
                Err(StoreError::Config(format!(
                    "a compression unit of {unit_chunks} chunks is outside 1..={MAX_UNIT_CHUNKS}"
                )))
            }
            _ => Ok(()),
        }
    }

    /// The repository format version a config with this compression needs: 1
    /// without compression (readable by a larder that knows only version 1), 2 with
    /// each chunk compressed alone, 4 with compression units (version 3 is
    /// encryption's).
    pub fn format_version(&self) -> u32 {
        match self {
            Self::None => 1,
            Self::Zstd { unit_chunks: 1, .. } => 2,
            Self::Zstd { .. } => 4,
        }
    }

    /// Chunks a frame may hold: 1 unless units are on.
    pub fn unit_chunks(&self) -> usize {
        match *self {
            Self::None => 1,
            Self::Zstd { unit_chunks, .. } => unit_chunks as usize,
        }
    }

    /// `none` or `zstd:LEVEL:UNIT`, as `init` accepts it.
    pub fn name(&self) -> String {
        match self {
            Self::None => "none".into(),
            Self::Zstd { level, unit_chunks } => format!("zstd:{level}:{unit_chunks}"),
        }
    }
}

/// How one chunk's bytes are stored, as its table entry says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChunkEncoding {
    /// The stored bytes are the chunk (flags 0).
    Raw,
    /// The stored bytes are one zstd frame of the chunk (flags 1).
    Zstd,
    /// The stored bytes are one zstd frame of a compression unit, which holds the
    /// chunk at `place` (flags 2).
    Member(UnitPlace),
}

/// Where a member lies in its unit, and what seals the unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnitPlace {
    /// From the start of the unit's raw bytes.
    pub raw_offset: u32,
    /// Raw bytes of the whole unit: what its frame decodes to.
    pub unit_len: u32,
    /// The unit's first member: an encrypted container seals the unit with its
    /// fingerprint, at its table index.
    pub first: larder_hash::Fingerprint,
}

/// Table flags: a chunk stored raw.
pub const FLAGS_RAW: u8 = 0;
/// Table flags: a chunk stored as its own zstd frame.
pub const FLAGS_ZSTD: u8 = 1;
/// Table flags: a member of a compression unit (container format version 3).
pub const FLAGS_MEMBER: u8 = 2;

impl ChunkEncoding {
    pub fn flags(self) -> u8 {
        match self {
            Self::Raw => FLAGS_RAW,
            Self::Zstd => FLAGS_ZSTD,
            Self::Member(_) => FLAGS_MEMBER,
        }
    }
}

/// Compresses chunks one at a time with a reused zstd context; one per thread.
pub struct ChunkCompressor {
    level: i32,
    context: Compressor<'static>,
    /// Output buffer, at least zstd's bound for the largest chunk seen, so that
    /// compression never fails for want of room (and takes zstd's faster path).
    out: Vec<u8>,
}

impl ChunkCompressor {
    pub fn new(level: i32) -> Result<Self> {
        let context = Compressor::new(level).map_err(|e| {
            StoreError::Compression(format!("cannot set up zstd at level {level}: {e}"))
        })?;
        Ok(Self {
            level,
            context,
            out: Vec::new(),
        })
    }

    pub fn level(&self) -> i32 {
        self.level
    }

    /// The zstd frame of `raw` if it is shorter than `raw`; `None` means store it raw.
    pub fn compress(&mut self, raw: &[u8]) -> Result<Option<&[u8]>> {
        let bound = zstd::zstd_safe::compress_bound(raw.len());
        if self.out.len() < bound {
            self.out.resize(bound, 0);
        }
        let written = self
            .context
            .compress_to_buffer(raw, &mut self.out[..bound])
            .map_err(|e| StoreError::Compression(format!("zstd compression failed: {e}")))?;
        Ok((written < raw.len()).then(|| &self.out[..written]))
    }
}

/// Decodes stored chunks; keeps one zstd context, made on the first compressed chunk.
#[derive(Default)]
pub struct ChunkDecoder {
    context: Option<Decompressor<'static>>,
}

impl ChunkDecoder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends the `raw_len` raw bytes that `stored` encodes to `out`. On any error
    /// `out` is left as it was. Allocates at most `raw_len` bytes for a raw chunk and
    /// at most [`MAX_COMPRESSED_RAW_LEN`] for a compressed one (a longer claim is an
    /// error). The error is a reason, for the caller to wrap with the chunk's name.
    pub fn decode_into(
        &mut self,
        encoding: ChunkEncoding,
        stored: &[u8],
        raw_len: u32,
        out: &mut Vec<u8>,
    ) -> std::result::Result<(), String> {
        if encoding != ChunkEncoding::Raw && raw_len > MAX_COMPRESSED_RAW_LEN {
            return Err(too_long(raw_len));
        }
        if encoding == ChunkEncoding::Raw && stored.len() != raw_len as usize {
            return Err(raw_mismatch(stored.len(), raw_len));
        }
        let start = out.len();
        out.resize(start + raw_len as usize, 0);
        let result = self.decode_to_slice(encoding, stored, &mut out[start..]);
        if result.is_err() {
            out.truncate(start);
        }
        result
    }

    /// Decodes the chunk that `stored` encodes into `out`, which must be exactly its
    /// raw length long: a frame that decodes to more or fewer bytes is an error (and
    /// zstd never writes past `out`). Allocates nothing but the zstd context. On an
    /// error the contents of `out` are unspecified. The error is a reason, as for
    /// [`ChunkDecoder::decode_into`].
    pub fn decode_to_slice(
        &mut self,
        encoding: ChunkEncoding,
        stored: &[u8],
        out: &mut [u8],
    ) -> std::result::Result<(), String> {
        let raw_len = out.len();
        match encoding {
            ChunkEncoding::Raw if stored.len() == raw_len => {
                out.copy_from_slice(stored);
                Ok(())
            }
            ChunkEncoding::Raw => Err(raw_mismatch(stored.len(), raw_len as u32)),
            ChunkEncoding::Zstd | ChunkEncoding::Member(_)
                if raw_len > MAX_COMPRESSED_RAW_LEN as usize =>
            {
                Err(too_long(raw_len as u32))
            }
            // A member's stored bytes are its unit's frame: `out` takes the whole unit.
            ChunkEncoding::Zstd | ChunkEncoding::Member(_) => {
                let frame_len =
                    zstd::zstd_safe::find_frame_compressed_size(stored).map_err(|code| {
                        format!(
                            "not a zstd frame ({})",
                            zstd::zstd_safe::get_error_name(code)
                        )
                    })?;
                if frame_len != stored.len() {
                    return Err(format!(
                        "the zstd frame is {frame_len} bytes but the chunk stores {}",
                        stored.len()
                    ));
                }
                if stored
                    .get(FRAME_HEADER_DESCRIPTOR)
                    .is_some_and(|d| d & FRAME_HEADER_UNUSED_BIT != 0)
                {
                    return Err("the zstd frame header has its unused bit set".into());
                }
                let context = match &mut self.context {
                    Some(c) => c,
                    empty => empty.insert(
                        Decompressor::new()
                            .map_err(|e| format!("cannot set up a zstd decompressor: {e}"))?,
                    ),
                };
                // The output slice is exactly `raw_len` long: zstd fails rather than
                // write past it.
                match context.decompress_to_buffer(stored, out) {
                    Ok(n) if n == raw_len => Ok(()),
                    Ok(n) => Err(format!(
                        "decompresses to {n} bytes, the table says {raw_len}"
                    )),
                    Err(e) => Err(format!("does not decompress: {e}")),
                }
            }
        }
    }
}

fn too_long(raw_len: u32) -> String {
    format!("claims {raw_len} raw bytes, more than a compressed chunk may hold")
}

fn raw_mismatch(stored: usize, raw_len: u32) -> String {
    format!("{stored} stored bytes for a raw chunk of {raw_len}")
}

/// Incompressible test data.
#[cfg(test)]
pub(crate) fn noise(seed: u64, len: usize) -> Vec<u8> {
    larder_gen::seeded_bytes(seed, len)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn text(len: usize) -> Vec<u8> {
        b"the quick brown fox jumps over the lazy dog; "
            .iter()
            .cycle()
            .take(len)
            .copied()
            .collect()
    }

    #[test]
    fn parse_accepts_the_documented_forms_and_nothing_else() {
        assert_eq!(Compression::parse("none"), Ok(Compression::None));
        assert_eq!(Compression::parse("zstd"), Ok(Compression::DEFAULT));
        assert_eq!(
            Compression::parse("ZSTD:19"),
            Ok(Compression::Zstd {
                level: 19,
                unit_chunks: DEFAULT_UNIT_CHUNKS
            })
        );
        assert_eq!(
            Compression::parse("zstd:1:1"),
            Ok(Compression::Zstd {
                level: 1,
                unit_chunks: 1
            })
        );
        assert_eq!(
            Compression::parse("zstd:3:255").map(|c| c.name()),
            Ok("zstd:3:255".into())
        );
        for bad in [
            "",
            "lz4",
            "zstd:",
            "zstd:0",
            "zstd:20",
            "zstd:-1",
            "zstd:3x",
            "zstd3",
            "none:1",
            "zstd:3:",
            "zstd:3:0",
            "zstd:3:256",
            "zstd:3:8:1",
            "zstd::8",
        ] {
            let err = Compression::parse(bad).unwrap_err();
            assert!(
                err.contains("none, zstd, zstd:LEVEL or zstd:LEVEL:UNIT"),
                "{bad}: {err}"
            );
        }
    }

    #[test]
    fn config_form_is_tagged_and_absent_means_none() {
        let single = Compression::Zstd {
            level: 5,
            unit_chunks: 1,
        };
        let json = serde_json::to_string(&single).unwrap();
        assert_eq!(json, r#"{"kind":"zstd","level":5}"#);
        assert_eq!(serde_json::from_str::<Compression>(&json).unwrap(), single);
        let json = serde_json::to_string(&Compression::DEFAULT).unwrap();
        assert_eq!(json, r#"{"kind":"zstd","level":3,"unit_chunks":16}"#);
        assert_eq!(Compression::DEFAULT.format_version(), 4);
        assert_eq!(single.format_version(), 2);
        assert_eq!(
            serde_json::to_string(&Compression::None).unwrap(),
            r#"{"kind":"none"}"#
        );
        assert!(serde_json::from_str::<Compression>(r#"{"kind":"lz4"}"#).is_err());
        assert_eq!(Compression::default(), Compression::None);
    }

    #[test]
    fn compressible_chunks_round_trip_at_every_level() {
        let raw = text(50_000);
        for level in ZSTD_LEVELS {
            let mut c = ChunkCompressor::new(level).unwrap();
            let frame = c.compress(&raw).unwrap().unwrap().to_vec();
            assert!(frame.len() < raw.len() / 10, "level {level}");
            let mut out = b"prefix".to_vec();
            ChunkDecoder::new()
                .decode_into(ChunkEncoding::Zstd, &frame, raw.len() as u32, &mut out)
                .unwrap();
            assert_eq!(&out[..6], b"prefix");
            assert_eq!(&out[6..], &raw[..]);
        }
    }

    #[test]
    fn incompressible_and_tiny_chunks_are_left_raw() {
        let mut c = ChunkCompressor::new(DEFAULT_ZSTD_LEVEL).unwrap();
        assert_eq!(c.compress(&noise(1, 10_000)).unwrap(), None);
        assert_eq!(c.compress(b"").unwrap(), None);
        assert_eq!(c.compress(b"x").unwrap(), None);
    }

    #[test]
    fn damaged_frames_are_errors_and_leave_the_output_alone() {
        let raw = text(20_000);
        let frame = ChunkCompressor::new(3)
            .unwrap()
            .compress(&raw)
            .unwrap()
            .unwrap()
            .to_vec();
        let mut d = ChunkDecoder::new();
        let mut caught = 0;
        for i in 0..frame.len() {
            for bit in [0x01u8, 0x80] {
                let mut bad = frame.clone();
                bad[i] ^= bit;
                let mut out = vec![7u8; 3];
                match d.decode_into(ChunkEncoding::Zstd, &bad, raw.len() as u32, &mut out) {
                    Err(_) => {
                        caught += 1;
                        assert_eq!(out, [7, 7, 7]);
                    }
                    // Without a frame checksum some flips decode to other bytes of the
                    // right length; the fingerprint catches those.
                    Ok(()) => assert_eq!(out.len(), 3 + raw.len()),
                }
            }
        }
        assert!(caught > 0);
        let mut out = Vec::new();
        for (stored, raw_len) in [
            (&frame[..frame.len() - 1], raw.len()),
            (&frame[..], raw.len() - 1),
            (&frame[..], raw.len() + 1),
        ] {
            assert!(d
                .decode_into(ChunkEncoding::Zstd, stored, raw_len as u32, &mut out)
                .is_err());
            assert!(out.is_empty());
        }
        let mut trailing = frame.clone();
        trailing.extend_from_slice(&frame);
        assert!(d
            .decode_into(ChunkEncoding::Zstd, &trailing, raw.len() as u32, &mut out)
            .is_err());
        assert!(d
            .decode_into(ChunkEncoding::Raw, &raw, raw.len() as u32 + 1, &mut out)
            .is_err());
    }

    proptest! {
        /// The in-CI twin of the `chunk` fuzz target: any stored bytes and raw length,
        /// no panic, and never more output than the raw length.
        #[test]
        fn arbitrary_frames_never_panic(
            stored in proptest::collection::vec(any::<u8>(), 0..300),
            raw_len in 0u32..100_000,
            magic in any::<bool>(),
        ) {
            let mut stored = stored;
            if magic {
                stored.splice(0..0, [0x28, 0xb5, 0x2f, 0xfd]);
            }
            let mut out = Vec::new();
            if ChunkDecoder::new().decode_into(ChunkEncoding::Zstd, &stored, raw_len, &mut out).is_ok() {
                prop_assert_eq!(out.len(), raw_len as usize);
            } else {
                prop_assert!(out.is_empty());
            }
        }

        /// Real frames with random damage: no panic, output bounded.
        #[test]
        fn damaged_real_frames_never_panic(
            len in 1usize..5000,
            flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..8),
        ) {
            let raw = text(len);
            let mut c = ChunkCompressor::new(1).unwrap();
            if let Some(frame) = c.compress(&raw).unwrap() {
                let mut bad = frame.to_vec();
                for (at, x) in flips {
                    let i = at % bad.len();
                    bad[i] ^= x;
                }
                let mut out = Vec::new();
                if ChunkDecoder::new().decode_into(ChunkEncoding::Zstd, &bad, len as u32, &mut out).is_ok() {
                    prop_assert_eq!(out.len(), len);
                }
            }
        }
    }
}
