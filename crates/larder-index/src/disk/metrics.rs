//! What the disk index did: answers by component, I/Os and bytes, time per component
//! (the shape of the Lazy Exact Deduplication paper's Tables IV, V and VII).

use std::fmt;
use std::time::{Duration, Instant};

/// A clock read only when the index times its components per call
/// ([`super::DiskIndexConfig::timed`]).
#[derive(Debug, Clone, Copy)]
pub(super) struct Stopwatch(Option<Instant>);

impl Stopwatch {
    pub fn start(timed: bool) -> Self {
        Self(timed.then(Instant::now))
    }

    /// The time since the start; zero when untimed.
    pub fn elapsed(self) -> Duration {
        self.0.map_or(Duration::ZERO, |started| started.elapsed())
    }
}

/// Time spent in each component of the lookup.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ComponentTimes {
    /// Bloom filter tests.
    pub bloom: Duration,
    /// Cache and insert-buffer lookups before buffering (lazy) or before the disk (eager).
    pub prelookup: Duration,
    /// Reading and searching bucket pages.
    pub disk_lookup: Duration,
    /// Reading metadata runs into the cache.
    pub prefetch: Duration,
    /// Cache lookups of a cycle's fingerprints after a prefetch (lazy).
    pub postlookup: Duration,
    /// Writing the insert buffer and metadata pages.
    pub flush: Duration,
    /// Everything inside the index's calls, the above included.
    pub total: Duration,
}

/// Counters of a disk index since it was opened. Serialized without `time` (the
/// counts alone; callers report times in their own shape).
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct DiskIndexMetrics {
    /// Fingerprints submitted.
    pub submitted: u64,
    /// Answered `New` by the Bloom filter.
    pub bloom_new: u64,
    /// Cache lookups before the disk (eager) or before buffering (lazy), and hits.
    pub prelookups: u64,
    pub prelookup_hits: u64,
    /// Found in the insert buffer (inserted, not yet written).
    pub insert_buffer_hits: u64,
    /// Answered by waiting for an earlier copy (a pending insert or a buffered copy).
    pub waited: u64,
    /// Fingerprints buffered (lazy).
    pub buffered: u64,
    /// Cache lookups after a prefetch (lazy), and hits.
    pub postlookups: u64,
    pub postlookup_hits: u64,
    /// Fingerprints looked up on disk, and those found there.
    pub disk_lookups: u64,
    pub disk_found: u64,
    /// Fingerprints the Bloom filter passed that the disk did not hold.
    pub bloom_false_positives: u64,
    /// Batch lookups (lazy): each reads one run of primary pages.
    pub batches: u64,
    /// Reads of bucket pages for lookups, and their bytes.
    pub lookup_ios: u64,
    pub lookup_bytes: u64,
    /// Prefetches, their reads of the metadata array, bytes, and records loaded.
    pub prefetches: u64,
    pub prefetch_ios: u64,
    pub prefetch_bytes: u64,
    pub prefetched_records: u64,
    /// Merges of the spilled runs and the insert buffer into the hash table.
    pub merges: u64,
    /// Insert-buffer flushes, the pages they read, their writes and bytes written.
    pub flushes: u64,
    pub flush_reads: u64,
    pub flush_writes: u64,
    pub flush_bytes_written: u64,
    #[serde(skip)]
    pub time: ComponentTimes,
}

fn rate(hits: u64, of: u64) -> f64 {
    if of == 0 {
        0.0
    } else {
        hits as f64 / of as f64
    }
}

impl DiskIndexMetrics {
    pub fn prelookup_hit_rate(&self) -> f64 {
        rate(self.prelookup_hits, self.prelookups)
    }

    pub fn postlookup_hit_rate(&self) -> f64 {
        rate(self.postlookup_hits, self.postlookups)
    }

    /// Read I/Os of any kind during lookups: bucket pages and prefetches.
    pub fn read_ios(&self) -> u64 {
        self.lookup_ios + self.prefetch_ios
    }
}

impl fmt::Display for DiskIndexMetrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        writeln!(f, "fingerprints        {}", self.submitted)?;
        writeln!(
            f,
            "answered by         bloom {} | prelookup {} | insert buffer {} | waiting {} | postlookup {} | disk {}",
            self.bloom_new,
            self.prelookup_hits,
            self.insert_buffer_hits,
            self.waited,
            self.postlookup_hits,
            self.disk_found + self.bloom_false_positives
        )?;
        writeln!(
            f,
            "hit rates           prelookup {:.1}% of {} | postlookup {:.1}% of {}",
            100.0 * self.prelookup_hit_rate(),
            self.prelookups,
            100.0 * self.postlookup_hit_rate(),
            self.postlookups
        )?;
        writeln!(
            f,
            "on-disk lookup      {} fingerprints, {} I/Os, {} bytes ({} batches); bloom false positives {}",
            self.disk_lookups, self.lookup_ios, self.lookup_bytes, self.batches, self.bloom_false_positives
        )?;
        writeln!(
            f,
            "prefetch            {} prefetches, {} I/Os, {} bytes, {} records",
            self.prefetches, self.prefetch_ios, self.prefetch_bytes, self.prefetched_records
        )?;
        writeln!(
            f,
            "flush               {} flushes ({} merges of runs into the table), {} page reads, {} writes, {} bytes",
            self.flushes, self.merges, self.flush_reads, self.flush_writes, self.flush_bytes_written
        )?;
        let t = &self.time;
        write!(
            f,
            "time (ms)           bloom {:.1} | prelookup {:.1} | on-disk lookup {:.1} | prefetch {:.1} | postlookup {:.1} | flush {:.1} | other {:.1} | total {:.1}",
            ms(t.bloom),
            ms(t.prelookup),
            ms(t.disk_lookup),
            ms(t.prefetch),
            ms(t.postlookup),
            ms(t.flush),
            ms(t
                .total
                .saturating_sub(t.bloom + t.prelookup + t.disk_lookup + t.prefetch + t.postlookup + t.flush)),
            ms(t.total)
        )
    }
}
