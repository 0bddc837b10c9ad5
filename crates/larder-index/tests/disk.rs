//! The disk index against a `HashMap` oracle: eager and lazy lookup, every answer
//! exact, over multi-generation workloads with locality, repeats inside one buffer,
//! memory budgets small enough to evict everything, delayed inserts, injected I/O
//! failures, reopening, crashes and damaged files (docs/design/disk-index.md).

use std::collections::{HashMap, VecDeque};

use larder_gen::fingerprint_stream::generations;
use larder_hash::{Fingerprint, HashAlgo};
use larder_index::disk::{
    Answer, DirIo, DiskIndex, DiskIndexConfig, IndexFile, IndexIo, Lookup, MemIo, PAGE,
};
use larder_index::{ChunkLocation, IndexError};
use proptest::prelude::*;

fn fp(id: u64) -> Fingerprint {
    HashAlgo::Blake3.fingerprint(&id.to_le_bytes())
}

/// Where the caller "stores" the chunk of the submission numbered `token`.
fn loc(token: u64) -> ChunkLocation {
    ChunkLocation {
        container: token / 64 + 1,
        offset: (token % 64) as u32 * 4096,
        length: 4096 + (token % 7) as u32,
    }
}

/// Drives an index like the engine will: submits, drains answers, inserts each `New`
/// after `delay` more answers, and keeps every answer for the oracle.
struct Driver<I> {
    index: DiskIndex<I, u64>,
    answers: HashMap<u64, Answer>,
    to_insert: VecDeque<(Fingerprint, u64)>,
    delay: usize,
}

impl<I: IndexIo> Driver<I> {
    fn new(index: DiskIndex<I, u64>, delay: usize) -> Self {
        Self {
            index,
            answers: HashMap::new(),
            to_insert: VecDeque::new(),
            delay,
        }
    }

    fn drain(&mut self, delay: usize) -> Result<(), IndexError> {
        loop {
            while let Some(r) = self.index.poll() {
                let old = self.answers.insert(r.token, r.answer);
                assert!(old.is_none(), "token {} answered twice", r.token);
                if r.answer == Answer::New {
                    self.to_insert.push_back((r.fp, r.token));
                }
            }
            if self.to_insert.len() <= delay {
                return Ok(());
            }
            let (fp, token) = self.to_insert.pop_front().expect("not empty");
            self.index.insert(fp, loc(token))?;
        }
    }

    fn submit(&mut self, id: u64, token: u64) -> Result<(), IndexError> {
        self.index.submit(fp(id), token)?;
        self.drain(self.delay)
    }

    /// Finishes the stream: everything answered and inserted.
    fn finish(&mut self) -> Result<(), IndexError> {
        self.index.finish()?;
        self.drain(0)?;
        assert_eq!(self.index.unresolved(), 0);
        assert_eq!(self.index.awaiting_insert(), 0);
        Ok(())
    }
}

/// What an exact index answers: the first submission of an id is `New`, every later
/// one `Duplicate` of the first's location.
#[derive(Default)]
struct Oracle {
    first: HashMap<u64, u64>,
    expected: HashMap<u64, Answer>,
}

impl Oracle {
    fn submit(&mut self, id: u64, token: u64) {
        let answer = match self.first.get(&id) {
            Some(&t) => Answer::Duplicate(loc(t)),
            None => {
                self.first.insert(id, token);
                Answer::New
            }
        };
        self.expected.insert(token, answer);
    }
}

fn config(budget: u64, expected: u64, bft: usize) -> DiskIndexConfig {
    DiskIndexConfig {
        memory_budget: budget,
        expected_fingerprints: expected,
        buffered_chunk_bytes: 64,
        bft,
        ..DiskIndexConfig::default()
    }
}

