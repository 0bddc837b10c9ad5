//! The lookup rate one node serves on loopback (issue 7, acceptance 3: at least 1
//! million fingerprints per second). A server over an in-memory handler (every
//! fingerprint Known, from a map of about 1 M entries) runs on its own runtime, as
//! another process would; one client connection keeps `--in-flight` batches in flight
//! on its one lookup stream, for each batch size in turn. Prints a Markdown table of
//! fingerprints per second (median of `--runs` rounds; the sizes take turns within
//! each round), and checks every answer.
//!
//! ```sh
//! cargo run --release -p larder-cluster --example lookup_rate -- \
//!     [--entries 1048576] [--in-flight 8] [--seconds 2] [--runs 3] [--batches 16,32,128,256,...,8192]
//! ```

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use larder_cluster::rpc::{Answer, GetAnswer, LookupHandler, LookupServer, NodeClient, RpcError};
use larder_hash::Fingerprint;
use larder_index::ChunkLocation;

/// Hashes a fingerprint by its bytes 16..24: they are uniformly distributed already,
/// so the map costs one probe, not a SipHash of 32 bytes, and the figure is the
/// protocol's.
#[derive(Default)]
struct FingerprintBytesHasher(u64);

impl Hasher for FingerprintBytesHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // `[u8; 32]` hashes as its length (a usize) and then its 32 bytes.
        if bytes.len() == 32 {
            self.0 = u64::from_le_bytes(bytes[16..24].try_into().expect("8 bytes"));
        }
    }
}

type Map = HashMap<Fingerprint, ChunkLocation, BuildHasherDefault<FingerprintBytesHasher>>;

struct KnownEverything(Map);

impl LookupHandler for KnownEverything {
    async fn lookup(&self, _from: u16, fps: Vec<Fingerprint>) -> Result<Vec<Answer>, RpcError> {
        Ok(fps
            .iter()
            .map(|fp| {
                self.0
                    .get(fp)
                    .map_or(Answer::New, |loc| Answer::Known(*loc))
            })
            .collect())
    }

    async fn ack(&self, _: u16, _: Vec<(Fingerprint, ChunkLocation)>) -> Result<(), RpcError> {
        Ok(())
    }

    async fn get(&self, fps: Vec<Fingerprint>) -> Result<Vec<GetAnswer>, RpcError> {
        Ok(fps
            .iter()
            .map(|fp| {
                self.0
                    .get(fp)
                    .map_or(GetAnswer::Absent, |l| GetAnswer::Known(*l))
            })
            .collect())
    }
}

fn fingerprint(i: u64) -> Fingerprint {
    let mut b = [0u8; 32];
    let mut x = i;
    for chunk in b.chunks_mut(8) {
        // splitmix64
        x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        chunk.copy_from_slice(&(z ^ (z >> 31)).to_le_bytes());
    }
    Fingerprint(b)
}

fn location(i: u64) -> ChunkLocation {
    ChunkLocation {
        container: (1 << 48) | (i / 500),
        offset: (i % 500) as u32 * 8192,
        length: 8192,
    }
}

struct Options {
    entries: u64,
    in_flight: usize,
    seconds: f64,
    runs: usize,
    batches: Vec<usize>,
}

fn parse_options() -> Result<Options, String> {
    let mut o = Options {
        entries: 1 << 20,
        in_flight: 8,
        seconds: 2.0,
        runs: 3,
        batches: vec![16, 32, 128, 256, 512, 1024, 2048, 4096, 8192],
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().ok_or(format!("{flag} needs a value"))?;
        let bad = |e: &dyn std::fmt::Display| format!("{flag} {value}: {e}");
        match flag.as_str() {
            "--entries" => o.entries = value.parse().map_err(|e| bad(&e))?,
            "--in-flight" => o.in_flight = value.parse().map_err(|e| bad(&e))?,
            "--seconds" => o.seconds = value.parse().map_err(|e| bad(&e))?,
            "--runs" => o.runs = value.parse().map_err(|e| bad(&e))?,
            "--batches" => {
                o.batches = value
                    .split(',')
                    .map(|b| b.parse().map_err(|e| bad(&e)))
                    .collect::<Result<_, _>>()?
            }
            _ => return Err(format!("unknown option {flag}")),
        }
    }
    Ok(o)
}

