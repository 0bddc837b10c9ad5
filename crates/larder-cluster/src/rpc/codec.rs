//! The packed fields of the lookup protocol (docs/design/cluster.md, "Lookups (gRPC,
//! tonic)"): fingerprints, answers, locations and acknowledgement entries as byte
//! strings. Pure functions; every decoder checks lengths and kind bytes and returns
//! `RpcError::Malformed`, never panics, on bytes a peer sent.

use larder_hash::Fingerprint;
use larder_index::ChunkLocation;
use prost::bytes::Bytes;

use super::{Answer, GetAnswer, RpcError};

/// Bytes of one packed fingerprint.
pub const FINGERPRINT_BYTES: usize = Fingerprint::LEN;
/// Bytes of one packed location: container (u64), offset (u32), length (u32), little-endian.
pub const LOCATION_BYTES: usize = 16;
/// Bytes of one packed acknowledgement entry: a fingerprint, then its location.
pub const ENTRY_BYTES: usize = FINGERPRINT_BYTES + LOCATION_BYTES;

/// Kind bytes of `LookupResponse.kinds` and `GetResponse.kinds`.
pub const KIND_KNOWN: u8 = 0;
pub const KIND_NEW: u8 = 1;
pub const KIND_MOVED: u8 = 2;
pub const KIND_ABSENT: u8 = 3;

/// `n * 32` bytes: the fingerprints concatenated, in order.
pub fn pack_fingerprints(fps: &[Fingerprint]) -> Bytes {
    let mut out = Vec::with_capacity(fps.len() * FINGERPRINT_BYTES);
    for fp in fps {
        out.extend_from_slice(fp.as_bytes());
    }
    out.into()
}

/// The inverse of `pack_fingerprints`; `what` names the field in the error.
pub fn unpack_fingerprints(what: &'static str, bytes: &[u8]) -> Result<Vec<Fingerprint>, RpcError> {
    let chunks = exact_chunks::<FINGERPRINT_BYTES>(what, bytes)?;
    Ok(chunks.map(|c| Fingerprint(*c)).collect())
}

fn put_location(out: &mut Vec<u8>, loc: &ChunkLocation) {
    out.extend_from_slice(&loc.container.to_le_bytes());
    out.extend_from_slice(&loc.offset.to_le_bytes());
    out.extend_from_slice(&loc.length.to_le_bytes());
}

fn location_from(b: &[u8; LOCATION_BYTES]) -> ChunkLocation {
    let (container, rest) = b.split_at(8);
    let (offset, length) = rest.split_at(4);
    ChunkLocation {
        container: u64::from_le_bytes(container.try_into().expect("8 bytes")),
        offset: u32::from_le_bytes(offset.try_into().expect("4 bytes")),
        length: u32::from_le_bytes(length.try_into().expect("4 bytes")),
    }
}

/// Splits `bytes` into `N`-byte arrays, or says why it cannot.
fn exact_chunks<'a, const N: usize>(
    what: &'static str,
    bytes: &'a [u8],
) -> Result<impl Iterator<Item = &'a [u8; N]>, RpcError> {
    if !bytes.len().is_multiple_of(N) {
        return Err(RpcError::Malformed {
            what,
            reason: format!("{} bytes is not a multiple of {N}", bytes.len()),
        });
    }
    Ok(bytes
        .chunks_exact(N)
        .map(|c| <&[u8; N]>::try_from(c).expect("chunks_exact yields N bytes")))
}

/// `(kinds, locations)` of a `LookupResponse`: one kind byte per answer, and one packed
/// location per `Known` answer, both in answer order.
pub fn pack_answers(answers: &[Answer]) -> (Bytes, Bytes) {
    let mut kinds = Vec::with_capacity(answers.len());
    let mut locations = Vec::new();
    for answer in answers {
        kinds.push(match answer {
            Answer::Known(loc) => {
                put_location(&mut locations, loc);
                KIND_KNOWN
            }
            Answer::New => KIND_NEW,
            Answer::Moved => KIND_MOVED,
        });
    }
    (kinds.into(), locations.into())
}

/// The inverse of `pack_answers`, checked against the `expected` answer count (the
/// number of fingerprints asked).
pub fn unpack_answers(
    expected: usize,
    kinds: &[u8],
    locations: &[u8],
) -> Result<Vec<Answer>, RpcError> {
    unpack_kinds(expected, kinds, locations, |kind, loc| match kind {
        KIND_KNOWN => loc().map(Answer::Known),
        KIND_NEW => Some(Answer::New),
        KIND_MOVED => Some(Answer::Moved),
        _ => None,
    })
}

