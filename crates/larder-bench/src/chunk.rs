//! The FastCDC paper's chunking experiments (section 5, Figs. 9 to 11 and Table 3) as
//! pure functions over an in-memory [`Corpus`]. Only chunking is timed; fingerprinting
//! for the dedup ratio happens after the timed runs. `docs/design/bench.md` describes
//! each experiment and its settings.
//!
//! The algorithms come from [`ChunkerKind::ALL`]; a configuration that a kind rejects
//! ([`ChunkerConfig::validate`]) is skipped and noted, never an error.

use std::time::Instant;

use larder_chunk::{Chunker, ChunkerConfig, ChunkerKind};
use larder_hash::HashAlgo;
use serde::Serialize;

use crate::corpus::{Corpus, CorpusSummary};
use crate::experiment_key::build_chunker;
use crate::stats::{Dedup, DistinctChunks, LinearHistogram, SizeStats, SizeSummary};
use crate::BenchError;

const KIB: usize = 1024;

/// What to measure. Sizes are in bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Plan {
    /// Timed runs of each configuration; speeds are reported as median, min and max.
    pub runs: usize,
    pub kinds: Vec<ChunkerKind>,
    /// Expected chunk sizes of the size sweep (Fig. 10, Table 3). As in the paper's
    /// section 5.1, the minimum is 1/4 and the maximum 8 times the expected size.
    pub avg_sizes: Vec<usize>,
    /// Normalization level of the size sweep: the repository default.
    pub level: u8,
    /// The expected size whose size-sweep results give the size distributions (Fig. 9).
    pub distribution_avg: usize,
    /// Expected size of the minimum-size sweep (Fig. 11); the maximum is 8 times it.
    pub min_sweep_avg: usize,
    pub min_sizes: Vec<usize>,
    /// Normalization levels of the minimum-size sweep, for the kinds that read one:
    /// 0 is the paper's Fig. 11 (cut-point skipping alone), the default shows what
    /// normalized chunking changes (its Fig. 12).
    pub min_sweep_levels: Vec<u8>,
}

impl Plan {
    /// The paper's settings: 4 to 32 KiB expected sizes, minimum 0 to 8 KiB at 8 KiB,
    /// every kind, five runs (the paper averaged five).
    pub fn full() -> Self {
        let level = ChunkerConfig::default().level;
        Self {
            runs: 5,
            kinds: ChunkerKind::ALL.to_vec(),
            avg_sizes: vec![4 * KIB, 8 * KIB, 16 * KIB, 32 * KIB],
            level,
            distribution_avg: 8 * KIB,
            min_sweep_avg: 8 * KIB,
            min_sizes: [0, 1, 2, 3, 4, 6, 8].map(|k| k * KIB).to_vec(),
            min_sweep_levels: vec![0, level],
        }
    }

    /// Fewer runs and sizes, for a first look or a test.
    pub fn quick() -> Self {
        Self {
            runs: 1,
            avg_sizes: vec![4 * KIB, 8 * KIB],
            min_sizes: [0, 2, 4, 8].map(|k| k * KIB).to_vec(),
            ..Self::full()
        }
    }
}

/// The configuration the paper uses for an expected size: maximum 8 times it.
pub fn paper_config(kind: ChunkerKind, min: usize, avg: usize, level: u8) -> ChunkerConfig {
    ChunkerConfig {
        kind,
        min_size: min,
        avg_size: avg,
        max_size: avg * 8,
        level,
        seed: 0,
    }
}

/// Chunking speed over the timed runs, in MB/s (10^6 bytes per second).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Speed {
    pub median_mb_per_sec: f64,
    pub min_mb_per_sec: f64,
    pub max_mb_per_sec: f64,
    /// Seconds each run spent chunking the whole corpus.
    pub run_seconds: Vec<f64>,
}

