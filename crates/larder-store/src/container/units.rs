//! Compression units in a container's table (docs/design/compression-units.md): the
//! tiling rules a parser checks, and how a reader finds a chunk's entry and learns how
//! its bytes are stored.

use larder_hash::Fingerprint;

use super::ChunkEntry;
use crate::compression::{
    ChunkEncoding, UnitPlace, FLAGS_MEMBER, FLAGS_RAW, FLAGS_ZSTD, MAX_COMPRESSED_RAW_LEN,
    MAX_UNIT_CHUNKS,
};

/// The first container format version whose tables may hold units.
pub(super) const UNITS_VERSION: u32 = 3;

/// Checks that `entries` tile the data region from `start`, in order, one stored unit
/// after another, each with lengths its flags allow; `tag` is what sealing adds to
/// every stored unit (0 in a plaintext container). Units are refused unless
/// `units` (a version 3 container). Returns where the data ends, or the reason.
pub(super) fn check_tiling(
    entries: &[ChunkEntry],
    start: u64,
    tag: u32,
    units: bool,
) -> Result<u64, String> {
    let mut end = start;
    let mut i = 0;
    while i < entries.len() {
        let e = &entries[i];
        if u64::from(e.offset) != end {
            return Err(format!("table entry {i} does not tile the data region"));
        }
        let members = match e.flags {
            FLAGS_RAW | FLAGS_ZSTD => {
                check_single(e, tag).map_err(|reason| format!("table entry {i}: {reason}"))?;
                1
            }
            FLAGS_MEMBER if units => check_unit(&entries[i..], tag)
                .map_err(|reason| format!("the unit at table entry {i}: {reason}"))?,
            FLAGS_MEMBER => {
                return Err(format!(
                    "table entry {i} is a unit member (flags 2), which only a version 3 \
                     container may hold"
                ))
            }
            flags => {
                return Err(format!(
                    "table entry {i} has unknown chunk encoding (flags {flags}); it was \
                     written by a newer larder"
                ))
            }
        };
        end += u64::from(e.stored_len);
        i += members;
    }
    Ok(end)
}

/// A chunk stored alone: raw bytes exactly its length, or a frame shorter than it.
fn check_single(e: &ChunkEntry, tag: u32) -> Result<(), String> {
    let agree = match e.stored_len.checked_sub(tag) {
        None => false,
        Some(s) if e.flags == FLAGS_RAW => s == e.raw_len,
        Some(s) => s < e.raw_len && e.raw_len <= MAX_COMPRESSED_RAW_LEN,
    };
    if !agree {
        return Err(format!(
            "stored length {} and raw length {} do not fit flags {}",
            e.stored_len, e.raw_len, e.flags
        ));
    }
    if e.unit_offset != 0 {
        return Err("a chunk stored alone has a unit offset".into());
    }
    Ok(())
}

/// The unit starting at `entries[0]`: 2 to [`MAX_UNIT_CHUNKS`] consecutive members
/// with one offset and stored length, whose raw bytes follow each other from 0 and
/// total more than the frame and at most [`MAX_COMPRESSED_RAW_LEN`]. Returns its
/// member count.
fn check_unit(entries: &[ChunkEntry], tag: u32) -> Result<usize, String> {
    let first = &entries[0];
    let members = entries
        .iter()
        .take_while(|e| e.flags == FLAGS_MEMBER && e.offset == first.offset)
        .count();
    if !(2..=MAX_UNIT_CHUNKS as usize).contains(&members) {
        return Err(format!("{members} members, not 2 to {MAX_UNIT_CHUNKS}"));
    }
    let mut raw_end = 0u64;
    for e in &entries[..members] {
        if e.stored_len != first.stored_len {
            return Err("its members disagree on its stored length".into());
        }
        if u64::from(e.unit_offset) != raw_end {
            return Err("its members' raw bytes do not follow each other".into());
        }
        raw_end += u64::from(e.raw_len);
    }
    let frame = first.stored_len.saturating_sub(tag);
    if frame == 0 || u64::from(frame) >= raw_end || raw_end > u64::from(MAX_COMPRESSED_RAW_LEN) {
        return Err(format!(
            "stored length {} does not fit {raw_end} raw bytes",
            first.stored_len
        ));
    }
    Ok(members)
}

