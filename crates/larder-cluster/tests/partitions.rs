//! Partitions on shared storage: a takeover finds every entry of its partitions in the
//! writers' containers, reads only the containers its checkpoint does not cover, and
//! replays everything when the index was not closed cleanly.

mod support;

use std::collections::HashMap;

use larder_cluster::ids::first_container;
use larder_cluster::partitions::{Covered, Opened, PartitionStore};
use larder_cluster::{partition_of, ClusterError, PartitionId};
use larder_hash::{Fingerprint, HashAlgo};
use larder_index::disk::Lookup;
use larder_index::ChunkLocation;
use proptest::prelude::*;
use support::containers::write_container;
use support::small_index;

const PARTITIONS: u32 = 8;

fn store(root: &std::path::Path, lookup: Lookup) -> PartitionStore {
    PartitionStore::new(root, PARTITIONS, HashAlgo::Blake3, small_index(), lookup)
}

#[test]
fn a_takeover_replays_what_its_checkpoint_does_not_cover() {
    for lookup in [Lookup::Eager, Lookup::Lazy] {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let mut all: HashMap<Fingerprint, ChunkLocation> = HashMap::new();
        for (node, seq, ids) in [(1, 0, 0..300), (1, 1, 300..600), (2, 0, 600..900)] {
            all.extend(write_container(root, node, seq, ids));
        }
        let mine = [PartitionId(0), PartitionId(3), PartitionId(5)];
        let check = |opened: &mut Vec<Opened>, all: &HashMap<Fingerprint, ChunkLocation>| {
            for (fp, location) in all {
                let p = partition_of(fp, PARTITIONS);
                for (q, index, _) in opened.iter_mut() {
                    let expected = (*q == p).then_some(*location);
                    assert_eq!(index.get(fp).unwrap(), expected, "{lookup:?}");
                }
            }
        };
        let store = store(root, lookup);
        let (mut opened, replay) = store.take_over(&mine, 7).unwrap();
        assert_eq!(replay.rebuilt, 3, "new partitions replay everything");
        assert_eq!(replay.containers_read, 3);
        let expected_inserted = all
            .keys()
            .filter(|fp| mine.contains(&partition_of(fp, PARTITIONS)))
            .count() as u64;
        assert_eq!(replay.inserted, expected_inserted);
        check(&mut opened, &all);
        for (_, _, covered) in &opened {
            assert_eq!(covered.epoch, 7);
            assert_eq!(covered.containers[&1], first_container(1) + 1);
            assert_eq!(covered.containers[&2], first_container(2));
        }
        drop(opened);

        // More containers after the checkpoint: the next owner reads only those.
        all.extend(write_container(root, 2, 1, 900..1200));
        all.extend(write_container(root, 3, 0, 1200..1500));
        let (mut opened, replay) = store.take_over(&mine, 9).unwrap();
        assert_eq!(replay.rebuilt, 0);
        assert_eq!(replay.containers_read, 2);
        check(&mut opened, &all);
    }
}

#[test]
fn a_damaged_index_is_rebuilt_from_every_container() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let mut all: HashMap<Fingerprint, ChunkLocation> = HashMap::new();
    for seq in 0..4 {
        all.extend(write_container(root, 4, seq, seq * 500..(seq + 1) * 500));
    }
    let store = store(root, Lookup::Eager);
    let p = PartitionId(2);
    drop(store.take_over(&[p], 1).unwrap());
    let table = store.dir(p).join("table");
    let mut bytes = std::fs::read(&table).unwrap();
    bytes[100] ^= 0xff;
    std::fs::write(&table, bytes).unwrap();
    let (mut opened, replay) = store.take_over(&[p], 2).unwrap();
    assert_eq!(replay.rebuilt, 1);
    assert_eq!(replay.containers_read, 4);
    let index = &mut opened[0].1;
    for (fp, location) in &all {
        let expected = (partition_of(fp, PARTITIONS) == p).then_some(*location);
        assert_eq!(index.get(fp).unwrap(), expected);
    }
}