impl Speed {
    fn from_runs(bytes: u64, run_seconds: Vec<f64>) -> Self {
        // A run too short for the clock to see counts as one nanosecond.
        let mut speeds: Vec<f64> = run_seconds
            .iter()
            .map(|s| bytes as f64 / 1e6 / s.max(1e-9))
            .collect();
        speeds.sort_by(f64::total_cmp);
        let n = speeds.len();
        let median = match n {
            0 => 0.0,
            _ if n % 2 == 1 => speeds[n / 2],
            _ => (speeds[n / 2 - 1] + speeds[n / 2]) / 2.0,
        };
        Self {
            median_mb_per_sec: median,
            min_mb_per_sec: speeds.first().copied().unwrap_or(0.0),
            max_mb_per_sec: speeds.last().copied().unwrap_or(0.0),
            run_seconds,
        }
    }
}

/// One configuration chunking the whole corpus.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Measurement {
    pub algo: &'static str,
    pub config: ChunkerConfig,
    pub speed: Speed,
    pub dedup: Dedup,
    pub sizes: SizeSummary,
    /// Bins of 1/8 of the expected size, up to the largest chunk the config allows.
    pub distribution: LinearHistogram,
}

/// The cut points of every stream of a corpus: `lengths[i]` are stream `i`'s chunk
/// lengths, in order. A chunk is at most 16 MiB (`ChunkerConfig`'s largest maximum),
/// so a length fits in `u32`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cuts {
    pub lengths: Vec<Vec<u32>>,
}

impl Cuts {
    /// Every chunk of the corpus, in stream order, with the index of its stream.
    fn chunks<'a>(&'a self, corpus: &'a Corpus) -> impl Iterator<Item = (usize, &'a [u8])> {
        corpus
            .streams
            .iter()
            .zip(&self.lengths)
            .enumerate()
            .flat_map(|(i, (stream, lens))| {
                let mut start = 0;
                lens.iter().map(move |&len| {
                    let end = start + len as usize;
                    let chunk = &stream.data[start..end];
                    start = end;
                    (i, chunk)
                })
            })
    }
}

fn cut_stream(chunker: &dyn Chunker, mut data: &[u8], lengths: &mut Vec<u32>) {
    while !data.is_empty() {
        let len = chunker.next_chunk_len(data);
        lengths.push(len as u32);
        data = &data[len..];
    }
}

/// Chunks every stream once (untimed).
pub fn cut(corpus: &Corpus, config: &ChunkerConfig) -> Result<Cuts, BenchError> {
    config.validate()?;
    let chunker = build_chunker(config);
    let lengths = corpus
        .streams
        .iter()
        .map(|s| {
            let mut lens = Vec::new();
            cut_stream(chunker.as_ref(), &s.data, &mut lens);
            lens
        })
        .collect();
    Ok(Cuts { lengths })
}

/// Input bytes over bytes of distinct chunks (by BLAKE3 fingerprint) across the corpus.
pub fn dedup(corpus: &Corpus, cuts: &Cuts) -> Dedup {
    let chunks: Vec<(usize, &[u8])> = cuts.chunks(corpus).collect();
    let slices: Vec<&[u8]> = chunks.iter().map(|&(_, c)| c).collect();
    let fingerprints = HashAlgo::Blake3.fingerprint_batch(&slices);
    let mut distinct = DistinctChunks::default();
    for (&(stream, chunk), fp) in chunks.iter().zip(fingerprints) {
        distinct.add(fp, chunk.len() as u64, stream);
    }
    distinct.dedup()
}

/// Chunk-size statistics and a distribution in bins of `bin_bytes`, up to `largest`.
pub fn sizes(cuts: &Cuts, bin_bytes: u64, largest: u64) -> (SizeSummary, LinearHistogram) {
    let mut stats = SizeStats::default();
    let mut distribution = LinearHistogram::new(bin_bytes, largest);
    for &len in cuts.lengths.iter().flatten() {
        stats.add(u64::from(len));
        distribution.add(u64::from(len));
    }
    (stats.summary(), distribution)
}

/// `kind min/avg/max level`, as progress and notes name a configuration.
pub fn describe(config: &ChunkerConfig) -> String {
    format!(
        "{} {}/{}/{} level {}",
        config.kind.name(),
        config.min_size,
        config.avg_size,
        config.max_size,
        config.level
    )
}