/// The table index of chunk `fp` stored at `offset`, if the table holds it: entries
/// are in offset order, and a unit's members share its offset.
pub fn position(entries: &[ChunkEntry], offset: u32, fp: &Fingerprint) -> Option<usize> {
    let from = entries.partition_point(|e| e.offset < offset);
    entries[from..]
        .iter()
        .take_while(|e| e.offset == offset)
        .position(|e| e.fingerprint == *fp)
        .map(|i| from + i)
}

/// How the chunk of `entries[i]` is stored, and the table index its stored bytes are
/// sealed at (a unit's first member's), in a table a parser has checked. `None` for
/// flags this larder does not know.
pub fn stored_form(entries: &[ChunkEntry], i: usize) -> Option<(ChunkEncoding, u32)> {
    let e = &entries[i];
    let encoding = match e.flags {
        FLAGS_RAW => ChunkEncoding::Raw,
        FLAGS_ZSTD => ChunkEncoding::Zstd,
        FLAGS_MEMBER => {
            let span = unit_span(entries, i);
            let last = &entries[span.end - 1];
            let first = span.start;
            let place = UnitPlace {
                raw_offset: e.unit_offset,
                unit_len: last.unit_offset.saturating_add(last.raw_len),
                first: entries[first].fingerprint,
            };
            return Some((ChunkEncoding::Member(place), first as u32));
        }
        _ => return None,
    };
    Some((encoding, i as u32))
}

/// The table indices of the unit `entries[i]` belongs to (just `i` for a chunk stored
/// alone).
pub fn unit_span(entries: &[ChunkEntry], i: usize) -> std::ops::Range<usize> {
    let e = &entries[i];
    if e.flags != FLAGS_MEMBER {
        return i..i + 1;
    }
    let same = |o: &ChunkEntry| o.flags == FLAGS_MEMBER && o.offset == e.offset;
    let start = i - entries[..i].iter().rev().take_while(|o| same(o)).count();
    let end = i + entries[i..].iter().take_while(|o| same(o)).count();
    start..end
}

/// Stored bytes a table's entries account for: each unit's once.
pub fn stored_bytes(entries: &[ChunkEntry]) -> u64 {
    entries
        .iter()
        .filter(|e| e.flags != FLAGS_MEMBER || e.unit_offset == 0)
        .map(|e| u64::from(e.stored_len))
        .sum()
}

