//! larder's dedup ratio against the workload generator's ground truth: generation 1
//! and generations 2 to 5 of `larder-gen` (one client, the default model: shifting
//! edits), each backed up as one snapshot into one repository, beside what the
//! generator knows is new.
//!
//! The difference has one cause: a chunk holding any new byte is new. The generator's
//! extents say which bytes of a generation repeat bytes written before (*copied*); so
//! every copied byte that content-defined chunking stores again is accounted for: in
//! a new chunk that also holds new bytes (it straddles a boundary between copied and
//! new bytes), or in a new chunk of copied bytes alone (cut differently from the
//! earlier copies, near such a boundary). The report gives both, and the boundaries.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};

use larder_chunk::{ChunkerConfig, ChunkerKind};
use larder_engine::{backup, BackupOptions, Parents};
use larder_gen::{Config, Extent, Model, Source, Truth, Workload, BLOCK};
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
    /// Per generation: the byte ranges that repeat bytes written before, sorted,
    /// disjoint and not touching.
    pub copied: Vec<Vec<(u64, u64)>>,
    /// Per generation: places inside copied ranges where two copies meet whose bytes
    /// were never adjacent before (a deletion, a copied pool run next to a copy).
    pub junctions: Vec<u64>,
}

/// A byte's place in its source: `(0, position)` for unique bytes, `(1, position in
/// the pool)` for pool bytes.
type SourceAt = (u8, u64);

/// The bytes of each source written so far (disjoint intervals by start), and the
/// seams written so far: pairs of bytes written next to each other although not
/// consecutive in their sources.
#[derive(Default)]
struct Written {
    unique: BTreeMap<u64, u64>,
    pool: BTreeMap<u64, u64>,
    seams: HashSet<(SourceAt, SourceAt)>,
}

/// Marks `a..b` of `map` written; returns the parts that were written before.
fn write_range(map: &mut BTreeMap<u64, u64>, a: u64, b: u64) -> Vec<(u64, u64)> {
    // Intervals that overlap or touch a..b: they start at or before b, and end at or
    // after a; walking back from b, the first that ends before a ends the search.
    let touching: Vec<(u64, u64)> = map
        .range(..=b)
        .rev()
        .take_while(|(_, &end)| end >= a)
        .map(|(&s, &e)| (s, e))
        .collect();
    let (mut low, mut high) = (a, b);
    let mut before = Vec::new();
    for &(s, e) in touching.iter().rev() {
        if s < b && e > a {
            before.push((s.max(a), e.min(b)));
        }
        low = low.min(s);
        high = high.max(e);
        map.remove(&s);
    }
    map.insert(low, high);
    before
}

/// A copied piece of an extent: `from..to` as offsets into the extent.
struct CopiedPiece {
    from: u64,
    to: u64,
}

/// Where byte `offset` of `e` is in its source (pool positions wrap).
fn source_at(e: &Extent, offset: u64, pool_bytes: u64) -> SourceAt {
    let at = e.first * BLOCK + u64::from(e.offset) + offset;
    match e.source {
        Source::Unique => (0, at),
        Source::Pool => (1, at % pool_bytes),
    }
}

impl Written {
    /// The pieces of `e`'s bytes written before, and marks all of them written. Pool
    /// positions wrap around the pool of `pool_bytes`.
    fn write(&mut self, e: &Extent, pool_bytes: u64) -> Vec<CopiedPiece> {
        let start = e.first * BLOCK + u64::from(e.offset);
        let piece = |from, to| CopiedPiece { from, to };
        match e.source {
            Source::Unique => write_range(&mut self.unique, start, start + e.len)
                .into_iter()
                .map(|(x, y)| piece(x - start, y - start))
                .collect(),
            Source::Pool => {
                let mut out = Vec::new();
                let (mut done, mut at) = (0, start % pool_bytes);
                while done < e.len {
                    let take = (e.len - done).min(pool_bytes - at);
                    for (x, y) in write_range(&mut self.pool, at, at + take) {
                        out.push(piece(done + x - at, done + y - at));
                    }
                    done += take;
                    at = 0;
                }
                out
            }
        }
    }
}

/// Appends `(a, b)` to sorted ranges, merging it with the last one if they touch.
fn push_merged(ranges: &mut Vec<(u64, u64)>, a: u64, b: u64) {
    match ranges.last_mut() {
        Some(last) if last.1 >= a => last.1 = last.1.max(b),
        _ => ranges.push((a, b)),
    }
}

