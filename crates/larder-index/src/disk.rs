//! The disk-resident exact index with eager and lazy lookup, after the Lazy Exact
//! Deduplication paper (docs/design/disk-index.md).
//!
//! A [`DiskIndex`] answers a stream of fingerprints: `submit(fp, token)`, then `poll`
//! yields [`Resolved`] answers, possibly out of order; the caller stores each chunk
//! answered [`Answer::New`] and calls `insert(fp, location)`. Both strategies answer
//! exactly what an in-memory map answers: of the copies of an unindexed fingerprint, the
//! first submitted is `New` and every other is `Duplicate` of the location inserted
//! for it.

mod bloom;
mod cache;
mod eager;
mod format;
mod get;
mod io;
mod lazy;
mod metrics;
mod runs;
mod sealed;
mod store;

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasher, Hasher};
use std::time::Instant;

use larder_hash::Fingerprint;

pub use self::bloom::BloomFilter;
pub use self::cache::LruCache;
pub use self::format::{
    bucket_of, decode_meta_header, decode_record_page, BloomHeader, BucketPage, Record, RunList,
    TableHeader, BUCKET_SLOTS, RECORDS_PER_PAGE,
};
pub use self::io::{DirIo, IndexFile, IndexIo, MemIo, PageBuf, PAGE};
use self::metrics::Stopwatch;
pub use self::metrics::{ComponentTimes, DiskIndexMetrics};
pub use self::sealed::{IndexDir, SealedIo};

use self::lazy::LazyBuffer;
use self::store::DiskStore;
use crate::{ChunkLocation, IndexError, Result};

/// The lookup strategy (`--index-lookup`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lookup {
    /// DDFS style: every fingerprint the Bloom filter and the cache do not settle is
    /// looked up on disk at once.
    Eager,
    /// The paper's lazy method: such fingerprints wait in buckets of BFT.
    Lazy,
}

/// Sizes and the paper's constants. `Default` gives the paper's values and a 256 MiB
/// budget.
#[derive(Debug, Clone, PartialEq)]
pub struct DiskIndexConfig {
    /// `--index-memory`: Bloom filter, cache, insert buffer and lazy buffer together.
    pub memory_budget: u64,
    /// Fingerprints the index is sized for at creation (buckets and Bloom filter).
    pub expected_fingerprints: u64,
    /// The Bloom filter's target false-positive rate at the expected count.
    pub bloom_target_rate: f64,
    /// Bytes of chunk data the budget reserves for each lazily buffered fingerprint:
    /// the average chunk when the caller keeps waiting chunks in memory (the paper's
    /// layout, the default), 0 when it keeps them outside the budget (spilled to
    /// disk). It sets how many buffer buckets the budget affords, and so how many
    /// table pages one batch reads (docs/design/disk-index.md, "Memory budget").
    pub buffered_chunk_bytes: u64,
    /// Buffer fingerprint threshold: a lazy bucket is looked up when it holds this many.
    pub bft: usize,
    /// Records prefetched around a hit (N).
    pub prefetch: u64,
    /// Consecutive Bloom-negative fingerprints that end a buffer cycle.
    pub max_unique_length: u64,
    /// The rank at which a new buffer cycle starts.
    pub max_cycle_length: u64,
    /// Cache lookups a buffered fingerprint gets before it leaves its cycle.
    pub max_cache_lookups: u8,
    /// Whether the lazy lookup looks in the cache before buffering (the paper's Table V
    /// compares with and without).
    pub prelookup: bool,
    /// A lazy batch reads the primary pages it needs in runs, starting another read
    /// only where more than this many unneeded pages lie between two needed ones.
    /// `u64::MAX` (the default) reads each batch in one read, as the paper does.
    pub batch_gap_pages: u64,
    /// Whether calls that handle one fingerprint (submit, insert, hasten, the Bloom
    /// filter and cache lookups) and `finish` time themselves into [`DiskIndexMetrics::time`]:
    /// five pairs of clock reads per fingerprint looked up and inserted, a tenth of a
    /// cluster owner's work (docs/performance.md, "Cluster: the owner's lock sharded").
    /// Reads, writes and syncs are timed either way.
    pub timed: bool,
}

