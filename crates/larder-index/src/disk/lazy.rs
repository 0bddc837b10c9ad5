//! Lazy lookup, the paper's method (docs/design/disk-index.md, "Lookup"): fingerprints
//! that the Bloom filter and the prelookup do not settle wait in buffer buckets; a
//! bucket holding BFT is looked up on disk in one batch. Buffer cycles and ranks
//! (the paper's Algorithm 1) say what to prefetch after a hit (N records from the
//! `r`-th preceding one) and which buffered fingerprints to look for in the cache
//! after it (postlookup).

use std::collections::HashMap;
use std::ops::Range;
use std::time::Instant;

use larder_hash::Fingerprint;

use super::format::bucket_of;
use super::io::IndexIo;
use super::{DiskIndex, DiskIndexConfig, FingerprintHasher};
use crate::Result;

/// A fingerprint waiting in the buffer, with the copies submitted after it.
struct Buffered<T> {
    fp: Fingerprint,
    token: T,
    /// Tokens of later copies: they get this fingerprint's answer.
    followers: Vec<T>,
    /// Unique per buffered fingerprint: tells a cycle's reference to a reused slot from
    /// one to its current occupant.
    serial: u64,
    rank: u64,
    /// Its buffer cycle; `None` once it left it (after too many cache lookups).
    cycle: Option<u64>,
    cache_lookups: u8,
    bucket: usize,
}

/// A buffer cycle's members, by slot and serial; `live` of them are still buffered and
/// in the cycle.
#[derive(Default)]
struct Cycle {
    members: Vec<(u32, u64)>,
    live: usize,
}

/// The lazy buffer. Invariants: every occupied slot is in exactly one bucket list (its
/// `bucket`) and in `by_fp`; a slot with `cycle == Some(c)` is among `cycles[c]`'s
/// members and counted in its `live`; `waiting` is the occupied slots plus their
/// followers.
pub(super) struct LazyBuffer<T> {
    slots: Vec<Option<Buffered<T>>>,
    free: Vec<u32>,
    by_fp: HashMap<Fingerprint, u32, FingerprintHasher>,
    buckets: Vec<Vec<u32>>,
    /// Disk buckets per buffer bucket: buffer bucket `i` covers disk buckets
    /// `i * region .. (i + 1) * region`.
    region: u64,
    table_buckets: u64,
    cycles: HashMap<u64, Cycle>,
    current_cycle: u64,
    rank: u64,
    uniques: u64,
    next_serial: u64,
    waiting: usize,
    capacity: usize,
    bft: usize,
    max_unique_length: u64,
    max_cycle_length: u64,
    max_cache_lookups: u8,
}

impl<T> LazyBuffer<T> {
    /// A buffer of about `wanted` buckets (at most one per disk bucket) over a table of
    /// `table_buckets` buckets.
    pub(super) fn new(table_buckets: u64, wanted: u64, config: &DiskIndexConfig) -> Self {
        let region = table_buckets.div_ceil(wanted.clamp(1, table_buckets));
        let count = table_buckets.div_ceil(region) as usize;
        let bft = config.bft.max(1);
        Self {
            slots: Vec::new(),
            free: Vec::new(),
            by_fp: HashMap::with_hasher(FingerprintHasher),
            buckets: vec![Vec::new(); count],
            region,
            table_buckets,
            cycles: HashMap::new(),
            current_cycle: 0,
            rank: 0,
            uniques: 0,
            next_serial: 0,
            waiting: 0,
            capacity: count * bft,
            bft,
            max_unique_length: config.max_unique_length,
            max_cycle_length: config.max_cycle_length,
            max_cache_lookups: config.max_cache_lookups.max(1),
        }
    }

    pub(super) fn bucket_count(&self) -> u64 {
        self.buckets.len() as u64
    }

    pub(super) fn waiting(&self) -> usize {
        self.waiting
    }

    /// The buffer bucket of `fp`, if it waits in the buffer (not as a follower).
    pub(super) fn bucket_of_buffered(&self, fp: &Fingerprint) -> Option<usize> {
        let slot = *self.by_fp.get(fp)?;
        self.slots[slot as usize].as_ref().map(|e| e.bucket)
    }

    /// Algorithm 1 for a Bloom-negative fingerprint: a run of more than
    /// MAX_UNIQUE_LENGTH of them ends the cycle.
    fn count_unique(&mut self) {
        self.uniques += 1;
        if self.uniques > self.max_unique_length {
            self.rank = 0;
            self.uniques = 0;
            self.start_cycle();
        }
    }

