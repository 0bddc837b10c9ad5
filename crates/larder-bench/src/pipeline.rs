//! P-Dedupe's experiments (its section 4): the throughput of the serial baseline, the
//! pipeline and the pipeline with parallel chunking and fingerprinting (its Fig. 14),
//! measured on larder's own backup path; that throughput against the model of its
//! equations 4 to 6, from the measured stage times; and parallel chunking against
//! sequential chunking: differing cut points and dedup ratio (its Table 3), and
//! chunking speed against segment size and thread count (its Fig. 10).
//! `docs/design/bench.md` describes the settings.

use std::path::{Path, PathBuf};
use std::time::Instant;

use larder_chunk::{Chunker, ChunkerConfig, ParallelChunker};
use larder_engine::{backup, BackupOptions, BackupSummary, Parents, StageTimes};
use larder_hash::HashAlgo;
use larder_store::{Compression, LockMode, RepoConfig, Repository};
use serde::Serialize;

use crate::chunk::{dedup, Cuts};
use crate::corpus::Corpus;
use crate::plot::Spread;
use crate::BenchError;

/// What to measure.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PipelinePlan {
    /// Backups of each mode, interleaved (each round runs every mode once).
    pub runs: usize,
    /// Thread counts of the pipeline with parallel chunking and fingerprinting.
    pub parallel_threads: Vec<usize>,
    /// The parallel-chunking sweep: segment sizes (bytes) and thread counts.
    pub segment_sizes: Vec<usize>,
    pub segment_threads: Vec<usize>,
}

impl PipelinePlan {
    /// `cores` is the machine's: the parallel mode runs on as many threads and on
    /// twice as many (more threads than cores shows what oversubscription costs).
    pub fn new(quick: bool, cores: usize) -> Self {
        let cores = cores.max(1);
        let mut threads = vec![cores.max(2), 2 * cores.max(2)];
        threads.dedup();
        Self {
            runs: if quick { 3 } else { 5 },
            parallel_threads: threads.clone(),
            segment_sizes: if quick {
                [256 << 10, 1 << 20, 4 << 20, 16 << 20].to_vec()
            } else {
                [64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20].to_vec()
            },
            segment_threads: std::iter::once(1).chain(threads).collect(),
        }
    }
}

/// Seconds a backup's stages worked, in the paper's four stages: `chunk` is reading
/// and chunking (with the walk), `write` is compressing, placing and writing new
/// chunks and the commit. `write` is the paper's `Tw / D`: only new data is written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct StageSeconds {
    pub chunk: f64,
    pub fingerprint: f64,
    pub index: f64,
    pub write: f64,
}

impl StageSeconds {
    fn of(t: &StageTimes) -> Self {
        Self {
            chunk: (t.walk + t.chunk).as_secs_f64(),
            fingerprint: t.fingerprint.as_secs_f64(),
            index: t.index.as_secs_f64(),
            write: (t.compress + t.write + t.sync).as_secs_f64(),
        }
    }

    pub fn sum(&self) -> f64 {
        self.chunk + self.fingerprint + self.index + self.write
    }

    /// Each stage's median over `runs`.
    fn median(runs: &[StageSeconds]) -> Self {
        let m = |f: fn(&StageSeconds) -> f64| {
            Spread::of(&runs.iter().map(f).collect::<Vec<_>>()).median
        };
        Self {
            chunk: m(|s| s.chunk),
            fingerprint: m(|s| s.fingerprint),
            index: m(|s| s.index),
            write: m(|s| s.write),
        }
    }
}

/// One way of running the backup (Fig. 14's bars).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Mode {
    pub label: String,
    pub threads: usize,
    /// The stages take turns ([`BackupOptions::serial`]).
    pub serial: bool,
    /// Input MB (10^6 bytes) per second of the whole backup, start to commit.
    pub mb_per_sec: Spread,
    pub seconds: Vec<f64>,
    pub stages: Vec<StageSeconds>,
}

