//! The persistent half of the disk index: the hash table, the metadata array, the
//! insert buffer and the Bloom filter, and the rules that make them durable
//! (docs/design/disk-index.md, "Files" and "Crash safety"). Lookup strategies sit
//! above it in `eager.rs` and `lazy.rs`.

use std::collections::HashMap;
use std::io;
use std::ops::Range;
use std::time::Instant;

use larder_hash::Fingerprint;

use super::bloom::BloomFilter;
use super::format::{
    bucket_of, decode_bloom_words, decode_meta_header, decode_record_page, encode_bloom_words,
    encode_meta_header, encode_record_page, BloomHeader, BucketEntry, BucketPage, Record, RunList,
    TableHeader, BUCKET_SLOTS, RECORDS_PER_PAGE,
};
use super::io::{IndexFile, IndexIo, PageBuf, PAGE};
use super::metrics::DiskIndexMetrics;
use super::runs::{Run, MAX_RUNS};
use super::sealed::Unopenable;
use super::FingerprintHasher;
use crate::{ChunkLocation, IndexError, Result};

/// Pages read at once when the Bloom filter is rebuilt from the metadata array.
const SCAN_PAGES: u64 = 256;
/// A flush reads, extends and writes back the primary pages of the buckets it touches
/// in runs, merging two touched pages into one run when at most this many untouched
/// pages lie between them (reading 256 KiB more costs less than another seek).
const FLUSH_GAP_PAGES: u64 = 64;

/// Sorted, distinct page numbers cut into runs `start..end`: a new run starts where
/// more than `gap` pages lie between two of them.
fn runs(pages: &[u64], gap: u64) -> Vec<Range<u64>> {
    let mut out: Vec<Range<u64>> = Vec::new();
    for &p in pages {
        match out.last_mut() {
            Some(run) if p - run.end <= gap => run.end = p + 1,
            _ => out.push(p..p + 1),
        }
    }
    out
}

/// Where an indexed fingerprint is: its record's position and its chunk's location.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Found {
    pub position: u64,
    pub location: ChunkLocation,
}

/// The files of one disk index and what of them is still in memory.
///
/// Invariants: `records` counts every record appended; records `meta_tail_start ..
/// records` are in `meta_tail` (`meta_tail_start` is a page boundary, so the last,
/// partial page is rewritten whole); every record is in exactly one of the table's
/// pages, a run of `runs` (pages `..runs_pages` of the `runs` file), or
/// `insert_buffer`; `header.entries` is `records` from the first flush on.
pub struct DiskStore<I> {
    pub(super) io: I,
    pub(super) header: TableHeader,
    /// Whether the on-disk header says dirty (rule 1 of "Crash safety").
    dirty_on_disk: bool,
    pub(super) records: u64,
    meta_tail_start: u64,
    meta_tail: Vec<Record>,
    pub(super) insert_buffer: HashMap<Fingerprint, Found, FingerprintHasher>,
    insert_buffer_capacity: usize,
    pub(super) runs: Vec<Run>,
    pub(super) runs_pages: u64,
    /// Untouched pages a batch lookup reads rather than start another read.
    batch_gap_pages: u64,
    bloom: BloomFilter,
    pub metrics: DiskIndexMetrics,
}

pub(super) fn page_offset(page: u64) -> u64 {
    page * PAGE as u64
}

impl<I: IndexIo> DiskStore<I> {
    /// A new, empty index of `buckets` buckets in `io`, replacing whatever was there.
    pub fn create(
        mut io: I,
        buckets: u64,
        bloom: BloomFilter,
        insert_buffer_capacity: usize,
    ) -> Result<Self> {
        let buckets = buckets.clamp(1, super::format::MAX_BUCKETS);
        let header = TableHeader {
            buckets,
            pages: buckets,
            entries: 0,
            dirty: true,
            runs: RunList::default(),
        };
        for file in IndexFile::ALL {
            io.create(file).map_err(|e| io_error(&io, file, e))?;
        }
        let mut store = Self {
            io,
            header,
            dirty_on_disk: true,
            records: 0,
            meta_tail_start: 0,
            meta_tail: Vec::new(),
            insert_buffer: HashMap::with_hasher(FingerprintHasher),
            insert_buffer_capacity: insert_buffer_capacity.max(1),
            runs: Vec::new(),
            runs_pages: 0,
            batch_gap_pages: u64::MAX,
            bloom,
            metrics: DiskIndexMetrics::default(),
        };
        store.write(IndexFile::Meta, 0, &page_of(&encode_meta_header()))?;
        // The primary pages start as zeros (an all-zero page is an empty bucket): the
        // last one is written so that the file has its full length.
        store.write(
            IndexFile::Table,
            page_offset(buckets),
            &PageBuf::zeroed(PAGE),
        )?;
        store.write_header(true)?;
        store.sync()?;
        Ok(store)
    }

