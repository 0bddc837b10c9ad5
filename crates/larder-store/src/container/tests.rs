use super::*;
use crate::compression::{Compression, MAX_COMPRESSED_RAW_LEN};

const CODEC: ChunkCodec = ChunkCodec::new(Compression::DEFAULT, HashAlgo::Blake3);

fn sample() -> (Vec<u8>, Vec<ChunkEntry>) {
    let algo = HashAlgo::Blake3;
    let mut b = ContainerBuilder::new(7, algo, 1 << 16);
    for i in 0..5u8 {
        let data = vec![i; 100 + usize::from(i)];
        b.push(algo.fingerprint(&data), &data);
    }
    b.seal()
}

/// Chunk `i` of the mixed sample: compressible text, except every third chunk,
/// which is noise.
fn mixed_chunk(i: u32) -> Vec<u8> {
    if i % 3 == 2 {
        crate::compression::noise(u64::from(i), 700)
    } else {
        format!("chunk {i}: ")
            .bytes()
            .chain(b"lorem ipsum dolor sit amet ".repeat(40))
            .collect()
    }
}

/// A container of compressed and raw chunks, as a backup with zstd writes it.
fn mixed_sample() -> (Vec<u8>, Vec<ChunkEntry>) {
    let algo = HashAlgo::Blake3;
    let mut b = ContainerBuilder::new(7, algo, 1 << 16);
    for i in 0..6 {
        let raw = mixed_chunk(i);
        let fp = algo.fingerprint(&raw);
        match CODEC.compress(&raw).unwrap() {
            Some(frame) => b.push_stored(fp, &frame, raw.len() as u32, true),
            None => b.push(fp, &raw),
        };
    }
    b.seal()
}

#[test]
fn compressed_and_raw_chunks_round_trip() {
    let (bytes, entries) = mixed_sample();
    let encodings: Vec<_> = (0..entries.len())
        .map(|i| stored_form(&entries, i).unwrap().0)
        .collect();
    assert!(encodings.contains(&ChunkEncoding::Zstd));
    assert!(encodings.contains(&ChunkEncoding::Raw));
    let c = ParsedContainer::parse(bytes, 7, HashAlgo::Blake3).unwrap();
    assert_eq!(c.entries, entries);
    for (i, e) in entries.iter().enumerate() {
        assert_eq!(c.position(e.offset, &e.fingerprint), Some(i));
        let mut out = Vec::new();
        c.read_chunk(e, &CODEC, &mut out).unwrap();
        assert_eq!(out, mixed_chunk(i as u32));
    }
    assert_eq!(
        c.position(entries[0].offset + 1, &entries[0].fingerprint),
        None
    );
    assert!(c.verify_chunks(&CODEC).is_empty());
}

#[test]
fn every_flipped_bit_of_compressed_chunks_is_detected() {
    let (bytes, entries) = mixed_sample();
    for (i, bit) in (0..bytes.len()).flat_map(|i| (0..8).map(move |b| (i, 1u8 << b))) {
        let mut damaged = bytes.clone();
        damaged[i] ^= bit;
        match ParsedContainer::parse(damaged, 7, HashAlgo::Blake3) {
            Err(_) => {}
            Ok(c) => {
                let bad = c.verify_chunks(&CODEC);
                assert_eq!(
                    bad.len(),
                    1,
                    "flip of bit {bit:#x} at byte {i} went unnoticed"
                );
                let e = bad[0];
                assert!((e.offset as usize..(e.offset + e.stored_len) as usize).contains(&i));
                let mut out = vec![1, 2];
                let read = c.read_chunk(&e, &CODEC, &mut out);
                assert!(read.is_err() || out.len() == 2 + e.raw_len as usize);
                assert!(entries.contains(&e));
            }
        }
    }
}

/// Seals a container whose only entry has the given flags and lengths; the table
/// checksum is right, so only the entry's own checks can refuse it.
fn with_entry(flags: u8, stored: &[u8], raw_len: u32) -> Vec<u8> {
    let mut b = ContainerBuilder::new(7, HashAlgo::Blake3, 1 << 10);
    b.push(Fingerprint([9; 32]), stored);
    b.entries[0].flags = flags;
    b.entries[0].raw_len = raw_len;
    b.seal().0
}

