//! `larder bench index`: eager against lazy lookup in the disk index (larder-index's
//! `disk`, docs/design/disk-index.md), after the Lazy Exact Deduplication paper's
//! Tables V to VII and Fig. 12, on larder-gen's multi-generation chunk-id stream
//! ([`larder_gen::fingerprint_stream`]) with an index many times the memory budget.
//!
//! Every run gets a fresh index in its own directory and the same stream; each
//! generation ends with `finish` and `sync`, as a backup does, and each new chunk is
//! inserted [`DiskIndexPlan::insert_delay`] answers after it was answered, as the
//! engine's writer does. Every answer is checked against a `HashSet` oracle: a run
//! that answers one fingerprint wrongly fails the benchmark. The text is
//! [`crate::disk_index_text`], the plots [`crate::disk_index_plots`];
//! `docs/design/bench.md` describes the experiment.

use std::collections::{HashSet, VecDeque};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use larder_gen::fingerprint_stream;
use larder_index::disk::{
    Answer, ComponentTimes, DirIo, DiskIndex, DiskIndexConfig, DiskIndexMetrics, Lookup,
};
use serde::Serialize;

use crate::disk_index_plots::disk_index_plots;
use crate::disk_index_text::report_markdown;
pub use crate::disk_index_text::report_tables;
use crate::index::{key, location};
use crate::plot::{PlotFile, Spread};
use crate::report_all::Machine;
use crate::BenchError;

/// One kind of run: eager (BFT does not apply: one configuration), or lazy with or
/// without prelookup (one configuration per BFT).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum RunKind {
    Eager,
    Lazy,
    LazyNoPrelookup,
}

impl RunKind {
    pub const ALL: [RunKind; 3] = [RunKind::Eager, RunKind::Lazy, RunKind::LazyNoPrelookup];

    /// The name `--lookup` takes.
    pub fn name(self) -> &'static str {
        match self {
            RunKind::Eager => "eager",
            RunKind::Lazy => "lazy",
            RunKind::LazyNoPrelookup => "lazy-no-prelookup",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.name() == name)
    }

    /// How tables and legends name it.
    pub fn title(self) -> &'static str {
        match self {
            RunKind::Eager => "eager",
            RunKind::Lazy => "lazy",
            RunKind::LazyNoPrelookup => "lazy, no prelookup",
        }
    }
}

/// Whether the index files bypass the page cache (`--direct`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum DirectMode {
    /// `O_DIRECT` where the scratch directory's filesystem allows it (not with
    /// `--drop-caches`, which then keeps the page cache out instead).
    Auto,
    /// `O_DIRECT`, or an error.
    On,
    Off,
}

/// Everything `larder bench index` measures.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DiskIndexPlan {
    pub seed: u64,
    /// Chunks of the first generation (before its repeats).
    pub first_generation: usize,
    pub generations: usize,
    /// `--index-memory`: Bloom filter, cache, insert buffer and lazy buffer together.
    pub memory_budget: u64,
    /// BFTs of the lazy runs.
    pub bfts: Vec<usize>,
    pub kinds: Vec<RunKind>,
    /// Timed runs of each configuration, interleaved.
    pub runs: usize,
    pub direct: DirectMode,
    /// Sync and drop the page cache before each run (root only).
    pub drop_caches: bool,
    /// Answers between a chunk's `New` and its insert.
    pub insert_delay: usize,
    /// `DiskIndexConfig::batch_gap_pages` of the lazy runs (`u64::MAX`, the default:
    /// one read per batch, as the paper).
    pub batch_gap_pages: u64,
    /// `DiskIndexConfig::buffered_chunk_bytes` of the lazy runs: 0 (the default) as a
    /// backup configures the index, whose stage 3 holds the waiting chunks in its own
    /// share of `--index-memory`; the average chunk (8192) reserves them inside the
    /// index's budget, as the paper does, which leaves the buffer fewer buckets.
    pub buffered_chunk_bytes: u64,
    /// Where the runs' index directories are made (in a temporary directory, removed
    /// at the end).
    pub dir: PathBuf,
}