    /// Opens the index in `io`. A dirty table is refused ([`IndexError::NeedsRebuild`]);
    /// a missing, stale or corrupt Bloom file is rebuilt from the metadata array with
    /// `bloom_if_rebuilt`'s size.
    pub fn open(
        mut io: I,
        bloom_if_rebuilt: BloomFilter,
        insert_buffer_capacity: usize,
    ) -> Result<Self> {
        let table_len = io
            .len(IndexFile::Table)
            .map_err(|e| io_error(&io, IndexFile::Table, e))?
            .ok_or(IndexError::Missing("table"))?;
        let meta_len = io
            .len(IndexFile::Meta)
            .map_err(|e| io_error(&io, IndexFile::Meta, e))?
            .ok_or(IndexError::Missing("meta"))?;
        let mut store = Self {
            io,
            header: TableHeader {
                buckets: 1,
                pages: 1,
                entries: 0,
                dirty: false,
                runs: RunList::default(),
            },
            dirty_on_disk: false,
            records: 0,
            meta_tail_start: 0,
            meta_tail: Vec::new(),
            insert_buffer: HashMap::with_hasher(FingerprintHasher),
            insert_buffer_capacity: insert_buffer_capacity.max(1),
            runs: Vec::new(),
            runs_pages: 0,
            batch_gap_pages: u64::MAX,
            bloom: bloom_if_rebuilt,
            metrics: DiskIndexMetrics::default(),
        };
        if table_len < PAGE as u64 {
            return Err(corrupt(IndexFile::Table, 0, "shorter than its header"));
        }
        let page = store.read_pages(IndexFile::Table, 0, 1)?;
        let header = TableHeader::decode(&page).map_err(|r| corrupt(IndexFile::Table, 0, r))?;
        if header.dirty {
            return Err(IndexError::NeedsRebuild);
        }
        if table_len < page_offset(header.pages + 1) {
            return Err(corrupt(
                IndexFile::Table,
                table_len,
                format!(
                    "{} pages declared, the file is {table_len} bytes",
                    header.pages
                ),
            ));
        }
        store.header = header;
        store.records = header.entries;
        let meta_pages = header.entries.div_ceil(RECORDS_PER_PAGE as u64);
        if meta_len < page_offset(meta_pages + 1) {
            return Err(corrupt(
                IndexFile::Meta,
                meta_len,
                format!(
                    "{} records declared, the file is {meta_len} bytes",
                    header.entries
                ),
            ));
        }
        let meta_header = store.read_pages(IndexFile::Meta, 0, 1)?;
        decode_meta_header(&meta_header).map_err(|r| corrupt(IndexFile::Meta, 0, r))?;
        store.meta_tail_start = header.entries / RECORDS_PER_PAGE as u64 * RECORDS_PER_PAGE as u64;
        if store.meta_tail_start < header.entries {
            let tail = store.read_records_from_disk(store.meta_tail_start..header.entries)?;
            store.meta_tail = tail;
        }
        store.load_runs(header.runs.pages())?;
        store.metrics = DiskIndexMetrics::default();
        match store.load_bloom()? {
            Some(bloom) => store.bloom = bloom,
            None => store.rebuild_bloom()?,
        }
        Ok(store)
    }

    /// Gives the I/O back without writing anything (what a crash leaves).
    pub fn into_io(self) -> I {
        self.io
    }

    pub fn set_batch_gap_pages(&mut self, gap: u64) {
        self.batch_gap_pages = gap;
    }

    pub fn io_mut(&mut self) -> &mut I {
        &mut self.io
    }

    pub fn bloom(&self) -> &BloomFilter {
        &self.bloom
    }

