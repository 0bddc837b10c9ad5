//! Encoding and decoding of every page of the disk index's files, byte by byte as
//! docs/design/disk-index.md draws them. Decoders take untrusted bytes: they check
//! every field and return a reason, never panic (fuzz/fuzz_targets/disk_index.rs).

use larder_hash::Fingerprint;

use super::io::PAGE;
use crate::ChunkLocation;

pub const TABLE_MAGIC: &[u8; 8] = b"LDXTABLE";
pub const META_MAGIC: &[u8; 8] = b"LDXMETA1";
pub const BLOOM_MAGIC: &[u8; 8] = b"LDXBLOOM";
pub const VERSION: u32 = 1;
/// The table's version: 2 lists spilled runs in its header; version 1 (no runs) is
/// still read.
pub const TABLE_VERSION: u32 = 2;
/// The Bloom filter's version: 2 takes its first hash from fingerprint bytes 24 .. 32
/// (version 1 took bytes 8 .. 16, which also pick a cluster's partition). A filter of
/// another version is rebuilt from `meta`, like a damaged one.
pub const BLOOM_VERSION: u32 = 2;
/// Spilled runs that may wait before they are merged into the table.
pub const MAX_RUNS: usize = 16;
/// Where the table header's list of runs starts, and its end (the checksum covers
/// bytes `0 .. 48` and `RUNS_AT .. RUNS_END`).
const RUNS_AT: usize = 56;
const RUNS_END: usize = RUNS_AT + 8 * MAX_RUNS;

/// Bytes of a hash-table entry: fingerprint, metadata position, location.
pub const ENTRY_LEN: usize = 56;
/// Entries in one bucket page.
pub const BUCKET_SLOTS: usize = 72;
const BUCKET_ENTRIES_AT: usize = 16;
/// Bytes of a metadata record: fingerprint and location.
pub const RECORD_LEN: usize = 48;
/// Records in one metadata page.
pub const RECORDS_PER_PAGE: usize = 85;
const RECORD_COUNT_AT: usize = RECORDS_PER_PAGE * RECORD_LEN;
/// Where a page's checksum sits (bucket and record pages).
const PAGE_CHECKSUM_AT: usize = PAGE - 8;
/// Bloom filter bits per page.
pub const BLOOM_BITS_PER_PAGE: u64 = PAGE as u64 * 8;

/// A decoding failure: what is wrong, for [`crate::IndexError::Corrupt`].
pub type Reason = String;

/// The first 8 bytes of the BLAKE3 hash of `bytes`.
pub fn checksum(bytes: &[u8]) -> u64 {
    let hash = blake3::hash(bytes);
    u64_at(hash.as_bytes(), 0)
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

fn fingerprint_at(b: &[u8], at: usize) -> Fingerprint {
    let mut a = [0u8; 32];
    a.copy_from_slice(&b[at..at + 32]);
    Fingerprint(a)
}

fn put(b: &mut [u8], at: usize, bytes: &[u8]) {
    b[at..at + bytes.len()].copy_from_slice(bytes);
}

/// Checks a stored checksum; fuzzing builds go on past a wrong one so that the fuzzer
/// reaches the fields behind it (docs/design/fuzzing.md).
fn check_sum(stored: u64, covered: &[u8], what: &str) -> Result<(), Reason> {
    if stored != checksum(covered) && !cfg!(fuzzing) {
        return Err(format!("{what} checksum mismatch"));
    }
    Ok(())
}

fn check_len(page: &[u8], what: &str) -> Result<(), Reason> {
    if page.len() != PAGE {
        return Err(format!("{what} is {} bytes, not {PAGE}", page.len()));
    }
    Ok(())
}

fn all_zero(b: &[u8]) -> bool {
    b.iter().all(|&x| x == 0)
}

/// The bucket of a fingerprint in a table of `buckets` buckets: the high bits of
/// `w0 * buckets`, so that consecutive buckets hold consecutive ranges of `w0`.
pub fn bucket_of(fp: &Fingerprint, buckets: u64) -> u64 {
    ((fp.prefix_u64() as u128 * buckets as u128) >> 64) as u64
}

/// The table file's header page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TableHeader {
    pub buckets: u64,
    /// Pages after the header: the primary pages and the overflow pages.
    pub pages: u64,
    pub entries: u64,
    pub dirty: bool,
    /// Pages of each run waiting in the `runs` file, in order (page 0 on).
    pub runs: RunList,
}