/// The copied ranges of a generation (offsets into it) and its junctions: copied
/// bytes next to copied bytes where the pair was never written side by side before.
/// Marks the generation's bytes and seams written.
fn copied_ranges(
    extents: &[Extent],
    written: &mut Written,
    pool_bytes: u64,
) -> (Vec<(u64, u64)>, u64) {
    let mut ranges: Vec<(u64, u64)> = Vec::new();
    let (mut pos, mut junctions) = (0, 0);
    let mut seams = Vec::new();
    for (i, e) in extents.iter().enumerate() {
        let pieces = written.write(e, pool_bytes);
        // Extents are cut where the source jumps (or, harmlessly, where it does not):
        // a junction is an extent boundary with copied bytes on both sides whose pair
        // of bytes is not consecutive in the source and not an earlier seam.
        if i > 0 {
            let prev = &extents[i - 1];
            let seam = (
                source_at(prev, prev.len - 1, pool_bytes),
                source_at(e, 0, pool_bytes),
            );
            let consecutive =
                seam.0 .0 == seam.1 .0 && source_at(prev, prev.len, pool_bytes) == seam.1;
            let copied_before = ranges.last().is_some_and(|r| r.1 == pos);
            let copied_after = pieces.first().is_some_and(|p| p.from == 0);
            if !consecutive {
                if copied_before && copied_after && !written.seams.contains(&seam) {
                    junctions += 1;
                }
                seams.push(seam);
            }
        }
        for p in pieces {
            push_merged(&mut ranges, pos + p.from, pos + p.to);
        }
        pos += e.len;
    }
    written.seams.extend(seams);
    (ranges, junctions)
}

/// Places where copied and new bytes meet in a generation of `len` bytes.
pub fn boundaries(copied: &[(u64, u64)], len: u64) -> u64 {
    copied
        .iter()
        .map(|&(a, b)| u64::from(a > 0) + u64::from(b < len))
        .sum()
}