    pub fn buckets(&self) -> u64 {
        self.header.buckets
    }

    /// Records appended (the fingerprints indexed).
    pub fn len(&self) -> u64 {
        self.records
    }

    /// Bytes of the three files as they will be after the next sync.
    pub fn disk_bytes(&self) -> u64 {
        page_offset(1 + self.header.pages)
            + page_offset(1 + self.records.div_ceil(RECORDS_PER_PAGE as u64))
            + PAGE as u64
            + self.bloom.bytes()
            + page_offset(self.runs_pages)
    }

    pub(super) fn read_pages(
        &mut self,
        file: IndexFile,
        first: u64,
        count: u64,
    ) -> Result<PageBuf> {
        let mut buf = PageBuf::zeroed(count as usize * PAGE);
        self.io
            .read_at(file, page_offset(first), &mut buf)
            .map_err(|e| io_error(&self.io, file, e))?;
        Ok(buf)
    }

    pub(super) fn write(&mut self, file: IndexFile, offset: u64, bytes: &PageBuf) -> Result<()> {
        self.io
            .write_at(file, offset, bytes)
            .map_err(|e| io_error(&self.io, file, e))
    }

    fn sync_file(&mut self, file: IndexFile) -> Result<()> {
        self.io.sync(file).map_err(|e| io_error(&self.io, file, e))
    }

    fn write_header(&mut self, dirty: bool) -> Result<()> {
        let pages: Vec<u64> = self.runs.iter().map(Run::pages).collect();
        let header = TableHeader {
            dirty,
            runs: RunList::new(&pages),
            ..self.header
        };
        self.write(IndexFile::Table, 0, &page_of(&header.encode()))
    }

    /// Rule 1: the header says dirty, durably, before any other write.
    fn mark_dirty(&mut self) -> Result<()> {
        if !self.dirty_on_disk {
            self.write_header(true)?;
            self.sync_file(IndexFile::Table)?;
            self.dirty_on_disk = true;
        }
        Ok(())
    }

    /// The fingerprint in the insert buffer (memory, no I/O).
    pub fn buffered(&self, fp: &Fingerprint) -> Option<Found> {
        self.insert_buffer.get(fp).copied()
    }

    pub fn prefetch_bloom(&self, fp: &Fingerprint) {
        self.bloom.prefetch(fp);
    }

    pub fn may_contain(&self, fp: &Fingerprint) -> bool {
        self.bloom.may_contain(fp)
    }

    /// Appends `fp` at `location`: a record, the Bloom filter, the insert buffer. The
    /// caller has made sure `fp` is not indexed. Flushes the insert buffer when full;
    /// on an error the record stays appended in memory and a later flush writes it.
    pub fn append(&mut self, fp: Fingerprint, location: ChunkLocation) -> Result<u64> {
        let position = self.records;
        self.records += 1;
        self.meta_tail.push(Record { fp, location });
        self.bloom.insert(&fp);
        self.insert_buffer.insert(fp, Found { position, location });
        if self.insert_buffer.len() >= self.insert_buffer_capacity {
            self.flush()?;
        }
        Ok(position)
    }

    /// Writes the metadata tail's whole pages, then the insert buffer: as a new run
    /// while fewer than [`MAX_RUNS`] wait, otherwise merged with every run into the
    /// table. On an error every entry not yet written stays where it was, so the
    /// flush can be retried.
    pub fn flush(&mut self) -> Result<()> {
        if self.insert_buffer.is_empty() && self.meta_tail.len() < RECORDS_PER_PAGE {
            return Ok(());
        }
        let started = Instant::now();
        let result = self.flush_unmeasured();
        self.metrics.time.flush += started.elapsed();
        result
    }

    fn flush_unmeasured(&mut self) -> Result<()> {
        self.mark_dirty()?;
        self.write_meta_pages()?;
        self.header.entries = self.records;
        if !self.insert_buffer.is_empty() {
            if self.runs.len() < MAX_RUNS {
                self.spill_run()?;
            } else {
                self.merge()?;
            }
        }
        self.metrics.flushes += 1;
        Ok(())
    }