/// A mode's measured throughput against the model's.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelRow {
    pub label: String,
    pub equation: &'static str,
    pub measured: Spread,
    /// The equation's throughput from the serial runs' median stage times.
    pub model_mb_per_sec: f64,
    /// The same, bounded by the cores: the stages' total work, spread over every core,
    /// cannot finish sooner than `sum / cores`.
    pub bounded_mb_per_sec: f64,
}

/// Parallel chunking at one segment size and thread count, whole streams in memory.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SegmentPoint {
    pub segment_size: usize,
    pub threads: usize,
    pub mb_per_sec: Spread,
    /// Cut points of the parallel chunking not among the sequential ones, plus the
    /// other way round, over the whole corpus.
    pub differing_cuts: u64,
}

/// Dedup of parallel chunking against sequential chunking at one segment size (the
/// paper's Table 3): larder's exact parallel chunking, and segments chunked
/// independently (P-Dedupe without its boundary jointing), for comparison.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SegmentDedup {
    pub segment_size: usize,
    pub exact_differing_cuts: u64,
    pub exact_ratio: f64,
    pub independent_differing_cuts: u64,
    pub independent_ratio: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PipelineReport {
    pub plan: PipelinePlan,
    pub bytes: u64,
    pub files: usize,
    pub cores: usize,
    /// Where the benchmark repositories were made (tmpfs keeps the disk out).
    pub repository_dir: String,
    pub backup_dedup_ratio: f64,
    pub modes: Vec<Mode>,
    pub serial_stages: StageSeconds,
    pub model: Vec<ModelRow>,
    pub chunks: u64,
    pub sequential_ratio: f64,
    pub segments: Vec<SegmentPoint>,
    pub segment_dedup: Vec<SegmentDedup>,
}

/// Backs `files` up into a fresh repository under `scratch` (removed afterwards):
/// larder's default chunker and BLAKE3, no compression (the paper's four stages).
fn backup_once(
    scratch: &Path,
    files: &[PathBuf],
    threads: usize,
    serial: bool,
) -> Result<BackupSummary, BenchError> {
    let root = scratch.join("repo");
    let config = RepoConfig::new(ChunkerConfig::default(), HashAlgo::Blake3)
        .with_compression(Compression::None);
    Repository::init(&root, &config)?;
    let mut repo = Repository::open(&root, LockMode::Exclusive)?;
    // Every byte read and no checkpoint: the experiments measure the papers' pipeline.
    let opts = BackupOptions {
        threads,
        hostname: "larder-bench".into(),
        username: "larder-bench".into(),
        serial,
        parents: Parents::None,
        checkpoint_interval: None,
        ..BackupOptions::default()
    };
    let summary = backup(&mut repo, files, &opts)?;
    drop(repo);
    std::fs::remove_dir_all(&root).map_err(|e| BenchError::io(&root, e))?;
    if let Some(w) = summary.warnings.iter().find(|w| w.is_error) {
        return Err(BenchError::Backup(format!("{w:?}")));
    }
    Ok(summary)
}

/// The throughput `bytes / seconds` in MB/s.
fn mb_per_sec(bytes: u64, seconds: f64) -> f64 {
    bytes as f64 / 1e6 / seconds.max(1e-9)
}

/// Fig. 14: every mode backed up `plan.runs` times, interleaved.
fn measure_modes(
    files: &[PathBuf],
    scratch: &Path,
    plan: &PipelinePlan,
    progress: &mut dyn FnMut(&str),
) -> Result<(Vec<Mode>, u64, f64), BenchError> {
    let mode = |label: String, threads, serial| Mode {
        label,
        threads,
        serial,
        mb_per_sec: Spread::exact(0.0),
        seconds: Vec::new(),
        stages: Vec::new(),
    };
    let mut modes = vec![
        mode("serial (1 thread, stages in turn)".into(), 1, true),
        mode("pipelined (1 thread a stage)".into(), 1, false),
    ];
    for &t in &plan.parallel_threads {
        modes.push(mode(format!("pipelined + parallel, {t} threads"), t, false));
    }
    let (mut bytes, mut ratio) = (0, 1.0);
    let runs = plan.runs.max(1);
    for round in 1..=runs {
        progress(&format!(
            "backups, round {round}/{runs} of {} modes",
            modes.len()
        ));
        for mode in &mut modes {
            let s = backup_once(scratch, files, mode.threads, mode.serial)?;
            bytes = s.bytes_in;
            ratio = s.dedup_ratio();
            mode.seconds.push(s.elapsed.as_secs_f64());
            mode.stages.push(StageSeconds::of(&s.stages));
        }
    }
    for mode in &mut modes {
        let speeds: Vec<f64> = mode.seconds.iter().map(|&s| mb_per_sec(bytes, s)).collect();
        mode.mb_per_sec = Spread::of(&speeds);
    }
    Ok((modes, bytes, ratio))
}

