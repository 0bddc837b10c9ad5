//! `larder chunk`: files chunked as they are read, block by block, in bounded memory.

use std::fs::File;
use std::io::{ErrorKind, Read};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use larder_chunk::{
    Chunker, ChunkerConfig, ChunkerKind, FastCdc2020, ParallelChunker, ParallelStats,
};
use larder_hash::HashAlgo;
use serde::Serialize;

use crate::experiment_key::{build_chunker, key_source, KeySource};
use crate::stats::{Dedup, DistinctChunks, SizeStats, SizeSummary};
use crate::BenchError;

/// Bytes read at a time (raised to twice the largest chunk where that is more). Each
/// block costs the parallel chunker a fixed price (about 1.5 ms here with 2 threads,
/// whatever the block's size), so blocks are large: with `--threads 2` on 1 GiB of real
/// data, 256 MiB blocks give 1.83x one thread, 32 MiB blocks 1.46x (medians of 5 to 7
/// alternating runs of `larder chunk`, docs/performance.md). Memory: one block.
pub const BLOCK_SIZE: usize = 256 << 20;

/// Chunks everything `reader` yields as one stream. A chunk is cut only when at least
/// `max_size` bytes follow its start or the stream has ended (the [`Chunker`]
/// contract), so the cuts equal those of chunking the whole stream at once, and the
/// uncut tail is carried into the next block. With a `pool` of more than one thread,
/// each block is chunked by [`ParallelChunker`], which finds exactly the same cuts.
/// `on_chunks(data, lengths)` gets each block's cut chunks: `data` starts with their
/// concatenation, followed by the uncut bytes the block still holds (the start of the
/// next chunk, which a fingerprint at a cut may read). Returns the time spent in the
/// chunker alone, not reading or in `on_chunks`, and the parallel chunker's statistics.
pub fn chunk_reader(
    reader: &mut dyn Read,
    chunker: &dyn Chunker,
    block_size: usize,
    pool: Option<&rayon::ThreadPool>,
    on_chunks: &mut dyn FnMut(&[u8], &[u32]),
) -> std::io::Result<(Duration, ParallelStats)> {
    let max = chunker.max_size();
    // The carried tail is shorter than `max`, so a block of 2 * max always has room
    // for at least `max` new bytes.
    let block_size = block_size.max(2 * max);
    let mut buf = vec![0u8; block_size];
    let mut filled = 0;
    let mut lengths = Vec::new();
    let mut busy = Duration::ZERO;
    let mut parallel = ParallelStats::default();
    loop {
        let mut eof = false;
        while filled < block_size {
            match reader.read(&mut buf[filled..]) {
                Ok(0) => {
                    eof = true;
                    break;
                }
                Ok(n) => filled += n,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        lengths.clear();
        let started = Instant::now();
        let mut pos = 0;
        if let Some(pool) = pool {
            let block = ParallelChunker::new(chunker, pool).chunk_block(&buf[..filled], eof);
            // A chunk is at most 16 MiB (`ChunkerConfig`'s largest maximum).
            lengths.extend(block.lengths.iter().map(|&len| len as u32));
            pos = block.consumed;
            parallel += block.stats;
        } else {
            while pos < filled && (eof || filled - pos >= max) {
                let len = chunker.next_chunk_len(&buf[pos..filled]);
                lengths.push(len as u32);
                pos += len;
            }
        }
        busy += started.elapsed();
        on_chunks(&buf[..filled], &lengths);
        buf.copy_within(pos..filled, 0);
        filled -= pos;
        if eof {
            return Ok((busy, parallel));
        }
    }
}

/// Where each chunk of a file starts and how long it is; for FastCDC 2020, also the
/// 64-bit Gear value at each cut ([`FastCdc2020::cut_fingerprint`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct FileCuts {
    pub offsets: Vec<u64>,
    pub lengths: Vec<u32>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub gear_fingerprints: Vec<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FileResult {
    pub path: String,
    pub bytes: u64,
    pub chunks: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cuts: Option<FileCuts>,
}

/// A file that could not be read to its end; it is left out of every figure.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FileFailure {
    pub path: String,
    pub message: String,
}

/// What `larder chunk` reports, over every file that was read whole.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChunkFilesReport {
    pub algo: &'static str,
    pub config: ChunkerConfig,
    /// For a chunker that needs a key: where the key came from.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<KeySource>,
    pub files: Vec<FileResult>,
    pub failed: Vec<FileFailure>,
    pub sizes: SizeSummary,
    /// Across all files read whole, by BLAKE3 fingerprint.
    pub dedup: Dedup,
    /// Time in the chunker alone: file reads and fingerprinting are not counted.
    pub chunk_seconds: f64,
    pub chunk_mb_per_sec: f64,
    /// Chunking threads; with more than one, `parallel` says what resynchronising cost.
    pub threads: usize,
    pub parallel: ParallelStats,
}