/// Runs `gens` through one index per generation session (closing and reopening in
/// between when `reopen`), and checks every answer against the oracle.
fn run_against_oracle(
    gens: &[Vec<u64>],
    config: &DiskIndexConfig,
    lookup: Lookup,
    delay: usize,
    reopen: bool,
) -> DiskIndex<MemIo, u64> {
    let mut oracle = Oracle::default();
    let mut driver = Driver::new(
        DiskIndex::create(MemIo::new(), config.clone(), lookup).unwrap(),
        delay,
    );
    let mut token = 0;
    for gen in gens {
        for &id in gen {
            oracle.submit(id, token);
            driver.submit(id, token).unwrap();
            token += 1;
        }
        driver.finish().unwrap();
        if reopen {
            let io = driver.index.close().unwrap();
            let answers = std::mem::take(&mut driver.answers);
            driver = Driver::new(DiskIndex::open(io, config.clone(), lookup).unwrap(), delay);
            driver.answers = answers;
        }
    }
    assert_eq!(driver.answers.len(), oracle.expected.len(), "tokens lost");
    for (t, expected) in &oracle.expected {
        assert_eq!(driver.answers.get(t), Some(expected), "token {t}");
    }
    assert_eq!(driver.index.len(), oracle.first.len() as u64);
    driver.index
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, ..ProptestConfig::default() })]

    #[test]
    fn eager_and_lazy_answer_like_a_hash_map(
        seed in any::<u64>(),
        gens in 1usize..5,
        len in 50usize..1500,
        budget_kib in prop_oneof![Just(16u64), Just(64), Just(1024)],
        expected in prop_oneof![Just(100u64), Just(5000)],
        bft in 1usize..40,
        delay in 0usize..20,
        reopen in any::<bool>(),
        prelookup in any::<bool>(),
        batch_gap_pages in prop_oneof![Just(0u64), Just(3), Just(u64::MAX)],
    ) {
        let workload = generations(seed, gens, len);
        let mut config = config(budget_kib << 10, expected, bft);
        config.prelookup = prelookup;
        config.batch_gap_pages = batch_gap_pages;
        // Small prefetches and cycles too, so that cycles end and prefetches miss.
        if seed % 3 == 0 {
            config.prefetch = 16;
            config.max_cycle_length = 16;
            config.max_unique_length = 4;
        }
        for lookup in [Lookup::Eager, Lookup::Lazy] {
            run_against_oracle(&workload, &config, lookup, delay, reopen);
        }
    }

    /// I/O failures at random moments lose nothing: the calls are retried after the
    /// failure heals, every answer is still exact, and the index then syncs and
    /// reopens with every fingerprint once.
    #[test]
    fn injected_io_failures_lose_nothing(seed in any::<u64>(), fail_after in 0u64..60, bft in 1usize..8, writes in any::<bool>()) {
        let workload = generations(seed, 3, 600);
        let config = config(16 << 10, 100, bft);
        for lookup in [Lookup::Eager, Lookup::Lazy] {
            let mut oracle = Oracle::default();
            let mut driver = Driver::new(DiskIndex::create(MemIo::new(), config.clone(), lookup).unwrap(), 3);
            let mut token = 0;
            let mut failures = 0;
            if writes {
                driver.index.io_mut().fail_writes_after(fail_after);
            } else {
                driver.index.io_mut().fail_reads_after(fail_after);
            }
            for gen in &workload {
                for &id in gen {
                    oracle.submit(id, token);
                    if driver.submit(id, token).is_err() {
                        failures += 1;
                        driver.index.io_mut().heal();
                    }
                    token += 1;
                }
                while driver.finish().is_err() {
                    failures += 1;
                    driver.index.io_mut().heal();
                }
            }
            prop_assert!(failures <= 2, "one failure per injection, at most: {}", failures);
            for (t, expected) in &oracle.expected {
                prop_assert_eq!(driver.answers.get(t), Some(expected), "token {}", t);
            }
            // Everything inserted is found after a sync and a reopen, exactly once.
            let io = driver.index.close().unwrap();
            let mut reopened = Driver::new(DiskIndex::open(io, config.clone(), lookup).unwrap(), 0);
            let ids: Vec<u64> = oracle.first.keys().copied().collect();
            for &id in &ids {
                reopened.submit(id, 1_000_000 + id).unwrap();
            }
            reopened.finish().unwrap();
            for &id in &ids {
                let first = oracle.first[&id];
                prop_assert_eq!(reopened.answers[&(1_000_000 + id)], Answer::Duplicate(loc(first)));
            }
            prop_assert_eq!(reopened.index.len(), ids.len() as u64);
        }
    }
}

