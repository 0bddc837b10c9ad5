//! Chunk-size statistics and the within-input dedup ratio, shared by `larder chunk`
//! (which feeds them chunk by chunk while streaming) and the experiments.

use std::collections::HashMap;

use larder_hash::Fingerprint;
use serde::Serialize;

/// Power-of-two buckets: bucket `k` counts chunk sizes in `[2^k, 2^(k+1))`. A chunk
/// length is a non-zero `u64`, so 64 buckets cover every length.
const POWER_BUCKETS: usize = 64;

/// Accumulates chunk sizes; cheap to update, exact to merge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SizeStats {
    chunks: u64,
    bytes: u64,
    /// Sum of squared sizes. Chunks are at most 16 MiB (the largest maximum that
    /// `ChunkerConfig` accepts), so each square is below 2^48 and the sum fits in 128
    /// bits for any count below 2^80.
    sum_squares: u128,
    min: u64,
    max: u64,
    buckets: [u64; POWER_BUCKETS],
}

impl Default for SizeStats {
    fn default() -> Self {
        Self {
            chunks: 0,
            bytes: 0,
            sum_squares: 0,
            min: u64::MAX,
            max: 0,
            buckets: [0; POWER_BUCKETS],
        }
    }
}

/// One power-of-two bucket: sizes in `low..high` bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SizeBucket {
    pub low: u64,
    pub high: u64,
    pub chunks: u64,
}

/// What [`SizeStats`] says about a set of chunks. Sizes are in bytes; with no chunks,
/// every figure is 0 and the histogram is empty.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SizeSummary {
    pub chunks: u64,
    pub bytes: u64,
    pub mean: f64,
    /// Population standard deviation.
    pub std_dev: f64,
    pub min: u64,
    pub max: u64,
    /// From the smallest to the largest non-empty bucket, empty ones between included;
    /// the counts sum to `chunks`.
    pub histogram: Vec<SizeBucket>,
}

impl SizeStats {
    /// Counts one chunk of `len` bytes (`len > 0`, as every chunker returns).
    pub fn add(&mut self, len: u64) {
        self.chunks += 1;
        self.bytes += len;
        self.sum_squares += u128::from(len) * u128::from(len);
        self.min = self.min.min(len);
        self.max = self.max.max(len);
        self.buckets[len.max(1).ilog2() as usize] += 1;
    }

    pub fn merge(&mut self, other: &SizeStats) {
        self.chunks += other.chunks;
        self.bytes += other.bytes;
        self.sum_squares += other.sum_squares;
        self.min = self.min.min(other.min);
        self.max = self.max.max(other.max);
        for (mine, theirs) in self.buckets.iter_mut().zip(other.buckets) {
            *mine += theirs;
        }
    }

    pub fn chunks(&self) -> u64 {
        self.chunks
    }

    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    pub fn summary(&self) -> SizeSummary {
        if self.chunks == 0 {
            return SizeSummary {
                chunks: 0,
                bytes: 0,
                mean: 0.0,
                std_dev: 0.0,
                min: 0,
                max: 0,
                histogram: Vec::new(),
            };
        }
        let n = self.chunks as f64;
        let mean = self.bytes as f64 / n;
        let variance = (self.sum_squares as f64 / n - mean * mean).max(0.0);
        let first = self.buckets.iter().position(|&c| c > 0).unwrap_or(0);
        let last = self.buckets.iter().rposition(|&c| c > 0).unwrap_or(0);
        let histogram = (first..=last)
            .map(|k| SizeBucket {
                low: 1 << k,
                high: 1u64.checked_shl(k as u32 + 1).unwrap_or(u64::MAX),
                chunks: self.buckets[k],
            })
            .collect();
        SizeSummary {
            chunks: self.chunks,
            bytes: self.bytes,
            mean,
            std_dev: variance.sqrt(),
            min: self.min,
            max: self.max,
            histogram,
        }
    }
}

/// Chunk counts in equal-width bins, for plotting a size distribution: bin `i` counts
/// sizes in `[i * bin_bytes, (i + 1) * bin_bytes)`, and the last bin holds the
/// largest possible chunk, so chunks forced at the maximum size show as a spike.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LinearHistogram {
    pub bin_bytes: u64,
    pub counts: Vec<u64>,
}

impl LinearHistogram {
    /// Bins of `bin_bytes` (> 0) covering sizes up to `largest` bytes.
    pub fn new(bin_bytes: u64, largest: u64) -> Self {
        let bin_bytes = bin_bytes.max(1);
        Self {
            bin_bytes,
            counts: vec![0; (largest / bin_bytes) as usize + 1],
        }
    }

    /// Counts one chunk; a size beyond `largest` goes to the last bin.
    pub fn add(&mut self, len: u64) {
        let last = self.counts.len() - 1;
        self.counts[((len / self.bin_bytes) as usize).min(last)] += 1;
    }

    pub fn total(&self) -> u64 {
        self.counts.iter().sum()
    }
}

/// How much a set of chunks deduplicates: bytes in over bytes of distinct chunks.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Dedup {
    pub input_bytes: u64,
    pub distinct_chunks: u64,
    pub distinct_bytes: u64,
    /// `input_bytes / distinct_bytes`; 1 for an empty input.
    pub ratio: f64,
    /// The FastCDC paper's "deduplication ratio": the share of input bytes found to be
    /// duplicates, in percent (`100 * (1 - 1 / ratio)`).
    pub duplicate_percent: f64,
}