#[test]
fn unknown_flags_and_impossible_lengths_are_refused() {
    let err = ParsedContainer::parse(with_entry(3, b"abc", 3), 7, HashAlgo::Blake3)
        .unwrap_err()
        .to_string();
    assert!(err.contains("unknown chunk encoding (flags 3)"), "{err}");
    assert!(err.contains("newer larder"), "{err}");
    let err = ParsedContainer::parse(with_entry(2, b"abc", 3), 7, HashAlgo::Blake3)
        .unwrap_err()
        .to_string();
    assert!(err.contains("only a version 3 container"), "{err}");
    for (flags, raw_len) in [
        (0, 4),
        (1, 3),
        (1, 2),
        (1, MAX_COMPRESSED_RAW_LEN + 1),
        (1, u32::MAX),
    ] {
        let err = ParsedContainer::parse(with_entry(flags, b"abc", raw_len), 7, HashAlgo::Blake3)
            .unwrap_err()
            .to_string();
        assert!(err.contains("do not fit flags"), "{flags} {raw_len}: {err}");
    }
    // Plausible lengths, but not a zstd frame: parses, and reading fails cleanly.
    let c = ParsedContainer::parse(with_entry(1, b"abc", 1000), 7, HashAlgo::Blake3).unwrap();
    let mut out = Vec::new();
    let err = c
        .read_chunk(&c.entries[0], &CODEC, &mut out)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("corrupt container") && err.contains("not a zstd frame"),
        "{err}"
    );
    assert!(out.is_empty());
    assert_eq!(c.verify_chunks(&CODEC).len(), 1);
}

/// Parses a container the way a restore reads it: footer, then table, then header.
fn parse_in_pieces(bytes: &[u8]) -> Result<Vec<ChunkEntry>> {
    let len = bytes.len() as u64;
    let loc = TableLocation::parse(
        &bytes[bytes.len().saturating_sub(CONTAINER_TAIL_LEN)..],
        len,
        7,
    )?;
    parse_container_table(
        &bytes[..HEADER_LEN],
        &bytes[loc.table_offset as usize..],
        loc,
        7,
        HashAlgo::Blake3,
    )
}

#[test]
fn the_table_read_alone_equals_the_whole_parse_and_every_flip_outside_the_data_is_refused() {
    let (bytes, entries) = mixed_sample();
    assert_eq!(parse_in_pieces(&bytes).unwrap(), entries);
    let data_end = entries
        .last()
        .map_or(HEADER_LEN, |e| (e.offset + e.stored_len) as usize);
    for i in (0..HEADER_LEN).chain(data_end..bytes.len()) {
        for bit in 0..8 {
            let mut damaged = bytes.clone();
            damaged[i] ^= 1 << bit;
            assert!(
                parse_in_pieces(&damaged).is_err(),
                "flip of bit {bit} at {i}"
            );
            assert!(ParsedContainer::parse(damaged, 7, HashAlgo::Blake3).is_err());
        }
    }
    // Chunk data is the fingerprints' to cover: the table still parses.
    let mut damaged = bytes.clone();
    damaged[HEADER_LEN] ^= 1;
    assert_eq!(parse_in_pieces(&damaged).unwrap(), entries);
    assert!(parse_in_pieces(&bytes[..bytes.len() - 1]).is_err());
    assert!(parse_in_pieces(&bytes[..40]).is_err());
}

proptest::proptest! {
    /// The split parse (what restore does) and the whole-file parse (the fuzz
    /// target's) agree on any bytes.
    #[test]
    fn split_and_whole_parses_agree(mut bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..400), valid in proptest::prelude::any::<bool>(), at in proptest::prelude::any::<usize>(), x in proptest::prelude::any::<u8>()) {
        if valid {
            bytes = mixed_sample().0;
            let i = at % bytes.len();
            bytes[i] ^= x;
        }
        let whole = ParsedContainer::parse(bytes.clone(), 7, HashAlgo::Blake3).map(|c| c.entries);
        let split = parse_in_pieces(&bytes);
        proptest::prop_assert_eq!(whole.is_ok(), split.is_ok());
        if let (Ok(a), Ok(b)) = (whole, split) {
            proptest::prop_assert_eq!(a, b);
        }
    }
}