/// The exactness trap, first half: copies of a fingerprint answered `New` but not yet
/// inserted wait for its insert and come out `Duplicate` of the inserted location.
#[test]
fn a_copy_submitted_while_the_first_is_buffered_is_a_duplicate_of_it() {
    let config = config(1 << 20, 1000, 32);
    for lookup in [Lookup::Eager, Lookup::Lazy] {
        let mut index: DiskIndex<MemIo, u64> =
            DiskIndex::create(MemIo::new(), config.clone(), lookup).unwrap();
        // A new fingerprint is answered `New` and pending until its insert.
        index.submit(fp(1), 0).unwrap();
        let first = index.poll().unwrap();
        assert_eq!(first.answer, Answer::New);
        // Two more copies before the insert: both wait.
        index.submit(fp(1), 1).unwrap();
        index.submit(fp(1), 2).unwrap();
        assert!(index.poll().is_none());
        index.insert(fp(1), loc(0)).unwrap();
        let answers: Vec<_> = std::iter::from_fn(|| index.poll()).collect();
        assert_eq!(answers.len(), 2);
        assert!(answers
            .iter()
            .all(|r| r.answer == Answer::Duplicate(loc(0)) && r.fp == fp(1)));
        assert!(matches!(
            index.insert(fp(1), loc(9)),
            Err(IndexError::NotPending(_))
        ));
    }
}

/// The exactness trap, second half: a fingerprint that the Bloom filter passes but no
/// cache holds is buffered (lazy); copies submitted meanwhile follow it, and come out
/// `Duplicate` of the location inserted for it once it is answered `New`.
#[test]
fn copies_of_a_buffered_fingerprint_follow_its_answer() {
    // A Bloom filter of one page, saturated with many fingerprints, passes nearly
    // everything: new fingerprints get buffered as Bloom false positives.
    let config = DiskIndexConfig {
        memory_budget: 16 << 10,
        expected_fingerprints: 10,
        buffered_chunk_bytes: 64,
        bft: 8,
        ..DiskIndexConfig::default()
    };
    let mut driver = Driver::new(
        DiskIndex::create(MemIo::new(), config, Lookup::Lazy).unwrap(),
        0,
    );
    let mut oracle = Oracle::default();
    let mut token = 0;
    for id in 0..20_000 {
        oracle.submit(id, token);
        driver.submit(id, token).unwrap();
        token += 1;
    }
    driver.finish().unwrap();
    assert!(driver.index.bloom_false_positive_rate() > 0.9);
    let before = driver.index.metrics().waited;
    // New fingerprints, each twice in a row: the second follows the buffered first.
    for id in 1_000_000..1_000_200u64 {
        for _ in 0..2 {
            oracle.submit(id, token);
            driver.submit(id, token).unwrap();
            token += 1;
        }
    }
    driver.finish().unwrap();
    let m = driver.index.metrics();
    assert!(m.bloom_false_positives > 150, "{m}");
    assert!(m.waited - before >= 150, "{m}");
    for (t, expected) in &oracle.expected {
        assert_eq!(driver.answers.get(t), Some(expected), "token {t}");
    }
}

/// The lazy lookup makes far fewer on-disk lookup I/Os than the eager one on a
/// workload with locality, and prelookup and postlookup both answer some fingerprints.
#[test]
fn lazy_batches_lookups_that_eager_makes_one_by_one() {
    let workload = generations(7, 4, 20_000);
    let config = DiskIndexConfig {
        // The eager cache holds about 8000 fingerprints of the 22 000 indexed.
        memory_budget: 1 << 20,
        expected_fingerprints: 25_000,
        buffered_chunk_bytes: 1024,
        ..DiskIndexConfig::default()
    };
    let eager = run_against_oracle(&workload, &config, Lookup::Eager, 4, false);
    let lazy = run_against_oracle(&workload, &config, Lookup::Lazy, 4, false);
    let (e, l) = (eager.metrics(), lazy.metrics());
    assert!(l.lookup_ios * 2 < e.lookup_ios, "eager:\n{e}\nlazy:\n{l}");
    assert!(l.prelookup_hits > 0 && l.postlookup_hits > 0, "{l}");
}