impl Dedup {
    pub fn new(input_bytes: u64, distinct_chunks: u64, distinct_bytes: u64) -> Self {
        let (ratio, duplicate_percent) = if distinct_bytes == 0 {
            (1.0, 0.0)
        } else {
            (
                input_bytes as f64 / distinct_bytes as f64,
                100.0 * (1.0 - distinct_bytes as f64 / input_bytes as f64),
            )
        };
        Self {
            input_bytes,
            distinct_chunks,
            distinct_bytes,
            ratio,
            duplicate_percent,
        }
    }
}

/// Where a distinct chunk was first seen, so that the chunks of a stream that failed
/// half-way can be taken back out.
#[derive(Debug, Clone, Copy)]
struct FirstSeen {
    len: u64,
    stream: usize,
}

/// The distinct chunks of several streams, by fingerprint.
#[derive(Debug, Default)]
pub struct DistinctChunks {
    seen: HashMap<Fingerprint, FirstSeen>,
    input_bytes: u64,
}

impl DistinctChunks {
    /// Counts a chunk of `len` bytes of stream `stream`.
    pub fn add(&mut self, fingerprint: Fingerprint, len: u64, stream: usize) {
        self.input_bytes += len;
        self.seen
            .entry(fingerprint)
            .or_insert(FirstSeen { len, stream });
    }

    /// Takes back every chunk of `stream` whose first copy was in it, and `bytes` of
    /// input: used when a stream failed and is left out of the result. Chunks of the
    /// stream that repeat earlier streams' chunks only ever added to `input_bytes`.
    pub fn remove_stream(&mut self, stream: usize, bytes: u64) {
        self.seen.retain(|_, first| first.stream != stream);
        self.input_bytes -= bytes;
    }

    pub fn dedup(&self) -> Dedup {
        let distinct_bytes = self.seen.values().map(|first| first.len).sum();
        Dedup::new(self.input_bytes, self.seen.len() as u64, distinct_bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use larder_hash::HashAlgo;

    #[test]
    fn summary_of_known_sizes() {
        let mut s = SizeStats::default();
        for len in [1, 2, 3, 4, 4096, 4097, 8191] {
            s.add(len);
        }
        let sum = s.summary();
        assert_eq!(sum.chunks, 7);
        assert_eq!(sum.bytes, 1 + 2 + 3 + 4 + 4096 + 4097 + 8191);
        assert_eq!((sum.min, sum.max), (1, 8191));
        assert_eq!(sum.histogram.first().map(|b| (b.low, b.high)), Some((1, 2)));
        assert_eq!(
            sum.histogram.last().map(|b| (b.low, b.high, b.chunks)),
            Some((4096, 8192, 3))
        );
        assert_eq!(sum.histogram.iter().map(|b| b.chunks).sum::<u64>(), 7);
        let lens = [1.0, 2.0, 3.0, 4.0, 4096.0, 4097.0, 8191.0];
        let mean = lens.iter().sum::<f64>() / 7.0;
        let var = lens.iter().map(|l| (l - mean) * (l - mean)).sum::<f64>() / 7.0;
        assert!((sum.mean - mean).abs() < 1e-9);
        assert!((sum.std_dev - var.sqrt()).abs() < 1e-6);
    }

    #[test]
    fn merging_equals_adding_everything_to_one() {
        let (mut a, mut b, mut all) = (
            SizeStats::default(),
            SizeStats::default(),
            SizeStats::default(),
        );
        for len in 1..500u64 {
            let len = len * 37 % 9000 + 1;
            if len % 3 == 0 {
                a.add(len);
            } else {
                b.add(len);
            }
            all.add(len);
        }
        a.merge(&b);
        assert_eq!(a, all);
    }

    #[test]
    fn empty_summary_is_all_zero() {
        let sum = SizeStats::default().summary();
        assert_eq!((sum.chunks, sum.min, sum.max), (0, 0, 0));
        assert!(sum.histogram.is_empty());
        assert_eq!(Dedup::new(0, 0, 0).ratio, 1.0);
    }

    #[test]
    fn linear_histogram_puts_the_maximum_in_its_own_last_bin() {
        let mut h = LinearHistogram::new(1024, 65536);
        assert_eq!(h.counts.len(), 65);
        for len in [1, 1023, 1024, 65535, 65536, 70000] {
            h.add(len);
        }
        assert_eq!(h.counts[0], 2);
        assert_eq!(h.counts[1], 1);
        assert_eq!(h.counts[63], 1);
        assert_eq!(h.counts[64], 2);
        assert_eq!(h.total(), 6);
    }

    #[test]
    fn distinct_chunks_count_repeats_once_and_forget_a_failed_stream() {
        let fp = |b: &[u8]| HashAlgo::Blake3.fingerprint(b);
        let mut d = DistinctChunks::default();
        d.add(fp(b"aa"), 2, 0);
        d.add(fp(b"bbb"), 3, 0);
        d.add(fp(b"aa"), 2, 1);
        d.add(fp(b"cccc"), 4, 1);
        let all = d.dedup();
        assert_eq!((all.input_bytes, all.distinct_bytes), (11, 9));
        assert_eq!(all.distinct_chunks, 3);
        d.remove_stream(1, 6);
        let first = d.dedup();
        assert_eq!((first.input_bytes, first.distinct_bytes), (5, 5));
        assert_eq!(first.ratio, 1.0);
    }
}
