//! The lookup protocol's packed fields from arbitrary peer bytes: the proptest twin of
//! the fuzz target `rpc_codec` (docs/design/fuzzing.md), with the same framing of its
//! input. Every unpack function refuses or accepts without panicking, and what one
//! accepts packs back to exactly the bytes it came from.

use larder_cluster::rpc::codec::{
    pack_answers, pack_entries, pack_fingerprints, pack_get_answers, unpack_answers,
    unpack_entries, unpack_fingerprints, unpack_get_answers, KIND_ABSENT, KIND_KNOWN, KIND_MOVED,
    KIND_NEW, LOCATION_BYTES,
};
use proptest::prelude::*;

/// Runs every unpack function on `data` as the fuzz target frames it; the number of
/// answer lists accepted (0 to 2).
fn unpack_all(data: &[u8]) -> usize {
    if let Ok(fps) = unpack_fingerprints("peer", data) {
        assert_eq!(&pack_fingerprints(&fps)[..], data);
    }
    if let Ok(entries) = unpack_entries(data) {
        assert_eq!(&pack_entries(&entries)[..], data);
    }
    let [kinds_len, expected, rest @ ..] = data else {
        return 0;
    };
    let (kinds, locations) = rest.split_at(usize::from(*kinds_len).min(rest.len()));
    let expected = if expected % 2 == 0 {
        kinds.len()
    } else {
        usize::from(expected / 2)
    };
    let mut accepted = 0;
    if let Ok(answers) = unpack_answers(expected, kinds, locations) {
        assert_eq!(answers.len(), expected);
        let (k, l) = pack_answers(&answers);
        assert_eq!((&k[..], &l[..]), (kinds, locations));
        accepted += 1;
    }
    if let Ok(answers) = unpack_get_answers(expected, kinds, locations) {
        assert_eq!(answers.len(), expected);
        let (k, l) = pack_get_answers(&answers);
        assert_eq!((&k[..], &l[..]), (kinds, locations));
        accepted += 1;
    }
    accepted
}

/// Kinds and as many locations as they name Known, framed as the target reads them.
fn framed_answers() -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(
        prop_oneof![
            Just(KIND_KNOWN),
            Just(KIND_NEW),
            Just(KIND_MOVED),
            Just(KIND_ABSENT),
            any::<u8>()
        ],
        0..40,
    )
    .prop_flat_map(|kinds| {
        let known = kinds.iter().filter(|&&k| k == KIND_KNOWN).count();
        let locations = proptest::collection::vec(any::<u8>(), known * LOCATION_BYTES);
        (Just(kinds), locations)
    })
    .prop_map(|(kinds, locations)| {
        let mut data = vec![kinds.len() as u8, 0];
        data.extend_from_slice(&kinds);
        data.extend_from_slice(&locations);
        data
    })
}

#[test]
fn the_fuzz_seeds_layout_is_accepted() {
    // Known, New, Moved, Known with their two locations: a lookup's answers, not a get's.
    let mut data = vec![4, 0, KIND_KNOWN, KIND_NEW, KIND_MOVED, KIND_KNOWN];
    data.extend_from_slice(&[7; 2 * LOCATION_BYTES]);
    assert_eq!(unpack_all(&data), 1);
    // Absent and Moved only: a get's answers.
    assert_eq!(unpack_all(&[2, 0, KIND_ABSENT, KIND_MOVED]), 1);
    // Moved only: both.
    assert_eq!(unpack_all(&[1, 0, KIND_MOVED]), 2);
}

proptest! {
    #[test]
    fn arbitrary_peer_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..200)) {
        unpack_all(&data);
    }

    #[test]
    fn well_framed_answers_never_panic_and_pack_back(data in framed_answers()) {
        unpack_all(&data);
    }
}