    /// Writes the whole pages of the metadata tail.
    fn write_meta_pages(&mut self) -> Result<()> {
        let full_pages = self.meta_tail.len() / RECORDS_PER_PAGE;
        if full_pages == 0 {
            return Ok(());
        }
        let whole = full_pages * RECORDS_PER_PAGE;
        let mut buf = PageBuf::zeroed(full_pages * PAGE);
        for (i, records) in self.meta_tail[..whole].chunks(RECORDS_PER_PAGE).enumerate() {
            encode_record_page(records, &mut buf[i * PAGE..(i + 1) * PAGE]);
        }
        let first = 1 + self.meta_tail_start / RECORDS_PER_PAGE as u64;
        self.write(IndexFile::Meta, page_offset(first), &buf)?;
        self.metrics.flush_writes += 1;
        self.metrics.flush_bytes_written += buf.len() as u64;
        self.meta_tail.drain(..whole);
        self.meta_tail_start += whole as u64;
        Ok(())
    }

    /// Writes every run's entries and the insert buffer's into their buckets' chains,
    /// bucket by bucket in order, then forgets the runs. A buffered entry leaves the
    /// insert buffer once its pages are written; the runs are forgotten only at the
    /// end, and a retry skips the entries a chain holds already.
    fn merge(&mut self) -> Result<()> {
        let buckets = self.header.buckets;
        let mut by_bucket: Vec<(u64, Fingerprint, Found)> = self
            .read_runs()?
            .into_iter()
            .map(|e| {
                let found = Found {
                    position: e.position,
                    location: e.location,
                };
                (bucket_of(&e.fp, buckets), e.fp, found)
            })
            .chain(
                self.insert_buffer
                    .iter()
                    .map(|(fp, f)| (bucket_of(fp, buckets), *fp, *f)),
            )
            .collect();
        by_bucket.sort_unstable_by_key(|&(b, _, f)| (b, f.position));
        let groups: Vec<&[(u64, Fingerprint, Found)]> =
            by_bucket.chunk_by(|a, b| a.0 == b.0).collect();
        let touched: Vec<u64> = groups.iter().map(|g| g[0].0).collect();
        let mut next_group = 0;
        for run in runs(&touched, FLUSH_GAP_PAGES) {
            let mut pages =
                self.read_pages(IndexFile::Table, 1 + run.start, run.end - run.start)?;
            self.metrics.flush_reads += 1;
            let first_group = next_group;
            while next_group < groups.len() && groups[next_group][0].0 < run.end {
                let group = groups[next_group];
                let at = (group[0].0 - run.start) as usize * PAGE;
                self.extend_chain(group, &mut pages[at..at + PAGE])?;
                next_group += 1;
            }
            self.write(IndexFile::Table, page_offset(1 + run.start), &pages)?;
            self.metrics.flush_writes += 1;
            self.metrics.flush_bytes_written += pages.len() as u64;
            for group in &groups[first_group..next_group] {
                for (_, fp, _) in group.iter() {
                    self.insert_buffer.remove(fp);
                }
            }
        }
        self.runs.clear();
        self.metrics.merges += 1;
        Ok(())
    }