/// Each entry's share of the stored bytes: a chunk stored alone, its stored length; a
/// unit's member, the unit's stored length in proportion to the member's raw length
/// (its first member takes what rounding leaves). The shares sum to [`stored_bytes`].
pub fn stored_shares(entries: &[ChunkEntry]) -> Vec<u64> {
    let mut shares = Vec::with_capacity(entries.len());
    while shares.len() < entries.len() {
        let span = unit_span(entries, shares.len());
        let unit = &entries[span.clone()];
        let stored = u64::from(unit[0].stored_len);
        let raw: u64 = unit
            .iter()
            .map(|e| u64::from(e.raw_len))
            .sum::<u64>()
            .max(1);
        let rest: Vec<u64> = unit[1..]
            .iter()
            .map(|e| stored * u64::from(e.raw_len) / raw)
            .collect();
        shares.push(stored - rest.iter().sum::<u64>().min(stored));
        shares.extend(rest);
    }
    shares
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(
        offset: u32,
        stored_len: u32,
        raw_len: u32,
        flags: u8,
        unit_offset: u32,
    ) -> ChunkEntry {
        ChunkEntry {
            fingerprint: Fingerprint([offset as u8 ^ unit_offset as u8; 32]),
            offset,
            stored_len,
            raw_len,
            flags,
            unit_offset,
        }
    }

    fn unit(offset: u32, stored: u32, raws: &[u32]) -> Vec<ChunkEntry> {
        let mut at = 0;
        raws.iter()
            .map(|&r| {
                let e = entry(offset, stored, r, FLAGS_MEMBER, at);
                at += r;
                e
            })
            .collect()
    }

    #[test]
    fn units_tile_between_single_chunks() {
        let mut t = vec![entry(32, 10, 10, FLAGS_RAW, 0)];
        t.extend(unit(42, 20, &[30, 40, 50]));
        t.push(entry(62, 5, 9, FLAGS_ZSTD, 0));
        t.extend(unit(67, 7, &[8, 8]));
        assert_eq!(check_tiling(&t, 32, 0, true), Ok(74));
        let err = check_tiling(&t, 32, 0, false).unwrap_err();
        assert!(err.contains("only a version 3 container"), "{err}");
        assert_eq!(stored_bytes(&t), 10 + 20 + 5 + 7);
        let shares = stored_shares(&t);
        assert_eq!(shares, [10, 20 - 6 - 8, 6, 8, 5, 4, 3]);
        assert_eq!(shares.iter().sum::<u64>(), stored_bytes(&t));
        assert_eq!(unit_span(&t, 2), 1..4);
        assert_eq!(unit_span(&t, 0), 0..1);
        assert_eq!(unit_span(&t, 6), 5..7);
        let (enc, seal) = stored_form(&t, 3).unwrap();
        assert_eq!(seal, 1);
        assert_eq!(
            enc,
            ChunkEncoding::Member(UnitPlace {
                raw_offset: 70,
                unit_len: 120,
                first: t[1].fingerprint
            })
        );
        assert_eq!(stored_form(&t, 4), Some((ChunkEncoding::Zstd, 4)));
        for (i, e) in t.iter().enumerate() {
            assert_eq!(position(&t, e.offset, &e.fingerprint), Some(i));
        }
        assert_eq!(position(&t, 43, &t[0].fingerprint), None);
        assert_eq!(position(&t, 42, &t[0].fingerprint), None);
    }

    #[test]
    fn malformed_units_are_refused() {
        let ok = unit(32, 20, &[30, 40]);
        let cases: Vec<(&str, Vec<ChunkEntry>)> = vec![
            ("one member", unit(32, 20, &[30])),
            ("gap in raw offsets", {
                let mut t = ok.clone();
                t[1].unit_offset = 31;
                t
            }),
            ("first raw offset not 0", {
                let mut t = ok.clone();
                t[0].unit_offset = 1;
                t[1].unit_offset = 31;
                t
            }),
            ("stored lengths disagree", {
                let mut t = ok.clone();
                t[1].stored_len = 21;
                t
            }),
            ("frame not smaller", unit(32, 70, &[30, 40])),
            ("empty frame", unit(32, 0, &[30, 40])),
            ("too large", unit(32, 20, &[MAX_COMPRESSED_RAW_LEN, 1])),
            (
                "single with unit offset",
                vec![entry(32, 5, 5, FLAGS_RAW, 1)],
            ),
            ("unknown flags", vec![entry(32, 5, 5, 3, 0)]),
        ];
        for (what, t) in cases {
            assert!(check_tiling(&t, 32, 0, true).is_err(), "{what}");
        }
        assert!(check_tiling(&unit(32, 20, &[1; 256]), 32, 0, true).is_err());
        assert_eq!(check_tiling(&unit(32, 20, &[1; 255]), 32, 0, true), Ok(52));
        // Sealed: the tag is part of the stored length.
        assert_eq!(check_tiling(&unit(32, 36, &[30, 40]), 32, 16, true), Ok(68));
        assert!(check_tiling(&unit(32, 16, &[30, 40]), 32, 16, true).is_err());
    }
}
