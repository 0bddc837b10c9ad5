//! The packed fields of the cluster's lookup protocol (docs/design/cluster.md,
//! "Lookups (gRPC, tonic)"; `larder_cluster::rpc::codec`) come from peers over the
//! network: every unpack function must refuse or accept any bytes without panicking.
//! The packing is canonical, so whatever one accepts must pack back to exactly the
//! bytes it came from.
//!
//! Input: the whole of it is tried as packed fingerprints and as packed
//! acknowledgement entries. For the answers of a lookup and of a get, byte 0 is the
//! length of the kinds field, which follows byte 1 (cut short at the input's end), and
//! the locations field is the rest; the answers expected are as many as the kinds
//! when byte 1 is even, else byte 1 / 2.
#![no_main]
use larder_cluster::rpc::codec::{
    pack_answers, pack_entries, pack_fingerprints, pack_get_answers, unpack_answers,
    unpack_entries, unpack_fingerprints, unpack_get_answers,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(fps) = unpack_fingerprints("fuzz", data) {
        assert_eq!(&pack_fingerprints(&fps)[..], data);
    }
    if let Ok(entries) = unpack_entries(data) {
        assert_eq!(&pack_entries(&entries)[..], data);
    }
    let [kinds_len, expected, rest @ ..] = data else {
        return;
    };
    let (kinds, locations) = rest.split_at(usize::from(*kinds_len).min(rest.len()));
    let expected = if expected % 2 == 0 {
        kinds.len()
    } else {
        usize::from(expected / 2)
    };
    if let Ok(answers) = unpack_answers(expected, kinds, locations) {
        assert_eq!(answers.len(), expected);
        let (k, l) = pack_answers(&answers);
        assert_eq!((&k[..], &l[..]), (kinds, locations));
    }
    if let Ok(answers) = unpack_get_answers(expected, kinds, locations) {
        assert_eq!(answers.len(), expected);
        let (k, l) = pack_get_answers(&answers);
        assert_eq!((&k[..], &l[..]), (kinds, locations));
    }
});