    /// Appends `group` (entries of one bucket) to the bucket's chain. `primary` is the
    /// bucket's primary page, in the caller's buffer, which the caller writes back;
    /// overflow pages are read and written here, one I/O each.
    fn extend_chain(
        &mut self,
        group: &[(u64, Fingerprint, Found)],
        primary: &mut [u8],
    ) -> Result<()> {
        let bucket = group[0].0;
        let mut page = decode_bucket(primary, 1 + bucket, bucket, &self.header)?;
        // What the chain holds already: a flush retried after a failure may find some
        // of the group written, and must not add them twice.
        let mut present: Vec<Fingerprint> = page.entries.iter().map(|e| e.fp).collect();
        // `None`: the page being filled is the primary one.
        let mut page_number = None;
        while page.next != 0 {
            let next = page.next;
            page = self.read_bucket_page(next, bucket, false)?;
            present.extend(page.entries.iter().map(|e| e.fp));
            page_number = Some(next);
        }
        let mut pending = group
            .iter()
            .filter(|(_, fp, _)| !present.contains(fp))
            .map(|&(_, fp, f)| BucketEntry {
                fp,
                position: f.position,
                location: f.location,
            })
            .collect::<Vec<_>>()
            .into_iter();
        // Overflow pages this extension changes or adds, written last first: a page
        // that names a new one reaches the disk only after it, so a failed write never
        // leaves a chain naming a page that was not written.
        let mut overflow: Vec<(u64, PageBuf)> = Vec::new();
        loop {
            while page.entries.len() < BUCKET_SLOTS {
                match pending.next() {
                    Some(entry) => page.entries.push(entry),
                    None => break,
                }
            }
            let more = pending.len() > 0;
            if more {
                // A new overflow page at the end of the file; the full page names it.
                self.header.pages += 1;
                page.next = self.header.pages;
            }
            match page_number {
                None => page.encode_into(primary),
                Some(number) => {
                    let mut buf = PageBuf::zeroed(PAGE);
                    page.encode_into(&mut buf);
                    overflow.push((number, buf));
                }
            }
            if !more {
                break;
            }
            page_number = Some(page.next);
            page = BucketPage::default();
        }
        for (number, buf) in overflow.iter().rev() {
            self.write(IndexFile::Table, page_offset(*number), buf)?;
            self.metrics.flush_writes += 1;
            self.metrics.flush_bytes_written += PAGE as u64;
        }
        Ok(())
    }

    /// Reads and decodes one page of bucket `bucket`'s chain; an all-zero page is an
    /// empty bucket never written. `lookup` says which counter the read goes to.
    fn read_bucket_page(&mut self, page: u64, bucket: u64, lookup: bool) -> Result<BucketPage> {
        let buf = self.read_pages(IndexFile::Table, page, 1)?;
        if lookup {
            self.metrics.lookup_ios += 1;
            self.metrics.lookup_bytes += PAGE as u64;
        } else {
            self.metrics.flush_reads += 1;
        }
        decode_bucket(&buf, page, bucket, &self.header)
    }

    /// Looks one fingerprint up on disk: its bucket's chain, page by page until found
    /// (the eager lookup's one I/O per page).
    pub fn lookup_one(&mut self, fp: &Fingerprint) -> Result<Option<Found>> {
        let started = Instant::now();
        let bucket = bucket_of(fp, self.header.buckets);
        let mut page_number = 1 + bucket;
        let result = loop {
            let page = self.read_bucket_page(page_number, bucket, true)?;
            if let Some(e) = page.entries.iter().find(|e| e.fp == *fp) {
                break Some(found_of(e));
            }
            if page.next == 0 {
                break None;
            }
            page_number = page.next;
        };
        let result = match result {
            None if !self.runs.is_empty() => {
                let mut results = [None];
                self.lookup_runs(std::slice::from_ref(fp), &mut results)?;
                results[0]
            }
            found => found,
        };
        self.metrics.disk_lookups += 1;
        self.metrics.time.disk_lookup += started.elapsed();
        Ok(result)
    }

    /// Looks a batch of fingerprints up on disk: the primary pages of the buckets they
    /// need, read in runs (one read from the lowest to the highest unless
    /// `batch_gap_pages` splits it where needed pages are further apart), then the
    /// overflow pages of the buckets that still miss some (one read each). Nothing
    /// changes on an error.
    pub fn lookup_batch(&mut self, fps: &[Fingerprint]) -> Result<Vec<Option<Found>>> {
        let started = Instant::now();
        let buckets = self.header.buckets;
        let mut results: Vec<Option<Found>> = fps.iter().map(|fp| self.buffered(fp)).collect();
        let needed: Vec<(u64, usize)> = {
            let mut v: Vec<(u64, usize)> = (0..fps.len())
                .filter(|&i| results[i].is_none())
                .map(|i| (bucket_of(&fps[i], buckets), i))
                .collect();
            v.sort_unstable();
            v
        };
        let groups: Vec<&[(u64, usize)]> = needed.chunk_by(|a, b| a.0 == b.0).collect();
        let buckets: Vec<u64> = groups.iter().map(|g| g[0].0).collect();
        let mut next_group = 0;
        for run in runs(&buckets, self.batch_gap_pages) {
            let pages = self.read_pages(IndexFile::Table, 1 + run.start, run.end - run.start)?;
            self.metrics.lookup_ios += 1;
            self.metrics.lookup_bytes += pages.len() as u64;
            while next_group < groups.len() && groups[next_group][0].0 < run.end {
                let group = groups[next_group];
                next_group += 1;
                let bucket = group[0].0;
                let at = (bucket - run.start) as usize * PAGE;
                let mut page =
                    decode_bucket(&pages[at..at + PAGE], 1 + bucket, bucket, &self.header)?;
                loop {
                    for &(_, i) in group {
                        if let Some(e) = page.entries.iter().find(|e| e.fp == fps[i]) {
                            results[i] = Some(found_of(e));
                        }
                    }
                    if page.next == 0 || group.iter().all(|&(_, i)| results[i].is_some()) {
                        break;
                    }
                    page = self.read_bucket_page(page.next, bucket, true)?;
                }
            }
        }
        if !self.runs.is_empty() {
            self.lookup_runs(fps, &mut results)?;
        }
        self.metrics.disk_lookups += needed.len() as u64;
        self.metrics.batches += 1;
        self.metrics.time.disk_lookup += started.elapsed();
        Ok(results)
    }

