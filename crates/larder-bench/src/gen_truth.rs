//! larder's dedup ratio against the workload generator's ground truth (issue 5,
//! acceptance 2): generation 1 and generations 2 to 5 of `larder-gen` (one client,
//! the default model: shifting edits), each backed up as one snapshot into one
//! repository, beside what the generator knows is new.
//!
//! The difference has one cause: a chunk holding any new byte is new. Every place
//! where the stream's source changes (the start or end of a unique or pool run in the
//! middle of copied data, an insertion, a deletion: a *discontinuity*) lies inside
//! some chunk, and that chunk's copied bytes are stored again. The report counts the
//! discontinuities and divides the extra bytes by them.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use larder_chunk::{ChunkerConfig, ChunkerKind};
use larder_engine::{backup, BackupOptions, NoProgress, PatternList};
use larder_gen::{Config, Extent, Model, Truth, Workload, BLOCK};
use larder_hash::{Fingerprint, HashAlgo};
use larder_store::{Compression, LockMode, RepoConfig, Repository};
use serde::Serialize;

use crate::chunk::cut;
use crate::corpus::{Corpus, Stream};
use crate::BenchError;

/// What to generate.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GenPlan {
    pub seed: u64,
    /// Bytes of each generation.
    pub generation_size: u64,
    pub generations: u32,
}

/// The generations, in memory (for the chunking experiments) and as files (for
/// backups), with the generator's ground truth.
pub struct Generated {
    pub plan: GenPlan,
    pub corpus: Corpus,
    pub files: Vec<PathBuf>,
    pub truths: Vec<Truth>,
    /// Per generation: where the source of consecutive bytes changes.
    pub discontinuities: Vec<u64>,
}

/// Whether `next` continues `prev`: the same source, the next byte.
fn continues(prev: &Extent, next: &Extent) -> bool {
    prev.source == next.source
        && prev.first * BLOCK + u64::from(prev.offset) + prev.len
            == next.first * BLOCK + u64::from(next.offset)
}

/// Places in a generation where the source of consecutive bytes changes.
pub fn discontinuities(extents: &[Extent]) -> u64 {
    extents
        .windows(2)
        .filter(|w| !continues(&w[0], &w[1]))
        .count() as u64
}

/// Generates every generation into memory and into `dir/gen-NNN.bin`.
pub fn generate(plan: &GenPlan, dir: &Path) -> Result<Generated, BenchError> {
    std::fs::create_dir_all(dir).map_err(|e| BenchError::io(dir, e))?;
    let mut workload = Workload::new(Config {
        seed: plan.seed,
        generation_size: plan.generation_size,
        generations: plan.generations,
        clients: 1,
        model: Model::default(),
    })?;
    let (mut streams, mut files, mut truths, mut breaks) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    while let Some(g) = workload.next_generation() {
        let mut data = Vec::with_capacity(g.truth.bytes as usize);
        workload.write(&g, &mut data)?;
        let name = format!("gen-{:03}.bin", g.truth.generation);
        let path = dir.join(&name);
        std::fs::write(&path, &data).map_err(|e| BenchError::io(&path, e))?;
        breaks.push(discontinuities(g.extents()));
        truths.push(g.truth);
        files.push(path);
        streams.push(Stream { name, data });
    }
    Ok(Generated {
        plan: plan.clone(),
        corpus: Corpus { streams },
        files,
        truths,
        discontinuities: breaks,
    })
}

/// One generation: bytes, and new bytes by the truth and by each way of counting.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GenerationRow {
    pub generation: u32,
    pub bytes: u64,
    pub truth_new: u64,
    /// The snapshot's `bytes_new`: new chunks of file data and of the tree stream.
    pub backup_new: u64,
    /// New chunk bytes of the file data alone, FastCDC as in the backup.
    pub data_new: u64,
    /// New chunk bytes with fixed 4 KiB chunks (the generator's block size).
    pub fixed_new: u64,
    pub discontinuities: u64,
    pub insertions: u64,
    pub deletions: u64,
}

