use super::*;
use proptest::prelude::*;

fn entry(kind: EntryKind, path: &[u8]) -> TreeEntry {
    let mut e = TreeEntry::new(kind, path.to_vec());
    e.mode = 0o100644;
    e.mtime_sec = -5;
    e.mtime_nsec = 999_999_999;
    e.ctime_sec = 1_700_000_000;
    e.ctime_nsec = 1;
    e.uid = 1000;
    e.gid = 100;
    e.inode = 77;
    e.device = 0x803;
    e.nlink = 3;
    e.user = b"me".to_vec();
    e.group = b"users".to_vec();
    e.xattrs = vec![
        Xattr {
            name: b"system.posix_acl_access".to_vec(),
            value: vec![2, 0, 0, 0],
        },
        Xattr {
            name: b"user.\xffraw".to_vec(),
            value: Vec::new(),
        },
    ];
    match kind {
        EntryKind::File => {
            e.size = 12;
            e.chunks = vec![Fingerprint([9; 32]); 3];
            e.attr_flags = 0x20 | 0x40;
            e.changed_while_read = true;
        }
        EntryKind::Symlink => e.target = b"../x".to_vec(),
        EntryKind::CharDevice | EntryKind::BlockDevice => e.rdev = 0x0801,
        EntryKind::Dir => e.attr_flags = 0x10,
        EntryKind::Fifo => {}
    }
    e
}

fn decode(bytes: &[u8]) -> Result<Vec<TreeEntry>> {
    TreeDecoder::new(bytes)?.collect()
}

/// An entry in the version 1 layout, as earlier larders wrote it.
fn encode_v1(e: &TreeEntry, out: &mut Vec<u8>) {
    out.push(e.kind.code());
    put_bytes32(out, &e.path);
    out.extend_from_slice(&e.mode.to_le_bytes());
    out.extend_from_slice(&e.mtime_sec.to_le_bytes());
    out.extend_from_slice(&e.mtime_nsec.to_le_bytes());
    out.extend_from_slice(&e.uid.to_le_bytes());
    out.extend_from_slice(&e.gid.to_le_bytes());
    out.extend_from_slice(&e.size.to_le_bytes());
    e.encode_tail(&e.chunks, out);
}

/// An entry in the version 2 layout: version 3's without the marks byte and the
/// attribute flags, which come right before the kind's own fields.
fn encode_v2(e: &TreeEntry, out: &mut Vec<u8>) {
    let mut v3 = Vec::new();
    e.encode(&mut v3);
    let mut tail = Vec::new();
    e.encode_tail(&e.chunks, &mut tail);
    let fields = v3.len() - tail.len() - 5;
    out.extend_from_slice(&v3[..fields]);
    out.extend_from_slice(&tail);
}

#[test]
fn round_trips_every_kind_and_raw_names() {
    let entries = vec![
        entry(EntryKind::Dir, b"a"),
        entry(EntryKind::File, b"a/\xff\xfe-not-utf8"),
        entry(EntryKind::Symlink, b"a/link"),
        entry(EntryKind::Fifo, b"a/pipe"),
        entry(EntryKind::CharDevice, b"a/null"),
        entry(EntryKind::BlockDevice, b"a/sda"),
    ];
    let bytes = encode_tree(&entries);
    assert_eq!(&bytes[..8], b"LARDERT3");
    assert_eq!(decode(&bytes).unwrap(), entries);
}

/// Trees written before the marks and attribute flags existed read back with neither.
#[test]
fn version_2_streams_read_with_no_marks_or_flags() {
    let old = [
        entry(EntryKind::Dir, b"a"),
        entry(EntryKind::File, b"a/f"),
        entry(EntryKind::Symlink, b"a/l"),
        entry(EntryKind::BlockDevice, b"a/b"),
    ];
    let mut bytes = b"LARDERT2".to_vec();
    for e in &old {
        encode_v2(e, &mut bytes);
    }
    bytes.push(0);
    assert_eq!(TreeDecoder::new(&bytes).unwrap().version(), 2);
    let expected: Vec<TreeEntry> = old
        .iter()
        .map(|e| TreeEntry {
            attr_flags: 0,
            changed_while_read: false,
            ..e.clone()
        })
        .collect();
    assert_eq!(decode(&bytes).unwrap(), expected);
}