impl Default for DiskIndexConfig {
    fn default() -> Self {
        Self {
            memory_budget: 256 << 20,
            expected_fingerprints: 1 << 20,
            bloom_target_rate: 0.01,
            buffered_chunk_bytes: 8 << 10,
            bft: 32,
            prefetch: 2048,
            max_unique_length: 200,
            max_cycle_length: 2048,
            max_cache_lookups: 10,
            prelookup: true,
            batch_gap_pages: u64::MAX,
            timed: true,
        }
    }
}

/// Bytes per insert-buffer entry counted for the budget: the entry itself, and what
/// it costs in memory in each of the runs that may wait once it is spilled.
const INSERT_BUFFER_ENTRY_BYTES: u64 = 80 + runs::MAX_RUNS as u64 * runs::RUN_BYTES_PER_ENTRY;
/// Bytes per lazily buffered fingerprint besides its chunk: the slot, the bucket's and
/// the cycle's references, the fingerprint map.
const BUFFERED_ENTRY_BYTES: u64 = 96;
/// Hash-table buckets are filled to this fraction at the expected count.
const TABLE_FILL: f64 = 0.7;

/// How the budget is split (docs/design/disk-index.md, "Memory budget").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    pub bloom_max_bytes: u64,
    pub insert_buffer_entries: usize,
    /// Lazy buffer buckets wanted (0 for eager); the buffer gets at most the table's
    /// bucket count.
    pub buffer_buckets: u64,
    pub cache_entries: usize,
}

impl DiskIndexConfig {
    /// The budget's split for `lookup`, with a Bloom filter of `bloom_bytes`.
    pub fn budget(&self, lookup: Lookup, bloom_bytes: u64) -> Budget {
        let b = self.memory_budget;
        let insert_buffer = b / 16;
        let rest = b.saturating_sub(bloom_bytes + insert_buffer);
        let (buffer, cache) = match lookup {
            Lookup::Eager => (0, rest),
            Lookup::Lazy => (rest / 2, rest - rest / 2),
        };
        let per_bucket =
            self.bft.max(1) as u64 * (BUFFERED_ENTRY_BYTES + self.buffered_chunk_bytes);
        Budget {
            bloom_max_bytes: b / 4,
            insert_buffer_entries: (insert_buffer / INSERT_BUFFER_ENTRY_BYTES).max(1) as usize,
            buffer_buckets: match lookup {
                Lookup::Eager => 0,
                Lookup::Lazy => (buffer / per_bucket).max(1),
            },
            cache_entries: (cache / LruCache::BYTES_PER_ENTRY).max(1) as usize,
        }
    }

    /// Hash-table buckets for the expected count, each 70% full.
    pub fn table_buckets(&self) -> u64 {
        ((self.expected_fingerprints as f64 / (BUCKET_SLOTS as f64 * TABLE_FILL)).ceil() as u64)
            .max(1)
    }

    fn bloom(&self) -> BloomFilter {
        BloomFilter::with_rate(
            self.expected_fingerprints,
            self.bloom_target_rate,
            self.memory_budget / 4,
        )
    }
}

/// What the index says about a submitted fingerprint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// Stored at this location (by an earlier backup, or by the `insert` of an earlier
    /// copy).
    Duplicate(ChunkLocation),
    /// Not indexed: store the chunk and `insert` its location.
    New,
}

/// The answer for one submitted token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved<T> {
    pub token: T,
    pub fp: Fingerprint,
    pub answer: Answer,
}

/// Hashes a fingerprint by its bytes 24 .. 32: they are uniform and independent of the
/// bits that choose buckets and Bloom probes.
#[derive(Debug, Clone, Copy, Default)]
pub struct FingerprintHasher;

impl BuildHasher for FingerprintHasher {
    type Hasher = FingerprintHashState;
    fn build_hasher(&self) -> FingerprintHashState {
        FingerprintHashState(0)
    }
}