#[test]
fn round_trips() {
    let (bytes, entries) = sample();
    let c = ParsedContainer::parse(bytes, 7, HashAlgo::Blake3).unwrap();
    assert_eq!(c.entries, entries);
    assert_eq!(
        c.chunk(entries[2].offset, entries[2].stored_len).unwrap(),
        &[2u8; 102][..]
    );
    assert!(c.verify_chunks(&CODEC).is_empty());
}

#[test]
fn every_flipped_byte_is_detected() {
    let (bytes, _) = sample();
    for i in 0..bytes.len() {
        let mut damaged = bytes.clone();
        damaged[i] ^= 0x40;
        match ParsedContainer::parse(damaged, 7, HashAlgo::Blake3) {
            Err(_) => {}
            Ok(c) => assert_eq!(
                c.verify_chunks(&CODEC).len(),
                1,
                "flip at byte {i} went unnoticed"
            ),
        }
    }
}

proptest::proptest! {
    /// The in-CI twin of the `container` fuzz target: any bytes, no panic; what
    /// parses has its chunks inside the file and decodes to at most its raw length.
    #[test]
    fn arbitrary_bytes_never_panic(mut bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..400), tail in proptest::prelude::any::<bool>()) {
        if tail {
            bytes.extend_from_slice(END_MAGIC);
        }
        if let Ok(c) = ParsedContainer::parse(bytes, 7, HashAlgo::Blake3) {
            for e in &c.entries {
                proptest::prop_assert!(c.chunk(e.offset, e.stored_len).is_some());
                let mut out = Vec::new();
                if c.read_chunk(e, &CODEC, &mut out).is_ok() {
                    proptest::prop_assert_eq!(out.len(), e.raw_len as usize);
                }
            }
            let _ = c.verify_chunks(&CODEC);
        }
    }

    /// A valid container of compressed chunks with any bytes of it changed: no
    /// panic, and every chunk read is its raw length or an error.
    #[test]
    fn damaged_compressed_containers_never_panic(flips in proptest::collection::vec((proptest::prelude::any::<usize>(), proptest::prelude::any::<u8>()), 1..6)) {
        let (mut bytes, _) = mixed_sample();
        for (at, x) in flips {
            let i = at % bytes.len();
            bytes[i] ^= x;
        }
        if let Ok(c) = ParsedContainer::parse(bytes, 7, HashAlgo::Blake3) {
            for e in &c.entries {
                let mut out = Vec::new();
                if c.read_chunk(e, &CODEC, &mut out).is_ok() {
                    proptest::prop_assert_eq!(out.len(), e.raw_len as usize);
                }
            }
        }
    }
}

#[test]
fn wrong_id_or_algorithm_is_refused() {
    let (bytes, _) = sample();
    assert!(ParsedContainer::parse(bytes.clone(), 8, HashAlgo::Blake3).is_err());
    assert!(ParsedContainer::parse(bytes, 7, HashAlgo::Sha256).is_err());
}

const UNITS: ChunkCodec = ChunkCodec::new(
    Compression::Zstd {
        level: 3,
        unit_chunks: 4,
    },
    HashAlgo::Blake3,
);

/// A version 3 container: a unit of chunks 0 to 3, chunk 4 alone, a unit of 5 and 6,
/// and the noise chunk 8 raw.
fn unit_sample() -> (Vec<u8>, Vec<ChunkEntry>) {
    let algo = HashAlgo::Blake3;
    let mut b = ContainerBuilder::with_buffer(7, &UNITS, Vec::new(), 1 << 20);
    let raws: Vec<Vec<u8>> = (0..9).map(mixed_chunk).collect();
    let member = |i: usize| (algo.fingerprint(&raws[i]), raws[i].len() as u32);
    let refs = |r: std::ops::Range<usize>| raws[r].iter().map(Vec::as_slice).collect::<Vec<_>>();
    let frame = UNITS.compress_unit(&refs(0..4)).unwrap().unwrap();
    b.push_unit(&frame, &(0..4).map(member).collect::<Vec<_>>());
    let frame = UNITS.compress(&raws[4]).unwrap().unwrap();
    b.push_stored(member(4).0, &frame, member(4).1, true);
    let frame = UNITS.compress_unit(&refs(5..7)).unwrap().unwrap();
    b.push_unit(&frame, &[member(5), member(6)]);
    b.push(member(8).0, &raws[8]);
    b.seal()
}

