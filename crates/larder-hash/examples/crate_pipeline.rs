//! The backup pipeline a user of the `fastcdc` and `blake3` crates writes: read a file,
//! cut it with `fastcdc::v2020` (2/8/64 KiB, level 2) and hash each chunk with
//! `blake3::hash`. The baseline of docs/performance.md's one-core backup comparison.
//!
//! `cargo run --release -p larder-hash --example crate_pipeline -- FILE [RUNS]`
//! prints each run's MB/s and the median, on one JSON line per run.

use std::time::Instant;

fn main() {
    let mut args = std::env::args().skip(1);
    let path = args.next().expect("usage: crate_pipeline FILE [RUNS]");
    let runs: usize = args
        .next()
        .map_or(5, |r| r.parse().expect("RUNS is a number"));
    let mut rates = Vec::new();
    for run in 0..runs {
        let started = Instant::now();
        let data = std::fs::read(&path).unwrap_or_else(|e| panic!("cannot read {path}: {e}"));
        let chunker = fastcdc::v2020::FastCDC::with_level(
            &data,
            2048,
            8192,
            65536,
            fastcdc::v2020::Normalization::Level2,
        );
        let (mut chunks, mut check) = (0usize, 0u8);
        for chunk in chunker {
            check ^= blake3::hash(&data[chunk.offset..chunk.offset + chunk.length]).as_bytes()[0];
            chunks += 1;
        }
        let seconds = started.elapsed().as_secs_f64();
        let rate = data.len() as f64 / seconds / 1e6;
        rates.push(rate);
        println!(
            "{{\"run\":{run},\"bytes\":{},\"chunks\":{chunks},\"seconds\":{seconds:.4},\"mb_per_sec\":{rate:.1},\"check\":{check}}}",
            data.len()
        );
    }
    rates.sort_by(f64::total_cmp);
    println!("median {:.1} MB/s", rates[rates.len() / 2]);
}