#[derive(Debug, Default)]
pub struct FingerprintHashState(u64);

impl Hasher for FingerprintHashState {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // `Fingerprint`'s derived `Hash` writes the 32 bytes in one call (after a
        // length); anything else is mixed in whole.
        if bytes.len() == 32 {
            self.0 ^= u64::from_le_bytes(bytes[24..32].try_into().expect("8 bytes"));
        } else {
            for &b in bytes {
                self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
            }
        }
    }
}

/// The disk index: the persistent store, the cache, and the lookup strategy's state.
/// `T` is the caller's token for each submitted fingerprint.
///
/// Invariants: every submitted token is in exactly one place until it is resolved: the
/// lazy buffer (as a buffered fingerprint or a follower), `pending` (waiting for an
/// insert), or `output`. A fingerprint in `pending` was answered `New` and is not
/// indexed yet; it is neither in the lazy buffer nor in the store.
pub struct DiskIndex<I, T> {
    store: DiskStore<I>,
    cache: LruCache,
    config: DiskIndexConfig,
    lookup: Lookup,
    lazy: Option<LazyBuffer<T>>,
    /// Fingerprints answered `New`, awaiting their insert, with the tokens of later copies.
    pending: HashMap<Fingerprint, Vec<T>, FingerprintHasher>,
    output: VecDeque<Resolved<T>>,
    /// Eager lookups whose disk read failed, and those submitted after them, in
    /// submission order, for the next submit or `finish` to retry.
    retry: VecDeque<(Fingerprint, T)>,
}

impl<I: IndexIo, T> DiskIndex<I, T> {
    /// A new empty index in `io`, sized for `config.expected_fingerprints`.
    pub fn create(io: I, config: DiskIndexConfig, lookup: Lookup) -> Result<Self> {
        let bloom = config.bloom();
        let budget = config.budget(lookup, bloom.bytes());
        let store = DiskStore::create(
            io,
            config.table_buckets(),
            bloom,
            budget.insert_buffer_entries,
        )?;
        Ok(Self::around(store, config, lookup))
    }

    /// Opens the index in `io` (created by [`DiskIndex::create`] and closed cleanly).
    pub fn open(io: I, config: DiskIndexConfig, lookup: Lookup) -> Result<Self> {
        let bloom = config.bloom();
        let budget = config.budget(lookup, bloom.bytes());
        let store = DiskStore::open(io, bloom, budget.insert_buffer_entries)?;
        Ok(Self::around(store, config, lookup))
    }

    fn around(mut store: DiskStore<I>, config: DiskIndexConfig, lookup: Lookup) -> Self {
        store.set_batch_gap_pages(config.batch_gap_pages);
        let budget = config.budget(lookup, store.bloom().bytes());
        let lazy = (lookup == Lookup::Lazy)
            .then(|| LazyBuffer::new(store.buckets(), budget.buffer_buckets, &config));
        Self {
            cache: LruCache::new(budget.cache_entries),
            store,
            config,
            lookup,
            lazy,
            pending: HashMap::with_hasher(FingerprintHasher),
            output: VecDeque::new(),
            retry: VecDeque::new(),
        }
    }

    pub fn lookup(&self) -> Lookup {
        self.lookup
    }

    pub fn config(&self) -> &DiskIndexConfig {
        &self.config
    }

    pub fn metrics(&self) -> &DiskIndexMetrics {
        &self.store.metrics
    }

