//! The backup pipeline a user of the `fastcdc` and `blake3` crates writes: cut a file
//! with `fastcdc::v2020` (2/8/64 KiB, level 2) and hash each chunk with
//! `blake3::hash`. The baseline of docs/performance.md's one-core backup comparison,
//! in two forms:
//! - `in-memory`: the file already in memory (read before the clock starts), so only
//!   chunking and hashing are timed: the strictest baseline;
//! - `stream`: `fastcdc::v2020::StreamCDC` reading the file, as a tool would.
//!
//! `cargo run --release -p larder-hash --example crate_pipeline -- FILE [RUNS]`
//! prints one JSON line per run and form, then the medians.

use std::fs::File;
use std::time::Instant;

use fastcdc::v2020::{FastCDC, Normalization, StreamCDC};

const MIN: usize = 2048;
const AVG: usize = 8192;
const MAX: usize = 65536;

/// Chunks and a checksum of the hashes, so that nothing is optimized away.
fn in_memory(data: &[u8]) -> (usize, u8) {
    let chunker = FastCDC::with_level(data, MIN, AVG, MAX, Normalization::Level2);
    chunker.fold((0, 0), |(n, x), c| {
        let hash = blake3::hash(&data[c.offset..c.offset + c.length]);
        (n + 1, x ^ hash.as_bytes()[0])
    })
}

fn stream(path: &str) -> (usize, u8) {
    let file = File::open(path).unwrap_or_else(|e| panic!("cannot open {path}: {e}"));
    let chunker = StreamCDC::with_level(file, MIN, AVG, MAX, Normalization::Level2);
    chunker.fold((0, 0), |(n, x), c| {
        let c = c.expect("read error");
        (n + 1, x ^ blake3::hash(&c.data).as_bytes()[0])
    })
}

fn main() {
    let mut args = std::env::args().skip(1);
    let path = args.next().expect("usage: crate_pipeline FILE [RUNS]");
    let runs: usize = args
        .next()
        .map_or(5, |r| r.parse().expect("RUNS is a number"));
    let data = std::fs::read(&path).unwrap_or_else(|e| panic!("cannot read {path}: {e}"));
    let mut rates = [Vec::new(), Vec::new()];
    for run in 0..runs {
        for (form, rates) in ["in-memory", "stream"].into_iter().zip(&mut rates) {
            let started = Instant::now();
            let (chunks, check) = match form {
                "in-memory" => in_memory(&data),
                _ => stream(&path),
            };
            let seconds = started.elapsed().as_secs_f64();
            let rate = data.len() as f64 / seconds / 1e6;
            rates.push(rate);
            println!(
                "{{\"form\":\"{form}\",\"run\":{run},\"bytes\":{},\"chunks\":{chunks},\"seconds\":{seconds:.4},\"mb_per_sec\":{rate:.1},\"check\":{check}}}",
                data.len()
            );
        }
    }
    for (form, rates) in ["in-memory", "stream"].into_iter().zip(&mut rates) {
        rates.sort_by(f64::total_cmp);
        println!("{form}: median {:.1} MB/s", rates[rates.len() / 2]);
    }
}
