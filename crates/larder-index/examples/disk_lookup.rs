//! Eager against lazy lookup in the disk index (docs/design/disk-index.md) on a
//! multi-generation chunk stream with locality (benches/common/generations.rs) whose
//! index is many times the memory budget: on-disk lookup I/Os and bytes, prefetches,
//! hit rates and time per component, per generation and in all. Each strategy gets a
//! fresh index in its own directory; every generation ends with `finish` and `sync`,
//! as a backup would.
//!
//! ```text
//! cargo run --release -p larder-index --example disk_lookup -- \
//!     [--chunks 2000000] [--generations 5] [--memory-mib 32] [--bft 32] \
//!     [--no-prelookup] [--seed 1] [--direct] [--dir DIR] [--lookup eager|lazy|both] \
//!     [--batch-gap PAGES] [--buffered-chunk-bytes N]
//! ```
//!
//! `--direct` opens the files with `O_DIRECT`, so every read reaches the disk.
//! `--batch-gap` splits a lazy batch's read where more than PAGES unneeded pages lie
//! between needed ones (default: one read per batch, as the paper).

use std::collections::VecDeque;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use larder_index::disk::{Answer, DirIo, DiskIndex, DiskIndexConfig, DiskIndexMetrics, Lookup};

#[path = "../benches/common/generations.rs"]
mod generations;
#[path = "../benches/common/keys.rs"]
mod keys;

struct Options {
    chunks: usize,
    generations: usize,
    memory_mib: u64,
    bft: usize,
    batch_gap_pages: u64,
    buffered_chunk_bytes: u64,
    prelookup: bool,
    seed: u64,
    direct: bool,
    dir: PathBuf,
    lookups: Vec<Lookup>,
}

fn options() -> Options {
    let mut o = Options {
        chunks: 2_000_000,
        generations: 5,
        memory_mib: 32,
        bft: 32,
        batch_gap_pages: u64::MAX,
        buffered_chunk_bytes: DiskIndexConfig::default().buffered_chunk_bytes,
        prelookup: true,
        seed: 1,
        direct: false,
        dir: std::env::temp_dir().join("larder-disk-lookup"),
        lookups: vec![Lookup::Eager, Lookup::Lazy],
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().unwrap_or_else(|| panic!("{arg} needs a value"));
        match arg.as_str() {
            "--chunks" => o.chunks = value().parse().expect("--chunks N"),
            "--generations" => o.generations = value().parse().expect("--generations N"),
            "--memory-mib" => o.memory_mib = value().parse().expect("--memory-mib N"),
            "--bft" => o.bft = value().parse().expect("--bft N"),
            "--batch-gap" => o.batch_gap_pages = value().parse().expect("--batch-gap PAGES"),
            "--buffered-chunk-bytes" => {
                o.buffered_chunk_bytes = value().parse().expect("--buffered-chunk-bytes N")
            }
            "--seed" => o.seed = value().parse().expect("--seed N"),
            "--dir" => o.dir = PathBuf::from(value()),
            "--no-prelookup" => o.prelookup = false,
            "--direct" => o.direct = true,
            "--lookup" => {
                o.lookups = match value().as_str() {
                    "eager" => vec![Lookup::Eager],
                    "lazy" => vec![Lookup::Lazy],
                    "both" => vec![Lookup::Eager, Lookup::Lazy],
                    other => panic!("--lookup eager|lazy|both, not {other}"),
                }
            }
            other => panic!("unknown argument {other}"),
        }
    }
    o
}

/// What one run measured.
struct Run {
    per_generation: Vec<(usize, DiskIndexMetrics, Duration)>,
    total: DiskIndexMetrics,
    wall: Duration,
    disk_bytes: u64,
    news: u64,
    /// The Bloom filter's predicted false-positive rate at the end.
    bloom_rate: f64,
}