/// Whatever the budget, the parts it covers fit in it (the lazy buffer's chunks
/// included), down to the smallest parts the index can have.
#[test]
fn the_parts_fit_in_the_memory_budget() {
    for budget in [1u64 << 20, 32 << 20, 256 << 20] {
        for lookup in [Lookup::Eager, Lookup::Lazy] {
            let config = DiskIndexConfig {
                memory_budget: budget,
                expected_fingerprints: 10_000_000,
                ..DiskIndexConfig::default()
            };
            // Real files: the table is created sparse, where memory would hold it all.
            let dir = std::env::temp_dir().join(format!(
                "larder-disk-budget-{}-{budget}-{lookup:?}",
                std::process::id()
            ));
            std::fs::create_dir_all(&dir).unwrap();
            let io = DirIo::open(&dir, false).unwrap();
            let index: DiskIndex<DirIo, u64> = DiskIndex::create(io, config, lookup).unwrap();
            let used = index.memory_estimate();
            std::fs::remove_dir_all(&dir).unwrap();
            assert!(used <= budget, "{lookup:?} at {budget}: {used}");
            assert!(
                used > budget / 2,
                "{lookup:?} at {budget}: only {used} used"
            );
        }
    }
}

#[test]
fn abandon_hands_back_every_unresolved_token() {
    let config = config(1 << 20, 100, 32);
    let mut index: DiskIndex<MemIo, u64> =
        DiskIndex::create(MemIo::new(), config.clone(), Lookup::Lazy).unwrap();
    for id in 0..50 {
        index.submit(fp(id), id).unwrap();
    }
    let news: Vec<_> = std::iter::from_fn(|| index.poll()).collect();
    for r in &news {
        index.insert(r.fp, loc(r.token)).unwrap();
    }
    index.sync().unwrap();
    let io = index.into_io_unsynced();
    // Reopened with a cold cache: known fingerprints pass the Bloom filter and wait in
    // the buffer (fewer than BFT per bucket), plus a pending one with a waiter.
    let mut index: DiskIndex<MemIo, u64> = DiskIndex::open(io, config, Lookup::Lazy).unwrap();
    for id in 0..10 {
        index.submit(fp(id), 100 + id).unwrap();
    }
    index.submit(fp(999), 200).unwrap();
    index.submit(fp(999), 201).unwrap();
    let answered: Vec<u64> = std::iter::from_fn(|| index.poll())
        .map(|r| r.token)
        .collect();
    let mut back: Vec<u64> = index.abandon().into_iter().map(|(t, _)| t).collect();
    back.extend(answered);
    back.sort_unstable();
    let mut all: Vec<u64> = (100..110).collect();
    all.extend([200, 201]);
    assert_eq!(back, all);
    assert_eq!(index.unresolved(), 0);
}

fn filled_index(lookup: Lookup) -> (MemIo, DiskIndexConfig) {
    let config = config(64 << 10, 500, 8);
    let mut driver = Driver::new(
        DiskIndex::create(MemIo::new(), config.clone(), lookup).unwrap(),
        0,
    );
    for id in 0..3000 {
        driver.submit(id, id).unwrap();
    }
    driver.finish().unwrap();
    (driver.index.close().unwrap(), config)
}