/// Fingerprints answered per second with `in_flight` batches of `batch` in flight for
/// `seconds`, and the lookup messages sent.
async fn measure(
    client: Arc<NodeClient>,
    keys: Arc<Vec<Fingerprint>>,
    batch: usize,
    in_flight: usize,
    seconds: f64,
) -> (f64, u64) {
    let stop = Arc::new(AtomicBool::new(false));
    let answered = Arc::new(AtomicU64::new(0));
    let messages = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let tasks: Vec<_> = (0..in_flight)
        .map(|t| {
            let (client, keys, stop) = (client.clone(), keys.clone(), stop.clone());
            let (answered, messages) = (answered.clone(), messages.clone());
            tokio::spawn(async move {
                let mut at = (t * keys.len() / in_flight) % (keys.len() - batch);
                while !stop.load(Ordering::Relaxed) {
                    let fps = &keys[at..at + batch];
                    let answers = client.lookup(fps).await.expect("lookup");
                    // Every answer is Known: the map holds every key.
                    assert_eq!(answers.len(), batch);
                    assert!(answers.iter().all(|a| matches!(a, Answer::Known(_))));
                    answered.fetch_add(batch as u64, Ordering::Relaxed);
                    messages.fetch_add(1, Ordering::Relaxed);
                    at = (at + batch) % (keys.len() - batch);
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs_f64(seconds)).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.expect("lookup task");
    }
    let elapsed = start.elapsed().as_secs_f64();
    (
        answered.load(Ordering::Relaxed) as f64 / elapsed,
        messages.load(Ordering::Relaxed),
    )
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let o = parse_options()?;
    let map: Map = (0..o.entries)
        .map(|i| (fingerprint(i), location(i)))
        .collect();
    // Asked in an order unrelated to the map's layout.
    let mut keys: Vec<Fingerprint> = (0..o.entries).map(|i| fingerprint(i ^ 0x5555)).collect();
    keys.retain(|fp| map.contains_key(fp));
    let keys = Arc::new(keys);
    let max_batch = o.batches.iter().copied().max().unwrap_or(0);
    if keys.len() <= max_batch {
        return Err("--entries must exceed the largest batch".into());
    }

    // The node: its own runtime, as another process would have.
    let server_rt = tokio::runtime::Runtime::new()?;
    let any_port: SocketAddr = "127.0.0.1:0".parse()?;
    let server =
        server_rt.block_on(LookupServer::bind(any_port, Arc::new(KnownEverything(map))))?;
    let addr = server.local_addr().to_string();

    let client_rt = tokio::runtime::Runtime::new()?;
    let client = Arc::new(client_rt.block_on(NodeClient::connect(&addr, 1))?);

    // A short warm-up (connection windows, allocator), not counted.
    client_rt.block_on(measure(
        client.clone(),
        keys.clone(),
        1024,
        o.in_flight,
        0.5,
    ));

    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); o.batches.len()];
    let mut sent: Vec<u64> = vec![0; o.batches.len()];
    for _ in 0..o.runs {
        for (i, &batch) in o.batches.iter().enumerate() {
            let (rate, messages) = client_rt.block_on(measure(
                client.clone(),
                keys.clone(),
                batch,
                o.in_flight,
                o.seconds,
            ));
            rates[i].push(rate);
            sent[i] += messages;
        }
    }
    let node = server.stats();
    println!(
        "lookup rate of one node on loopback: {} entries, {} batches in flight on one stream, {} s per run, median of {} runs",
        keys.len(),
        o.in_flight,
        o.seconds,
        o.runs
    );
    println!();
    println!(
        "| fingerprints per message | fingerprints/s (median) | min | max | lookup messages/s |"
    );
    println!("| ---: | ---: | ---: | ---: | ---: |");
    for (i, &batch) in o.batches.iter().enumerate() {
        let m = median(rates[i].clone());
        let min = rates[i].iter().copied().fold(f64::INFINITY, f64::min);
        let max = rates[i].iter().copied().fold(0.0, f64::max);
        println!(
            "| {batch} | {:.0} | {:.0} | {:.0} | {:.0} |",
            m,
            min,
            max,
            m / batch as f64
        );
    }
    println!();
    println!(
        "server counters: {} lookup messages, {} fingerprints, {} failed; client sent {} timed messages",
        node.lookup_messages_in,
        node.lookup_fingerprints_in,
        node.failed_requests,
        sent.iter().sum::<u64>()
    );
    drop(client);
    server_rt.block_on(server.shutdown());
    Ok(())
}
