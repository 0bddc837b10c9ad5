//! Runs spilled from the insert buffer (docs/design/disk-index.md, "`runs`"): the
//! buffer's entries, sorted by bucket, written in one sequential write (when it is full,
//! and at `sync`) instead of being merged into the hash table's pages at once. Up to
//! [`MAX_RUNS`] runs wait, listed in the table's header at `sync`; the next buffer
//! written merges them all into the table in one pass, so that the table is rewritten
//! once per `MAX_RUNS + 1` buffers rather than once per buffer. A lookup the table
//! cannot answer asks the runs whose filter may hold the fingerprint.

use std::ops::Range;

use larder_hash::Fingerprint;

use super::format::{bucket_of, BucketEntry, BucketPage, BUCKET_SLOTS};
use super::io::{IndexFile, IndexIo, PageBuf, PAGE};
use super::store::{corrupt, page_offset, DiskStore, Found};
use crate::Result;

pub use super::format::MAX_RUNS;
/// Filter bits per entry of a run: with [`FILTER_HASHES`] probes, a false-positive
/// rate of about 0.05%.
const FILTER_BITS_PER_ENTRY: u64 = 16;
const FILTER_HASHES: u64 = 11;
/// Memory per insert-buffer entry that the runs take once spilled: the filter's two
/// bytes and the page fences, rounded up.
pub const RUN_BYTES_PER_ENTRY: u64 = 3;

/// A membership filter over one run's fingerprints. Its probes use the fingerprint's
/// bytes 16 .. 32, which neither the Bloom filter's first probe nor the bucket uses.
struct RunFilter {
    words: Vec<u64>,
}

impl RunFilter {
    fn new(entries: usize) -> Self {
        let bits = (entries as u64 * FILTER_BITS_PER_ENTRY).max(64);
        Self {
            words: vec![0; bits.div_ceil(64) as usize],
        }
    }

    fn probes(&self, fp: &Fingerprint) -> impl Iterator<Item = u64> {
        let b = fp.as_bytes();
        let h1 = u64::from_le_bytes(b[24..32].try_into().expect("8 bytes"));
        let h2 = u64::from_le_bytes(b[16..24].try_into().expect("8 bytes")) | 1;
        let bits = self.words.len() as u64 * 64;
        (0..FILTER_HASHES).map(move |j| h1.wrapping_add(j.wrapping_mul(h2)) % bits)
    }

    fn insert(&mut self, fp: &Fingerprint) {
        for bit in self.probes(fp).collect::<Vec<_>>() {
            self.words[(bit / 64) as usize] |= 1 << (bit % 64);
        }
    }

    fn may_contain(&self, fp: &Fingerprint) -> bool {
        self.probes(fp)
            .all(|bit| self.words[(bit / 64) as usize] & (1 << (bit % 64)) != 0)
    }
}

/// One spilled run: pages `first_page ..` of the `runs` file. Invariant: its entries
/// are sorted by bucket, `fences[i]` is the lowest and highest bucket of page `i`, and
/// `filter` holds every fingerprint of the run.
pub struct Run {
    first_page: u64,
    fences: Vec<(u64, u64)>,
    filter: RunFilter,
}

impl Run {
    pub fn pages(&self) -> u64 {
        self.fences.len() as u64
    }

    /// The pages (relative to the run) that may hold entries of `bucket`.
    fn pages_of(&self, bucket: u64) -> Range<usize> {
        let lo = self.fences.partition_point(|&(_, last)| last < bucket);
        let hi = self.fences.partition_point(|&(first, _)| first <= bucket);
        lo..hi.max(lo)
    }
}