/// The marks byte and the flags sit right before the kind's fields, byte for byte as
/// format.md draws them.
#[test]
fn marks_and_flags_are_laid_out_as_documented() {
    let mut e = entry(EntryKind::File, b"f");
    e.xattrs.clear();
    e.user.clear();
    e.group.clear();
    e.chunks.clear();
    e.attr_flags = 0x10 | 0x8000_0000;
    let mut bytes = Vec::new();
    e.encode(&mut bytes);
    // kind, path, mode, mtime, ctime, uid, gid, size, inode, device, nlink, two empty
    // names, no attributes; then marks, flags and a zero chunk count.
    let fields = 1 + 4 + 1 + 4 + 12 + 12 + 4 + 4 + 8 + 8 + 8 + 4 + 1 + 1 + 4;
    assert_eq!(bytes.len(), fields + 1 + 4 + 8);
    assert_eq!(bytes[fields], 1, "the changed mark");
    // Bits outside the recorded set are left out.
    assert_eq!(&bytes[fields + 1..fields + 5], &0x10u32.to_le_bytes());
    assert_eq!(attr_flag_letters(0x10 | 0x20 | 0x8000_0000), "+ia");
    assert_eq!(attr_flag_letters(0), "");
}

#[test]
fn version_1_streams_read_with_the_new_fields_empty() {
    let old = [
        entry(EntryKind::Dir, b"a"),
        entry(EntryKind::File, b"a/f"),
        entry(EntryKind::Symlink, b"a/l"),
    ];
    let mut bytes = b"LARDERT1".to_vec();
    for e in &old {
        encode_v1(e, &mut bytes);
    }
    bytes.push(0);
    let back = decode(&bytes).unwrap();
    assert_eq!(TreeDecoder::new(&bytes).unwrap().version(), 1);
    for (b, o) in back.iter().zip(&old) {
        let mut expected = TreeEntry::new(o.kind, o.path.clone());
        expected.mode = o.mode;
        expected.mtime_sec = o.mtime_sec;
        expected.mtime_nsec = o.mtime_nsec;
        expected.uid = o.uid;
        expected.gid = o.gid;
        expected.size = o.size;
        expected.chunks = o.chunks.clone();
        expected.target = o.target.clone();
        assert_eq!(b, &expected);
    }
    // Version 1 knew three kinds only.
    let mut fifo = b"LARDERT1".to_vec();
    encode_v1(&entry(EntryKind::Fifo, b"p"), &mut fifo);
    fifo.push(0);
    assert!(decode(&fifo).is_err());
}

#[test]
fn hostile_paths_are_rejected() {
    for path in [
        &b"../etc/passwd"[..],
        b"/etc/passwd",
        b"a/../../b",
        b"a//b",
        b"./a",
        b"",
        b"a/\0b",
    ] {
        let bytes = encode_tree(&[entry(EntryKind::File, path)]);
        let first = TreeDecoder::new(&bytes).unwrap().next().unwrap();
        assert!(
            first.is_err(),
            "accepted {:?}",
            String::from_utf8_lossy(path)
        );
    }
}

#[test]
fn malformed_fields_are_refused() {
    let refused = |e: TreeEntry, what: &str| {
        assert!(decode(&encode_tree(&[e])).is_err(), "accepted {what}");
    };
    let mut e = entry(EntryKind::File, b"f");
    e.ctime_nsec = NANOS;
    refused(e, "ctime nanoseconds out of range");
    let mut e = entry(EntryKind::File, b"f");
    e.mtime_nsec = NANOS;
    refused(e, "mtime nanoseconds out of range");
    let mut e = entry(EntryKind::File, b"f");
    e.xattrs.reverse();
    refused(e, "attributes out of order");
    let mut e = entry(EntryKind::File, b"f");
    e.xattrs[1] = e.xattrs[0].clone();
    refused(e, "a repeated attribute");
    // An empty attribute name, which the encoder never writes: the count's first
    // byte is where the streams with and without one attribute first differ, and
    // the name's length follows the count.
    let mut e = entry(EntryKind::File, b"f");
    e.xattrs.truncate(1);
    let mut bytes = encode_tree(&[e.clone()]);
    e.xattrs.clear();
    let count_at = (0..)
        .find(|&i| bytes[i] != encode_tree(&[e.clone()])[i])
        .unwrap();
    bytes[count_at + 4] = 0;
    assert!(decode(&bytes).is_err(), "accepted an empty attribute name");
    let mut bytes = encode_tree(&[entry(EntryKind::Dir, b"d")]);
    bytes[8] = 7;
    assert!(decode(&bytes).is_err(), "accepted kind 7");
    // A directory's stream ends with its marks, its flags and the end marker.
    let good = encode_tree(&[entry(EntryKind::Dir, b"d")]);
    let marks_at = good.len() - 6;
    let mut bytes = good.clone();
    bytes[marks_at] = 2;
    assert!(decode(&bytes).is_err(), "accepted an unknown mark");
    let mut bytes = good;
    bytes[marks_at + 4] = 0x80;
    assert!(decode(&bytes).is_err(), "accepted unknown attribute flags");
}