/// Equations 4 to 6 from the serial runs' stage times, next to what each mode measured.
fn model_rows(modes: &[Mode], t: &StageSeconds, bytes: u64, cores: usize) -> Vec<ModelRow> {
    let bound = mb_per_sec(bytes, t.sum()) * cores as f64;
    modes
        .iter()
        .map(|m| {
            let n = m.threads as f64;
            let (equation, seconds) = if m.serial {
                ("(4) 1 / (Tc + Tf + Ti + Tw/D)", t.sum())
            } else if m.threads == 1 {
                ("(5) 1 / max(Tc, Tf, Ti, Tw/D)", {
                    t.chunk.max(t.fingerprint).max(t.index).max(t.write)
                })
            } else {
                ("(6) 1 / max(Tc/N, Tf/N, Ti, Tw/D)", {
                    (t.chunk / n)
                        .max(t.fingerprint / n)
                        .max(t.index)
                        .max(t.write)
                })
            };
            let model = mb_per_sec(bytes, seconds);
            ModelRow {
                label: m.label.clone(),
                equation,
                measured: m.mb_per_sec,
                model_mb_per_sec: model,
                bounded_mb_per_sec: if m.serial { model } else { model.min(bound) },
            }
        })
        .collect()
}

/// Cut points (chunk ends) in one split and not the other, both ways: 0 for equal
/// splits of the same bytes.
pub fn differing_cuts(a: &[usize], b: &[usize]) -> u64 {
    let ends = |lens: &[usize]| -> Vec<usize> {
        lens.iter()
            .scan(0usize, |end, &len| {
                *end += len;
                Some(*end)
            })
            .collect()
    };
    let (a, b) = (ends(a), ends(b));
    let (mut i, mut j, mut differ) = (0, 0, 0u64);
    while i < a.len() && j < b.len() {
        match a[i].cmp(&b[j]) {
            std::cmp::Ordering::Equal => {
                i += 1;
                j += 1;
            }
            std::cmp::Ordering::Less => {
                differ += 1;
                i += 1;
            }
            std::cmp::Ordering::Greater => {
                differ += 1;
                j += 1;
            }
        }
    }
    differ + (a.len() - i + b.len() - j) as u64
}

fn to_cuts(lengths: &[Vec<usize>]) -> Cuts {
    Cuts {
        lengths: lengths
            .iter()
            .map(|l| l.iter().map(|&x| x as u32).collect())
            .collect(),
    }
}

/// Each segment of `data` chunked on its own, as if a chunk started at every segment
/// start: P-Dedupe's parallel chunking without boundary jointing.
fn independent_segments(chunker: &dyn Chunker, data: &[u8], segment: usize) -> Vec<usize> {
    data.chunks(segment.max(1))
        .flat_map(|s| chunker.chunk_lengths(s))
        .collect()
}