impl<I: IndexIo> DiskStore<I> {
    /// Writes the insert buffer as a new run at the end of the `runs` file and empties
    /// the buffer. On an error nothing changes (the buffer keeps every entry).
    pub(super) fn spill_run(&mut self) -> Result<()> {
        let buckets = self.header.buckets;
        let mut entries: Vec<(u64, BucketEntry)> = self
            .insert_buffer
            .iter()
            .map(|(fp, f)| {
                let entry = BucketEntry {
                    fp: *fp,
                    position: f.position,
                    location: f.location,
                };
                (bucket_of(fp, buckets), entry)
            })
            .collect();
        entries.sort_unstable_by_key(|&(b, e)| (b, e.position));
        let pages = entries.len().div_ceil(BUCKET_SLOTS);
        let mut buf = PageBuf::zeroed(pages * PAGE);
        let mut fences = Vec::with_capacity(pages);
        let mut filter = RunFilter::new(entries.len());
        for (i, chunk) in entries.chunks(BUCKET_SLOTS).enumerate() {
            let page = BucketPage {
                entries: chunk.iter().map(|&(_, e)| e).collect(),
                next: 0,
            };
            page.encode_into(&mut buf[i * PAGE..(i + 1) * PAGE]);
            fences.push((chunk[0].0, chunk[chunk.len() - 1].0));
            chunk.iter().for_each(|(_, e)| filter.insert(&e.fp));
        }
        if self.runs.is_empty() {
            // The file's old contents were merged (or belong to a crashed writer).
            self.runs_pages = 0;
            self.io
                .create(IndexFile::Runs)
                .map_err(|e| super::store::io_error(&self.io, IndexFile::Runs, e))?;
        }
        let first_page = self.runs_pages;
        self.write(IndexFile::Runs, page_offset(first_page), &buf)?;
        self.metrics.flush_writes += 1;
        self.metrics.flush_bytes_written += buf.len() as u64;
        self.runs.push(Run {
            first_page,
            fences,
            filter,
        });
        self.runs_pages += pages as u64;
        self.insert_buffer.clear();
        Ok(())
    }

    /// Takes up the runs a clean header lists (`pages` each, in order from page 0 of
    /// the `runs` file): reads and checks every page, and rebuilds each run's fences
    /// and filter.
    pub(super) fn load_runs(&mut self, pages: &[u64]) -> Result<()> {
        let needed = page_offset(pages.iter().sum());
        if needed > 0 {
            let len = self
                .io
                .len(IndexFile::Runs)
                .map_err(|e| super::store::io_error(&self.io, IndexFile::Runs, e))?
                .unwrap_or(0);
            if len < needed {
                return Err(corrupt(
                    IndexFile::Runs,
                    len,
                    format!(
                        "{} runs of {needed} bytes listed, the file is {len}",
                        pages.len()
                    ),
                ));
            }
        }
        let mut first_page = 0;
        for &count in pages {
            let buf = self.read_pages(IndexFile::Runs, first_page, count)?;
            let mut fences = Vec::with_capacity(count as usize);
            // Every page but the last is full, so this is the run's entry count or
            // slightly more.
            let mut filter = RunFilter::new(count as usize * BUCKET_SLOTS);
            for (i, page) in buf.chunks_exact(PAGE).enumerate() {
                let page = self.decode_run_page(page, first_page + i as u64)?;
                let (Some(lo), Some(hi)) = (page.entries.first(), page.entries.last()) else {
                    return Err(corrupt(
                        IndexFile::Runs,
                        page_offset(first_page),
                        "an empty run page",
                    ));
                };
                let buckets = self.header.buckets;
                fences.push((bucket_of(&lo.fp, buckets), bucket_of(&hi.fp, buckets)));
                page.entries.iter().for_each(|e| filter.insert(&e.fp));
            }
            if fences.windows(2).any(|w| w[1].0 < w[0].1) {
                return Err(corrupt(
                    IndexFile::Runs,
                    page_offset(first_page),
                    "a run not sorted by bucket",
                ));
            }
            self.runs.push(Run {
                first_page,
                fences,
                filter,
            });
            first_page += count;
        }
        self.runs_pages = first_page;
        Ok(())
    }