impl DiskIndexPlan {
    /// The defaults: a first generation of 500 000 chunks (5 generations, 2 977 832
    /// chunks, 579 163 distinct: an index of about 72 MiB) under an 8 MiB budget, BFT
    /// 4 to 64, 3 runs; `quick`: 20 000 chunks under 2 MiB (an index of 2.9 MiB), one
    /// run: a smaller budget leaves the lazy buffer one bucket, whose batches read
    /// the whole table.
    pub fn new(quick: bool) -> Self {
        Self {
            seed: 1,
            first_generation: if quick { 20_000 } else { 500_000 },
            generations: 5,
            memory_budget: if quick { 2 << 20 } else { 8 << 20 },
            bfts: vec![4, 8, 16, 32, 48, 64],
            kinds: RunKind::ALL.to_vec(),
            runs: if quick { 1 } else { 3 },
            direct: DirectMode::Auto,
            drop_caches: false,
            insert_delay: 64,
            batch_gap_pages: DiskIndexConfig::default().batch_gap_pages,
            buffered_chunk_bytes: 0,
            dir: std::env::temp_dir(),
        }
    }

    /// The runs, in the order they are made and reported: eager, then lazy at each
    /// BFT, then lazy without prelookup at each BFT.
    pub fn configurations(&self) -> Vec<(RunKind, Option<usize>)> {
        let mut out = Vec::new();
        for kind in RunKind::ALL {
            if !self.kinds.contains(&kind) {
                continue;
            }
            match kind {
                RunKind::Eager => out.push((kind, None)),
                _ => out.extend(self.bfts.iter().map(|&b| (kind, Some(b)))),
            }
        }
        out
    }
}

/// How the page cache was kept out of the figures.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CacheMethod {
    pub direct: bool,
    pub drop_caches: bool,
    /// One sentence for the output.
    pub note: String,
}

/// The counters of one run (the same in every repetition): the index's metrics
/// without their times, which [`Seconds`] holds.
fn counts_of(m: &DiskIndexMetrics) -> DiskIndexMetrics {
    DiskIndexMetrics {
        time: ComponentTimes::default(),
        ..*m
    }
}

/// Seconds per component of the index's calls (the paper's Tables V and VII), and
/// the wall clock of the whole run, each over the repetitions.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Seconds {
    pub bloom: Spread,
    pub prelookup: Spread,
    pub disk_lookup: Spread,
    pub prefetch: Spread,
    pub postlookup: Spread,
    /// Insert-buffer flushes: the writes of `insert` and `sync`.
    pub flush: Spread,
    /// The index's time outside the components above (buffering, answering, inserts).
    pub other: Spread,
    /// Everything inside the index's calls.
    pub total: Spread,
    /// The run start to end, the driver and the oracle check included.
    pub wall: Spread,
}

/// One configuration's results.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunResult {
    pub kind: RunKind,
    /// `None` for eager.
    pub bft: Option<usize>,
    pub table_buckets: u64,
    /// Lazy buffer buckets (0 for eager).
    pub buffer_buckets: u64,
    /// Fingerprints the cache holds.
    pub cache_fingerprints: usize,
    pub counts: DiskIndexMetrics,
    /// Whether every repetition counted exactly the same (the index is deterministic;
    /// if not, the counts are the first repetition's).
    pub counts_identical: bool,
    /// Fingerprints answered `New`: checked equal to the oracle's.
    pub new_chunks: u64,
    /// Bytes of the index's files at the end.
    pub index_bytes: u64,
    /// The Bloom filter's predicted false-positive rate at the end.
    pub bloom_rate: f64,
    pub seconds: Seconds,
}

impl RunResult {
    /// "eager", "lazy, BFT 32", "lazy, no prelookup, BFT 32".
    pub fn label(&self) -> String {
        match self.bft {
            None => self.kind.title().to_string(),
            Some(b) => format!("{}, BFT {b}", self.kind.title()),
        }
    }
}