/// A configuration being measured: its chunker, the seconds of its runs so far, and
/// what its chunks say, found after its first run.
struct InProgress {
    config: ChunkerConfig,
    chunker: Box<dyn Chunker>,
    run_seconds: Vec<f64>,
    analysis: Option<(Dedup, SizeSummary, LinearHistogram)>,
}

impl InProgress {
    fn new(config: &ChunkerConfig) -> Result<Self, BenchError> {
        config.validate()?;
        Ok(Self {
            config: *config,
            chunker: build_chunker(config),
            run_seconds: Vec::new(),
            analysis: None,
        })
    }

    /// One timed run over the whole corpus, cutting into `lengths` (one vector per
    /// stream, reused across runs); after the first, the chunks are analysed, untimed.
    fn run(&mut self, corpus: &Corpus, lengths: &mut [Vec<u32>]) {
        lengths.iter_mut().for_each(Vec::clear);
        let started = Instant::now();
        for (stream, lens) in corpus.streams.iter().zip(lengths.iter_mut()) {
            cut_stream(self.chunker.as_ref(), &stream.data, lens);
        }
        self.run_seconds.push(started.elapsed().as_secs_f64());
        if self.analysis.is_none() {
            // A chunker is a pure function of its input, so every run cuts these chunks.
            let cuts = Cuts {
                lengths: lengths.to_vec(),
            };
            let bin = (self.config.avg_size / 8).max(1) as u64;
            let (summary, distribution) = sizes(&cuts, bin, self.config.max_chunk_size() as u64);
            self.analysis = Some((dedup(corpus, &cuts), summary, distribution));
        }
    }

    /// The measurement; with no run made, that of an empty corpus.
    fn finish(self, bytes: u64) -> Measurement {
        let bin = (self.config.avg_size / 8).max(1) as u64;
        let (dedup, sizes, distribution) = self.analysis.unwrap_or_else(|| {
            (
                Dedup::new(0, 0, 0),
                SizeStats::default().summary(),
                LinearHistogram::new(bin, self.config.max_chunk_size() as u64),
            )
        });
        Measurement {
            algo: self.config.kind.name(),
            config: self.config,
            speed: Speed::from_runs(bytes, self.run_seconds),
            dedup,
            sizes,
            distribution,
        }
    }
}

/// Chunks the corpus `runs` times (at least once), timing only the chunker, and
/// fingerprints the chunks (untimed) for the dedup ratio.
pub fn measure(
    corpus: &Corpus,
    config: &ChunkerConfig,
    runs: usize,
) -> Result<Measurement, BenchError> {
    let mut m = InProgress::new(config)?;
    let mut lengths = vec![Vec::new(); corpus.streams.len()];
    for _ in 0..runs.max(1) {
        m.run(corpus, &mut lengths);
    }
    Ok(m.finish(corpus.bytes()))
}

/// One line of a plot: a kind (and level, where it reads one) across a sweep.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Series {
    pub label: String,
    pub algo: &'static str,
    pub points: Vec<Measurement>,
}

/// A configuration the plan asked for but did not measure, and why.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Note {
    pub experiment: &'static str,
    pub algo: &'static str,
    pub config: Option<ChunkerConfig>,
    pub reason: String,
}

/// Everything `larder bench chunk` measured.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChunkBenchReport {
    pub corpus: CorpusSummary,
    pub plan: Plan,
    /// One series per kind over `plan.avg_sizes` (Fig. 10, Table 3, Fig. 9).
    pub size_sweep: Vec<Series>,
    /// One series per kind and level over `plan.min_sizes` (Fig. 11).
    pub min_sweep: Vec<Series>,
    pub notes: Vec<Note>,
}

impl ChunkBenchReport {
    /// The size-sweep measurements at the distribution size, one per kind (Fig. 9).
    pub fn distributions(&self) -> Vec<&Measurement> {
        self.size_sweep
            .iter()
            .filter_map(|s| {
                s.points
                    .iter()
                    .find(|m| m.config.avg_size == self.plan.distribution_avg)
            })
            .collect()
    }
}

pub const SIZE_SWEEP: &str = "size sweep";
pub const MIN_SWEEP: &str = "minimum-size sweep";