/// The parallel-chunking sweep and Table 3 on the corpus in memory.
fn measure_segments(
    corpus: &Corpus,
    plan: &PipelinePlan,
    progress: &mut dyn FnMut(&str),
) -> Result<(Vec<SegmentPoint>, Vec<SegmentDedup>, u64, f64), BenchError> {
    let config = ChunkerConfig::default();
    let chunker = config.build();
    let sequential: Vec<Vec<usize>> = corpus
        .streams
        .iter()
        .map(|s| chunker.chunk_lengths(&s.data))
        .collect();
    let chunks = sequential.iter().map(|l| l.len() as u64).sum();
    let sequential_ratio = dedup(corpus, &to_cuts(&sequential)).ratio;
    let pools = plan
        .segment_threads
        .iter()
        .map(|&t| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(t)
                .build()
                .map_err(|e| BenchError::Threads(e.to_string()))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut points: Vec<(SegmentPoint, Vec<f64>)> = Vec::new();
    for &segment_size in &plan.segment_sizes {
        for &threads in &plan.segment_threads {
            points.push((
                SegmentPoint {
                    segment_size,
                    threads,
                    mb_per_sec: Spread::exact(0.0),
                    differing_cuts: 0,
                },
                Vec::new(),
            ));
        }
    }
    let mut exact_cuts: Vec<Option<Vec<Vec<usize>>>> = vec![None; plan.segment_sizes.len()];
    let runs = plan.runs.max(1);
    for round in 1..=runs {
        progress(&format!(
            "parallel chunking, round {round}/{runs} of {} configurations",
            points.len()
        ));
        for (point, seconds) in &mut points {
            let pool_at = plan
                .segment_threads
                .iter()
                .position(|&t| t == point.threads)
                .unwrap_or(0);
            let segment = std::num::NonZeroUsize::new(point.segment_size)
                .unwrap_or(std::num::NonZeroUsize::MIN);
            let parallel =
                ParallelChunker::new(chunker.as_ref(), &pools[pool_at]).with_segment_size(segment);
            let started = Instant::now();
            let lengths: Vec<Vec<usize>> = corpus
                .streams
                .iter()
                .map(|s| parallel.chunk_lengths(&s.data).lengths)
                .collect();
            seconds.push(started.elapsed().as_secs_f64());
            if round == 1 {
                point.differing_cuts = sequential
                    .iter()
                    .zip(&lengths)
                    .map(|(a, b)| differing_cuts(a, b))
                    .sum();
                let at = plan
                    .segment_sizes
                    .iter()
                    .position(|&s| s == point.segment_size)
                    .unwrap_or(0);
                // Keep the run on the most threads: the one with the most segment
                // boundaries worked on at once.
                if point.threads == plan.segment_threads.iter().copied().max().unwrap_or(1) {
                    exact_cuts[at] = Some(lengths);
                }
            }
        }
    }
    let bytes = corpus.bytes();
    let segments = points
        .into_iter()
        .map(|(mut p, seconds)| {
            let speeds: Vec<f64> = seconds.iter().map(|&s| mb_per_sec(bytes, s)).collect();
            p.mb_per_sec = Spread::of(&speeds);
            p
        })
        .collect();
    progress("dedup of parallel against sequential chunking");
    let mut table = Vec::new();
    for (&segment_size, exact) in plan.segment_sizes.iter().zip(exact_cuts) {
        let exact = exact.unwrap_or_else(|| sequential.clone());
        let independent: Vec<Vec<usize>> = corpus
            .streams
            .iter()
            .map(|s| independent_segments(chunker.as_ref(), &s.data, segment_size))
            .collect();
        let count = |split: &[Vec<usize>]| -> u64 {
            sequential
                .iter()
                .zip(split)
                .map(|(a, b)| differing_cuts(a, b))
                .sum()
        };
        table.push(SegmentDedup {
            segment_size,
            exact_differing_cuts: count(&exact),
            exact_ratio: dedup(corpus, &to_cuts(&exact)).ratio,
            independent_differing_cuts: count(&independent),
            independent_ratio: dedup(corpus, &to_cuts(&independent)).ratio,
        });
    }
    Ok((segments, table, chunks, sequential_ratio))
}

/// Every P-Dedupe experiment: backups of `files` (whose bytes `corpus` holds, in
/// memory, for the chunking sweep) with repositories under `scratch`.
pub fn run_pipeline_bench(
    corpus: &Corpus,
    files: &[PathBuf],
    scratch: &Path,
    plan: &PipelinePlan,
    cores: usize,
    progress: &mut dyn FnMut(&str),
) -> Result<PipelineReport, BenchError> {
    if corpus.bytes() == 0 {
        return Err(BenchError::NoData);
    }
    let (modes, bytes, backup_dedup_ratio) = measure_modes(files, scratch, plan, progress)?;
    let serial_stages = modes
        .iter()
        .find(|m| m.serial)
        .map(|m| StageSeconds::median(&m.stages))
        .unwrap_or_default();
    let model = model_rows(&modes, &serial_stages, bytes, cores);
    let (segments, segment_dedup, chunks, sequential_ratio) =
        measure_segments(corpus, plan, progress)?;
    Ok(PipelineReport {
        plan: plan.clone(),
        bytes,
        files: files.len(),
        cores,
        repository_dir: scratch.display().to_string(),
        backup_dedup_ratio,
        modes,
        serial_stages,
        model,
        chunks,
        sequential_ratio,
        segments,
        segment_dedup,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::corpus::Stream;
    use crate::seeded::xorshift_bytes as random;

    #[test]
    fn differing_cuts_counts_both_ways() {
        assert_eq!(differing_cuts(&[4, 4, 2], &[4, 4, 2]), 0);
        // Ends 4, 8, 10 against 4, 6, 10: 8 and 6 differ.
        assert_eq!(differing_cuts(&[4, 4, 2], &[4, 2, 4]), 2);
        assert_eq!(differing_cuts(&[10], &[5, 5]), 1);
        assert_eq!(differing_cuts(&[], &[]), 0);
    }

    #[test]
    fn the_model_follows_equations_4_to_6() {
        let t = StageSeconds {
            chunk: 4.0,
            fingerprint: 2.0,
            index: 1.0,
            write: 1.0,
        };
        let mode = |threads, serial| Mode {
            label: String::new(),
            threads,
            serial,
            mb_per_sec: Spread::exact(1.0),
            seconds: Vec::new(),
            stages: Vec::new(),
        };
        let modes = [
            mode(1, true),
            mode(1, false),
            mode(2, false),
            mode(8, false),
        ];
        let rows = model_rows(&modes, &t, 8_000_000, 2);
        let model: Vec<f64> = rows.iter().map(|r| r.model_mb_per_sec).collect();
        // 8 MB over 8 s, over max 4 s, over max(2, 1, 1, 1), over max(0.5, 0.25, 1, 1).
        assert_eq!(model, [1.0, 2.0, 4.0, 8.0]);
        // Two cores do 8 s of work in at least 4 s: 2 MB/s at most.
        let bounded: Vec<f64> = rows.iter().map(|r| r.bounded_mb_per_sec).collect();
        assert_eq!(bounded, [1.0, 2.0, 2.0, 2.0]);
    }

    #[test]
    fn exact_parallel_chunking_misses_nothing_and_independent_segments_do() {
        let data = random(3, 3 << 20);
        let mut doubled = data.clone();
        doubled.extend_from_slice(&data[1000..]);
        let corpus = Corpus {
            streams: vec![Stream {
                name: "s".into(),
                data: doubled,
            }],
        };
        let plan = PipelinePlan {
            runs: 1,
            parallel_threads: vec![2],
            segment_sizes: vec![256 << 10],
            segment_threads: vec![1, 2],
        };
        let (segments, table, chunks, ratio) =
            measure_segments(&corpus, &plan, &mut |_| {}).unwrap();
        assert!(chunks > 500);
        assert!(ratio > 1.9, "{ratio}");
        assert!(segments.iter().all(|p| p.differing_cuts == 0));
        assert_eq!(segments.len(), 2);
        let row = &table[0];
        assert_eq!(row.exact_differing_cuts, 0);
        assert_eq!(row.exact_ratio, ratio);
        assert!(row.independent_differing_cuts > 0);
        assert!(row.independent_ratio < ratio);
    }
}
