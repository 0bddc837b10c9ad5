//! The lookup rate one node serves on loopback (the target: at least 1
//! million fingerprints per second). A server runs on its own runtime, as another
//! process would, over one of two handlers (`--handler`):
//!
//! - `map`: an in-memory `HashMap` of about 1 M entries: the protocol's own cost;
//! - `owner`: the real owner, an `OwnerService` owning all `--partitions` partitions,
//!   each a disk index in a directory under `--dir` (default `/dev/shm`, tmpfs),
//!   filled first with the `--entries` fingerprints through its own lookups and acks.
//!
//! One client connection keeps `--in-flight` batches in flight on its one lookup
//! stream, for each batch size and each share of new fingerprints (`--new`: 0 is a
//! second backup generation, every fingerprint known) in turn; new ones are answered
//! `New` and acknowledged at once (one Ack per batch, timed too). Prints a Markdown
//! table of fingerprints looked up per second (median of `--runs` rounds; the cases
//! take turns within each round), and checks every answer's kind.
//!
//! ```sh
//! cargo run --release -p larder-cluster --example lookup_rate -- [--handler map|owner] \
//!     [--entries 1048576] [--in-flight 8] [--seconds 2] [--runs 3] [--batches 16,32,128,256,...,8192] \
//!     [--new 0] [--partitions 1024] [--index-mib 256] [--lookup eager|lazy] [--order permuted|stream] [--dir /dev/shm]
//! ```

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use larder_cluster::ids::first_container;
use larder_cluster::partitions::PartitionStore;
use larder_cluster::router::MapView;
use larder_cluster::rpc::{Answer, GetAnswer, LookupHandler, LookupServer, NodeClient, RpcError};
use larder_cluster::service::OwnerService;
use larder_cluster::PartitionId;
use larder_hash::{Fingerprint, HashAlgo};
use larder_index::disk::{DiskIndexConfig, Lookup};
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
        container: first_container(1) | (i / 500),
        offset: (i % 500) as u32 * 8192,
        length: 8192,
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Handler {
    Map,
    Owner,
}

struct Options {
    handler: Handler,
    partitions: u32,
    index_mib: u64,
    lookup: Lookup,
    dir: std::path::PathBuf,
    new: Vec<f64>,
    /// Whether the indexed fingerprints are asked in the order they were indexed (a
    /// second backup generation of the same data), else in a permuted order.
    stream: bool,
    entries: u64,
    in_flight: usize,
    seconds: f64,
    runs: usize,
    batches: Vec<usize>,
}

