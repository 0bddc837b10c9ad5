//! Parallel inserts: builds of N keys with 1 and with 2 threads, interleaved, so that
//! both see the same machine load (the development machine is shared: criterion's
//! separate runs of each, minutes apart, measure the load as much as the code).
//!
//! ```text
//! cargo run --release -p larder-index --example insert_scaling -- [N] [ROUNDS] [--dashmap]
//! ```
//! N (default 10 000 000) keys, sized for with `with_capacity(N)`, inserted with
//! `insert_batch(items, threads)`; `--dashmap` builds a `DashMap` from 1 and 2 threads
//! instead, for comparison. Each of ROUNDS (default 7) rounds builds once with each
//! thread count, in alternating order. Prints each build's wall time and the CPU time
//! the process used during it (user + system, all threads), then the medians, and the
//! median of the rounds' ratios (1-thread time / 2-thread time): the speedup. CPU time
//! divided by wall time says how many cores a build really had.

use std::time::Instant;

use dashmap::DashMap;
use larder_hash::Fingerprint;
use larder_index::{ChunkLocation, CuckooIndex, FingerprintIndex};

#[path = "../benches/common/keys.rs"]
mod keys;
use keys::{fingerprint, location};

/// User plus system CPU seconds of this process, all threads, so far.
fn cpu_seconds() -> f64 {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage writes a whole `rusage` into the pointer it is given.
    let usage = unsafe {
        libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr());
        usage.assume_init()
    };
    let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    seconds(usage.ru_utime) + seconds(usage.ru_stime)
}

/// Builds a structure from `items` on `threads` threads; returns (wall, CPU) seconds.
fn build(items: &[(Fingerprint, ChunkLocation)], threads: usize, dashmap: bool) -> (f64, f64) {
    let cpu = cpu_seconds();
    let started = Instant::now();
    let built: Box<dyn Send> = if dashmap {
        let map = DashMap::with_capacity(items.len());
        std::thread::scope(|s| {
            for part in items.chunks(items.len().div_ceil(threads)) {
                let map = &map;
                s.spawn(move || {
                    for (fp, loc) in part {
                        map.insert(fp.0, *loc);
                    }
                });
            }
        });
        assert_eq!(map.len(), items.len());
        Box::new(map)
    } else {
        let mut index = CuckooIndex::with_capacity(items.len());
        index.insert_batch(items, threads);
        assert_eq!(index.len(), items.len());
        Box::new(index)
    };
    let times = (started.elapsed().as_secs_f64(), cpu_seconds() - cpu);
    drop(built);
    times
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let numbers: Vec<usize> = args.iter().filter_map(|a| a.parse().ok()).collect();
    let n = numbers.first().copied().unwrap_or(10_000_000);
    let rounds = numbers.get(1).copied().unwrap_or(7).max(1);
    let dashmap = args.iter().any(|a| a == "--dashmap");
    let structure = if dashmap { "dashmap" } else { "cuckoo" };
    let items: Vec<_> = (0..n as u64)
        .map(|i| (fingerprint(i), location(i)))
        .collect();
    let (mut one, mut two, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds {
        let order = if round % 2 == 0 { [1, 2] } else { [2, 1] };
        let mut wall = [0.0; 3];
        for threads in order {
            let (w, cpu) = build(&items, threads, dashmap);
            println!(
                "{structure} {n} keys, round {round}, {threads} thread(s): {w:.3} s wall, {cpu:.3} s CPU ({:.2} cores)",
                cpu / w
            );
            wall[threads] = w;
        }
        one.push(wall[1]);
        two.push(wall[2]);
        ratios.push(wall[1] / wall[2]);
    }
    println!(
        "{structure} {n} keys, median of {rounds} rounds: 1 thread {:.3} s ({:.2} M inserts/s), 2 threads {:.3} s ({:.2} M inserts/s), speedup (median of the rounds' ratios) {:.2}x",
        median(one.clone()),
        n as f64 / median(one) / 1e6,
        median(two.clone()),
        n as f64 / median(two) / 1e6,
        median(ratios)
    );
}