#[test]
fn names_that_do_not_fit_are_left_out() {
    let mut e = entry(EntryKind::Dir, b"d");
    e.user = vec![b'u'; 256];
    e.xattrs.insert(
        0,
        Xattr {
            name: Vec::new(),
            value: b"v".to_vec(),
        },
    );
    e.xattrs.push(Xattr {
        name: vec![b'z'; 256],
        value: Vec::new(),
    });
    let back = decode(&encode_tree(&[e.clone()])).unwrap();
    assert!(back[0].user.is_empty());
    assert_eq!(back[0].group, b"users");
    assert_eq!(back[0].xattrs, e.xattrs[1..3]);
}

#[test]
fn truncation_is_an_error_not_a_short_tree() {
    let bytes = encode_tree(&[entry(EntryKind::File, b"f")]);
    for cut in 8..bytes.len() {
        let results: Vec<_> = TreeDecoder::new(&bytes[..cut]).unwrap().collect();
        assert!(
            results.iter().any(|r| r.is_err()),
            "cut at {cut} decoded cleanly"
        );
    }
}

fn arb_entry() -> impl Strategy<Value = TreeEntry> {
    let kinds = prop_oneof![
        Just(EntryKind::File),
        Just(EntryKind::Dir),
        Just(EntryKind::Symlink),
        Just(EntryKind::Fifo),
        Just(EntryKind::CharDevice),
        Just(EntryKind::BlockDevice),
    ];
    let names = proptest::collection::btree_map(
        proptest::collection::vec(1u8.., 1..12),
        proptest::collection::vec(any::<u8>(), 0..20),
        0..4,
    );
    (
        kinds,
        proptest::collection::vec(b'a'..=b'z', 1..10),
        any::<(u32, i64, i64, u32, u32, u64, u64, u64, u32)>(),
        (0..NANOS, 0..NANOS, any::<u64>()),
        names,
        proptest::collection::vec(any::<[u8; 32]>(), 0..4),
        (any::<u32>(), any::<bool>()),
    )
        .prop_map(
            |(kind, path, nums, (mn, cn, rdev), xattrs, fps, (flags, changed))| {
                let mut e = TreeEntry::new(kind, path);
                (
                    e.mode,
                    e.mtime_sec,
                    e.ctime_sec,
                    e.uid,
                    e.gid,
                    e.size,
                    e.inode,
                    e.device,
                    e.nlink,
                ) = nums;
                e.mtime_nsec = mn;
                e.ctime_nsec = cn;
                e.user = b"user".to_vec();
                e.attr_flags = flags & ATTR_FLAGS_KEPT;
                e.changed_while_read = changed;
                e.xattrs = xattrs
                    .into_iter()
                    .map(|(name, value)| Xattr { name, value })
                    .collect();
                match kind {
                    EntryKind::File => e.chunks = fps.into_iter().map(Fingerprint).collect(),
                    EntryKind::Symlink => e.target = b"t".to_vec(),
                    EntryKind::CharDevice | EntryKind::BlockDevice => e.rdev = rdev,
                    EntryKind::Dir | EntryKind::Fifo => {}
                }
                e
            },
        )
}

proptest! {
    #[test]
    fn arbitrary_entries_round_trip(entries in proptest::collection::vec(arb_entry(), 0..6)) {
        prop_assert_eq!(decode(&encode_tree(&entries)).unwrap(), entries);
    }

    /// The in-CI twin of the `tree` fuzz target, for every version.
    #[test]
    fn arbitrary_bytes_never_panic(
        tail in proptest::collection::vec(any::<u8>(), 0..256),
        version in 0..3usize,
    ) {
        let mut bytes = [MAGIC_V1, MAGIC_V2, MAGIC_V3][version].to_vec();
        bytes.extend(tail);
        for e in TreeDecoder::new(&bytes).unwrap().flatten() {
            prop_assert!(is_safe_relative_path(&e.path));
        }
    }
}