/// The page counts of the spilled runs a table header lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RunList {
    count: usize,
    pages: [u64; MAX_RUNS],
}

impl RunList {
    /// Runs of `pages` pages each, at most [`MAX_RUNS`].
    pub fn new(pages: &[u64]) -> Self {
        assert!(pages.len() <= MAX_RUNS, "at most {MAX_RUNS} runs");
        let mut list = Self {
            count: pages.len(),
            pages: [0; MAX_RUNS],
        };
        list.pages[..pages.len()].copy_from_slice(pages);
        list
    }

    pub fn pages(&self) -> &[u64] {
        &self.pages[..self.count]
    }
}

/// The most buckets a table may have (docs/design/disk-index.md, "Limits").
pub const MAX_BUCKETS: u64 = 1 << 40;

impl TableHeader {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; PAGE];
        put(&mut b, 0, TABLE_MAGIC);
        put(&mut b, 8, &TABLE_VERSION.to_le_bytes());
        put(&mut b, 12, &(PAGE as u32).to_le_bytes());
        put(&mut b, 16, &self.buckets.to_le_bytes());
        put(&mut b, 24, &self.pages.to_le_bytes());
        put(&mut b, 32, &self.entries.to_le_bytes());
        put(&mut b, 40, &u32::from(self.dirty).to_le_bytes());
        put(&mut b, 44, &(self.runs.count as u32).to_le_bytes());
        for (i, pages) in self.runs.pages().iter().enumerate() {
            put(&mut b, RUNS_AT + 8 * i, &pages.to_le_bytes());
        }
        let sum = Self::checksum(&b);
        put(&mut b, 48, &sum.to_le_bytes());
        b
    }

    /// The checksum of a version 2 header: bytes `0 .. 48` and the run list.
    fn checksum(b: &[u8]) -> u64 {
        let mut covered = b[..48].to_vec();
        covered.extend_from_slice(&b[RUNS_AT..RUNS_END]);
        checksum(&covered)
    }

    pub fn decode(b: &[u8]) -> Result<Self, Reason> {
        check_len(b, "table header")?;
        if &b[0..8] != TABLE_MAGIC {
            return Err("not a disk index table (bad magic)".into());
        }
        let version = u32_at(b, 8);
        match version {
            1 => check_sum(u64_at(b, 48), &b[..48], "table header")?,
            TABLE_VERSION => {
                let stored = u64_at(b, 48);
                if stored != Self::checksum(b) && !cfg!(fuzzing) {
                    return Err("table header checksum mismatch".into());
                }
            }
            _ => {
                return Err(format!(
                    "table version {version}, this larder reads 1 and {TABLE_VERSION}"
                ))
            }
        }
        if u32_at(b, 12) as usize != PAGE {
            return Err(format!("page size {}, not {PAGE}", u32_at(b, 12)));
        }
        let header = Self {
            buckets: u64_at(b, 16),
            pages: u64_at(b, 24),
            entries: u64_at(b, 32),
            dirty: match u32_at(b, 40) {
                0 => false,
                1 => true,
                s => return Err(format!("unknown table state {s}")),
            },
            runs: RunList::default(),
        };
        let count = u32_at(b, 44) as usize;
        if count > MAX_RUNS || (version == 1 && count != 0) {
            return Err(format!("{count} runs listed (at most {MAX_RUNS})"));
        }
        let mut runs = [0; MAX_RUNS];
        for (i, pages) in runs.iter_mut().enumerate() {
            *pages = u64_at(b, RUNS_AT + 8 * i);
            if (i < count) != (*pages > 0) || *pages > MAX_BUCKETS {
                return Err(format!("run {i} of {count} has {pages} pages"));
            }
        }
        let header = Self {
            runs: RunList::new(&runs[..count]),
            ..header
        };
        if header.buckets == 0 || header.buckets > MAX_BUCKETS {
            return Err(format!("{} buckets", header.buckets));
        }
        if header.pages < header.buckets || header.pages > MAX_BUCKETS * 64 {
            return Err(format!(
                "{} pages for {} buckets",
                header.pages, header.buckets
            ));
        }
        let run_pages: u64 = header.runs.pages().iter().sum();
        let capacity = (header.pages + run_pages).saturating_mul(BUCKET_SLOTS as u64);
        if header.entries > capacity {
            return Err(format!(
                "{} entries in {} pages",
                header.entries, header.pages
            ));
        }
        if !all_zero(&b[RUNS_END..]) {
            return Err("nonzero reserved bytes in the table header".into());
        }
        Ok(header)
    }
}