    /// Algorithm 1 for a fingerprint that passed the Bloom filter: the uniques before it
    /// count in the rank.
    fn count_candidate(&mut self) {
        self.rank += self.uniques;
        self.uniques = 0;
    }

    /// A fingerprint settled without being buffered (a prelookup hit, a copy of a
    /// pending or buffered fingerprint) still takes a rank.
    pub(super) fn count_settled(&mut self) {
        self.count_candidate();
        self.rank += 1;
    }

    fn start_cycle(&mut self) {
        if self
            .cycles
            .get(&self.current_cycle)
            .is_some_and(|c| c.live == 0)
        {
            self.cycles.remove(&self.current_cycle);
        }
        self.current_cycle += 1;
    }

    /// Buffers `fp` in the current cycle with the current rank; returns its bucket.
    fn push(&mut self, fp: Fingerprint, token: T) -> usize {
        if self.rank > self.max_cycle_length {
            self.rank = 0;
            self.start_cycle();
        }
        let bucket = (bucket_of(&fp, self.table_buckets) / self.region) as usize;
        let serial = self.next_serial;
        self.next_serial += 1;
        let entry = Buffered {
            fp,
            token,
            followers: Vec::new(),
            serial,
            rank: self.rank,
            cycle: Some(self.current_cycle),
            cache_lookups: 0,
            bucket,
        };
        let slot = match self.free.pop() {
            Some(s) => {
                self.slots[s as usize] = Some(entry);
                s
            }
            None => {
                self.slots.push(Some(entry));
                (self.slots.len() - 1) as u32
            }
        };
        let cycle = self.cycles.entry(self.current_cycle).or_default();
        cycle.members.push((slot, serial));
        cycle.live += 1;
        self.by_fp.insert(fp, slot);
        self.buckets[bucket].push(slot);
        self.waiting += 1;
        self.rank += 1;
        bucket
    }

    /// Takes a buffered fingerprint out of its slot, `by_fp` and its cycle (not out of
    /// its bucket list: the caller does that).
    fn take(&mut self, slot: u32) -> Buffered<T> {
        let entry = self.slots[slot as usize].take().expect("a live slot");
        self.free.push(slot);
        self.by_fp.remove(&entry.fp);
        self.waiting -= 1 + entry.followers.len();
        if let Some(c) = entry.cycle {
            self.leave_cycle(c);
        }
        entry
    }

    fn leave_cycle(&mut self, c: u64) {
        if let Some(cycle) = self.cycles.get_mut(&c) {
            cycle.live -= 1;
            if cycle.live == 0 && c != self.current_cycle {
                self.cycles.remove(&c);
            }
        }
    }

    /// The bucket holding the most fingerprints.
    fn fullest(&self) -> Option<usize> {
        (0..self.buckets.len())
            .filter(|&b| !self.buckets[b].is_empty())
            .max_by_key(|&b| self.buckets[b].len())
    }

    /// Empties the buffer: every token, with its fingerprint.
    pub(super) fn drain(&mut self) -> Vec<(T, Fingerprint)> {
        let mut out = Vec::new();
        for entry in self.slots.drain(..).flatten() {
            out.push((entry.token, entry.fp));
            out.extend(entry.followers.into_iter().map(|t| (t, entry.fp)));
        }
        self.free.clear();
        self.by_fp.clear();
        self.buckets.iter_mut().for_each(Vec::clear);
        self.cycles.clear();
        self.waiting = 0;
        out
    }
}

impl<I: IndexIo, T> DiskIndex<I, T> {
    fn buffer(&mut self) -> &mut LazyBuffer<T> {
        self.lazy.as_mut().expect("a lazy index has a buffer")
    }

    pub(super) fn submit_lazy(&mut self, fp: Fingerprint, token: T) -> Result<()> {
        let buffer = self.buffer();
        if let Some(&slot) = buffer.by_fp.get(&fp) {
            let entry = buffer.slots[slot as usize].as_mut().expect("a live slot");
            entry.followers.push(token);
            buffer.waiting += 1;
            buffer.count_settled();
            self.store.metrics.waited += 1;
            return Ok(());
        }
        if self.bloom_says_new(&fp) {
            self.buffer().count_unique();
            self.resolve_new(fp, token, Vec::new());
            return Ok(());
        }
        self.buffer().count_candidate();
        if self.config.prelookup {
            if let Some(location) = self.prelookup(&fp) {
                self.buffer().rank += 1;
                self.resolve_duplicate(fp, token, location);
                return Ok(());
            }
        }
        self.store.metrics.buffered += 1;
        let buffer = self.buffer();
        let bucket = buffer.push(fp, token);
        if buffer.buckets[bucket].len() >= buffer.bft {
            self.look_up_bucket(bucket)?;
        }
        while self.buffer().waiting >= self.buffer().capacity {
            match self.buffer().fullest() {
                Some(b) => self.look_up_bucket(b)?,
                None => break,
            }
        }
        Ok(())
    }