fn parse_options() -> Result<Options, String> {
    let mut o = Options {
        handler: Handler::Map,
        partitions: larder_cluster::DEFAULT_PARTITIONS,
        index_mib: 256,
        lookup: Lookup::Eager,
        dir: "/dev/shm".into(),
        new: vec![0.0],
        stream: false,
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
            "--handler" => {
                o.handler = match value.as_str() {
                    "map" => Handler::Map,
                    "owner" => Handler::Owner,
                    _ => return Err(format!("--handler {value}: map or owner")),
                }
            }
            "--lookup" => {
                o.lookup = match value.as_str() {
                    "eager" => Lookup::Eager,
                    "lazy" => Lookup::Lazy,
                    _ => return Err(format!("--lookup {value}: eager or lazy")),
                }
            }
            "--order" => {
                o.stream = match value.as_str() {
                    "stream" => true,
                    "permuted" => false,
                    _ => return Err(format!("--order {value}: stream or permuted")),
                }
            }
            "--partitions" => o.partitions = value.parse().map_err(|e| bad(&e))?,
            "--index-mib" => o.index_mib = value.parse().map_err(|e| bad(&e))?,
            "--dir" => o.dir = value.into(),
            "--new" => {
                o.new = value
                    .split(',')
                    .map(|b| b.parse().map_err(|e| bad(&e)))
                    .collect::<Result<_, _>>()?
            }
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

/// The ids of fingerprints never indexed: each is asked once.
const FRESH: u64 = 1 << 40;

/// Fingerprints looked up per second with `in_flight` batches of `batch` in flight for
/// `seconds`, a share `new` of each batch never seen before (answered `New`, and
/// acknowledged in one Ack before the next batch), and the lookup messages sent.
async fn measure(
    client: Arc<NodeClient>,
    keys: Arc<Vec<Fingerprint>>,
    fresh: Arc<AtomicU64>,
    batch: usize,
    new: f64,
    in_flight: usize,
    seconds: f64,
) -> (f64, u64) {
    let stop = Arc::new(AtomicBool::new(false));
    let answered = Arc::new(AtomicU64::new(0));
    let messages = Arc::new(AtomicU64::new(0));
    let fresh_per_batch = ((batch as f64 * new).round() as usize).min(batch);
    let known_per_batch = batch - fresh_per_batch;
    let start = Instant::now();
    let tasks: Vec<_> = (0..in_flight)
        .map(|t| {
            let (client, keys, stop, fresh) =
                (client.clone(), keys.clone(), stop.clone(), fresh.clone());
            let (answered, messages) = (answered.clone(), messages.clone());
            tokio::spawn(async move {
                let mut at = (t * keys.len() / in_flight) % (keys.len() - batch);
                while !stop.load(Ordering::Relaxed) {
                    let first = fresh.fetch_add(fresh_per_batch as u64, Ordering::Relaxed);
                    let mut fps: Vec<Fingerprint> = (first..first + fresh_per_batch as u64)
                        .map(fingerprint)
                        .collect();
                    fps.extend_from_slice(&keys[at..at + known_per_batch]);
                    let answers = client.lookup(&fps).await.expect("lookup");
                    // The fresh ones first, then the indexed ones.
                    assert_eq!(answers.len(), batch);
                    assert!(answers[..fresh_per_batch].iter().all(|a| *a == Answer::New));
                    assert!(answers[fresh_per_batch..]
                        .iter()
                        .all(|a| matches!(a, Answer::Known(_))));
                    if fresh_per_batch > 0 {
                        let acks: Vec<(Fingerprint, ChunkLocation)> = (first..)
                            .zip(&fps[..fresh_per_batch])
                            .map(|(id, fp)| (*fp, location(id - FRESH)))
                            .collect();
                        client.ack(&acks).await.expect("ack");
                    }
                    answered.fetch_add(batch as u64, Ordering::Relaxed);
                    messages.fetch_add(1, Ordering::Relaxed);
                    at = (at + known_per_batch) % (keys.len() - batch);
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

/// An owner of all `o.partitions` partitions, in disk indexes under `dir`, with the
/// fingerprints of ids `0..o.entries` indexed through its own lookups and acks.
fn filled_owner(
    o: &Options,
    dir: &std::path::Path,
    rt: &tokio::runtime::Runtime,
) -> Result<OwnerService, Box<dyn std::error::Error>> {
    let per_partition = o.entries.div_ceil(u64::from(o.partitions));
    let config = DiskIndexConfig {
        memory_budget: (o.index_mib << 20) / u64::from(o.partitions),
        // Room for the new fingerprints the mixed cases add.
        expected_fingerprints: 4 * per_partition,
        buffered_chunk_bytes: 0,
        ..DiskIndexConfig::default()
    };
    let store = PartitionStore::new(dir, o.partitions, HashAlgo::Blake3, config, o.lookup);
    // Node 1, the clients' id, is the one member it serves.
    let members = MapView {
        owners: Vec::new(),
        addrs: HashMap::from([(1, "127.0.0.1:0".to_string())]),
    };
    let service = OwnerService::new(
        store,
        o.partitions,
        Duration::from_secs(60),
        Arc::new(RwLock::new(members)),
    );
    let all: Vec<PartitionId> = (0..o.partitions).map(PartitionId).collect();
    service.take_over(&all, 1)?;
    let started = Instant::now();
    rt.block_on(async {
        let ids: Vec<u64> = (0..o.entries).collect();
        for part in ids.chunks(8192) {
            let fps: Vec<Fingerprint> = part.iter().map(|&i| fingerprint(i)).collect();
            let answers = service.lookup(1, fps.clone()).await?;
            assert!(answers.iter().all(|a| *a == Answer::New));
            let entries: Vec<(Fingerprint, ChunkLocation)> = part
                .iter()
                .zip(fps)
                .map(|(&i, fp)| (fp, location(i)))
                .collect();
            service.ack(1, &entries)?;
        }
        Ok::<(), larder_cluster::ClusterError>(())
    })?;
    eprintln!(
        "owner: {} fingerprints indexed in {} partitions in {:.1} s",
        o.entries,
        o.partitions,
        started.elapsed().as_secs_f64()
    );
    Ok(service)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let o = parse_options()?;
    // The ids 0..entries, in the order they were indexed or permuted.
    let permute = if o.stream { 0 } else { 0x5555 };
    let keys: Vec<Fingerprint> = (0..o.entries)
        .map(|i| i ^ permute)
        .filter(|&i| i < o.entries)
        .map(fingerprint)
        .collect();
    let keys = Arc::new(keys);
    let max_batch = o.batches.iter().copied().max().unwrap_or(0);
    if keys.len() <= max_batch {
        return Err("--entries must exceed the largest batch".into());
    }

    // The node: its own runtime, as another process would have.
    let server_rt = tokio::runtime::Runtime::new()?;
    let any_port: SocketAddr = "127.0.0.1:0".parse()?;
    let dir = tempfile::tempdir_in(&o.dir)?;
    let (server, handler) = match o.handler {
        Handler::Map => {
            let map: Map = (0..o.entries)
                .map(|i| (fingerprint(i), location(i)))
                .collect();
            let server =
                server_rt.block_on(LookupServer::bind(any_port, Arc::new(KnownEverything(map))))?;
            (server, "an in-memory HashMap".to_string())
        }
        Handler::Owner => {
            let service = filled_owner(&o, dir.path(), &server_rt)?;
            let server = server_rt.block_on(LookupServer::bind(any_port, Arc::new(service)))?;
            let lookup = match o.lookup {
                Lookup::Eager => "eager",
                Lookup::Lazy => "lazy",
            };
            (
                server,
                format!(
                    "the owner (OwnerService, {} partitions, disk indexes in {}, {} MiB in all, {lookup} lookup)",
                    o.partitions,
                    o.dir.display(),
                    o.index_mib
                ),
            )
        }
    };
    let addr = server.local_addr().to_string();
    let fresh = Arc::new(AtomicU64::new(FRESH));

    let client_rt = tokio::runtime::Runtime::new()?;
    let client = Arc::new(client_rt.block_on(NodeClient::connect(&addr, 1))?);

    // A short warm-up (connection windows, allocator), not counted.
    client_rt.block_on(measure(
        client.clone(),
        keys.clone(),
        fresh.clone(),
        1024,
        0.0,
        o.in_flight,
        0.5,
    ));

    let cases: Vec<(f64, usize)> = o
        .new
        .iter()
        .flat_map(|&new| o.batches.iter().map(move |&b| (new, b)))
        .collect();
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); cases.len()];
    let mut sent: Vec<u64> = vec![0; cases.len()];
    for _ in 0..o.runs {
        for (i, &(new, batch)) in cases.iter().enumerate() {
            let (rate, messages) = client_rt.block_on(measure(
                client.clone(),
                keys.clone(),
                fresh.clone(),
                batch,
                new,
                o.in_flight,
                o.seconds,
            ));
            rates[i].push(rate);
            sent[i] += messages;
        }
    }
    let node = server.stats();
    println!(
        "lookup rate of one node on loopback over {handler}: {} fingerprints indexed, {} batches in flight on one stream, {} s per run, median of {} runs",
        o.entries,
        o.in_flight,
        o.seconds,
        o.runs
    );
    println!();
    println!(
        "| new | fingerprints per message | fingerprints/s (median) | min | max | lookup messages/s |"
    );
    println!("| ---: | ---: | ---: | ---: | ---: | ---: |");
    for (i, &(new, batch)) in cases.iter().enumerate() {
        let m = median(rates[i].clone());
        let min = rates[i].iter().copied().fold(f64::INFINITY, f64::min);
        let max = rates[i].iter().copied().fold(0.0, f64::max);
        println!(
            "| {:.0}% | {batch} | {:.0} | {:.0} | {:.0} | {:.0} |",
            new * 100.0,
            m,
            min,
            max,
            m / batch as f64
        );
    }
    println!();
    println!(
        "server counters: {} lookup messages, {} fingerprints, {} acks, {} failed; client sent {} timed messages",
        node.lookup_messages_in,
        node.lookup_fingerprints_in,
        node.ack_messages_in,
        node.failed_requests,
        sent.iter().sum::<u64>()
    );
    drop(client);
    server_rt.block_on(server.shutdown());
    Ok(())
}