    /// The records at positions `range` (clamped to those that exist), for prefetching:
    /// one read of the pages on disk, the rest from memory.
    pub fn read_records(&mut self, range: Range<u64>) -> Result<Vec<Record>> {
        let range = range.start.min(self.records)..range.end.min(self.records);
        let on_disk = range.start..range.end.min(self.meta_tail_start);
        let mut out = if on_disk.is_empty() {
            Vec::new()
        } else {
            self.metrics.prefetch_ios += 1;
            self.read_records_from_disk(on_disk)?
        };
        let from = range.start.max(self.meta_tail_start);
        if from < range.end {
            let a = (from - self.meta_tail_start) as usize;
            let b = (range.end - self.meta_tail_start) as usize;
            out.extend_from_slice(&self.meta_tail[a..b]);
        }
        self.metrics.prefetches += 1;
        self.metrics.prefetched_records += out.len() as u64;
        Ok(out)
    }

    fn read_records_from_disk(&mut self, range: Range<u64>) -> Result<Vec<Record>> {
        let per_page = RECORDS_PER_PAGE as u64;
        let first = range.start / per_page;
        let last = (range.end - 1) / per_page;
        let buf = self.read_pages(IndexFile::Meta, 1 + first, last - first + 1)?;
        self.metrics.prefetch_bytes += buf.len() as u64;
        let mut records = Vec::with_capacity(buf.len() / PAGE * RECORDS_PER_PAGE);
        for (i, page) in buf.chunks_exact(PAGE).enumerate() {
            let number = first + i as u64;
            let count = decode_record_page(page, &mut records)
                .map_err(|r| corrupt(IndexFile::Meta, page_offset(1 + number), r))?;
            let expected = (self.records - number * per_page).min(per_page);
            if count as u64 != expected {
                return Err(corrupt(
                    IndexFile::Meta,
                    page_offset(1 + number),
                    format!("{count} records where {expected} were written"),
                ));
            }
        }
        let skip = (range.start - first * per_page) as usize;
        records.truncate(skip + (range.end - range.start) as usize);
        records.drain(..skip);
        Ok(records)
    }

    fn load_bloom(&mut self) -> Result<Option<BloomFilter>> {
        let len = match self.io.len(IndexFile::Bloom) {
            Ok(Some(len)) if len >= PAGE as u64 => len,
            _ => return Ok(None),
        };
        let Ok(page) = self.read_pages(IndexFile::Bloom, 0, 1) else {
            return Ok(None);
        };
        let Ok(header) = BloomHeader::decode(&page) else {
            return Ok(None);
        };
        if header.covers != self.records || len < PAGE as u64 + header.bits / 8 {
            return Ok(None);
        }
        let bits = self.read_pages(IndexFile::Bloom, 1, header.bits / 8 / PAGE as u64)?;
        let words = decode_bloom_words(&bits);
        if header.check_bits(&page, &words).is_err() {
            return Ok(None);
        }
        Ok(Some(BloomFilter::from_parts(
            words,
            header.hashes,
            header.added,
        )))
    }