/// One hash-table entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BucketEntry {
    pub fp: Fingerprint,
    /// The record's number in the metadata array.
    pub position: u64,
    pub location: ChunkLocation,
}

/// One page of a bucket's chain.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct BucketPage {
    pub entries: Vec<BucketEntry>,
    /// The next page of the chain; 0 for none.
    pub next: u64,
}

impl BucketPage {
    pub fn encode_into(&self, b: &mut [u8]) {
        debug_assert!(self.entries.len() <= BUCKET_SLOTS);
        b[..PAGE].fill(0);
        put(b, 0, &(self.entries.len() as u16).to_le_bytes());
        put(b, 8, &self.next.to_le_bytes());
        for (i, e) in self.entries.iter().enumerate() {
            let at = BUCKET_ENTRIES_AT + i * ENTRY_LEN;
            put(b, at, e.fp.as_bytes());
            put(b, at + 32, &e.position.to_le_bytes());
            put(b, at + 40, &e.location.container.to_le_bytes());
            put(b, at + 48, &e.location.offset.to_le_bytes());
            put(b, at + 52, &e.location.length.to_le_bytes());
        }
        let sum = checksum(&b[..PAGE_CHECKSUM_AT]);
        put(b, PAGE_CHECKSUM_AT, &sum.to_le_bytes());
    }

    /// Decodes page number `page` of bucket `bucket`'s chain, in a table of `header`'s
    /// shape (whose entry count bounds the metadata positions).
    pub fn decode(b: &[u8], page: u64, bucket: u64, header: &TableHeader) -> Result<Self, Reason> {
        let (count, next) = check_entry_page(b, "bucket page")?;
        if next != 0 && (next <= header.buckets.max(page) || next > header.pages) {
            return Err(format!(
                "page {page} chains to page {next} (overflow pages are {}..={})",
                header.buckets + 1,
                header.pages
            ));
        }
        let entries = decode_entries(b, count, header.entries, |fp| {
            if bucket_of(fp, header.buckets) != bucket {
                return Err(format!("an entry of page {page} is not in bucket {bucket}"));
            }
            Ok(())
        })?;
        Ok(Self { entries, next })
    }

    /// Decodes a page of a spilled run (docs/design/disk-index.md, "`runs`"): a
    /// bucket page without a next page whose entries are sorted by bucket, in a table
    /// of `buckets` buckets whose metadata array holds `records`.
    pub fn decode_run(b: &[u8], buckets: u64, records: u64) -> Result<Self, Reason> {
        let (count, next) = check_entry_page(b, "run page")?;
        if next != 0 {
            return Err(format!("a run page names a next page ({next})"));
        }
        let mut last = 0;
        let entries = decode_entries(b, count, records, |fp| {
            let bucket = bucket_of(fp, buckets);
            if bucket < last {
                return Err("the entries of a run page are not sorted by bucket".into());
            }
            last = bucket;
            Ok(())
        })?;
        Ok(Self { entries, next })
    }
}

/// The checksum, count and padding of a page of entries (bucket or run page); its
/// entry count and next page.
fn check_entry_page(b: &[u8], what: &str) -> Result<(usize, u64), Reason> {
    check_len(b, what)?;
    check_sum(u64_at(b, PAGE_CHECKSUM_AT), &b[..PAGE_CHECKSUM_AT], what)?;
    let count = u16_at(b, 0) as usize;
    if count > BUCKET_SLOTS {
        return Err(format!("{count} entries in a {what} of {BUCKET_SLOTS}"));
    }
    let used_end = BUCKET_ENTRIES_AT + count * ENTRY_LEN;
    if !all_zero(&b[2..8]) || !all_zero(&b[used_end..PAGE_CHECKSUM_AT]) {
        return Err(format!("nonzero bytes outside the entries of a {what}"));
    }
    Ok((count, u64_at(b, 8)))
}