fn unit_raw(i: usize) -> Vec<u8> {
    mixed_chunk([0, 1, 2, 3, 4, 5, 6, 8][i])
}

#[test]
fn units_round_trip_and_their_members_read_in_any_order() {
    let (bytes, entries) = unit_sample();
    assert_eq!(le_u32(&bytes[8..12]), 3);
    assert_eq!(entries.len(), 8);
    assert_eq!(unit_span(&entries, 2), 0..4);
    assert_eq!(parse_in_pieces(&bytes).unwrap(), entries);
    let c = ParsedContainer::parse(bytes, 7, HashAlgo::Blake3).unwrap();
    for i in [3, 0, 7, 5, 1, 6, 4, 2] {
        let e = &entries[i];
        assert_eq!(c.position(e.offset, &e.fingerprint), Some(i));
        let mut out = b"x".to_vec();
        c.read_chunk(e, &UNITS, &mut out).unwrap();
        assert_eq!(&out[1..], unit_raw(i), "entry {i}");
    }
    assert!(c.verify_chunks(&UNITS).is_empty());
}

#[test]
fn every_flipped_bit_of_a_unit_is_detected_in_its_members() {
    let (bytes, entries) = unit_sample();
    let unit = entries[0].offset as usize..(entries[0].offset + entries[0].stored_len) as usize;
    for i in unit.clone().step_by(3) {
        for bit in [0x01u8, 0x20] {
            let mut damaged = bytes.clone();
            damaged[i] ^= bit;
            let c = ParsedContainer::parse(damaged, 7, HashAlgo::Blake3).unwrap();
            let bad = c.verify_chunks(&UNITS);
            assert!(!bad.is_empty(), "flip of {bit:#x} at {i} went unnoticed");
            assert!(bad.iter().all(|e| e.offset == entries[0].offset), "{bad:?}");
        }
    }
}

#[test]
fn a_unit_whose_members_lie_is_refused() {
    let (bytes, _) = unit_sample();
    let loc = TableLocation::parse(
        &bytes[bytes.len() - CONTAINER_TAIL_LEN..],
        bytes.len() as u64,
        7,
    )
    .unwrap();
    // Rewrites entry `i` of the table and the checksum: only the unit checks can
    // refuse it.
    let rewrite = |i: usize, edit: &dyn Fn(&mut ChunkEntry)| {
        let mut b = bytes.clone();
        let at = loc.table_offset as usize + i * ENTRY_LEN;
        let mut e = ChunkEntry::decode(&b[at..at + ENTRY_LEN]);
        edit(&mut e);
        let mut raw = Vec::new();
        e.encode(&mut raw);
        b[at..at + ENTRY_LEN].copy_from_slice(&raw);
        let sum_at = b.len() - 40;
        let mut h = blake3::Hasher::new();
        h.update(&b[..HEADER_LEN]);
        h.update(&b[loc.table_offset as usize..sum_at]);
        let sum = *h.finalize().as_bytes();
        b[sum_at..sum_at + 32].copy_from_slice(&sum);
        ParsedContainer::parse(b, 7, HashAlgo::Blake3)
    };
    assert!(rewrite(1, &|_| {}).is_ok());
    assert!(rewrite(1, &|e| e.unit_offset += 1).is_err());
    assert!(rewrite(1, &|e| e.raw_len += 1).is_err());
    assert!(rewrite(1, &|e| e.flags = 1).is_err());
    assert!(rewrite(4, &|e| e.unit_offset = 1).is_err());
    assert!(rewrite(5, &|e| e.stored_len -= 1).is_err());
    // A last member claiming one more raw byte than the frame holds parses (the table
    // is consistent) but does not decode.
    let c = rewrite(3, &|e| e.raw_len += 1).unwrap();
    let mut out = Vec::new();
    let err = c
        .read_chunk(&c.entries[3], &UNITS, &mut out)
        .unwrap_err()
        .to_string();
    assert!(err.contains("unit does not decode"), "{err}");
    assert!(out.is_empty());
}