/// What `larder bench index` measured.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DiskIndexReport {
    pub plan: DiskIndexPlan,
    pub machine: Machine,
    pub cache: CacheMethod,
    /// Chunks per generation, repeats included.
    pub generation_chunks: Vec<usize>,
    pub chunks: u64,
    pub distinct: u64,
    pub runs: Vec<RunResult>,
    pub seconds: f64,
}

impl DiskIndexReport {
    pub fn eager(&self) -> Option<&RunResult> {
        self.runs.iter().find(|r| r.kind == RunKind::Eager)
    }

    pub fn lazy(&self, kind: RunKind, bft: usize) -> Option<&RunResult> {
        self.runs
            .iter()
            .find(|r| r.kind == kind && r.bft == Some(bft))
    }

    /// The BFT the paper's tables compare at: the index's default (32, the paper's)
    /// if it was run, else the first.
    pub fn reference_bft(&self) -> Option<usize> {
        let default = DiskIndexConfig::default().bft;
        if self.plan.bfts.contains(&default) {
            Some(default)
        } else {
            self.plan.bfts.first().copied()
        }
    }

    /// The largest index of the runs, in bytes (all are sized alike).
    pub fn index_bytes(&self) -> u64 {
        self.runs.iter().map(|r| r.index_bytes).max().unwrap_or(0)
    }
}

/// The report, the files written, and where.
pub struct DiskIndexResults {
    pub report: DiskIndexReport,
    pub plots: Vec<PlotFile>,
    pub report_path: PathBuf,
}

/// One page written to and read back from `path`, opened with `O_DIRECT`.
#[cfg(not(target_os = "linux"))]
fn direct_round_trip(_: &Path) -> std::io::Result<()> {
    Err(std::io::Error::new(
        std::io::ErrorKind::Unsupported,
        "the index uses O_DIRECT on Linux only",
    ))
}

/// One page written to and read back from `path`, opened with `O_DIRECT`.
#[cfg(target_os = "linux")]
fn direct_round_trip(path: &Path) -> std::io::Result<()> {
    use larder_index::disk::{PageBuf, PAGE};
    use std::os::unix::fs::{FileExt, OpenOptionsExt};
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)?;
    let mut page = PageBuf::zeroed(PAGE);
    page[0] = 1;
    file.write_all_at(&page, 0)?;
    let mut back = PageBuf::zeroed(PAGE);
    file.read_exact_at(&mut back, 0)?;
    if back[0] != 1 {
        return Err(std::io::Error::other("read back other bytes than written"));
    }
    Ok(())
}

/// Whether `dir`'s filesystem takes `O_DIRECT` reads and writes; `Err` says why not.
fn probe_direct(dir: &Path) -> Result<(), String> {
    let path = dir.join("o_direct-probe");
    let result = direct_round_trip(&path);
    let _ = std::fs::remove_file(&path);
    result.map_err(|e| e.to_string())
}

#[cfg(not(target_os = "linux"))]
fn on_tmpfs(_: &Path) -> bool {
    false
}

/// Whether `dir` is on tmpfs, where `O_DIRECT` may work (Linux 6.6 and later) but
/// there is no disk to reach.
#[cfg(target_os = "linux")]
fn on_tmpfs(dir: &Path) -> bool {
    const TMPFS_MAGIC: i64 = 0x0102_1994;
    let Ok(path) = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()) else {
        return false;
    };
    let mut fs = std::mem::MaybeUninit::<libc::statfs>::uninit();
    // SAFETY: `path` is a NUL-terminated string and `fs` is large enough for the
    // struct statfs(2) fills; it is read only when the call succeeded.
    let ok = unsafe { libc::statfs(path.as_ptr(), fs.as_mut_ptr()) } == 0;
    // SAFETY: filled by the successful call above.
    let f_type = ok.then(|| unsafe { fs.assume_init() }.f_type);
    // `f_type`'s integer type differs between architectures.
    #[allow(clippy::unnecessary_cast)]
    let tmpfs = f_type.is_some_and(|t| t as i64 == TMPFS_MAGIC);
    tmpfs
}

const DROP_CACHES: &str = "/proc/sys/vm/drop_caches";