/// `(kinds, locations)` of a `GetResponse`, laid out as `pack_answers`'.
pub fn pack_get_answers(answers: &[GetAnswer]) -> (Bytes, Bytes) {
    let mut kinds = Vec::with_capacity(answers.len());
    let mut locations = Vec::new();
    for answer in answers {
        kinds.push(match answer {
            GetAnswer::Known(loc) => {
                put_location(&mut locations, loc);
                KIND_KNOWN
            }
            GetAnswer::Absent => KIND_ABSENT,
            GetAnswer::Moved => KIND_MOVED,
        });
    }
    (kinds.into(), locations.into())
}

/// The inverse of `pack_get_answers`.
pub fn unpack_get_answers(
    expected: usize,
    kinds: &[u8],
    locations: &[u8],
) -> Result<Vec<GetAnswer>, RpcError> {
    unpack_kinds(expected, kinds, locations, |kind, loc| match kind {
        KIND_KNOWN => loc().map(GetAnswer::Known),
        KIND_ABSENT => Some(GetAnswer::Absent),
        KIND_MOVED => Some(GetAnswer::Moved),
        _ => None,
    })
}

/// Decodes `kinds` with `decode(kind, next_location)`, which answers `None` for a kind
/// byte it does not accept. Every location must be used exactly once.
fn unpack_kinds<T>(
    expected: usize,
    kinds: &[u8],
    locations: &[u8],
    decode: impl Fn(u8, &mut dyn FnMut() -> Option<ChunkLocation>) -> Option<T>,
) -> Result<Vec<T>, RpcError> {
    if kinds.len() != expected {
        return Err(RpcError::Malformed {
            what: "answer kinds",
            reason: format!("{} answers for {expected} fingerprints", kinds.len()),
        });
    }
    let mut locs = exact_chunks::<LOCATION_BYTES>("answer locations", locations)?;
    let mut used = 0usize;
    let mut next_location = || {
        used += 1;
        locs.next().map(location_from)
    };
    let mut out = Vec::with_capacity(expected);
    for (i, &kind) in kinds.iter().enumerate() {
        out.push(
            decode(kind, &mut next_location).ok_or_else(|| RpcError::Malformed {
                what: "answer kinds",
                reason: format!(
                    "answer {i}: kind byte {kind} is not valid here, or its location is missing"
                ),
            })?,
        );
    }
    let given = locations.len() / LOCATION_BYTES;
    if used != given {
        return Err(RpcError::Malformed {
            what: "answer locations",
            reason: format!("{given} locations for {used} Known answers"),
        });
    }
    Ok(out)
}

/// `n * 48` bytes: per entry the fingerprint, then its packed location.
pub fn pack_entries(entries: &[(Fingerprint, ChunkLocation)]) -> Bytes {
    let mut out = Vec::with_capacity(entries.len() * ENTRY_BYTES);
    for (fp, loc) in entries {
        out.extend_from_slice(fp.as_bytes());
        put_location(&mut out, loc);
    }
    out.into()
}

