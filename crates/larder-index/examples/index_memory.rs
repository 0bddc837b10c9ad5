//! Resident memory per fingerprint: RSS growth (VmRSS of /proc/self/status) while N
//! unique fingerprints are inserted, divided by N.
//!
//! ```text
//! cargo run --release -p larder-index --example index_memory -- [N] [--capacity] [--hashbrown]
//! ```
//! N defaults to 10 000 000. `--capacity` sizes the index with `with_capacity(N)`
//! first (as the repository does from its index segments); without it the index grows
//! from empty. `--hashbrown` measures a `hashbrown::HashMap<[u8; 32], ChunkLocation>`
//! instead, for comparison. Fingerprints are generated on the fly, so that only the
//! index's memory is counted.

use std::time::Instant;

use larder_index::{ChunkLocation, CuckooIndex, FingerprintIndex};

#[path = "../benches/common/keys.rs"]
mod keys;
use keys::{fingerprint, location};

fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let n: u64 = args
        .iter()
        .find_map(|a| a.parse().ok())
        .unwrap_or(10_000_000);
    let capacity = args.iter().any(|a| a == "--capacity");
    let hashbrown = args.iter().any(|a| a == "--hashbrown");
    let before = rss_bytes();
    let started = Instant::now();
    let (after, detail) = if hashbrown {
        let mut map = hashbrown::HashMap::<[u8; 32], ChunkLocation>::new();
        if capacity {
            map.reserve(n as usize);
        }
        for i in 0..n {
            map.insert(fingerprint(i).0, location(i));
        }
        let after = rss_bytes();
        (after, format!("\"capacity\": {}", map.capacity()))
    } else {
        let mut index = match capacity {
            true => CuckooIndex::with_capacity(n as usize),
            false => CuckooIndex::new(),
        };
        for i in 0..n {
            index.insert(fingerprint(i), location(i));
        }
        let after = rss_bytes();
        assert_eq!(index.len() as u64, n);
        let s = index.stats();
        (
            after,
            format!(
                "\"load_factor\": {:.4}, \"stashed\": {}, \"growths\": {}, \"kicks_per_insert\": {:.3}, \"heap_bytes_per_fingerprint\": {:.2}",
                s.load_factor(),
                s.stashed,
                s.growths,
                s.kicks as f64 / n as f64,
                s.heap_bytes as f64 / n as f64
            ),
        )
    };
    println!(
        "{{\"structure\": \"{}\", \"fingerprints\": {n}, \"with_capacity\": {capacity}, \"rss_growth_bytes\": {}, \"rss_bytes_per_fingerprint\": {:.2}, \"insert_seconds\": {:.2}, {detail}}}",
        if hashbrown { "hashbrown" } else { "cuckoo" },
        after.saturating_sub(before),
        after.saturating_sub(before) as f64 / n as f64,
        started.elapsed().as_secs_f64(),
    );
}