/// The `count` entries of a checked page; `check` vets each fingerprint, and every
/// metadata position must lie below `records`.
fn decode_entries(
    b: &[u8],
    count: usize,
    records: u64,
    mut check: impl FnMut(&Fingerprint) -> Result<(), Reason>,
) -> Result<Vec<BucketEntry>, Reason> {
    let mut entries = Vec::with_capacity(count);
    for i in 0..count {
        let at = BUCKET_ENTRIES_AT + i * ENTRY_LEN;
        let fp = fingerprint_at(b, at);
        check(&fp)?;
        let position = u64_at(b, at + 32);
        if position >= records {
            return Err(format!("an entry names record {position} of {records}"));
        }
        entries.push(BucketEntry {
            fp,
            position,
            location: ChunkLocation {
                container: u64_at(b, at + 40),
                offset: u32_at(b, at + 48),
                length: u32_at(b, at + 52),
            },
        });
    }
    Ok(entries)
}

/// The metadata file's header page.
pub fn encode_meta_header() -> Vec<u8> {
    let mut b = vec![0u8; PAGE];
    put(&mut b, 0, META_MAGIC);
    put(&mut b, 8, &VERSION.to_le_bytes());
    put(&mut b, 12, &(RECORD_LEN as u32).to_le_bytes());
    let sum = checksum(&b[..16]);
    put(&mut b, 16, &sum.to_le_bytes());
    b
}

pub fn decode_meta_header(b: &[u8]) -> Result<(), Reason> {
    check_len(b, "metadata header")?;
    if &b[0..8] != META_MAGIC {
        return Err("not a disk index metadata array (bad magic)".into());
    }
    check_sum(u64_at(b, 16), &b[..16], "metadata header")?;
    if u32_at(b, 8) != VERSION || u32_at(b, 12) as usize != RECORD_LEN {
        return Err(format!(
            "metadata version {} with {}-byte records",
            u32_at(b, 8),
            u32_at(b, 12)
        ));
    }
    if !all_zero(&b[24..]) {
        return Err("nonzero reserved bytes in the metadata header".into());
    }
    Ok(())
}

/// One metadata record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record {
    pub fp: Fingerprint,
    pub location: ChunkLocation,
}

pub fn encode_record_page(records: &[Record], b: &mut [u8]) {
    debug_assert!(!records.is_empty() && records.len() <= RECORDS_PER_PAGE);
    b[..PAGE].fill(0);
    for (i, r) in records.iter().enumerate() {
        let at = i * RECORD_LEN;
        put(b, at, r.fp.as_bytes());
        put(b, at + 32, &r.location.container.to_le_bytes());
        put(b, at + 40, &r.location.offset.to_le_bytes());
        put(b, at + 44, &r.location.length.to_le_bytes());
    }
    put(b, RECORD_COUNT_AT, &(records.len() as u16).to_le_bytes());
    let sum = checksum(&b[..PAGE_CHECKSUM_AT]);
    put(b, PAGE_CHECKSUM_AT, &sum.to_le_bytes());
}

/// Decodes a record page, appending its records to `out`; returns how many.
pub fn decode_record_page(b: &[u8], out: &mut Vec<Record>) -> Result<usize, Reason> {
    check_len(b, "metadata page")?;
    check_sum(
        u64_at(b, PAGE_CHECKSUM_AT),
        &b[..PAGE_CHECKSUM_AT],
        "metadata page",
    )?;
    let count = u16_at(b, RECORD_COUNT_AT) as usize;
    if count == 0 || count > RECORDS_PER_PAGE {
        return Err(format!("{count} records in a metadata page"));
    }
    if !all_zero(&b[count * RECORD_LEN..RECORD_COUNT_AT])
        || !all_zero(&b[RECORD_COUNT_AT + 2..PAGE_CHECKSUM_AT])
    {
        return Err("nonzero bytes outside the records of a metadata page".into());
    }
    for i in 0..count {
        let at = i * RECORD_LEN;
        out.push(Record {
            fp: fingerprint_at(b, at),
            location: ChunkLocation {
                container: u64_at(b, at + 32),
                offset: u32_at(b, at + 40),
                length: u32_at(b, at + 44),
            },
        });
    }
    Ok(count)
}