/// The inverse of `pack_entries`.
pub fn unpack_entries(bytes: &[u8]) -> Result<Vec<(Fingerprint, ChunkLocation)>, RpcError> {
    let chunks = exact_chunks::<ENTRY_BYTES>("ack entries", bytes)?;
    Ok(chunks
        .map(|e| {
            let (fp, loc) = e.split_at(FINGERPRINT_BYTES);
            (
                Fingerprint(fp.try_into().expect("32 bytes")),
                location_from(loc.try_into().expect("16 bytes")),
            )
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn fp(i: u8) -> Fingerprint {
        Fingerprint([i; 32])
    }

    fn loc() -> impl Strategy<Value = ChunkLocation> {
        (any::<u64>(), any::<u32>(), any::<u32>()).prop_map(|(container, offset, length)| {
            ChunkLocation {
                container,
                offset,
                length,
            }
        })
    }

    fn answer() -> impl Strategy<Value = Answer> {
        prop_oneof![
            loc().prop_map(Answer::Known),
            Just(Answer::New),
            Just(Answer::Moved)
        ]
    }

    fn get_answer() -> impl Strategy<Value = GetAnswer> {
        prop_oneof![
            loc().prop_map(GetAnswer::Known),
            Just(GetAnswer::Absent),
            Just(GetAnswer::Moved)
        ]
    }

    #[test]
    fn location_layout_is_little_endian_container_offset_length() {
        let (kinds, locations) = pack_answers(&[
            Answer::New,
            Answer::Known(ChunkLocation {
                container: 0x0102_0304_0506_0708,
                offset: 0x1112_1314,
                length: 0x2122_2324,
            }),
        ]);
        assert_eq!(&kinds[..], &[KIND_NEW, KIND_KNOWN]);
        assert_eq!(
            &locations[..],
            &[8, 7, 6, 5, 4, 3, 2, 1, 0x14, 0x13, 0x12, 0x11, 0x24, 0x23, 0x22, 0x21]
        );
    }

    #[test]
    fn fingerprints_whose_length_is_not_a_multiple_of_32_are_malformed() {
        let packed = pack_fingerprints(&[fp(1), fp(2)]);
        assert_eq!(
            unpack_fingerprints("f", &packed).unwrap(),
            vec![fp(1), fp(2)]
        );
        for len in [1, 31, 33, 63] {
            let err = unpack_fingerprints("f", &packed[..len.min(packed.len())]).unwrap_err();
            assert!(
                matches!(err, RpcError::Malformed { what: "f", .. }),
                "{err}"
            );
            assert!(err.to_string().contains("not a multiple of 32"), "{err}");
        }
        assert_eq!(unpack_fingerprints("f", &[]).unwrap(), vec![]);
    }

    #[test]
    fn answers_with_wrong_counts_or_kinds_are_malformed() {
        let known = Answer::Known(ChunkLocation {
            container: 1,
            offset: 2,
            length: 3,
        });
        let (kinds, locations) = pack_answers(&[known, Answer::New]);
        assert_eq!(
            unpack_answers(2, &kinds, &locations).unwrap(),
            vec![known, Answer::New]
        );
        // Too few or too many answers for the fingerprints asked.
        assert!(unpack_answers(3, &kinds, &locations).is_err());
        assert!(unpack_answers(1, &kinds[..1], &locations).is_ok());
        // A location missing, one too many, or a torn one.
        assert!(unpack_answers(2, &kinds, &[]).is_err());
        let mut two = locations.to_vec();
        two.extend_from_slice(&locations);
        assert!(unpack_answers(2, &kinds, &two).is_err());
        assert!(unpack_answers(2, &kinds, &locations[..15]).is_err());
        // Unknown kind bytes, and Absent in a lookup or New in a get.
        assert!(unpack_answers(2, &[KIND_KNOWN, 9], &locations).is_err());
        assert!(unpack_answers(1, &[KIND_ABSENT], &[]).is_err());
        assert!(unpack_get_answers(1, &[KIND_NEW], &[]).is_err());
    }

    proptest! {
        #[test]
        fn answers_round_trip(answers in proptest::collection::vec(answer(), 0..64)) {
            let (kinds, locations) = pack_answers(&answers);
            let known = answers.iter().filter(|a| matches!(a, Answer::Known(_))).count();
            prop_assert_eq!(kinds.len(), answers.len());
            prop_assert_eq!(locations.len(), known * LOCATION_BYTES);
            prop_assert_eq!(unpack_answers(answers.len(), &kinds, &locations).unwrap(), answers);
        }

        #[test]
        fn get_answers_round_trip(answers in proptest::collection::vec(get_answer(), 0..64)) {
            let (kinds, locations) = pack_get_answers(&answers);
            prop_assert_eq!(unpack_get_answers(answers.len(), &kinds, &locations).unwrap(), answers);
        }

        #[test]
        fn entries_round_trip(entries in proptest::collection::vec((any::<[u8; 32]>(), loc()), 0..64)) {
            let entries: Vec<_> = entries.into_iter().map(|(f, l)| (Fingerprint(f), l)).collect();
            let packed = pack_entries(&entries);
            prop_assert_eq!(packed.len(), entries.len() * ENTRY_BYTES);
            prop_assert_eq!(unpack_entries(&packed).unwrap(), entries);
            if !packed.is_empty() {
                prop_assert!(unpack_entries(&packed[1..]).is_err());
            }
        }

        #[test]
        fn fingerprints_round_trip(fps in proptest::collection::vec(any::<[u8; 32]>(), 0..64)) {
            let fps: Vec<_> = fps.into_iter().map(Fingerprint).collect();
            let packed = pack_fingerprints(&fps);
            prop_assert_eq!(&packed[..32.min(packed.len())], fps.first().map_or(&[][..], |f| &f.as_bytes()[..]));
            prop_assert_eq!(unpack_fingerprints("f", &packed).unwrap(), fps);
        }
    }
}