/// Writes back every dirty page, then drops the clean ones (page cache, dentries and
/// inodes), so that the next run's reads reach the disk.
fn drop_caches() -> Result<(), BenchError> {
    // SAFETY: sync(2) takes no arguments and cannot fail.
    unsafe { libc::sync() };
    std::fs::write(DROP_CACHES, "3\n").map_err(|source| BenchError::DropCaches { source })
}

/// Decides how reads reach the disk, checking that the choice works in `dir`.
fn cache_method(plan: &DiskIndexPlan, dir: &Path) -> Result<CacheMethod, BenchError> {
    let probe = match plan.direct {
        DirectMode::Off => None,
        DirectMode::Auto if plan.drop_caches => None,
        DirectMode::Auto | DirectMode::On => Some(probe_direct(dir)),
    };
    if plan.direct == DirectMode::On {
        if let Some(Err(reason)) = &probe {
            return Err(BenchError::DirectUnsupported {
                dir: dir.to_path_buf(),
                reason: reason.clone(),
            });
        }
    }
    if plan.drop_caches {
        drop_caches()?;
    }
    let direct = matches!(probe, Some(Ok(())));
    let note = match (direct, plan.drop_caches, &probe) {
        (true, false, _) => "O_DIRECT: the index files bypass the page cache, so every read reaches the disk".to_string(),
        (true, true, _) => "O_DIRECT, and the page cache dropped before each run".to_string(),
        (false, true, _) => "the page cache dropped (sync; echo 3 > /proc/sys/vm/drop_caches) before each run; within a run, pages the run itself wrote or read may be read from memory".to_string(),
        (false, false, Some(Err(reason))) => format!(
            "through the page cache: O_DIRECT is not available in {} ({reason}); reads may come from memory, not the disk",
            dir.display()
        ),
        (false, false, _) => "through the page cache (--direct off): reads may come from memory, not the disk".to_string(),
    };
    let note = if on_tmpfs(dir) {
        format!(
            "{note} ({} is on tmpfs: there is no disk, every read is from memory)",
            dir.display()
        )
    } else {
        note
    };
    Ok(CacheMethod {
        direct,
        drop_caches: plan.drop_caches,
        note,
    })
}

/// The workload, flattened: ids in submission order, where each generation ends, and
/// whether each submission is the first of its id (the `HashSet` oracle's answer
/// `New`).
struct Workload {
    ids: Vec<u64>,
    generation_ends: Vec<usize>,
    first: Vec<bool>,
    distinct: u64,
}

impl Workload {
    fn new(plan: &DiskIndexPlan) -> Self {
        let gens =
            fingerprint_stream::generations(plan.seed, plan.generations, plan.first_generation);
        let distinct = fingerprint_stream::distinct(&gens);
        let mut generation_ends = Vec::with_capacity(gens.len());
        let mut ids = Vec::with_capacity(gens.iter().map(Vec::len).sum());
        for g in gens {
            ids.extend_from_slice(&g);
            generation_ends.push(ids.len());
        }
        let mut seen = HashSet::with_capacity(distinct as usize);
        let first = ids.iter().map(|&id| seen.insert(id)).collect();
        Self {
            ids,
            generation_ends,
            first,
            distinct,
        }
    }
}

/// One repetition of one configuration.
struct Measured {
    counts: DiskIndexMetrics,
    times: [Duration; 8],
    wall: Duration,
    table_buckets: u64,
    buffer_buckets: u64,
    cache_fingerprints: usize,
    new_chunks: u64,
    index_bytes: u64,
    bloom_rate: f64,
}

/// Checks each answer against the oracle as it comes, and inserts each `New` later.
struct Checker<'a> {
    workload: &'a Workload,
    answered: Vec<bool>,
    to_insert: VecDeque<u64>,
    news: u64,
    run: String,
}