impl GenerationRow {
    /// Bytes over new bytes; `new` 0 counts as 1 byte.
    pub fn ratio(&self, new: u64) -> f64 {
        self.bytes as f64 / new.max(1) as f64
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GenTruthReport {
    pub plan: GenPlan,
    pub rows: Vec<GenerationRow>,
    /// FastCDC's average chunk over the generations, bytes.
    pub mean_chunk: f64,
}

impl GenTruthReport {
    /// Sums of a column over every generation.
    pub fn total(&self, f: impl Fn(&GenerationRow) -> u64) -> u64 {
        self.rows.iter().map(f).sum()
    }
}

/// New bytes of each stream, chunked by `config` and deduplicated against every
/// earlier stream, and the number of chunks.
fn new_bytes_per_stream(
    corpus: &Corpus,
    config: &ChunkerConfig,
) -> Result<(Vec<u64>, u64), BenchError> {
    let cuts = cut(corpus, config)?;
    let mut seen: HashSet<Fingerprint> = HashSet::new();
    let mut out = Vec::new();
    let mut chunks = 0;
    for (stream, lens) in corpus.streams.iter().zip(&cuts.lengths) {
        let mut start = 0;
        let slices: Vec<&[u8]> = lens
            .iter()
            .map(|&len| {
                let s = &stream.data[start..start + len as usize];
                start += len as usize;
                s
            })
            .collect();
        let fps = HashAlgo::Blake3.fingerprint_batch(&slices);
        let new = slices
            .iter()
            .zip(fps)
            .filter(|(_, fp)| seen.insert(*fp))
            .map(|(s, _)| s.len() as u64)
            .sum();
        chunks += slices.len() as u64;
        out.push(new);
    }
    Ok((out, chunks))
}

/// Backs each generation up as its own snapshot, in order, into one repository under
/// `scratch` (larder's defaults but compression, which does not change what is new),
/// and counts new bytes with FastCDC and fixed 4 KiB chunks over the data alone.
pub fn run_gen_truth(
    generated: &Generated,
    scratch: &Path,
    progress: &mut dyn FnMut(&str),
) -> Result<GenTruthReport, BenchError> {
    let root = scratch.join("gen-truth-repo");
    let config = ChunkerConfig::default();
    Repository::init(
        &root,
        &RepoConfig::new(config, HashAlgo::Blake3).with_compression(Compression::None),
    )?;
    let mut repo = Repository::open(&root, LockMode::Exclusive)?;
    let opts = BackupOptions {
        threads: 0,
        hostname: "larder-bench".into(),
        username: "larder-bench".into(),
        exclude: PatternList::default(),
        progress: Arc::new(NoProgress),
        serial: false,
    };
    let mut backup_new = Vec::new();
    for (i, file) in generated.files.iter().enumerate() {
        progress(&format!("backing up generation {}", i + 1));
        let s = backup(&mut repo, std::slice::from_ref(file), &opts)?;
        backup_new.push(s.bytes_new);
    }
    drop(repo);
    std::fs::remove_dir_all(&root).map_err(|e| BenchError::io(&root, e))?;
    progress("counting new chunks of the data alone (FastCDC, fixed 4 KiB)");
    let (data_new, chunks) = new_bytes_per_stream(&generated.corpus, &config)?;
    let fixed = ChunkerConfig {
        kind: ChunkerKind::Fixed,
        min_size: BLOCK as usize,
        avg_size: BLOCK as usize,
        max_size: BLOCK as usize,
        level: 0,
    };
    let (fixed_new, _) = new_bytes_per_stream(&generated.corpus, &fixed)?;
    let rows = generated
        .truths
        .iter()
        .enumerate()
        .map(|(i, t)| GenerationRow {
            generation: t.generation,
            bytes: t.bytes,
            truth_new: t.new_bytes,
            backup_new: backup_new[i],
            data_new: data_new[i],
            fixed_new: fixed_new[i],
            discontinuities: generated.discontinuities[i],
            insertions: t.insertions,
            deletions: t.deletions,
        })
        .collect();
    Ok(GenTruthReport {
        plan: generated.plan.clone(),
        rows,
        mean_chunk: generated.corpus.bytes() as f64 / chunks.max(1) as f64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    use larder_gen::Source;

    #[test]
    fn discontinuities_are_changes_of_source_or_jumps() {
        let e = |source, first, offset, len| Extent {
            source,
            first,
            offset,
            len,
        };
        let extents = [
            e(Source::Unique, 0, 0, 8192),
            e(Source::Unique, 2, 0, 100),
            e(Source::Unique, 2, 100, 50),
            e(Source::Pool, 2, 150, 10),
            e(Source::Pool, 9, 0, 10),
        ];
        // 0..8192 then block 2 continues; 2+100 continues; pool breaks; pool jumps.
        assert_eq!(discontinuities(&extents), 2);
    }

    #[test]
    fn aligned_counting_matches_the_truth_and_cdc_loses_only_near_discontinuities() {
        let dir = tempfile::tempdir().unwrap();
        let plan = GenPlan {
            seed: 3,
            generation_size: 4 << 20,
            generations: 3,
        };
        let generated = generate(&plan, &dir.path().join("gens")).unwrap();
        assert_eq!(generated.files.len(), 3);
        let report = run_gen_truth(&generated, dir.path(), &mut |_| {}).unwrap();
        for row in &report.rows {
            assert_eq!(row.bytes, 4 << 20);
            // Nothing the truth calls a copy can be new to content-defined chunks but
            // for the chunks around discontinuities (two maximal chunks each, resynchronising).
            assert!(row.data_new >= row.truth_new, "{row:?}");
            assert!(
                row.data_new <= row.truth_new + (row.discontinuities + 1) * (128 << 10),
                "{row:?}"
            );
            // The backup also stores the tree stream.
            assert!(row.backup_new >= row.data_new, "{row:?}");
        }
        // Generation 1 starts at a block boundary and its runs are whole blocks, so
        // fixed 4 KiB chunks find exactly what the truth says.
        assert_eq!(report.rows[0].fixed_new, report.rows[0].truth_new);
        assert!(!dir.path().join("gen-truth-repo").exists());
    }
}
