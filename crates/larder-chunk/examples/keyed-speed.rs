//! Single-thread speed of the keyed chunker against FastCDC 2020, in memory, at
//! 2/8/64 KiB level 2: alternating runs over the same bytes, so that a busy machine
//! slows both alike. Prints the median and best of each and the ratio of the medians.
//!
//! `cargo run --release -p larder-chunk --example keyed-speed -- FILE [BYTES] [RUNS] [BACKEND]`
//! (BYTES: how much of FILE, default 256 MiB; RUNS: default 9; BACKEND: portable,
//! aes-ni or vaes, default the best). `docs/performance.md` ("Keyed chunker") used it.

use std::io::Read;
use std::sync::Arc;
use std::time::Instant;

use larder_chunk::{Chunker, FastCdc2020, KeyedCdc};
use larder_crypto::{AesBackend, WindowPrf};

/// Chunk count and bytes, so that no cut is optimized away.
fn chunk_all(chunker: &dyn Chunker, mut data: &[u8]) -> (usize, usize) {
    let (mut count, mut bytes) = (0, 0);
    while !data.is_empty() {
        let len = chunker.next_chunk_len(data);
        count += 1;
        bytes += len;
        data = &data[len..];
    }
    (count, bytes)
}

/// Median and best of `seconds`, as MB/s over `bytes`.
fn summary(bytes: usize, seconds: &mut [f64]) -> (f64, f64) {
    seconds.sort_by(f64::total_cmp);
    let mb = bytes as f64 / 1e6;
    (mb / seconds[seconds.len() / 2], mb / seconds[0])
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let path = args
        .get(1)
        .ok_or("usage: keyed-speed FILE [BYTES] [RUNS] [BACKEND]")?;
    let limit: u64 = args.get(2).map_or(Ok(256 << 20), |s| s.parse())?;
    let runs: usize = args.get(3).map_or(Ok(9), |s| s.parse())?;
    let backend = match args.get(4) {
        None => AesBackend::detect(),
        Some(name) => AesBackend::ALL
            .into_iter()
            .find(|b| b.name() == name)
            .ok_or("backends: portable, aes-ni, vaes")?,
    };
    let mut data = Vec::new();
    std::fs::File::open(path)?
        .take(limit)
        .read_to_end(&mut data)?;
    let prf = WindowPrf::from_secret_on(&[7; 32], backend).ok_or("backend not supported here")?;
    let keyed = KeyedCdc::new(Arc::new(prf), 2048, 8192, 65536, 2);
    let fastcdc = FastCdc2020::new(2048, 8192, 65536, 2);
    let (mut fast_seconds, mut keyed_seconds) = (Vec::new(), Vec::new());
    for _ in 0..runs.max(1) {
        let started = Instant::now();
        std::hint::black_box(chunk_all(&fastcdc, &data));
        fast_seconds.push(started.elapsed().as_secs_f64());
        let started = Instant::now();
        std::hint::black_box(chunk_all(&keyed, &data));
        keyed_seconds.push(started.elapsed().as_secs_f64());
    }
    let (fast_median, fast_best) = summary(data.len(), &mut fast_seconds);
    let (keyed_median, keyed_best) = summary(data.len(), &mut keyed_seconds);
    println!(
        "fastcdc2020 median {fast_median:.0} MB/s (best {fast_best:.0}); keyed ({}) median \
         {keyed_median:.0} MB/s (best {keyed_best:.0}); ratio of medians {:.2}",
        backend.name(),
        keyed_median / fast_median
    );
    Ok(())
}