/// An old owner still writing a partition (its writer lock held) holds the new
/// owner's takeover back until it is done: two nodes never write one partition's
/// files at once.
#[test]
fn a_takeover_waits_for_the_partitions_writer_lock() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    write_container(&root, 1, 0, 0..300);
    let held = store(&root, Lookup::Eager)
        .lock_writer(PartitionId(3))
        .unwrap();
    let (done, finished) = std::sync::mpsc::channel();
    let taker = std::thread::spawn(move || {
        let store = store(&root, Lookup::Eager);
        let taken = store.take_over(&[PartitionId(5), PartitionId(3)], 2);
        done.send(()).unwrap();
        taken.map(|(opened, _)| opened.len())
    });
    assert!(
        finished
            .recv_timeout(std::time::Duration::from_millis(300))
            .is_err(),
        "the takeover wrote partition 3 while its writer lock was held"
    );
    drop(held);
    assert_eq!(taker.join().unwrap().unwrap(), 2);
}

/// `covered.json`'s bytes as cluster.md draws them, and back.
#[test]
fn covered_json_is_the_documented_record_and_decodes_back() {
    let mut covered = Covered {
        epoch: 9,
        ..Covered::default()
    };
    covered.cover(first_container(3));
    covered.cover(first_container(1) + 5);
    covered.cover(first_container(1) + 2);
    let bytes = covered.encode();
    assert_eq!(
        std::str::from_utf8(&bytes).unwrap(),
        format!(
            r#"{{"epoch":9,"containers":{{"1":{},"3":{}}}}}"#,
            first_container(1) + 5,
            first_container(3)
        )
    );
    assert_eq!(Covered::decode(&bytes).unwrap(), covered);
    for bad in [
        &b""[..],
        b"{}",
        b"{\"epoch\":1}",
        b"{\"epoch\":-1,\"containers\":{}}",
        b"{\"epoch\":1,\"containers\":{\"65536\":0}}",
        b"{\"epoch\":1,\"containers\":[]}",
    ] {
        assert!(
            matches!(Covered::decode(bad), Err(ClusterError::Corrupt { .. })),
            "{}",
            String::from_utf8_lossy(bad)
        );
    }
}

/// A record naming a container of another writer than its key is refused: trusted,
/// `{"2": u64::MAX}` would cover every container of node 2 and skip their replay.
#[test]
fn covered_json_naming_another_writers_container_is_corrupt() {
    let other = format!(
        r#"{{"epoch":1,"containers":{{"2":{}}}}}"#,
        first_container(3)
    );
    for bytes in [
        other.as_bytes(),
        br#"{"epoch":1,"containers":{"2":18446744073709551615}}"#,
        br#"{"epoch":1,"containers":{"2":5}}"#,
    ] {
        let err = Covered::decode(bytes).unwrap_err();
        assert!(err.to_string().contains("was written by node"), "{err}");
    }

    // At a takeover the error names the file.
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    write_container(root, 2, 0, 0..300);
    let store = store(root, Lookup::Eager);
    let p = PartitionId(1);
    drop(store.take_over(&[p], 1).unwrap());
    std::fs::write(store.dir(p).join("covered.json"), other).unwrap();
    let err = store.take_over(&[p], 2).map(|_| ()).unwrap_err();
    assert!(
        matches!(&err, ClusterError::Corrupt { what, .. } if what.ends_with("covered.json")),
        "{err}"
    );
}

/// The fuzz target `covered`'s committed seed is a record the encoder writes.
#[test]
fn the_covered_fuzz_seed_is_an_encoded_record() {
    let seed = std::fs::read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../fuzz/seeds/covered/seed-covered"
    ))
    .unwrap();
    let covered = Covered::decode(&seed).unwrap();
    assert_eq!(covered.containers.len(), 2);
    assert_eq!(covered.encode(), seed);
}

proptest! {
    /// The fuzz target `covered`'s twin: arbitrary bytes never panic, and what decodes
    /// encodes and decodes back to itself.
    #[test]
    fn covered_json_from_arbitrary_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..96)) {
        if let Ok(covered) = Covered::decode(&bytes) {
            prop_assert_eq!(Covered::decode(&covered.encode()).unwrap(), covered);
        }
    }

    #[test]
    fn covered_json_round_trips(epoch in any::<u64>(), containers in proptest::collection::vec(any::<u64>(), 0..16)) {
        let mut covered = Covered { epoch, ..Covered::default() };
        for c in containers {
            covered.cover(c);
        }
        prop_assert_eq!(Covered::decode(&covered.encode()).unwrap(), covered);
    }
}