impl Checker<'_> {
    fn wrong(&self, detail: String) -> BenchError {
        BenchError::Inexact {
            run: self.run.clone(),
            detail,
        }
    }

    /// Takes every answer out of `index`, then inserts the oldest `New` chunks until
    /// at most `keep` wait.
    fn drain(&mut self, index: &mut DiskIndex<DirIo, u64>, keep: usize) -> Result<(), BenchError> {
        loop {
            while let Some(r) = index.poll() {
                let token = r.token as usize;
                let id = self.workload.ids[token];
                if std::mem::replace(&mut self.answered[token], true) {
                    return Err(self.wrong(format!("submission {token} answered twice")));
                }
                if r.fp != key(id) {
                    return Err(self.wrong(format!(
                        "submission {token} answered for another fingerprint"
                    )));
                }
                match (r.answer, self.workload.first[token]) {
                    (Answer::New, true) => {
                        self.news += 1;
                        self.to_insert.push_back(r.token);
                    }
                    (Answer::Duplicate(at), false) if at == location(id) => {}
                    (answer, first) => {
                        return Err(self.wrong(format!(
                        "submission {token} (chunk {id}) answered {answer:?}; the oracle says {}",
                        if first {
                            "new".to_string()
                        } else {
                            format!("duplicate at {:?}", location(id))
                        }
                    )))
                    }
                }
            }
            if self.to_insert.len() <= keep {
                return Ok(());
            }
            let token = self.to_insert.pop_front().expect("longer than keep");
            let id = self.workload.ids[token as usize];
            index.insert(key(id), location(id))?;
        }
    }
}

fn measure(
    plan: &DiskIndexPlan,
    workload: &Workload,
    kind: RunKind,
    bft: Option<usize>,
    method: &CacheMethod,
    dir: &Path,
    run: String,
) -> Result<Measured, BenchError> {
    std::fs::create_dir_all(dir).map_err(|e| BenchError::io(dir, e))?;
    let config = DiskIndexConfig {
        memory_budget: plan.memory_budget,
        expected_fingerprints: workload.distinct,
        bft: bft.unwrap_or(DiskIndexConfig::default().bft),
        prelookup: kind != RunKind::LazyNoPrelookup,
        batch_gap_pages: plan.batch_gap_pages,
        buffered_chunk_bytes: plan.buffered_chunk_bytes,
        ..DiskIndexConfig::default()
    };
    let lookup = match kind {
        RunKind::Eager => Lookup::Eager,
        RunKind::Lazy | RunKind::LazyNoPrelookup => Lookup::Lazy,
    };
    let io = DirIo::open(dir, method.direct).map_err(|e| BenchError::io(dir, e))?;
    let mut index: DiskIndex<DirIo, u64> = DiskIndex::create(io, config, lookup)?;
    if method.drop_caches {
        drop_caches()?;
    }
    let (table_buckets, buffer_buckets) = index.buckets();
    let mut checker = Checker {
        workload,
        answered: vec![false; workload.ids.len()],
        to_insert: VecDeque::new(),
        news: 0,
        run,
    };
    let started = Instant::now();
    let mut token = 0usize;
    for &end in &workload.generation_ends {
        while token < end {
            index.submit(key(workload.ids[token]), token as u64)?;
            token += 1;
            checker.drain(&mut index, plan.insert_delay)?;
        }
        index.finish()?;
        checker.drain(&mut index, 0)?;
        index.sync()?;
    }
    let wall = started.elapsed();
    if let Some(t) = checker.answered.iter().position(|a| !a) {
        return Err(checker.wrong(format!("submission {t} never answered")));
    }
    if checker.news != workload.distinct {
        return Err(checker.wrong(format!(
            "{} new chunks, the oracle {}",
            checker.news, workload.distinct
        )));
    }
    let m = *index.metrics();
    let t = &m.time;
    let other = t.total.saturating_sub(
        t.bloom + t.prelookup + t.disk_lookup + t.prefetch + t.postlookup + t.flush,
    );
    Ok(Measured {
        counts: counts_of(&m),
        times: [
            t.bloom,
            t.prelookup,
            t.disk_lookup,
            t.prefetch,
            t.postlookup,
            t.flush,
            other,
            t.total,
        ],
        wall,
        table_buckets,
        buffer_buckets,
        cache_fingerprints: index.cache_capacity(),
        new_chunks: checker.news,
        index_bytes: index.disk_bytes(),
        bloom_rate: index.bloom_false_positive_rate(),
    })
}

