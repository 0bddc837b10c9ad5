//! Dedup ratio and mean chunk size of FastCDC 2020 and of the keyed chunker under
//! several fixed keys, at 2/8/64 KiB level 2, over files that are each a stream (as
//! `larder chunk` counts them: distinct chunks by BLAKE3 over all files).
//!
//! `cargo run --release -p larder-chunk --example keyed-dedup -- KEYS FILE...`
//! (key `k` is the secret of 32 bytes `37 k + 1`). `docs/performance.md` ("Keyed
//! chunker") used it.

use std::collections::HashSet;
use std::sync::Arc;

use larder_chunk::{Chunker, FastCdc2020, KeyedCdc};
use larder_crypto::WindowPrf;

/// Input over distinct bytes, and the mean chunk size.
fn measure(chunker: &dyn Chunker, files: &[Vec<u8>]) -> (f64, f64) {
    let mut seen = HashSet::new();
    let (mut total, mut distinct, mut chunks) = (0u64, 0u64, 0u64);
    for file in files {
        let mut data = &file[..];
        while !data.is_empty() {
            let len = chunker.next_chunk_len(data);
            total += len as u64;
            chunks += 1;
            if seen.insert(blake3::hash(&data[..len])) {
                distinct += len as u64;
            }
            data = &data[len..];
        }
    }
    (total as f64 / distinct as f64, total as f64 / chunks as f64)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let keys: u8 = args
        .get(1)
        .ok_or("usage: keyed-dedup KEYS FILE...")?
        .parse()?;
    let files = args[2..]
        .iter()
        .map(std::fs::read)
        .collect::<Result<Vec<_>, _>>()?;
    let (ratio, mean) = measure(&FastCdc2020::new(2048, 8192, 65536, 2), &files);
    println!("fastcdc2020 ratio {ratio:.4} mean {mean:.0}");
    let mut ratios = Vec::new();
    for k in 0..keys {
        let secret = [k.wrapping_mul(37).wrapping_add(1); 32];
        let keyed = KeyedCdc::new(
            Arc::new(WindowPrf::from_secret(&secret)),
            2048,
            8192,
            65536,
            2,
        );
        let (keyed_ratio, keyed_mean) = measure(&keyed, &files);
        println!(
            "keyed key {k} ratio {keyed_ratio:.4} mean {keyed_mean:.0} ({:+.2}%)",
            100.0 * (keyed_ratio / ratio - 1.0)
        );
        ratios.push(keyed_ratio);
    }
    if !ratios.is_empty() {
        let average = ratios.iter().sum::<f64>() / ratios.len() as f64;
        println!(
            "keyed mean ratio {average:.4} ({:+.2}% against fastcdc2020)",
            100.0 * (average / ratio - 1.0)
        );
    }
    Ok(())
}