/// Generates every generation into memory and into `dir/gen-NNN.bin`.
pub fn generate(plan: &GenPlan, dir: &Path) -> Result<Generated, BenchError> {
    std::fs::create_dir_all(dir).map_err(|e| BenchError::io(dir, e))?;
    let model = Model::default();
    let pool_bytes = u64::from(model.pool_blocks) * BLOCK;
    let mut workload = Workload::new(Config {
        seed: plan.seed,
        generation_size: plan.generation_size,
        generations: plan.generations,
        clients: 1,
        model,
    })?;
    let mut written = Written::default();
    let (mut streams, mut files, mut truths) = (Vec::new(), Vec::new(), Vec::new());
    let (mut copied, mut junctions) = (Vec::new(), Vec::new());
    while let Some(g) = workload.next_generation() {
        let mut data = Vec::with_capacity(g.truth.bytes as usize);
        workload.write(&g, &mut data)?;
        let name = format!("gen-{:03}.bin", g.truth.generation);
        let path = dir.join(&name);
        std::fs::write(&path, &data).map_err(|e| BenchError::io(&path, e))?;
        let (ranges, joins) = copied_ranges(g.extents(), &mut written, pool_bytes);
        copied.push(ranges);
        junctions.push(joins);
        truths.push(g.truth);
        files.push(path);
        streams.push(Stream { name, data });
    }
    Ok(Generated {
        plan: plan.clone(),
        corpus: Corpus { streams },
        files,
        truths,
        copied,
        junctions,
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
    /// Places where copied and new bytes meet.
    pub boundaries: u64,
    /// Places where two copies meet that were not adjacent before.
    pub junctions: u64,
    /// Copied bytes in new FastCDC chunks that also hold new bytes.
    pub lost_straddling: u64,
    /// Bytes of new FastCDC chunks made of copied bytes alone.
    pub lost_whole: u64,
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

/// What chunking one generation found new.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct NewChunks {
    bytes: u64,
    /// Copied bytes in new chunks that hold new bytes too.
    straddling: u64,
    /// Bytes of new chunks that hold copied bytes only.
    whole: u64,
}

/// Bytes of `copied` (sorted, disjoint) inside `a..b`; `from` is the first range that
/// may overlap, advanced past those that end before `a` (chunks come in order).
fn copied_within(copied: &[(u64, u64)], from: &mut usize, a: u64, b: u64) -> u64 {
    while *from < copied.len() && copied[*from].1 <= a {
        *from += 1;
    }
    copied[*from..]
        .iter()
        .take_while(|r| r.0 < b)
        .map(|&(x, y)| y.min(b).saturating_sub(x.max(a)))
        .sum()
}

/// New chunk bytes of each stream, chunked by `config` and deduplicated against every
/// earlier stream, with the copied bytes among them; and the number of chunks.
fn new_bytes_per_stream(
    corpus: &Corpus,
    config: &ChunkerConfig,
    copied: &[Vec<(u64, u64)>],
) -> Result<(Vec<NewChunks>, u64), BenchError> {
    let cuts = cut(corpus, config)?;
    let mut seen: HashSet<Fingerprint> = HashSet::new();
    let mut out = Vec::new();
    let mut chunks = 0;
    for ((stream, lens), copied) in corpus.streams.iter().zip(&cuts.lengths).zip(copied) {
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
        let mut new = NewChunks::default();
        let (mut at, mut from) = (0u64, 0usize);
        for (s, fp) in slices.iter().zip(fps) {
            let (a, b) = (at, at + s.len() as u64);
            at = b;
            if !seen.insert(fp) {
                continue;
            }
            new.bytes += b - a;
            match copied_within(copied, &mut from, a, b) {
                c if c == b - a => new.whole += c,
                c => new.straddling += c,
            }
        }
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
    // Every byte read and no checkpoint: the experiments measure the papers' pipeline.
    let opts = BackupOptions {
        hostname: "larder-bench".into(),
        username: "larder-bench".into(),
        parents: Parents::None,
        checkpoint_interval: None,
        ..BackupOptions::default()
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
    let copied = &generated.copied;
    let (data_new, chunks) = new_bytes_per_stream(&generated.corpus, &config, copied)?;
    let fixed = ChunkerConfig {
        kind: ChunkerKind::Fixed,
        min_size: BLOCK as usize,
        avg_size: BLOCK as usize,
        max_size: BLOCK as usize,
        level: 0,
        seed: 0,
    };
    let (fixed_new, _) = new_bytes_per_stream(&generated.corpus, &fixed, copied)?;
    let rows = generated
        .truths
        .iter()
        .enumerate()
        .map(|(i, t)| GenerationRow {
            generation: t.generation,
            bytes: t.bytes,
            truth_new: t.new_bytes,
            backup_new: backup_new[i],
            data_new: data_new[i].bytes,
            fixed_new: fixed_new[i].bytes,
            boundaries: boundaries(&generated.copied[i], t.bytes),
            junctions: generated.junctions[i],
            lost_straddling: data_new[i].straddling,
            lost_whole: data_new[i].whole,
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

    #[test]
    fn copied_ranges_are_bytes_written_before_by_source_and_position() {
        let e = |source, first, offset, len| Extent {
            source,
            first,
            offset,
            len,
        };
        let pool = 4 * BLOCK;
        let mut written = Written::default();
        let first = [
            e(Source::Unique, 0, 0, 8192),
            e(Source::Pool, 3, 0, 2 * BLOCK),
        ];
        // Pool block 3 then, wrapping around the pool, block 0: all new.
        assert_eq!(copied_ranges(&first, &mut written, pool), (vec![], 0));
        let second = [
            e(Source::Unique, 1, 100, 50), // inside unique block 1: copied
            e(Source::Unique, 2, 0, 10),   // never written
            e(Source::Pool, 4, 10, 20),    // block 4 is pool block 0: copied
            e(Source::Pool, 3, BLOCK as u32 - 5, 10), // block 3's end, then block 0's start
        ];
        let (copied, junctions) = copied_ranges(&second, &mut written, pool);
        assert_eq!(copied, [(0, 50), (60, 90)]);
        // Pool block 0 at 10..30, then block 3's end: a junction; block 3's end runs
        // on into block 0's start, the same pool bytes in order: none.
        assert_eq!(junctions, 1);
        // The same extents again: every seam was written before.
        let (again, junctions) = copied_ranges(&second, &mut written, pool);
        assert_eq!((again, junctions), (vec![(0, 90)], 0));
        assert_eq!(boundaries(&copied, 90), 2);
        assert_eq!(boundaries(&[(0, 90)], 90), 0);
        let mut from = 0;
        assert_eq!(copied_within(&copied, &mut from, 40, 70), 20);
        assert_eq!(copied_within(&copied, &mut from, 70, 90), 20);
        assert_eq!(from, 1);
    }

    #[test]
    fn every_new_chunk_byte_is_new_or_a_copied_byte_stored_again() {
        let dir = tempfile::tempdir().unwrap();
        let plan = GenPlan {
            seed: 3,
            generation_size: 4 << 20,
            generations: 3,
        };
        let generated = generate(&plan, &dir.path().join("gens")).unwrap();
        assert_eq!(generated.files.len(), 3);
        // The copied ranges are the generator's truth, byte for byte.
        for (t, copied) in generated.truths.iter().zip(&generated.copied) {
            let bytes: u64 = copied.iter().map(|(a, b)| b - a).sum();
            assert_eq!(bytes, t.duplicate_bytes(), "generation {}", t.generation);
        }
        let report = run_gen_truth(&generated, dir.path(), &mut |_| {}).unwrap();
        for row in &report.rows {
            assert_eq!(row.bytes, 4 << 20);
            // Every new chunk byte is a new byte or a copied byte stored again.
            assert_eq!(
                row.data_new,
                row.truth_new + row.lost_straddling + row.lost_whole,
                "{row:?}"
            );
            // Later generations copy the previous one, with changes in between.
            assert!(row.generation == 1 || row.boundaries > 0, "{row:?}");
            // The backup also stores the tree stream.
            assert!(row.backup_new >= row.data_new, "{row:?}");
        }
        // Generation 1 starts at a block boundary and its runs are whole blocks, so
        // fixed 4 KiB chunks find exactly what the truth says.
        assert_eq!(report.rows[0].fixed_new, report.rows[0].truth_new);
        assert!(!dir.path().join("gen-truth-repo").exists());
    }
}