/// The Bloom file's header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BloomHeader {
    pub hashes: u32,
    pub bits: u64,
    pub added: u64,
    /// Records of the metadata array the filter holds.
    pub covers: u64,
}

/// Bloom filters above this many bits (64 GiB) are refused when decoding.
pub const MAX_BLOOM_BITS: u64 = 1 << 39;

impl BloomHeader {
    /// The header page; its checksum covers `words`, the filter's bits.
    pub fn encode(&self, words: &[u64]) -> Vec<u8> {
        let mut b = vec![0u8; PAGE];
        put(&mut b, 0, BLOOM_MAGIC);
        put(&mut b, 8, &BLOOM_VERSION.to_le_bytes());
        put(&mut b, 12, &self.hashes.to_le_bytes());
        put(&mut b, 16, &self.bits.to_le_bytes());
        put(&mut b, 24, &self.added.to_le_bytes());
        put(&mut b, 32, &self.covers.to_le_bytes());
        let sum = bloom_checksum(&b[..40], words);
        put(&mut b, 40, &sum.to_le_bytes());
        b
    }

    /// Decodes the header alone (the bits are checked by [`BloomHeader::check_bits`]).
    pub fn decode(b: &[u8]) -> Result<Self, Reason> {
        check_len(b, "bloom header")?;
        if &b[0..8] != BLOOM_MAGIC {
            return Err("not a disk index Bloom filter (bad magic)".into());
        }
        if u32_at(b, 8) != BLOOM_VERSION {
            return Err(format!("bloom version {}", u32_at(b, 8)));
        }
        let header = Self {
            hashes: u32_at(b, 12),
            bits: u64_at(b, 16),
            added: u64_at(b, 24),
            covers: u64_at(b, 32),
        };
        if !(1..=16).contains(&header.hashes) {
            return Err(format!("{} hashes", header.hashes));
        }
        if header.bits == 0
            || !header.bits.is_multiple_of(BLOOM_BITS_PER_PAGE)
            || header.bits > MAX_BLOOM_BITS
        {
            return Err(format!("{} bits", header.bits));
        }
        if !all_zero(&b[48..]) {
            return Err("nonzero reserved bytes in the bloom header".into());
        }
        Ok(header)
    }

    /// Checks the header page's checksum against the filter's bits.
    pub fn check_bits(&self, header_page: &[u8], words: &[u64]) -> Result<(), Reason> {
        check_len(header_page, "bloom header")?;
        if words.len() as u64 * 64 != self.bits {
            return Err(format!(
                "{} bits stored, {} declared",
                words.len() * 64,
                self.bits
            ));
        }
        let sum = bloom_checksum(&header_page[..40], words);
        if sum != u64_at(header_page, 40) && !cfg!(fuzzing) {
            return Err("bloom filter checksum mismatch".into());
        }
        Ok(())
    }
}

fn bloom_checksum(header: &[u8], words: &[u64]) -> u64 {
    let mut h = blake3::Hasher::new();
    h.update(header);
    for chunk in words.chunks(512) {
        let mut bytes = Vec::with_capacity(chunk.len() * 8);
        for w in chunk {
            bytes.extend_from_slice(&w.to_le_bytes());
        }
        h.update(&bytes);
    }
    u64_at(h.finalize().as_bytes(), 0)
}

/// The bits of a Bloom file's pages after the header.
pub fn decode_bloom_words(b: &[u8]) -> Vec<u64> {
    b.chunks_exact(8).map(|c| u64_at(c, 0)).collect()
}