fn run(o: &Options, gens: &[Vec<u64>], unique: u64, lookup: Lookup) -> Run {
    let dir = o.dir.join(format!("{lookup:?}").to_lowercase());
    std::fs::create_dir_all(&dir).expect("create the index directory");
    let config = DiskIndexConfig {
        memory_budget: o.memory_mib << 20,
        expected_fingerprints: unique,
        bft: o.bft,
        batch_gap_pages: o.batch_gap_pages,
        buffered_chunk_bytes: o.buffered_chunk_bytes,
        prelookup: o.prelookup,
        ..DiskIndexConfig::default()
    };
    let io = DirIo::open(&dir, o.direct).expect("open the directory");
    let mut index: DiskIndex<DirIo, u64> =
        DiskIndex::create(io, config, lookup).expect("create the index");
    let (table_buckets, buffer_buckets) = index.buckets();
    eprintln!(
        "{lookup:?}: {table_buckets} table buckets, {buffer_buckets} buffer buckets, cache {} fingerprints, bloom {} KiB",
        index.cache_capacity(),
        index.bloom().bytes() >> 10
    );
    let mut to_insert: VecDeque<(larder_hash::Fingerprint, u64)> = VecDeque::new();
    let mut news = 0;
    let mut per_generation = Vec::new();
    let started = Instant::now();
    for gen in gens {
        let before = *index.metrics();
        let gen_started = Instant::now();
        let mut drain = |index: &mut DiskIndex<DirIo, u64>, keep: usize| loop {
            while let Some(r) = index.poll() {
                if r.answer == Answer::New {
                    to_insert.push_back((r.fp, r.token));
                    news += 1;
                }
            }
            if to_insert.len() <= keep {
                break;
            }
            let (fp, id) = to_insert.pop_front().expect("not empty");
            index.insert(fp, keys::location(id)).expect("insert");
        };
        for &id in gen {
            index.submit(keys::fingerprint(id), id).expect("submit");
            // New chunks are inserted a few answers later, as the engine's writer would.
            drain(&mut index, 64);
        }
        index.finish().expect("finish");
        drain(&mut index, 0);
        index.sync().expect("sync");
        per_generation.push((
            gen.len(),
            delta(index.metrics(), &before),
            gen_started.elapsed(),
        ));
    }
    Run {
        per_generation,
        total: *index.metrics(),
        wall: started.elapsed(),
        disk_bytes: index.disk_bytes(),
        news,
        bloom_rate: index.bloom_false_positive_rate(),
    }
}

fn delta(now: &DiskIndexMetrics, before: &DiskIndexMetrics) -> DiskIndexMetrics {
    let mut d = *now;
    d.lookup_ios -= before.lookup_ios;
    d.lookup_bytes -= before.lookup_bytes;
    d.prefetch_ios -= before.prefetch_ios;
    d.prefetch_bytes -= before.prefetch_bytes;
    d.disk_lookups -= before.disk_lookups;
    d.time.total -= before.time.total;
    d.time.disk_lookup -= before.time.disk_lookup;
    d.time.prefetch -= before.time.prefetch;
    d
}

fn main() {
    let o = options();
    let gens = generations::generations(o.seed, o.generations, o.chunks);
    let total: usize = gens.iter().map(Vec::len).sum();
    let unique = gens.iter().flatten().max().map_or(0, |&m| m + 1);
    println!(
        "workload: {} generations, {total} chunks, {unique} distinct; budget {} MiB; BFT {}; prelookup {}; {}",
        o.generations,
        o.memory_mib,
        o.bft,
        o.prelookup,
        if o.direct { "O_DIRECT" } else { "page cache" }
    );
    let mut runs = Vec::new();
    for &lookup in &o.lookups {
        let r = run(&o, &gens, unique, lookup);
        println!(
            "\n{lookup:?}: index {:.1} MiB on disk = {:.1}x the budget; {} new; Bloom false-positive rate {:.2e} predicted at the end, {:.2e} met over the run; wall {:.1} s",
            r.disk_bytes as f64 / (1 << 20) as f64,
            r.disk_bytes as f64 / (o.memory_mib << 20) as f64,
            r.news,
            r.bloom_rate,
            r.total.bloom_false_positives as f64
                / (r.total.bloom_new + r.total.bloom_false_positives).max(1) as f64,
            r.wall.as_secs_f64()
        );
        println!("| gen | chunks | disk lookups | lookup I/Os | lookup MiB | prefetch I/Os | prefetch MiB | index s | on-disk lookup s | prefetch s | wall s |");
        println!("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
        for (g, (chunks, m, wall)) in r.per_generation.iter().enumerate() {
            println!(
                "| {} | {chunks} | {} | {} | {:.1} | {} | {:.1} | {:.2} | {:.2} | {:.2} | {:.2} |",
                g + 1,
                m.disk_lookups,
                m.lookup_ios,
                m.lookup_bytes as f64 / (1 << 20) as f64,
                m.prefetch_ios,
                m.prefetch_bytes as f64 / (1 << 20) as f64,
                m.time.total.as_secs_f64(),
                m.time.disk_lookup.as_secs_f64(),
                m.time.prefetch.as_secs_f64(),
                wall.as_secs_f64()
            );
        }
        println!("{}", r.total);
        runs.push((lookup, r));
    }
    if let [(_, eager), (_, lazy)] = &runs[..] {
        let (e, l) = (&eager.total, &lazy.total);
        println!(
            "\nlazy / eager: on-disk lookup I/Os {} / {} = {:.3} ({:.1}% fewer); all read I/Os {:.3}; index time {:.3}",
            l.lookup_ios,
            e.lookup_ios,
            l.lookup_ios as f64 / e.lookup_ios as f64,
            100.0 * (1.0 - l.lookup_ios as f64 / e.lookup_ios as f64),
            l.read_ios() as f64 / e.read_ios() as f64,
            l.time.total.as_secs_f64() / e.time.total.as_secs_f64()
        );
        assert_eq!(
            eager.news, lazy.news,
            "eager and lazy disagree on the new chunks"
        );
    }
}
