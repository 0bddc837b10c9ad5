//! How a fingerprint is split between the partition number, the slot and the entry,
//! and how an entry packs the rest of it with the chunk's location. Every bit is drawn
//! in docs/design/index.md ("Layout").
//!
//! With `w0` the first 8 bytes of the fingerprint read as a little-endian `u64`:
//!
//! ```text
//! w0 bit  63 ........ 54 53 ....................... 12 11 ...... 0
//!         partition (10)  tag (42)                      entry (12)
//! bytes 8..32 of the fingerprint: entry (24 bytes)
//! ```
//!
//! The partition bits are implicit (the partition a fingerprint lives in), the tag is
//! in the slot, everything else is in the entry: together they are all 256 bits.

use std::collections::HashMap;

use larder_hash::Fingerprint;

use crate::ChunkLocation;

pub(crate) const PARTITION_BITS: u32 = 10;
/// Partitions of one index; each is a cuckoo table of its own.
pub(crate) const PARTITIONS: usize = 1 << PARTITION_BITS;
pub(crate) const TAG_BITS: u32 = 42;
const TAG_MASK: u64 = (1 << TAG_BITS) - 1;
/// Fingerprint bits below the tag in `w0`, kept in the entry.
const LOW_BITS: u32 = 64 - PARTITION_BITS - TAG_BITS;
const LOW_MASK: u64 = (1 << LOW_BITS) - 1;
/// Each table's bucket is chosen by one half of the tag.
pub(crate) const BUCKET_CHOICE_BITS: u32 = TAG_BITS / 2;
const BUCKET_CHOICE_MASK: u64 = (1 << BUCKET_CHOICE_BITS) - 1;

/// A slot is `tag << ENTRY_BITS | (entry number + 1)`; 0 is an empty slot.
pub(crate) const ENTRY_BITS: u32 = 64 - TAG_BITS;
const ENTRY_MASK: u64 = (1 << ENTRY_BITS) - 1;
/// Entries one partition can hold: entry numbers `0..MAX_ENTRIES` fit the slot field
/// after the `+ 1`. With [`PARTITIONS`] partitions that is 2^32 fingerprints in all.
pub(crate) const MAX_ENTRIES: usize = (1 << ENTRY_BITS) - 1;

/// Bytes of one entry: 24 fingerprint bytes, then 11 bytes of packed fields.
pub(crate) const ENTRY_LEN: usize = 35;
pub(crate) type Entry = [u8; ENTRY_LEN];
const REST_LEN: usize = 24;

// The packed fields, an 88-bit little-endian number in entry bytes 24..35.
const CONTAINER_SHIFT: u32 = LOW_BITS;
const CONTAINER_BITS: u32 = 27;
const OFFSET_SHIFT: u32 = CONTAINER_SHIFT + CONTAINER_BITS;
const OFFSET_BITS: u32 = 25;
const LENGTH_SHIFT: u32 = OFFSET_SHIFT + OFFSET_BITS;
const LENGTH_BITS: u32 = 24;
const _: () = assert!(LENGTH_SHIFT + LENGTH_BITS == 8 * (ENTRY_LEN - REST_LEN) as u32);
/// The container field's all-ones value: the location did not fit the fields and is
/// kept whole in the partition's overflow map.
const OVERFLOW_CONTAINER: u32 = (1 << CONTAINER_BITS) - 1;

/// A fingerprint cut along the layout above.
pub(crate) struct Key {
    pub partition: usize,
    pub tag: u64,
    low: u64,
    rest: [u8; REST_LEN],
}

impl Key {
    pub fn new(fp: &Fingerprint) -> Self {
        let w0 = fp.prefix_u64();
        let mut rest = [0; REST_LEN];
        rest.copy_from_slice(&fp.0[8..]);
        Self {
            partition: (w0 >> (64 - PARTITION_BITS)) as usize,
            tag: (w0 >> LOW_BITS) & TAG_MASK,
            low: w0 & LOW_MASK,
            rest,
        }
    }

    /// Whether `entry` holds the bits of this fingerprint that the slot does not.
    pub fn matches(&self, entry: &Entry) -> bool {
        let low = u64::from(u16::from_le_bytes([entry[REST_LEN], entry[REST_LEN + 1]]));
        entry[..REST_LEN] == self.rest && low & LOW_MASK == self.low
    }