/// Chunks each of `paths` as its own stream. Memory: one block, 40 bytes or so per
/// distinct chunk, and with `keep_cuts` 12 bytes per chunk. A file that cannot be read
/// is listed in `failed`; only an invalid `config` is an error.
pub fn chunk_files(
    paths: &[PathBuf],
    config: &ChunkerConfig,
    keep_cuts: bool,
    threads: usize,
) -> Result<ChunkFilesReport, BenchError> {
    config.validate()?;
    let chunker = build_chunker(config);
    let c = config;
    let gear = (keep_cuts && c.kind == ChunkerKind::Fastcdc2020)
        .then(|| FastCdc2020::with_seed(c.min_size, c.avg_size, c.max_size, c.level, c.seed));
    let pool = if threads > 1 {
        Some(
            rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .map_err(|e| BenchError::Threads(e.to_string()))?,
        )
    } else {
        None
    };
    let mut parallel = ParallelStats::default();
    let mut totals = SizeStats::default();
    let mut distinct = DistinctChunks::default();
    let mut files = Vec::new();
    let mut failed = Vec::new();
    let mut busy = Duration::ZERO;
    for (index, path) in paths.iter().enumerate() {
        let mut stats = SizeStats::default();
        let mut cuts = keep_cuts.then(FileCuts::default);
        let mut offset = 0u64;
        let mut on_chunks = |data: &[u8], lengths: &[u32]| {
            let mut slices = Vec::with_capacity(lengths.len());
            let mut start = 0;
            for &len in lengths {
                let len = len as usize;
                slices.push(&data[start..start + len]);
                // `gear` is only there with `cuts`; the fingerprint may read the bytes
                // after the chunk, which `data` still holds.
                if let (Some(gear), Some(cuts)) = (&gear, &mut cuts) {
                    let value = gear.cut_fingerprint(&data[start..], len);
                    cuts.gear_fingerprints.push(value);
                }
                start += len;
            }
            let fingerprints = HashAlgo::Blake3.fingerprint_batch(&slices);
            for (&len, fp) in lengths.iter().zip(fingerprints) {
                stats.add(u64::from(len));
                distinct.add(fp, u64::from(len), index);
                if let Some(cuts) = &mut cuts {
                    cuts.offsets.push(offset);
                    cuts.lengths.push(len);
                }
                offset += u64::from(len);
            }
        };
        let result = File::open(path).and_then(|mut file| {
            chunk_reader(
                &mut file,
                chunker.as_ref(),
                BLOCK_SIZE,
                pool.as_ref(),
                &mut on_chunks,
            )
        });
        match result {
            Ok((spent, stats_parallel)) => {
                busy += spent;
                parallel += stats_parallel;
                totals.merge(&stats);
                files.push(FileResult {
                    path: path.display().to_string(),
                    bytes: stats.bytes(),
                    chunks: stats.chunks(),
                    cuts,
                });
            }
            Err(e) => {
                distinct.remove_stream(index, stats.bytes());
                failed.push(FileFailure {
                    path: path.display().to_string(),
                    message: format!("cannot read {}: {e}", path.display()),
                });
            }
        }
    }
    let seconds = busy.as_secs_f64();
    let bytes = totals.bytes();
    Ok(ChunkFilesReport {
        algo: config.kind.name(),
        config: *config,
        key: config.kind.needs_key().then(key_source),
        files,
        failed,
        sizes: totals.summary(),
        dedup: distinct.dedup(),
        chunk_seconds: seconds,
        chunk_mb_per_sec: if bytes == 0 {
            0.0
        } else {
            bytes as f64 / 1e6 / seconds.max(1e-9)
        },
        threads: threads.max(1),
        parallel,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::seeded::xorshift_bytes as random;
    use larder_chunk::ChunkerKind;

    /// A reader that hands out at most `step` bytes a call, like a pipe.
    struct Trickle<'a> {
        data: &'a [u8],
        step: usize,
    }

    impl Read for Trickle<'_> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let n = buf.len().min(self.step).min(self.data.len());
            buf[..n].copy_from_slice(&self.data[..n]);
            self.data = &self.data[n..];
            Ok(n)
        }
    }

    #[test]
    fn streaming_cuts_equal_whole_stream_cuts_for_every_kind_block_size_and_thread_count() {
        let data = random(11, 700_000);
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(3)
            .build()
            .unwrap();
        for kind in ChunkerKind::ALL {
            let config = ChunkerConfig {
                kind,
                min_size: 1024,
                avg_size: 4096,
                max_size: 16384,
                level: 2,
                seed: 0,
            };
            if config.validate().is_err() {
                continue;
            }
            let chunker = build_chunker(&config);
            let whole: Vec<u32> = chunker
                .chunk_lengths(&data)
                .into_iter()
                .map(|l| l as u32)
                .collect();
            for (block, step) in [(1, 1000), (40_000, 4096), (1 << 20, 1 << 20)] {
                for pool in [None, Some(&pool)] {
                    let (mut streamed, mut joined) = (Vec::new(), Vec::new());
                    let mut reader = Trickle { data: &data, step };
                    chunk_reader(&mut reader, chunker.as_ref(), block, pool, &mut |d, l| {
                        let cut: u32 = l.iter().sum();
                        joined.extend_from_slice(&d[..cut as usize]);
                        streamed.extend_from_slice(l);
                    })
                    .unwrap();
                    let threads = pool.map_or(1, |p| p.current_num_threads());
                    assert_eq!(
                        streamed,
                        whole,
                        "{} block {block}, {threads} threads",
                        kind.name()
                    );
                    assert_eq!(joined, data);
                }
            }
        }
    }

    #[test]
    fn failed_files_are_left_out_and_named() {
        let dir = tempfile::tempdir().unwrap();
        let good = dir.path().join("good");
        std::fs::write(&good, random(12, 100_000)).unwrap();
        let missing = dir.path().join("missing");
        let report = chunk_files(
            &[good.clone(), missing.clone(), good],
            &ChunkerConfig::default(),
            true,
            1,
        )
        .unwrap();
        assert_eq!(report.files.len(), 2);
        assert_eq!(report.failed.len(), 1);
        assert!(report.failed[0].message.contains("missing"));
        assert_eq!(report.sizes.bytes, 200_000);
        assert!((report.dedup.ratio - 2.0).abs() < 1e-9);
        let cuts = report.files[0].cuts.as_ref().unwrap();
        assert_eq!(cuts.offsets[0], 0);
        let end = cuts.offsets.last().unwrap() + u64::from(*cuts.lengths.last().unwrap());
        assert_eq!(end, 100_000);
    }
}