pub fn encode_bloom_words(words: &[u64], out: &mut [u8]) {
    for (i, w) in words.iter().enumerate() {
        put(out, i * 8, &w.to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn fp(i: u64) -> Fingerprint {
        larder_hash::HashAlgo::Blake3.fingerprint(&i.to_le_bytes())
    }

    fn loc(i: u64) -> ChunkLocation {
        ChunkLocation {
            container: i * 3 + 1,
            offset: i as u32 * 7,
            length: 4096 + i as u32,
        }
    }

    #[test]
    fn table_header_round_trips_and_refuses_damage() {
        let h = TableHeader {
            buckets: 9,
            pages: 12,
            entries: 100,
            dirty: true,
            runs: RunList::new(&[3, 1]),
        };
        let b = h.encode();
        assert_eq!(TableHeader::decode(&b).unwrap(), h);
        for at in [0, 9, 17, 41, 45, 50, 57, 65, 100, 200] {
            let mut bad = b.clone();
            bad[at] ^= 1;
            assert!(TableHeader::decode(&bad).is_err(), "flip at {at} accepted");
        }
    }

    /// A version 1 header (before runs: its checksum covers bytes 0 .. 48) is still
    /// read, and lists no runs.
    #[test]
    fn version_1_table_headers_are_read() {
        let h = TableHeader {
            buckets: 9,
            pages: 12,
            entries: 100,
            dirty: false,
            runs: RunList::default(),
        };
        let mut b = h.encode();
        put(&mut b, 8, &1u32.to_le_bytes());
        let sum = checksum(&b[..48]);
        put(&mut b, 48, &sum.to_le_bytes());
        assert_eq!(TableHeader::decode(&b).unwrap(), h);
        put(&mut b, 44, &1u32.to_le_bytes());
        assert!(
            TableHeader::decode(&b).is_err(),
            "a version 1 header lists no runs"
        );
    }

    #[test]
    fn bucket_pages_round_trip_and_check_membership() {
        let header = TableHeader {
            buckets: 4,
            pages: 10,
            entries: 1000,
            dirty: false,
            runs: RunList::default(),
        };
        let bucket = 2;
        let entries: Vec<BucketEntry> = (0..)
            .map(|i| (i, fp(i)))
            .filter(|(_, f)| bucket_of(f, 4) == bucket)
            .take(BUCKET_SLOTS)
            .map(|(i, f)| BucketEntry {
                fp: f,
                position: i,
                location: loc(i),
            })
            .collect();
        let page = BucketPage { entries, next: 7 };
        let mut b = vec![0u8; PAGE];
        page.encode_into(&mut b);
        assert_eq!(BucketPage::decode(&b, 3, bucket, &header).unwrap(), page);
        assert!(BucketPage::decode(&b, 3, bucket + 1, &header).is_err());
        let mut bad = b.clone();
        bad[20] ^= 0x80;
        assert!(BucketPage::decode(&bad, 3, bucket, &header).is_err());
        let backwards = BucketPage {
            entries: vec![],
            next: 3,
        };
        backwards.encode_into(&mut b);
        assert!(BucketPage::decode(&b, 1, bucket, &header).is_err());
    }

    #[test]
    fn record_pages_round_trip() {
        let records: Vec<Record> = (0..RECORDS_PER_PAGE as u64)
            .map(|i| Record {
                fp: fp(i),
                location: loc(i),
            })
            .collect();
        for n in [1, 2, RECORDS_PER_PAGE] {
            let mut b = vec![0u8; PAGE];
            encode_record_page(&records[..n], &mut b);
            let mut back = Vec::new();
            assert_eq!(decode_record_page(&b, &mut back).unwrap(), n);
            assert_eq!(back, records[..n]);
        }
        assert!(decode_record_page(&[0u8; PAGE], &mut Vec::new()).is_err());
        decode_meta_header(&encode_meta_header()).unwrap();
    }

    #[test]
    fn bloom_header_round_trips_with_its_bits() {
        let words: Vec<u64> = (0..512u64).map(|i| i.wrapping_mul(0x9e37_79b9)).collect();
        let h = BloomHeader {
            hashes: 7,
            bits: 32768,
            added: 5,
            covers: 5,
        };
        let page = h.encode(&words);
        let back = BloomHeader::decode(&page).unwrap();
        assert_eq!(back, h);
        back.check_bits(&page, &words).unwrap();
        let mut flipped = words.clone();
        flipped[3] ^= 1;
        assert!(back.check_bits(&page, &flipped).is_err());
    }

    proptest! {
        #[test]
        fn arbitrary_pages_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..PAGE + 8), bucket in 0u64..8) {
            let header = TableHeader { buckets: 8, pages: 20, entries: 50, dirty: false, runs: RunList::default() };
            let _ = TableHeader::decode(&bytes);
            let _ = BucketPage::decode(&bytes, 2, bucket, &header);
            let _ = decode_record_page(&bytes, &mut Vec::new());
            let _ = decode_meta_header(&bytes);
            if let Ok(h) = BloomHeader::decode(&bytes) {
                let _ = h.check_bits(&bytes, &[]);
            }
        }
    }
}
