//! What a repository stores, for tests that compare repositories by their data. A
//! snapshot's tree records its sources' ancestors, whose times change whenever anything
//! (another test, another program) creates or removes an entry beside them, so two
//! backups of the same unchanged sources may store different tree chunks; their data
//! chunks are the same. (The CLI's test kit includes this file too.)

use std::collections::BTreeSet;

use larder_store::Repository;

/// One stored data chunk: its fingerprint (hex), raw length and how it is stored
/// (the container table's flags).
pub type DataChunk = (String, u32, u8);

/// The data chunks of `repo`, container by container in id order, each in its
/// container's order: every stored chunk that no snapshot's tree holds. Two
/// repositories that chunked, deduplicated and packed the same data the same way give
/// the same lists.
pub fn data_chunks(repo: &Repository) -> Vec<Vec<DataChunk>> {
    let (snapshots, bad) = repo.snapshots().expect("list snapshots");
    assert!(bad.is_empty(), "unreadable snapshots: {bad:?}");
    let trees: BTreeSet<String> = snapshots
        .iter()
        .flat_map(|(_, s)| s.tree.fingerprints().expect("tree fingerprints"))
        .map(|fp| fp.to_hex())
        .collect();
    repo.indexed_containers()
        .iter()
        .map(|&id| {
            let container = repo.load_container(id).expect("load a container");
            container
                .entries
                .iter()
                .map(|e| (e.fingerprint.to_hex(), e.raw_len, e.flags))
                .filter(|(fp, _, _)| !trees.contains(fp))
                .collect::<Vec<_>>()
        })
        .filter(|chunks| !chunks.is_empty())
        .collect()
}