/// Reopening answers exactly what the index answered before it was closed, with the
/// Bloom filter loaded from its file or, when that file is gone, rebuilt.
#[test]
fn a_reopened_index_answers_identically() {
    for lookup in [Lookup::Eager, Lookup::Lazy] {
        for drop_bloom in [false, true] {
            let (mut io, config) = filled_index(lookup);
            if drop_bloom {
                io.create(IndexFile::Bloom).unwrap();
            }
            let mut driver = Driver::new(DiskIndex::open(io, config, lookup).unwrap(), 0);
            for id in 0..4000 {
                driver.submit(id, 10_000 + id).unwrap();
            }
            driver.finish().unwrap();
            for id in 0..4000u64 {
                let expected = if id < 3000 {
                    Answer::Duplicate(loc(id))
                } else {
                    Answer::New
                };
                assert_eq!(driver.answers[&(10_000 + id)], expected, "id {id}");
            }
        }
    }
}

/// A crash (no sync) after writes leaves a dirty table, which `open` refuses.
#[test]
fn an_index_not_synced_after_writes_needs_a_rebuild() {
    let (io, config) = filled_index(Lookup::Lazy);
    let mut driver = Driver::new(
        DiskIndex::open(io, config.clone(), Lookup::Lazy).unwrap(),
        0,
    );
    for id in 5000..9000 {
        driver.submit(id, id).unwrap();
    }
    driver.finish().unwrap();
    let io = driver.index.into_io_unsynced();
    assert!(matches!(
        DiskIndex::<_, u64>::open(io, config, Lookup::Lazy),
        Err(IndexError::NeedsRebuild)
    ));
}

/// Damaged bytes give a clear error, never a panic or a wrong answer.
#[test]
fn damaged_files_are_refused_with_a_clear_error() {
    let flip = |file: IndexFile, at: usize| {
        let (mut io, config) = filled_index(Lookup::Eager);
        let data = io.file_mut(file).unwrap();
        let at = at.min(data.len() - 1);
        data[at] ^= 0x40;
        (io, config)
    };
    // The table header, and the metadata header.
    for (file, at) in [(IndexFile::Table, 20), (IndexFile::Meta, 3)] {
        let (io, config) = flip(file, at);
        let err = DiskIndex::<_, u64>::open(io, config, Lookup::Eager)
            .err()
            .expect("refused");
        assert!(matches!(err, IndexError::Corrupt { .. }), "{err}");
        assert!(err.to_string().contains("rebuild"), "{err}");
    }
    // A bucket page: every lookup that reads it fails, the others work.
    let (io, config) = flip(IndexFile::Table, PAGE + 100);
    let mut index: DiskIndex<_, u64> = DiskIndex::open(io, config, Lookup::Eager).unwrap();
    let mut corrupt = 0;
    for id in 0..3000 {
        match index.submit(fp(id), id) {
            Ok(()) => {}
            Err(IndexError::Corrupt { file, .. }) => {
                assert_eq!(file, "table");
                corrupt += 1;
            }
            Err(e) => panic!("{e}"),
        }
    }
    assert!(corrupt > 0);
    // A metadata page: prefetches that read it fail with Corrupt.
    let (io, config) = flip(IndexFile::Meta, 2 * PAGE + 7);
    let mut index: DiskIndex<_, u64> = DiskIndex::open(io, config, Lookup::Eager).unwrap();
    let errors = (0..3000)
        .filter(|&id| {
            matches!(
                index.submit(fp(id), id),
                Err(IndexError::Corrupt { file: "meta", .. })
            )
        })
        .count();
    assert!(errors > 0);
    // A damaged Bloom file is rebuilt from the metadata array, not trusted.
    let (io, config) = flip(IndexFile::Bloom, PAGE + 5);
    let mut driver = Driver::new(DiskIndex::open(io, config, Lookup::Eager).unwrap(), 0);
    for id in 0..3000 {
        driver.submit(id, 10_000 + id).unwrap();
    }
    assert!(driver.answers.values().all(|a| *a != Answer::New));
}