fn summarize(kind: RunKind, bft: Option<usize>, reps: &[Measured]) -> RunResult {
    let first = &reps[0];
    let spread = |i: usize| {
        Spread::of(
            &reps
                .iter()
                .map(|m| m.times[i].as_secs_f64())
                .collect::<Vec<_>>(),
        )
    };
    RunResult {
        kind,
        bft,
        table_buckets: first.table_buckets,
        buffer_buckets: first.buffer_buckets,
        cache_fingerprints: first.cache_fingerprints,
        counts: first.counts,
        counts_identical: reps.iter().all(|m| m.counts == first.counts),
        new_chunks: first.new_chunks,
        index_bytes: first.index_bytes,
        bloom_rate: first.bloom_rate,
        seconds: Seconds {
            bloom: spread(0),
            prelookup: spread(1),
            disk_lookup: spread(2),
            prefetch: spread(3),
            postlookup: spread(4),
            flush: spread(5),
            other: spread(6),
            total: spread(7),
            wall: Spread::of(
                &reps
                    .iter()
                    .map(|m| m.wall.as_secs_f64())
                    .collect::<Vec<_>>(),
            ),
        },
    }
}

/// Runs every configuration of `plan` (`plan.runs` rounds, each running every
/// configuration once), then writes `out/disk-index.md` and the plots. `command` is
/// quoted in the report; `progress` hears of each run.
pub fn run_disk_index_bench(
    plan: &DiskIndexPlan,
    out: &Path,
    command: &str,
    progress: &mut dyn FnMut(&str),
) -> Result<DiskIndexResults, BenchError> {
    let started = Instant::now();
    let scratch = tempfile::Builder::new()
        .prefix("larder-bench-index-")
        .tempdir_in(&plan.dir)
        .map_err(|e| BenchError::io(&plan.dir, e))?;
    let method = cache_method(plan, scratch.path())?;
    progress(&format!("index I/O: {}", method.note));
    let workload = Workload::new(plan);
    progress(&format!(
        "workload: {} generations, {} chunks, {} distinct",
        plan.generations,
        workload.ids.len(),
        workload.distinct
    ));
    let configurations = plan.configurations();
    let mut measured: Vec<Vec<Measured>> = configurations.iter().map(|_| Vec::new()).collect();
    for round in 0..plan.runs.max(1) {
        for (i, &(kind, bft)) in configurations.iter().enumerate() {
            let label = match bft {
                None => kind.title().to_string(),
                Some(b) => format!("{}, BFT {b}", kind.title()),
            };
            let dir = scratch.path().join(format!("run-{i}"));
            let m = measure(plan, &workload, kind, bft, &method, &dir, label.clone())?;
            std::fs::remove_dir_all(&dir).map_err(|e| BenchError::io(&dir, e))?;
            progress(&format!(
                "{label}, run {}/{}: {} on-disk lookup I/Os, index {:.2} s",
                round + 1,
                plan.runs.max(1),
                m.counts.lookup_ios,
                m.times[7].as_secs_f64()
            ));
            measured[i].push(m);
        }
    }
    let runs = configurations
        .iter()
        .zip(&measured)
        .map(|(&(kind, bft), reps)| summarize(kind, bft, reps))
        .collect();
    let report = DiskIndexReport {
        plan: plan.clone(),
        machine: Machine::this(),
        cache: method,
        generation_chunks: workload
            .generation_ends
            .iter()
            .scan(0, |prev, &end| {
                let n = end - *prev;
                *prev = end;
                Some(n)
            })
            .collect(),
        chunks: workload.ids.len() as u64,
        distinct: workload.distinct,
        runs,
        seconds: started.elapsed().as_secs_f64(),
    };
    std::fs::create_dir_all(out).map_err(|e| BenchError::io(out, e))?;
    let mut plots = Vec::new();
    for (file, svg) in disk_index_plots(&report)? {
        let path = out.join(&file.file);
        std::fs::write(&path, svg).map_err(|e| BenchError::io(&path, e))?;
        plots.push(file);
    }
    let report_path = out.join("disk-index.md");
    std::fs::write(&report_path, report_markdown(&report, &plots, command))
        .map_err(|e| BenchError::io(&report_path, e))?;
    Ok(DiskIndexResults {
        report,
        plots,
        report_path,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny(kinds: Vec<RunKind>, bfts: Vec<usize>) -> DiskIndexPlan {
        DiskIndexPlan {
            first_generation: 3000,
            generations: 3,
            memory_budget: 256 << 10,
            bfts,
            kinds,
            direct: DirectMode::Off,
            ..DiskIndexPlan::new(true)
        }
    }

    #[test]
    fn configurations_are_eager_once_and_lazy_per_bft() {
        let plan = tiny(RunKind::ALL.to_vec(), vec![4, 32]);
        assert_eq!(
            plan.configurations(),
            [
                (RunKind::Eager, None),
                (RunKind::Lazy, Some(4)),
                (RunKind::Lazy, Some(32)),
                (RunKind::LazyNoPrelookup, Some(4)),
                (RunKind::LazyNoPrelookup, Some(32)),
            ]
        );
        let plan = tiny(vec![RunKind::LazyNoPrelookup, RunKind::Eager], vec![8]);
        assert_eq!(
            plan.configurations(),
            [(RunKind::Eager, None), (RunKind::LazyNoPrelookup, Some(8))]
        );
        for kind in RunKind::ALL {
            assert_eq!(RunKind::from_name(kind.name()), Some(kind));
        }
    }

    #[test]
    fn the_oracle_marks_each_first_copy_new() {
        let w = Workload::new(&tiny(vec![RunKind::Eager], vec![4]));
        assert_eq!(w.first.iter().filter(|&&f| f).count() as u64, w.distinct);
        assert_eq!(*w.generation_ends.last().unwrap(), w.ids.len());
        let mut max = None;
        for (&id, &first) in w.ids.iter().zip(&w.first) {
            assert_eq!(first, max.is_none_or(|m| id > m));
            max = max.max(Some(id));
        }
    }

    /// The driver's oracle check fails on a wrong answer: a workload whose oracle is
    /// told every chunk is new (as if no fingerprint repeated) rejects the index's
    /// first `Duplicate`.
    #[test]
    fn a_wrong_answer_fails_the_run() {
        let plan = tiny(vec![RunKind::Eager], vec![4]);
        let mut w = Workload::new(&plan);
        w.first.iter_mut().for_each(|f| *f = true);
        let dir = tempfile::tempdir().unwrap();
        let method = cache_method(&plan, dir.path()).unwrap();
        let err = measure(
            &plan,
            &w,
            RunKind::Eager,
            None,
            &method,
            &dir.path().join("i"),
            "eager".into(),
        )
        .err()
        .expect("a wrong answer");
        assert!(matches!(err, BenchError::Inexact { .. }), "{err}");
    }

    #[test]
    fn every_run_answers_like_the_oracle_and_writes_its_files() {
        let plan = tiny(RunKind::ALL.to_vec(), vec![4, 32]);
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        let r = run_disk_index_bench(&plan, &out, "test", &mut |_| {}).unwrap();
        let report = &r.report;
        assert_eq!(report.runs.len(), 5);
        for run in &report.runs {
            assert_eq!(run.new_chunks, report.distinct, "{}", run.label());
            assert_eq!(run.counts.submitted, report.chunks, "{}", run.label());
            assert!(run.counts_identical);
        }
        assert_eq!(report.eager().unwrap().buffer_buckets, 0);
        assert!(report.lazy(RunKind::Lazy, 32).unwrap().buffer_buckets > 0);
        assert!(report.lazy(RunKind::Lazy, 4).unwrap().counts.prelookups > 0);
        assert_eq!(
            report
                .lazy(RunKind::LazyNoPrelookup, 4)
                .unwrap()
                .counts
                .prelookups,
            0
        );
        assert!(r.report_path.is_file());
        for p in &r.plots {
            assert!(out.join(&p.file).is_file(), "{}", p.file);
        }
    }
}
