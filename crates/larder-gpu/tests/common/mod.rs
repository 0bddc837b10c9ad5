//! The differential check shared by the emulated and the device pipeline tests: the
//! pipeline's chunks of a stream against FastCDC 2020 and larder-hash.

use larder_chunk::{CandidateChunker, Chunker};
use larder_gpu::{ChunkerHasher, Device, GpuConfig};
use larder_hash::HashAlgo;

#[path = "../support/noise.rs"]
mod noise;
pub use noise::noise;

/// One case: the stream, the chunker's sizes and level, the hash, the pipeline's
/// configuration and the size of each push.
#[derive(Debug)]
pub struct Case {
    pub data: Vec<u8>,
    pub sizes: (usize, usize, usize),
    pub level: u8,
    pub algo: HashAlgo,
    pub config: GpuConfig,
    pub piece: usize,
}

/// `count` cases of inputs up to `max_len` bytes, from random data, and from slices of
/// `real` for every other case when given.
pub fn cases(count: u64, max_len: u64, real: Option<&[u8]>) -> impl Iterator<Item = Case> + '_ {
    let mut rng = 0x5eed_u64;
    let mut next = move |n: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % n.max(1)
    };
    (0..count).map(move |case| {
        let avg = 1usize << (8 + next(9));
        let sizes = (
            avg / 4 * next(2) as usize,
            avg,
            avg * (2 + next(7) as usize),
        );
        let len = match next(4) {
            0 => next(4096) as usize,
            1 => next(max_len / 8) as usize,
            _ => next(max_len) as usize,
        };
        let data = match real {
            Some(real) if case % 2 == 1 => {
                let start = next(real.len().saturating_sub(len) as u64) as usize;
                real[start..(start + len).min(real.len())].to_vec()
            }
            _ => noise(len, case),
        };
        let config = GpuConfig {
            block_size: [1 << 12, 1 << 16, 1 << 20][next(3) as usize],
            stretch: [64, 4096, 65_536][next(3) as usize],
            slots: 1 + next(16) as usize,
            streams: 2 + next(3) as usize,
        };
        Case {
            data,
            sizes,
            level: next(4) as u8,
            algo: HashAlgo::ALL[case as usize % 3],
            config,
            piece: 1 + next(max_len / 2) as usize,
        }
    })
}

/// The pipeline's chunks of `case.data` on `device` equal the CPU path's, byte for byte.
pub fn check<D: Device>(device: &D, case: &Case) {
    let (min, avg, max) = case.sizes;
    let chunker = CandidateChunker::new(min, avg, max, case.level);
    let mut hasher = ChunkerHasher::new(device, chunker, max, case.algo, case.config).unwrap();
    let mut got = Vec::new();
    for part in case.data.chunks(case.piece) {
        got.extend(hasher.push(part).unwrap());
    }
    got.extend(hasher.finish().unwrap().0);
    let ctx = format!(
        "{} bytes, sizes {:?}, level {}, {}, {:?}, pushes of {}",
        case.data.len(),
        case.sizes,
        case.level,
        case.algo.name(),
        case.config,
        case.piece
    );
    let lengths = chunker.sequential().chunk_lengths(&case.data);
    let got_lengths: Vec<usize> = got.iter().map(|c| c.len).collect();
    assert_eq!(got_lengths, lengths, "cut points: {ctx}");
    let mut at = 0;
    for c in &got {
        let expected = case.algo.fingerprint(&case.data[at..at + c.len]);
        assert_eq!(c.fingerprint, expected, "fingerprint at {at}: {ctx}");
        at += c.len;
    }
}