/// The same through real files, in a directory.
#[test]
fn real_files_round_trip_through_a_directory() {
    let dir = std::env::temp_dir().join(format!("larder-disk-index-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = config(64 << 10, 2000, 16);
    let mut driver = Driver::new(
        DiskIndex::create(
            DirIo::open(&dir, false).unwrap(),
            config.clone(),
            Lookup::Lazy,
        )
        .unwrap(),
        2,
    );
    for id in 0..5000 {
        driver.submit(id % 3000, id).unwrap();
    }
    driver.finish().unwrap();
    driver.index.close().unwrap();
    let mut driver = Driver::new(
        DiskIndex::open(DirIo::open(&dir, false).unwrap(), config, Lookup::Eager).unwrap(),
        0,
    );
    for id in 0..3000 {
        driver.submit(id, 10_000 + id).unwrap();
    }
    driver.finish().unwrap();
    for id in 0..3000u64 {
        assert_eq!(driver.answers[&(10_000 + id)], Answer::Duplicate(loc(id)));
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Writes the `disk_index` fuzz target's seed (fuzz/seeds/disk_index/seed-index): a
/// small synced index with overflow chains, as one byte giving the table's length in
/// pages, then the table file, then the metadata file. Run by hand when the format changes:
/// `cargo test -p larder-index --test disk -- --ignored write_the_fuzz_seed`.
#[test]
#[ignore = "writes fuzz/seeds/disk_index; run by hand"]
fn write_the_fuzz_seed() {
    let config = config(64 << 10, 100, 4);
    let mut driver = Driver::new(
        DiskIndex::create(MemIo::new(), config, Lookup::Lazy).unwrap(),
        0,
    );
    for id in 0..200 {
        driver.submit(id, id).unwrap();
    }
    driver.finish().unwrap();
    let mut io = driver.index.close().unwrap();
    let table = io.file_mut(IndexFile::Table).unwrap().clone();
    let meta = io.file_mut(IndexFile::Meta).unwrap().clone();
    let mut seed = vec![u8::try_from(table.len() / PAGE).unwrap()];
    seed.extend_from_slice(&table);
    seed.extend_from_slice(&meta);
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/seeds/disk_index");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("seed-index"), seed).unwrap();
}

/// A crash at any write of a sync (simulated by failing every write from the k-th on
/// and dropping the index) leaves either a dirty table, which `open` refuses, or the
/// state of the last completed sync, which answers exactly as before.
#[test]
fn a_crash_at_any_write_of_a_sync_is_refused_or_invisible() {
    let (synced, config) = filled_index(Lookup::Eager);
    let (mut refused, mut completed) = (0, 0);
    for k in (0..40).step_by(6) {
        let mut index: DiskIndex<MemIo, u64> =
            DiskIndex::open(synced.clone(), config.clone(), Lookup::Eager).unwrap();
        let mut driver = Driver::new(index, 0);
        for id in 3000..3400 {
            driver.submit(id, id).unwrap();
        }
        driver.finish().unwrap();
        index = driver.index;
        index.io_mut().fail_writes_after(k);
        let synced_now = index.sync().is_ok();
        let mut io = index.into_io_unsynced();
        io.heal();
        match DiskIndex::<_, u64>::open(io, config.clone(), Lookup::Eager) {
            Err(IndexError::NeedsRebuild) => {
                assert!(!synced_now, "k = {k}");
                refused += 1;
            }
            Err(e) => panic!("k = {k}: {e}"),
            Ok(index) => {
                completed += usize::from(synced_now);
                let expected_len = if synced_now { 3400 } else { 3000 };
                assert_eq!(index.len(), expected_len, "k = {k}");
                let mut driver = Driver::new(index, 0);
                for id in 0..expected_len {
                    driver.submit(id, 10_000 + id).unwrap();
                }
                driver.finish().unwrap();
                assert!(
                    (0..expected_len)
                        .all(|id| driver.answers[&(10_000 + id)] == Answer::Duplicate(loc(id))),
                    "k = {k}"
                );
            }
        }
    }
    assert!(
        refused > 0 && completed > 0,
        "{refused} refused, {completed} completed"
    );
}

/// Regression: an eager lookup that failed was retried after later submits, so a later
/// copy of a new fingerprint could be answered `New` and the first `Duplicate` of it.
/// Submits behind a failed lookup now wait in order.
#[test]
fn eager_answers_stay_in_submission_order_after_a_failed_lookup() {
    let config = config(16 << 10, 10, 8);
    let mut driver = Driver::new(
        DiskIndex::create(MemIo::new(), config, Lookup::Eager).unwrap(),
        0,
    );
    // Saturate the one-page Bloom filter so that new fingerprints pass it.
    for id in 0..10_000 {
        driver.submit(id, id).unwrap();
    }
    driver.finish().unwrap();
    let mut tested = 0;
    for id in 1_000_000..1_000_040u64 {
        if !driver.index.bloom().may_contain(&fp(id)) {
            continue;
        }
        tested += 1;
        let (first, second) = (2 * id, 2 * id + 1);
        driver.index.io_mut().fail_reads_after(0);
        assert!(driver.submit(id, first).is_err());
        driver.index.io_mut().heal();
        driver.submit(id, second).unwrap();
        driver.finish().unwrap();
        assert_eq!(driver.answers[&first], Answer::New);
        assert_eq!(driver.answers[&second], Answer::Duplicate(loc(first)));
    }
    assert!(tested > 10);
}

/// `hasten` answers a buffered fingerprint now, with the rest of its bucket, and
/// leaves the other buckets waiting; on a fingerprint not buffered it does nothing.
#[test]
fn hasten_looks_up_one_bucket_now() {
    let (io, config) = filled_index(Lookup::Lazy);
    let mut index: DiskIndex<MemIo, u64> = DiskIndex::open(io, config, Lookup::Lazy).unwrap();
    // Reopened, the cache is empty: old fingerprints wait in the buffer.
    let ids: Vec<u64> = (0..6).map(|i| i * 401).collect();
    for (token, &id) in ids.iter().enumerate() {
        index.submit(fp(id), token as u64).unwrap();
    }
    assert!(index.poll().is_none(), "buffered, not answered");
    let waiting = index.unresolved();
    index.hasten(&fp(ids[2])).unwrap();
    let answered: Vec<_> = std::iter::from_fn(|| index.poll()).collect();
    assert!(answered.iter().any(|r| r.token == 2));
    assert!(answered
        .iter()
        .all(|r| matches!(r.answer, Answer::Duplicate(_)) && r.fp == fp(ids[r.token as usize])));
    assert_eq!(index.unresolved(), waiting - answered.len());
    assert!(index.unresolved() > 0, "other buckets still wait");
    index.hasten(&fp(ids[2])).unwrap();
    index.hasten(&fp(999_999)).unwrap();
    assert!(index.poll().is_none());
    index.finish().unwrap();
    assert_eq!(
        std::iter::from_fn(|| index.poll()).count(),
        waiting - answered.len()
    );
}

/// Runs still waiting at a clean close are listed in the table's header and taken up
/// at open; a `runs` file cut short is refused as corrupt (the repository then
/// rebuilds the index from its containers).
#[test]
fn waiting_runs_survive_a_close_and_a_short_runs_file_is_refused() {
    let (mut io, config) = filled_index(Lookup::Eager);
    let runs = io
        .file_mut(IndexFile::Runs)
        .expect("runs were spilled")
        .clone();
    assert!(!runs.is_empty());
    let mut index: DiskIndex<MemIo, u64> =
        DiskIndex::open(io.clone(), config.clone(), Lookup::Eager).unwrap();
    for id in (0..3000).step_by(97) {
        assert!(index.get(&fp(id)).unwrap().is_some(), "fingerprint {id}");
    }
    io.file_mut(IndexFile::Runs)
        .unwrap()
        .truncate(runs.len() - PAGE);
    assert!(matches!(
        DiskIndex::<MemIo, u64>::open(io, config, Lookup::Eager),
        Err(IndexError::Corrupt { file: "runs", .. })
    ));
}

/// Regression: a merge that extended a chain wrote the overflow page naming a new page
/// before the new page itself, so a write failing between the two left a chain naming
/// a page past the end of the table, and every later lookup of that bucket failed even
/// after the failure healed. Failing the k-th write of a stream that merges into long
/// chains, for every k in turn: one failure, healed, is the last, and the index then
/// answers every fingerprint exactly.
#[test]
fn a_write_failure_anywhere_in_a_merge_heals() {
    let config = config(16 << 10, 100, 4);
    let ids = 0..600u64;
    let mut merged_with_chains = 0;
    // The stream makes about 100 writes: k = 0..100 fails each in turn.
    for k in 0..100 {
        let mut driver = Driver::new(
            DiskIndex::create(MemIo::new(), config.clone(), Lookup::Eager).unwrap(),
            0,
        );
        driver.index.io_mut().fail_writes_after(k);
        let mut failures = 0;
        for id in ids.clone() {
            if driver.submit(id, id).is_err() {
                failures += 1;
                driver.index.io_mut().heal();
            }
        }
        if driver.finish().is_err() {
            failures += 1;
            driver.index.io_mut().heal();
            driver
                .finish()
                .unwrap_or_else(|e| panic!("k = {k}: a healed index still fails: {e}"));
        }
        assert!(
            failures <= 1,
            "k = {k}: {failures} failures from one injection"
        );
        let buckets = driver.index.buckets().0;
        let table = driver
            .index
            .io_mut()
            .file_mut(IndexFile::Table)
            .unwrap()
            .len();
        if failures == 1
            && driver.index.metrics().merges > 0
            && table > (1 + buckets as usize) * PAGE
        {
            merged_with_chains += 1;
        }
        for id in ids.clone() {
            assert_eq!(driver.answers[&id], Answer::New, "k = {k}, id {id}");
            assert_eq!(
                driver.index.get(&fp(id)).unwrap(),
                Some(loc(id)),
                "k = {k}, id {id}"
            );
        }
    }
    assert!(merged_with_chains > 40, "{merged_with_chains}");
}

/// `unlock` hands a pending fingerprint to the first copy waiting on it (answered `New`
/// in its turn, the others following it), or forgets it when none waits; `checkpoint`
/// syncs with fingerprints still pending, and a reopened index answers what was
/// inserted and nothing that was only pending.
#[test]
fn unlock_hands_a_new_fingerprint_to_its_first_waiter() {
    for lookup in [Lookup::Eager, Lookup::Lazy] {
        let config = config(64 << 10, 500, 4);
        let mut index: DiskIndex<MemIo, u64> =
            DiskIndex::create(MemIo::new(), config.clone(), lookup).unwrap();
        for token in 0..3 {
            index.submit(fp(7), token).unwrap();
        }
        index.submit(fp(8), 10).unwrap();
        index.finish().unwrap();
        let answers: Vec<_> = std::iter::from_fn(|| index.poll()).collect();
        assert_eq!(answers.len(), 2);
        assert!(answers.iter().all(|r| r.answer == Answer::New));
        assert!(index.is_pending(&fp(7)) && index.is_pending(&fp(8)));
        // Token 0's writer never acknowledges: token 1 takes over, token 2 follows it.
        assert!(index.unlock(&fp(7)));
        let next = index.poll().unwrap();
        assert_eq!((next.token, next.answer), (1, Answer::New));
        assert!(index.poll().is_none());
        index.insert(fp(7), loc(1)).unwrap();
        let follower = index.poll().unwrap();
        assert_eq!(
            (follower.token, follower.answer),
            (2, Answer::Duplicate(loc(1)))
        );
        // Nobody waits on fp(8): it is forgotten, and a later copy is new again.
        assert!(!index.unlock(&fp(8)));
        assert!(!index.is_pending(&fp(8)));
        assert!(!index.unlock(&fp(9)));
        index.submit(fp(8), 11).unwrap();
        index.finish().unwrap();
        assert_eq!(index.poll().unwrap().answer, Answer::New);
        assert!(index.sync().is_err(), "sync refuses while fp(8) is pending");
        index.checkpoint().unwrap();
        let mut reopened: DiskIndex<MemIo, u64> =
            DiskIndex::open(index.into_io_unsynced(), config, lookup).unwrap();
        assert_eq!(reopened.get(&fp(7)).unwrap(), Some(loc(1)));
        assert_eq!(reopened.get(&fp(8)).unwrap(), None);
    }
}