    /// The entry for this fingerprint with the location fields `packed`.
    pub fn entry(&self, packed: PackedLocation) -> Entry {
        let mut e = [0; ENTRY_LEN];
        e[..REST_LEN].copy_from_slice(&self.rest);
        let fields = u128::from(self.low) | packed.0;
        e[REST_LEN..].copy_from_slice(&fields.to_le_bytes()[..ENTRY_LEN - REST_LEN]);
        e
    }
}

/// The bucket of `table` (0 or 1) for `tag` among `buckets` buckets: one half of the
/// tag, scaled to the bucket count (multiply and shift, so any count works).
pub(crate) fn bucket_of(table: usize, tag: u64, buckets: usize) -> usize {
    let choice = (tag >> (BUCKET_CHOICE_BITS * table as u32)) & BUCKET_CHOICE_MASK;
    ((choice * buckets as u64) >> BUCKET_CHOICE_BITS) as usize
}

pub(crate) fn slot_of(tag: u64, entry: usize) -> u64 {
    (tag << ENTRY_BITS) | (entry as u64 + 1)
}

pub(crate) fn tag_of(slot: u64) -> u64 {
    slot >> ENTRY_BITS
}

/// The entry number a non-empty slot names.
pub(crate) fn entry_of(slot: u64) -> usize {
    (slot & ENTRY_MASK) as usize - 1
}

/// Whether `slot` is occupied by a fingerprint with `tag`.
pub(crate) fn slot_has_tag(slot: u64, tag: u64) -> bool {
    slot != 0 && tag_of(slot) == tag
}

/// The fingerprint stored as partition `partition`, slot `slot` and `entry`.
pub(crate) fn fingerprint_of(partition: usize, slot: u64, entry: &Entry) -> Fingerprint {
    let fields = entry_fields(entry);
    let w0 = ((partition as u64) << (64 - PARTITION_BITS))
        | (tag_of(slot) << LOW_BITS)
        | (fields as u64 & LOW_MASK);
    let mut fp = [0; 32];
    fp[..8].copy_from_slice(&w0.to_le_bytes());
    fp[8..].copy_from_slice(&entry[..REST_LEN]);
    Fingerprint(fp)
}

fn entry_fields(entry: &Entry) -> u128 {
    let mut bytes = [0; 16];
    bytes[..ENTRY_LEN - REST_LEN].copy_from_slice(&entry[REST_LEN..]);
    u128::from_le_bytes(bytes)
}

/// A location's fields, already shifted to their place in the packed number (the
/// fingerprint's low bits are or-ed in by [`Key::entry`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PackedLocation(u128);

impl PackedLocation {
    const OVERFLOW: Self = Self((OVERFLOW_CONTAINER as u128) << CONTAINER_SHIFT);

    pub fn is_overflow(self) -> bool {
        self == Self::OVERFLOW
    }
}

/// What an entry's location fields say.
pub(crate) enum StoredLocation {
    /// The fields hold the location; the container is given by its table number.
    Fields {
        container_number: u32,
        offset: u32,
        length: u32,
    },
    /// The partition's overflow map holds the location.
    Overflow,
}

pub(crate) fn stored_location(entry: &Entry) -> StoredLocation {
    let fields = entry_fields(entry);
    let field = |shift: u32, bits: u32| ((fields >> shift) as u64 & ((1 << bits) - 1)) as u32;
    let container_number = field(CONTAINER_SHIFT, CONTAINER_BITS);
    if container_number == OVERFLOW_CONTAINER {
        return StoredLocation::Overflow;
    }
    StoredLocation::Fields {
        container_number,
        offset: field(OFFSET_SHIFT, OFFSET_BITS),
        // The field holds length - 1: lengths 1..=2^24 fit, 0 never does.
        length: field(LENGTH_SHIFT, LENGTH_BITS) + 1,
    }
}