    /// Every entry of every run, in one read per run.
    pub(super) fn read_runs(&mut self) -> Result<Vec<BucketEntry>> {
        let mut out = Vec::new();
        for r in 0..self.runs.len() {
            let (first, count) = (self.runs[r].first_page, self.runs[r].fences.len());
            let pages = self.read_pages(IndexFile::Runs, first, count as u64)?;
            self.metrics.flush_reads += 1;
            for (i, page) in pages.chunks_exact(PAGE).enumerate() {
                out.extend(self.decode_run_page(page, first + i as u64)?.entries);
            }
        }
        Ok(out)
    }

    fn decode_run_page(&self, page: &[u8], number: u64) -> Result<BucketPage> {
        BucketPage::decode_run(page, self.header.buckets, self.records)
            .map_err(|r| corrupt(IndexFile::Runs, page_offset(number), r))
    }

    /// Looks the fingerprints `fps[i]` whose `results[i]` is `None` up in the runs:
    /// for each run whose filter may hold some, one read of the pages their buckets
    /// span. Changes nothing but `results` and the counters.
    pub(super) fn lookup_runs(
        &mut self,
        fps: &[Fingerprint],
        results: &mut [Option<Found>],
    ) -> Result<()> {
        let buckets = self.header.buckets;
        for r in 0..self.runs.len() {
            let run = &self.runs[r];
            let wanted: Vec<(usize, Range<usize>)> = (0..fps.len())
                .filter(|&i| results[i].is_none() && run.filter.may_contain(&fps[i]))
                .map(|i| (i, run.pages_of(bucket_of(&fps[i], buckets))))
                .filter(|(_, pages)| !pages.is_empty())
                .collect();
            let (Some(lo), Some(hi)) = (
                wanted.iter().map(|(_, p)| p.start).min(),
                wanted.iter().map(|(_, p)| p.end).max(),
            ) else {
                continue;
            };
            let first = run.first_page + lo as u64;
            let buf = self.read_pages(IndexFile::Runs, first, (hi - lo) as u64)?;
            self.metrics.lookup_ios += 1;
            self.metrics.lookup_bytes += buf.len() as u64;
            let mut pages = Vec::with_capacity(hi - lo);
            for (i, page) in buf.chunks_exact(PAGE).enumerate() {
                pages.push(self.decode_run_page(page, first + i as u64)?);
            }
            for (i, range) in wanted {
                let found = pages[range.start - lo..range.end - lo]
                    .iter()
                    .flat_map(|p| &p.entries)
                    .find(|e| e.fp == fps[i]);
                if let Some(e) = found {
                    results[i] = Some(Found {
                        position: e.position,
                        location: e.location,
                    });
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_filter_holds_what_was_inserted_and_rarely_more() {
        let fp = |i: u64| larder_hash::HashAlgo::Blake3.fingerprint(&i.to_le_bytes());
        let mut filter = RunFilter::new(1000);
        (0..1000).for_each(|i| filter.insert(&fp(i)));
        assert!((0..1000).all(|i| filter.may_contain(&fp(i))));
        let false_positives = (1000..101_000)
            .filter(|&i| filter.may_contain(&fp(i)))
            .count();
        assert!(false_positives < 200, "{false_positives} of 100000");
    }

    #[test]
    fn fences_give_the_pages_a_bucket_may_be_in() {
        let run = Run {
            first_page: 0,
            fences: vec![(0, 3), (3, 3), (3, 7), (9, 12)],
            filter: RunFilter::new(1),
        };
        assert_eq!(run.pages_of(0), 0..1);
        assert_eq!(run.pages_of(3), 0..3);
        assert_eq!(run.pages_of(5), 2..3);
        assert_eq!(run.pages_of(8), 3..3);
        assert_eq!(run.pages_of(12), 3..4);
        assert_eq!(run.pages_of(13), 4..4);
    }
}