    /// Fingerprints indexed (inserted, durable or not).
    pub fn len(&self) -> u64 {
        self.store.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn bloom(&self) -> &BloomFilter {
        self.store.bloom()
    }

    /// The Bloom filter's false-positive rate at the current count.
    pub fn bloom_false_positive_rate(&self) -> f64 {
        self.bloom().false_positive_rate(self.len())
    }

    /// Bytes of the index's files after the next sync.
    pub fn disk_bytes(&self) -> u64 {
        self.store.disk_bytes()
    }

    /// Hash-table buckets on disk, and lazy buffer buckets (0 for eager).
    pub fn buckets(&self) -> (u64, u64) {
        (
            self.store.buckets(),
            self.lazy.as_ref().map_or(0, |l| l.bucket_count()),
        )
    }

    /// The memory the budget covers, at full use: the Bloom filter, the cache, the
    /// insert buffer and the lazy buffer with its waiting chunks (at the configured
    /// average size), plus 16 bytes per lazy bucket for the bucket vectors.
    pub fn memory_estimate(&self) -> u64 {
        let budget = self.config.budget(self.lookup, self.bloom().bytes());
        let buffer_buckets = self.lazy.as_ref().map_or(0, |l| l.bucket_count());
        self.bloom().bytes()
            + self.cache.capacity() as u64 * LruCache::BYTES_PER_ENTRY
            + budget.insert_buffer_entries as u64 * INSERT_BUFFER_ENTRY_BYTES
            + buffer_buckets
                * (self.config.bft as u64
                    * (BUFFERED_ENTRY_BYTES + self.config.buffered_chunk_bytes)
                    + 16)
    }

    pub fn cache_capacity(&self) -> usize {
        self.cache.capacity()
    }

    /// Submitted tokens not yet in the output: buffered, followers, and waiting for an
    /// insert.
    pub fn unresolved(&self) -> usize {
        self.lazy.as_ref().map_or(0, |l| l.waiting())
            + self.retry.len()
            + self.pending.values().map(Vec::len).sum::<usize>()
    }

    /// Fingerprints answered `New` whose insert has not come.
    pub fn awaiting_insert(&self) -> usize {
        self.pending.len()
    }

    pub fn io_mut(&mut self) -> &mut I {
        self.store.io_mut()
    }

    /// Starts loading the memory an eager lookup of `fp` reads first (its cache slot,
    /// and with `bloom` its Bloom filter words), so that a caller submitting a batch overlaps its
    /// lookups' memory misses by prefetching ahead. The index's own fields must be in
    /// the processor's cache first, or this waits for them (see
    /// [`larder_index::prefetch::prefetch_value`](crate::prefetch::prefetch_value)).
    /// A hint: no effect on answers.
    pub fn prefetch_lookup(&self, fp: &Fingerprint, bloom: bool) {
        if bloom {
            self.store.prefetch_bloom(fp);
        }
        self.cache.prefetch(fp);
    }

    /// Looks `fp` up; its answer comes out of [`DiskIndex::poll`], at once or later.
    /// On an error nothing submitted is lost: the token is resolved later, or handed
    /// back by [`DiskIndex::abandon`].
    pub fn submit(&mut self, fp: Fingerprint, token: T) -> Result<()> {
        let started = Stopwatch::start(self.config.timed);
        self.store.metrics.submitted += 1;
        let result = self.submit_unsubmitted(fp, token);
        self.store.metrics.time.total += started.elapsed();
        result
    }

    fn submit_unsubmitted(&mut self, fp: Fingerprint, token: T) -> Result<()> {
        if let Some(waiters) = self.pending.get_mut(&fp) {
            waiters.push(token);
            self.store.metrics.waited += 1;
            if let Some(lazy) = self.lazy.as_mut() {
                lazy.count_settled();
            }
            return Ok(());
        }
        match self.lookup {
            Lookup::Eager if self.retry.is_empty() => self.submit_eager(fp, token),
            // Behind a failed lookup: answered in submission order, so that of the
            // copies of a new fingerprint the first submitted is the one answered `New`.
            Lookup::Eager => {
                self.retry.push_back((fp, token));
                self.finish_eager()
            }
            Lookup::Lazy => self.submit_lazy(fp, token),
        }
    }

    /// The next answer, if any.
    pub fn poll(&mut self) -> Option<Resolved<T>> {
        self.output.pop_front()
    }

    /// Records the location where the caller stored a chunk answered `New`; later copies
    /// waiting on it are answered `Duplicate(location)`. Call `sync` only once the
    /// containers named by the inserts are durable (docs/design/disk-index.md, "Crash
    /// safety"). An
    /// `Io` error comes from the flush of a full insert buffer: the insert itself is
    /// kept (do not repeat it), and the flush is retried by the next one or by `sync`.
    pub fn insert(&mut self, fp: Fingerprint, location: ChunkLocation) -> Result<()> {
        let started = Stopwatch::start(self.config.timed);
        let waiters = self.pending.remove(&fp).ok_or(IndexError::NotPending(fp))?;
        for token in waiters {
            self.output.push_back(Resolved {
                token,
                fp,
                answer: Answer::Duplicate(location),
            });
        }
        self.cache.insert(fp, location);
        let result = self.store.append(fp, location).map(drop);
        self.store.metrics.time.total += started.elapsed();
        result
    }

    /// Gives up on the insert of `fp`, answered `New` and not inserted (its writer
    /// died or timed out: the cluster's lock on new, docs/design/cluster.md): the first
    /// copy waiting on it is answered `New` in its place and the others keep waiting on
    /// it; with no copy waiting, `fp` is forgotten. Returns whether a copy took over.
    /// Nothing happens to a fingerprint not pending.
    pub fn unlock(&mut self, fp: &Fingerprint) -> bool {
        let Some(mut waiters) = self.pending.remove(fp) else {
            return false;
        };
        if waiters.is_empty() {
            return false;
        }
        let first = waiters.remove(0);
        self.resolve_new(*fp, first, waiters);
        true
    }

    /// Whether `fp` was answered `New` and awaits its insert.
    pub fn is_pending(&self, fp: &Fingerprint) -> bool {
        self.pending.contains_key(fp)
    }

    /// Looks up everything still buffered (lazy); afterwards every submitted token is in
    /// the output or waits for an insert. On an error, what was not looked up stays
    /// buffered: call again, or [`DiskIndex::abandon`].
    pub fn finish(&mut self) -> Result<()> {
        let started = Stopwatch::start(self.config.timed);
        let result = match self.lookup {
            Lookup::Eager => self.finish_eager(),
            Lookup::Lazy => self.finish_lazy(),
        };
        self.store.metrics.time.total += started.elapsed();
        result
    }

    /// Looks the lazy buffer bucket holding `fp` up on disk now, with every
    /// fingerprint waiting in it, so that `fp` is answered without waiting for its
    /// bucket to fill: for a caller that must release what waits on `fp` (stage 3
    /// holding chunk bytes in stream order). Nothing happens when `fp` is not buffered
    /// (answered, pending, or an eager index). On an error nothing is lost, as with a
    /// full bucket.
    pub fn hasten(&mut self, fp: &Fingerprint) -> Result<()> {
        let started = Stopwatch::start(self.config.timed);
        let bucket = self.lazy.as_ref().and_then(|l| l.bucket_of_buffered(fp));
        let result = match bucket {
            Some(b) => self.look_up_bucket(b),
            None => Ok(()),
        };
        self.store.metrics.time.total += started.elapsed();
        result
    }

    /// Makes every insert durable (docs/design/disk-index.md, "Crash safety"). Refused
    /// while a fingerprint answered `New` awaits its insert.
    pub fn sync(&mut self) -> Result<()> {
        if !self.pending.is_empty() {
            return Err(IndexError::InsertsOutstanding(self.pending.len()));
        }
        let started = Instant::now();
        let result = self.store.sync();
        self.store.metrics.time.total += started.elapsed();
        result
    }

    /// Makes every insert durable like [`DiskIndex::sync`], while fingerprints answered
    /// `New` still await their inserts (a cluster partition's owner, which always has
    /// some). They are not in the store: a crash forgets them, as it forgets their
    /// locks, and their writers' acknowledgements after a reopen insert them anew.
    pub fn checkpoint(&mut self) -> Result<()> {
        let started = Instant::now();
        let result = self.store.sync();
        self.store.metrics.time.total += started.elapsed();
        result
    }

    /// Gives up on everything unresolved: returns every token not yet answered (with its
    /// fingerprint), and forgets the fingerprints answered `New` but not inserted. The
    /// answers already in the output stay there.
    pub fn abandon(&mut self) -> Vec<(T, Fingerprint)> {
        let mut out = self.lazy.as_mut().map_or_else(Vec::new, |l| l.drain());
        out.extend(self.retry.drain(..).map(|(fp, t)| (t, fp)));
        for (fp, waiters) in self.pending.drain() {
            out.extend(waiters.into_iter().map(|t| (t, fp)));
        }
        out
    }

    /// Syncs and gives the I/O back.
    pub fn close(mut self) -> Result<I> {
        self.sync()?;
        Ok(self.store.into_io())
    }

    /// Gives the I/O back without syncing, as a crash would leave it.
    pub fn into_io_unsynced(self) -> I {
        self.store.into_io()
    }

    /// Answers `fp` `New` and makes it pending (its later copies wait for its insert).
    fn resolve_new(&mut self, fp: Fingerprint, token: T, waiters: Vec<T>) {
        debug_assert!(!self.pending.contains_key(&fp));
        self.pending.insert(fp, waiters);
        self.output.push_back(Resolved {
            token,
            fp,
            answer: Answer::New,
        });
    }

    fn resolve_duplicate(&mut self, fp: Fingerprint, token: T, location: ChunkLocation) {
        self.output.push_back(Resolved {
            token,
            fp,
            answer: Answer::Duplicate(location),
        });
    }

    /// Bloom filter test, timed.
    fn bloom_says_new(&mut self, fp: &Fingerprint) -> bool {
        let started = Stopwatch::start(self.config.timed);
        let new = !self.store.may_contain(fp);
        self.store.metrics.time.bloom += started.elapsed();
        if new {
            self.store.metrics.bloom_new += 1;
        }
        new
    }

    /// The cache, then the insert buffer: memory only.
    fn prelookup(&mut self, fp: &Fingerprint) -> Option<ChunkLocation> {
        let started = Stopwatch::start(self.config.timed);
        self.store.metrics.prelookups += 1;
        let hit = match self.cache.get(fp) {
            Some(location) => {
                self.store.metrics.prelookup_hits += 1;
                Some(location)
            }
            None => self.store.buffered(fp).map(|found| {
                self.store.metrics.insert_buffer_hits += 1;
                found.location
            }),
        };
        self.store.metrics.time.prelookup += started.elapsed();
        hit
    }

    /// Loads records `range` of the metadata array into the cache.
    fn prefetch(&mut self, range: std::ops::Range<u64>) -> Result<()> {
        let started = Instant::now();
        let records = self.store.read_records(range)?;
        for r in records {
            self.cache.insert(r.fp, r.location);
        }
        self.store.metrics.time.prefetch += started.elapsed();
        Ok(())
    }
}

#[cfg(test)]
mod budget_tests {
    use super::*;

    #[test]
    fn the_budget_is_split_as_documented() {
        let config = DiskIndexConfig::default();
        let bloom = 16 << 20;
        let eager = config.budget(Lookup::Eager, bloom);
        let lazy = config.budget(Lookup::Lazy, bloom);
        assert_eq!(eager.bloom_max_bytes, 64 << 20);
        assert_eq!(
            eager.insert_buffer_entries as u64,
            (16 << 20) / (80 + 16 * 3)
        );
        let rest = (256u64 << 20) - bloom - (16 << 20);
        assert_eq!(eager.cache_entries as u64, rest / 96);
        assert_eq!(lazy.cache_entries as u64, (rest - rest / 2) / 96);
        assert_eq!(lazy.buffer_buckets, (rest / 2) / (32 * (96 + 8192)));
        let used = bloom
            + eager.insert_buffer_entries as u64 * (80 + 16 * 3)
            + lazy.cache_entries as u64 * 96
            + lazy.buffer_buckets * 32 * (96 + 8192);
        assert!(used <= 256 << 20);
    }
}