/// A measurement still to make: which series it belongs to.
struct Job {
    min_sweep: bool,
    series: usize,
    config: ChunkerConfig,
}

/// A pseudo-random probe, the same on every run (xorshift64).
fn probe_data() -> Vec<u8> {
    crate::seeded::xorshift_bytes(0x9e37_79b9_7f4a_7c15, 1 << 20)
}

/// Whether two configurations cut the probe differently. This is how the experiments
/// learn which parameters a kind reads (fixed-size chunking has no minimum; only FastCDC
/// has a normalization level) without a list of kinds. Invalid configs count as equal.
fn cuts_differ(probe: &[u8], a: &ChunkerConfig, b: &ChunkerConfig) -> bool {
    if a.validate().is_err() || b.validate().is_err() {
        return false;
    }
    build_chunker(a).chunk_lengths(probe) != build_chunker(b).chunk_lengths(probe)
}

/// The measurements of a plan, in series order, before they are run.
fn plan_jobs(plan: &Plan) -> (Vec<Series>, Vec<Series>, Vec<Note>, Vec<Job>) {
    let probe = probe_data();
    let (mut size_sweep, mut min_sweep, mut notes, mut jobs) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut add = |experiment, series: usize, config: ChunkerConfig, min_sweep: bool| match config
        .validate()
    {
        Ok(()) => jobs.push(Job {
            min_sweep,
            series,
            config,
        }),
        Err(e) => notes.push(Note {
            experiment,
            algo: config.kind.name(),
            config: Some(config),
            reason: format!("{} rejects it: {e}", config.kind.name()),
        }),
    };
    for &kind in &plan.kinds {
        size_sweep.push(Series {
            label: kind.name().to_string(),
            algo: kind.name(),
            points: Vec::new(),
        });
        for &avg in &plan.avg_sizes {
            let config = paper_config(kind, avg / 4, avg, plan.level);
            add(SIZE_SWEEP, size_sweep.len() - 1, config, false);
        }
    }
    let avg = plan.min_sweep_avg;
    let mut ignores_min = Vec::new();
    for &kind in &plan.kinds {
        let at = |min, level| paper_config(kind, min, avg, level);
        if !cuts_differ(&probe, &at(avg / 4, plan.level), &at(avg / 2, plan.level)) {
            ignores_min.push(kind);
            continue;
        }
        let reads_level = cuts_differ(&probe, &at(avg / 4, 0), &at(avg / 4, 3));
        let levels = if reads_level {
            plan.min_sweep_levels.clone()
        } else {
            vec![plan.level]
        };
        for level in levels {
            min_sweep.push(Series {
                label: if reads_level {
                    format!("{} NC {level}", kind.name())
                } else {
                    kind.name().to_string()
                },
                algo: kind.name(),
                points: Vec::new(),
            });
            for &min in &plan.min_sizes {
                add(MIN_SWEEP, min_sweep.len() - 1, at(min, level), true);
            }
        }
    }
    for kind in ignores_min {
        notes.push(Note {
            experiment: MIN_SWEEP,
            algo: kind.name(),
            config: None,
            reason: format!(
                "{} has no minimum size (its cuts do not change with it): left out",
                kind.name()
            ),
        });
    }
    (size_sweep, min_sweep, notes, jobs)
}