/// The index's container ids: an entry names its container by number in this table
/// (ids are u64, numbers fit 27 bits), so that a location packs into 76 bits.
#[derive(Default)]
pub(crate) struct ContainerTable {
    ids: Vec<u64>,
    numbers: HashMap<u64, u32>,
    /// The last container packed: a backup packs chunks container after container.
    last: Option<(u64, u32)>,
}

impl ContainerTable {
    /// `loc`'s fields, numbering its container if it is new here; the overflow marker
    /// if some field does not fit.
    pub fn pack(&mut self, loc: ChunkLocation) -> PackedLocation {
        if loc.offset >= 1 << OFFSET_BITS || loc.length == 0 || loc.length > 1 << LENGTH_BITS {
            return PackedLocation::OVERFLOW;
        }
        let number = match self.last {
            Some((id, number)) if id == loc.container => number,
            _ => {
                let next = self.ids.len() as u32;
                let number = *self.numbers.entry(loc.container).or_insert(next);
                if number == next {
                    if next >= OVERFLOW_CONTAINER {
                        self.numbers.remove(&loc.container);
                        return PackedLocation::OVERFLOW;
                    }
                    self.ids.push(loc.container);
                }
                self.last = Some((loc.container, number));
                number
            }
        };
        PackedLocation(
            (u128::from(number) << CONTAINER_SHIFT)
                | (u128::from(loc.offset) << OFFSET_SHIFT)
                | (u128::from(loc.length - 1) << LENGTH_SHIFT),
        )
    }

    /// The id of container `number`. Numbers come from [`ContainerTable::pack`] of
    /// this table, so `number` is always in range.
    pub fn id(&self, number: u32) -> u64 {
        self.ids[number as usize]
    }

    pub fn len(&self) -> usize {
        self.ids.len()
    }

    pub fn heap_bytes(&self) -> usize {
        self.ids.capacity() * 8 + self.numbers.capacity() * 16
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_round_trip_the_fingerprint_and_the_fields() {
        let mut table = ContainerTable::default();
        for seed in 0..200u8 {
            let mut bytes = [0; 32];
            for (i, b) in bytes.iter_mut().enumerate() {
                *b = seed
                    .wrapping_mul(31)
                    .wrapping_add((i as u8).wrapping_mul(97))
                    ^ (i as u8);
            }
            let fp = Fingerprint(bytes);
            let key = Key::new(&fp);
            let loc = ChunkLocation {
                container: u64::from(seed) << 40,
                offset: (1 << 25) - 1 - u32::from(seed),
                length: (1 << 24) - u32::from(seed),
            };
            let entry = key.entry(table.pack(loc));
            assert!(key.matches(&entry));
            let slot = slot_of(key.tag, 7);
            assert_eq!(entry_of(slot), 7);
            assert_eq!(fingerprint_of(key.partition, slot, &entry), fp);
            match stored_location(&entry) {
                StoredLocation::Fields {
                    container_number,
                    offset,
                    length,
                } => {
                    assert_eq!(table.id(container_number), loc.container);
                    assert_eq!((offset, length), (loc.offset, loc.length));
                }
                StoredLocation::Overflow => panic!("{loc:?} should fit"),
            }
        }
    }

    #[test]
    fn out_of_range_fields_overflow() {
        let mut table = ContainerTable::default();
        for (offset, length) in [
            (1 << 25, 1),
            (0, 0),
            (0, (1 << 24) + 1),
            (u32::MAX, u32::MAX),
        ] {
            let packed = table.pack(ChunkLocation {
                container: 1,
                offset,
                length,
            });
            assert!(packed.is_overflow(), "{offset} {length}");
        }
        assert_eq!(
            table.len(),
            0,
            "an overflowing location numbered its container"
        );
    }

    #[test]
    fn each_table_chooses_buckets_from_its_own_half_of_the_tag() {
        let tag = (5u64 << BUCKET_CHOICE_BITS) | 9;
        let buckets = 1 << BUCKET_CHOICE_BITS;
        assert_eq!(bucket_of(0, tag, buckets), 9);
        assert_eq!(bucket_of(1, tag, buckets), 5);
        for buckets in [1, 16, 1000, 4096] {
            assert!(bucket_of(0, TAG_MASK, buckets) < buckets);
            assert!(bucket_of(1, TAG_MASK, buckets) < buckets);
        }
    }
}