    fn rebuild_bloom(&mut self) -> Result<()> {
        let mut start = 0;
        while start < self.records {
            let end = (start + SCAN_PAGES * RECORDS_PER_PAGE as u64).min(self.records);
            for r in self.read_records(start..end)? {
                self.bloom.insert(&r.fp);
            }
            start = end;
        }
        self.metrics = DiskIndexMetrics::default();
        Ok(())
    }

    /// Rule 2 of "Crash safety": everything written and synced, then the header clean.
    pub fn sync(&mut self) -> Result<()> {
        if !self.dirty_on_disk && self.insert_buffer.is_empty() {
            return Ok(());
        }
        self.mark_dirty()?;
        // Forces the partial last metadata page out too.
        self.flush_all()?;
        let header = BloomHeader {
            hashes: self.bloom.hashes(),
            bits: self.bloom.bits(),
            added: self.bloom.added(),
            covers: self.records,
        };
        let mut buf = PageBuf::zeroed(PAGE + self.bloom.bytes() as usize);
        buf[..PAGE].copy_from_slice(&header.encode(self.bloom.words()));
        encode_bloom_words(self.bloom.words(), &mut buf[PAGE..]);
        self.write(IndexFile::Bloom, 0, &buf)?;
        for file in IndexFile::ALL {
            self.sync_file(file)?;
        }
        if !self.runs.is_empty() {
            self.sync_file(IndexFile::Runs)?;
        }
        self.write_header(false)?;
        self.sync_file(IndexFile::Table)?;
        self.dirty_on_disk = false;
        Ok(())
    }

    /// Writes everything: the metadata tail (its partial last page too) and the
    /// insert buffer (spilled as a run, or merged with the runs into the table when
    /// [`MAX_RUNS`] wait already).
    fn flush_all(&mut self) -> Result<()> {
        let started = Instant::now();
        let result = self.flush_unmeasured();
        self.metrics.time.flush += started.elapsed();
        result?;
        if !self.meta_tail.is_empty() {
            let mut buf = PageBuf::zeroed(PAGE);
            encode_record_page(&self.meta_tail, &mut buf);
            let page = 1 + self.meta_tail_start / RECORDS_PER_PAGE as u64;
            self.write(IndexFile::Meta, page_offset(page), &buf)?;
            self.metrics.flush_writes += 1;
            self.metrics.flush_bytes_written += PAGE as u64;
        }
        Ok(())
    }
}

fn decode_bucket(buf: &[u8], page: u64, bucket: u64, header: &TableHeader) -> Result<BucketPage> {
    if buf.iter().all(|&b| b == 0) {
        return Ok(BucketPage::default());
    }
    BucketPage::decode(buf, page, bucket, header)
        .map_err(|r| corrupt(IndexFile::Table, page_offset(page), r))
}

fn found_of(e: &BucketEntry) -> Found {
    Found {
        position: e.position,
        location: e.location,
    }
}

fn page_of(bytes: &[u8]) -> PageBuf {
    let mut buf = PageBuf::zeroed(bytes.len());
    buf.copy_from_slice(bytes);
    buf
}

/// An I/O error of `file`: a sealed page that does not open ([`SealedIo`]) is a
/// corrupt file, anything else an I/O error.
///
/// [`SealedIo`]: super::SealedIo
pub(super) fn io_error<I: IndexIo>(io: &I, file: IndexFile, source: io::Error) -> IndexError {
    match source.downcast::<Unopenable>() {
        Ok(unopenable) => unopenable.into_error(),
        Err(source) => IndexError::Io {
            path: io.path(file),
            source,
        },
    }
}

pub(super) fn corrupt(file: IndexFile, offset: u64, reason: impl Into<String>) -> IndexError {
    IndexError::Corrupt {
        file: file.name(),
        offset,
        reason: reason.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::runs;

    #[test]
    fn runs_merge_pages_at_most_gap_apart() {
        assert_eq!(runs(&[], 3), vec![]);
        assert_eq!(runs(&[5], 0), vec![5..6]);
        assert_eq!(runs(&[1, 2, 4, 9, 10], 1), vec![1..5, 9..11]);
        assert_eq!(runs(&[1, 2, 4, 9, 10], 0), vec![1..3, 4..5, 9..11]);
        assert_eq!(runs(&[1, 2, 4, 9, 10], u64::MAX), vec![1..11]);
    }
}