/// Runs every experiment of `plan` on `corpus`, reporting progress in words. The runs
/// are interleaved: each round times every configuration once, so that a burst of
/// load on a shared machine spreads over all configurations instead of slowing one.
/// A configuration in both sweeps (the size sweep's point at the minimum sweep's
/// expected size) is measured once.
pub fn run_chunk_bench(
    corpus: &Corpus,
    plan: &Plan,
    progress: &mut dyn FnMut(&str),
) -> Result<ChunkBenchReport, BenchError> {
    if corpus.bytes() == 0 {
        return Err(BenchError::NoData);
    }
    let (mut size_sweep, mut min_sweep, notes, jobs) = plan_jobs(plan);
    let mut configs: Vec<ChunkerConfig> = Vec::new();
    for job in &jobs {
        if !configs.contains(&job.config) {
            configs.push(job.config);
        }
    }
    let mut pending = configs
        .iter()
        .map(InProgress::new)
        .collect::<Result<Vec<_>, _>>()?;
    let mut lengths = vec![Vec::new(); corpus.streams.len()];
    let runs = plan.runs.max(1);
    for round in 1..=runs {
        if round > 1 {
            progress(&format!(
                "run {round}/{runs} of all {} configurations",
                pending.len()
            ));
        }
        for (i, m) in pending.iter_mut().enumerate() {
            if round == 1 {
                progress(&format!(
                    "run 1/{runs}: [{}/{}] {}",
                    i + 1,
                    configs.len(),
                    describe(&m.config)
                ));
            }
            m.run(corpus, &mut lengths);
        }
    }
    let measured: Vec<Measurement> = pending
        .into_iter()
        .map(|m| m.finish(corpus.bytes()))
        .collect();
    for job in jobs {
        let sweep = if job.min_sweep {
            &mut min_sweep
        } else {
            &mut size_sweep
        };
        if let Some(m) = measured.iter().find(|m| m.config == job.config) {
            sweep[job.series].points.push(m.clone());
        }
    }
    Ok(ChunkBenchReport {
        corpus: corpus.summary(),
        plan: plan.clone(),
        size_sweep,
        min_sweep,
        notes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::corpus::Stream;
    use crate::seeded::xorshift_bytes as random;

    fn corpus(streams: Vec<Vec<u8>>) -> Corpus {
        Corpus {
            streams: streams
                .into_iter()
                .enumerate()
                .map(|(i, data)| Stream {
                    name: format!("s{i}"),
                    data,
                })
                .collect(),
        }
    }

    fn fastcdc() -> ChunkerConfig {
        ChunkerConfig::default()
    }

    #[test]
    fn an_input_repeated_twice_deduplicates_about_twice() {
        let data = random(1, 1 << 20);
        let twice = corpus(vec![data.clone(), data.clone()]);
        for kind in ChunkerKind::ALL {
            let config = paper_config(kind, 2048, 8192, 2);
            if config.validate().is_err() {
                continue;
            }
            let m = measure(&twice, &config, 1).unwrap();
            assert!(
                (m.dedup.ratio - 2.0).abs() < 0.01,
                "{}: ratio {}",
                kind.name(),
                m.dedup.ratio
            );
            assert!((m.dedup.duplicate_percent - 50.0).abs() < 0.5);
            assert_eq!(m.dedup.input_bytes, 2 << 20);
        }
        // One stream holding the data twice: the second copy starts at a fixed-size
        // boundary (1 MiB is a multiple of 8 KiB), so even fixed-size chunking finds it.
        let mut doubled = data.clone();
        doubled.extend_from_slice(&data);
        let fixed = paper_config(ChunkerKind::Fixed, 0, 8192, 0);
        let m = measure(&corpus(vec![doubled]), &fixed, 1).unwrap();
        assert_eq!(m.dedup.ratio, 2.0);
    }

    #[test]
    fn fixed_size_chunking_of_n_sizes_gives_n_chunks() {
        let size = 4096;
        let config = paper_config(ChunkerKind::Fixed, 0, size, 0);
        let m = measure(&corpus(vec![random(2, 37 * size)]), &config, 2).unwrap();
        assert_eq!(m.sizes.chunks, 37);
        assert_eq!((m.sizes.min, m.sizes.max), (size as u64, size as u64));
        assert_eq!(m.sizes.std_dev, 0.0);
        assert_eq!(m.speed.run_seconds.len(), 2);
    }

    #[test]
    fn histograms_sum_to_the_chunk_count() {
        let c = corpus(vec![random(3, 3 << 20), random(4, 12345)]);
        let m = measure(&c, &fastcdc(), 1).unwrap();
        let buckets: u64 = m.sizes.histogram.iter().map(|b| b.chunks).sum();
        assert_eq!(buckets, m.sizes.chunks);
        assert_eq!(m.distribution.total(), m.sizes.chunks);
        assert_eq!(m.sizes.bytes, c.bytes());
        assert_eq!(m.distribution.bin_bytes, 1024);
        assert_eq!(m.distribution.counts.len(), 65);
    }

    #[test]
    fn repeated_runs_give_identical_results_but_for_time() {
        let c = corpus(vec![random(5, 2 << 20)]);
        let a = measure(&c, &fastcdc(), 3).unwrap();
        let b = measure(&c, &fastcdc(), 1).unwrap();
        assert_eq!(a.dedup, b.dedup);
        assert_eq!(a.sizes, b.sizes);
        assert_eq!(a.distribution, b.distribution);
        assert_eq!(cut(&c, &fastcdc()).unwrap(), cut(&c, &fastcdc()).unwrap());
    }

    #[test]
    fn each_stream_is_chunked_from_its_own_start() {
        let (a, b) = (random(6, 100_000), random(7, 50_000));
        let both = cut(&corpus(vec![a.clone(), b.clone()]), &fastcdc()).unwrap();
        let alone_a = cut(&corpus(vec![a]), &fastcdc()).unwrap();
        let alone_b = cut(&corpus(vec![b]), &fastcdc()).unwrap();
        assert_eq!(both.lengths[0], alone_a.lengths[0]);
        assert_eq!(both.lengths[1], alone_b.lengths[0]);
    }

    #[test]
    fn invalid_configs_are_errors_for_measure_and_notes_for_the_bench() {
        let c = corpus(vec![random(8, 1000)]);
        let bad = ChunkerConfig {
            level: 9,
            ..fastcdc()
        };
        assert!(matches!(measure(&c, &bad, 1), Err(BenchError::Config(_))));
        let plan = Plan {
            avg_sizes: vec![8192, 3],
            ..Plan::quick()
        };
        let report = run_chunk_bench(&c, &plan, &mut |_| {}).unwrap();
        assert!(report
            .notes
            .iter()
            .any(|n| n.experiment == SIZE_SWEEP && n.config.is_some_and(|c| c.avg_size == 3)));
    }

    #[test]
    fn speed_is_median_min_and_max_of_the_runs() {
        let s = Speed::from_runs(4_000_000, vec![1.0, 4.0, 2.0, 0.5]);
        assert_eq!(s.min_mb_per_sec, 1.0);
        assert_eq!(s.max_mb_per_sec, 8.0);
        assert_eq!(s.median_mb_per_sec, 3.0);
    }

    #[test]
    fn quick_bench_covers_every_kind_and_skips_what_a_kind_rejects() {
        let c = corpus(vec![random(9, 300_000), random(9, 300_000)]);
        let plan = Plan::quick();
        let mut messages = Vec::new();
        let report = run_chunk_bench(&c, &plan, &mut |m| messages.push(m.to_string())).unwrap();
        assert!(messages
            .iter()
            .any(|m| m.contains(ChunkerKind::Fixed.name())));
        let algos: Vec<&str> = report.size_sweep.iter().map(|s| s.algo).collect();
        let names: Vec<&str> = ChunkerKind::ALL.iter().map(|k| k.name()).collect();
        assert_eq!(algos, names);
        assert_eq!(report.distributions().len(), ChunkerKind::ALL.len());
        // Fixed-size chunking has no minimum; FastCDC has levels 0 and the default.
        assert!(report.notes.iter().any(|n| n.experiment == MIN_SWEEP
            && n.algo == ChunkerKind::Fixed.name()
            && n.config.is_none()));
        let fastcdc_series = report
            .min_sweep
            .iter()
            .filter(|s| s.algo == ChunkerKind::Fastcdc2020.name())
            .count();
        assert_eq!(fastcdc_series, plan.min_sweep_levels.len());
        // Every point is either measured or noted.
        for series in &report.min_sweep {
            for &min in &plan.min_sizes {
                let measured = series.points.iter().any(|m| m.config.min_size == min);
                let noted = report
                    .notes
                    .iter()
                    .any(|n| n.algo == series.algo && n.config.is_some_and(|c| c.min_size == min));
                assert!(measured || noted, "{} min {min}", series.label);
            }
        }
        for m in report.size_sweep.iter().flat_map(|s| &s.points) {
            assert!((m.dedup.ratio - 2.0).abs() < 0.05, "{}", m.algo);
        }
    }
}