    pub(super) fn finish_lazy(&mut self) -> Result<()> {
        for bucket in 0..self.buffer().buckets.len() {
            if !self.buffer().buckets[bucket].is_empty() {
                self.look_up_bucket(bucket)?;
            }
        }
        Ok(())
    }

    /// Looks a bucket's fingerprints up on disk in one batch, answers them, then
    /// prefetches around each hit still in a cycle and postlooks up its cycle. The
    /// disk is read before anything changes, so an error loses nothing; a failed
    /// prefetch after the answers costs only cache hits.
    pub(super) fn look_up_bucket(&mut self, bucket: usize) -> Result<()> {
        let buffer = self.lazy.as_ref().expect("a lazy index has a buffer");
        let slots = buffer.buckets[bucket].clone();
        let fps: Vec<Fingerprint> = slots
            .iter()
            .map(|&s| buffer.slots[s as usize].as_ref().expect("a live slot").fp)
            .collect();
        let found = self.store.lookup_batch(&fps)?;
        self.buffer().buckets[bucket].clear();
        let mut prefetch_from = Vec::new();
        for (slot, found) in slots.into_iter().zip(found) {
            let entry = self.buffer().take(slot);
            match found {
                Some(f) => {
                    self.store.metrics.disk_found += 1;
                    self.cache.insert(entry.fp, f.location);
                    if let Some(c) = entry.cycle {
                        prefetch_from.push((f.position, entry.rank, c));
                    }
                    self.resolve_duplicate(entry.fp, entry.token, f.location);
                    for t in entry.followers {
                        self.resolve_duplicate(entry.fp, t, f.location);
                    }
                }
                None => {
                    self.store.metrics.bloom_false_positives += 1;
                    self.resolve_new(entry.fp, entry.token, entry.followers);
                }
            }
        }
        let mut covered: Vec<Range<u64>> = Vec::new();
        for (position, rank, cycle) in prefetch_from {
            if covered.iter().any(|r| r.contains(&position)) {
                continue;
            }
            let start = position.saturating_sub(rank);
            let range = start..start.saturating_add(self.config.prefetch);
            self.prefetch(range.clone())?;
            covered.push(range);
            self.postlookup(cycle);
        }
        Ok(())
    }

    /// Looks every fingerprint of `cycle` still buffered up in the cache: hits are
    /// answered; misses count a lookup, and leave the cycle at the limit.
    fn postlookup(&mut self, cycle: u64) {
        let started = Instant::now();
        // Taken out while they are looked up (`take` and `leave_cycle` only touch the
        // cycle's `live`); what stays in the cycle is put back below.
        let Some(members) = self
            .buffer()
            .cycles
            .get_mut(&cycle)
            .map(|c| std::mem::take(&mut c.members))
        else {
            return;
        };
        let mut kept = Vec::with_capacity(members.len());
        for (slot, serial) in members {
            let buffer = self.lazy.as_ref().expect("a lazy index has a buffer");
            let Some(entry) = buffer.slots[slot as usize].as_ref() else {
                continue;
            };
            if entry.serial != serial || entry.cycle != Some(cycle) {
                continue;
            }
            let fp = entry.fp;
            self.store.metrics.postlookups += 1;
            match self.cache.get(&fp) {
                Some(location) => {
                    self.store.metrics.postlookup_hits += 1;
                    let buffer = self.buffer();
                    let entry = buffer.take(slot);
                    buffer.buckets[entry.bucket].retain(|&s| s != slot);
                    self.resolve_duplicate(fp, entry.token, location);
                    for t in entry.followers {
                        self.resolve_duplicate(fp, t, location);
                    }
                }
                None => {
                    let buffer = self.buffer();
                    let max = buffer.max_cache_lookups;
                    let entry = buffer.slots[slot as usize].as_mut().expect("a live slot");
                    entry.cache_lookups += 1;
                    if entry.cache_lookups >= max {
                        entry.cycle = None;
                        buffer.leave_cycle(cycle);
                    } else {
                        kept.push((slot, serial));
                    }
                }
            }
        }
        if let Some(c) = self.buffer().cycles.get_mut(&cycle) {
            c.members = kept;
        }
        self.store.metrics.time.postlookup += started.elapsed();
    }
}
