//! Messages per node per request against the paper's model (its equation (1) and
//! Fig. 4, `larder_cluster::model`). For each cluster size, in-process nodes (an
//! `OwnerService` over per-partition disk indexes and its `LookupServer` on loopback
//! each, the partitions spread by `plan_moves`) and one `Router` per node answering its
//! own partitions in process. Every node in turn writes requests of `c` = request size
//! / chunk size chunks, each new with probability `--new` (else a copy of a chunk
//! stored before, as in a second backup generation), and acknowledges the `New` ones:
//! its own partitions' in process, the others' with one Ack per owner. Counts per
//! request the lookup messages, their responses and the Ack messages (the model's three
//! phases), checks the totals against the owners' server counters, and prints a
//! Markdown table measured vs model.
//!
//! ```sh
//! cargo run --release -p larder-cluster --example messages -- \
//!     [--nodes 2,3,4,5] [--chunk-kib 4,8,16] [--request-kib 256,1024,4096] \
//!     [--requests 300] [--new 0.02] [--cache 0] [--dir /dev/shm]
//! ```

use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use larder_cluster::balance::plan_moves;
use larder_cluster::ids::first_container;
use larder_cluster::model::{NewChunks, Request, Targets};
use larder_cluster::partitions::PartitionStore;
use larder_cluster::router::{MapView, Router};
use larder_cluster::rpc::{LookupServer, NodeStats};
use larder_cluster::service::OwnerService;
use larder_cluster::{partition_of, Answer, NodeId, PartitionId, DEFAULT_PARTITIONS};
use larder_hash::{Fingerprint, HashAlgo};
use larder_index::disk::{DiskIndexConfig, Lookup};
use larder_index::ChunkLocation;

struct Options {
    nodes: Vec<u32>,
    chunk_kib: Vec<u64>,
    request_kib: Vec<u64>,
    requests: usize,
    p_new: f64,
    cache: usize,
    dir: std::path::PathBuf,
}

fn list<T: std::str::FromStr>(value: &str) -> Result<Vec<T>, T::Err> {
    value.split(',').map(str::parse).collect()
}

fn parse_options() -> Result<Options, String> {
    let mut o = Options {
        nodes: vec![2, 3, 4, 5],
        chunk_kib: vec![4, 8, 16],
        request_kib: vec![256, 1024, 4096],
        requests: 300,
        p_new: 0.02,
        cache: 0,
        dir: "/dev/shm".into(),
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().ok_or(format!("{flag} needs a value"))?;
        let bad = |e: &dyn std::fmt::Display| format!("{flag} {value}: {e}");
        match flag.as_str() {
            "--nodes" => o.nodes = list(&value).map_err(|e| bad(&e))?,
            "--chunk-kib" => o.chunk_kib = list(&value).map_err(|e| bad(&e))?,
            "--request-kib" => o.request_kib = list(&value).map_err(|e| bad(&e))?,
            "--requests" => o.requests = value.parse().map_err(|e| bad(&e))?,
            "--new" => o.p_new = value.parse().map_err(|e| bad(&e))?,
            "--cache" => o.cache = value.parse().map_err(|e| bad(&e))?,
            "--dir" => o.dir = value.into(),
            _ => return Err(format!("unknown option {flag}")),
        }
    }
    if o.nodes.iter().any(|&n| !(1..=64).contains(&n)) {
        return Err("--nodes: 1 to 64 nodes".into());
    }
    Ok(o)
}

/// splitmix64: a deterministic stream of uniform numbers.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

fn fingerprint(id: u64) -> Fingerprint {
    HashAlgo::Blake3.fingerprint(&id.to_le_bytes())
}

struct Node {
    id: NodeId,
    service: OwnerService,
    server: LookupServer,
    router: Router,
    /// The next location this node stores a chunk at.
    next: u64,
}

struct Cluster {
    nodes: Vec<Node>,
    map: Arc<RwLock<MapView>>,
    /// Chunk ids stored so far (acknowledged): the copies a request draws from.
    stored: Vec<u64>,
    next_id: u64,
    _dir: tempfile::TempDir,
}

async fn cluster(n: u32, o: &Options) -> Result<Cluster, Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir_in(&o.dir)?;
    let config = DiskIndexConfig {
        memory_budget: 256 << 10,
        expected_fingerprints: 4096,
        buffered_chunk_bytes: 0,
        ..DiskIndexConfig::default()
    };
    let ids: Vec<NodeId> = (1..=n as NodeId).collect();
    let owners = vec![0; DEFAULT_PARTITIONS as usize];
    let moves = plan_moves(&owners, &ids);
    // Every service reads the members (whose lookups it takes) from it.
    let map = Arc::new(RwLock::new(MapView {
        owners,
        addrs: HashMap::new(),
    }));
    let mut services = Vec::new();
    for &id in &ids {
        let store = PartitionStore::new(
            dir.path(),
            DEFAULT_PARTITIONS,
            HashAlgo::Blake3,
            config.clone(),
            Lookup::Eager,
        );
        let service = OwnerService::new(
            store,
            DEFAULT_PARTITIONS,
            Duration::from_secs(60),
            map.clone(),
        );
        let mine: Vec<PartitionId> = moves
            .iter()
            .filter(|(_, to)| *to == id)
            .map(|(p, _)| *p)
            .collect();
        service.take_over(&mine, 1)?;
        for p in &mine {
            map.write().expect("map").owners[p.0 as usize] = id;
        }
        let any_port: SocketAddr = "127.0.0.1:0".parse()?;
        let server = LookupServer::bind(any_port, Arc::new(service.clone())).await?;
        let addr = server.local_addr().to_string();
        map.write().expect("map").addrs.insert(id, addr);
        services.push((id, service, server));
    }
    let nodes = services
        .into_iter()
        .map(|(id, service, server)| Node {
            id,
            router: Router::new(id, DEFAULT_PARTITIONS, map.clone(), o.cache)
                .with_local(service.clone()),
            service,
            server,
            next: first_container(id),
        })
        .collect();
    Ok(Cluster {
        nodes,
        map,
        stored: Vec::new(),
        next_id: 0,
        _dir: dir,
    })
}

/// What one request cost.
#[derive(Debug, Default, Clone, Copy)]
struct Cost {
    lookups: u64,
    acks: u64,
    fingerprints_sent: u64,
    ack_entries_sent: u64,
    local: u64,
    new: u64,
}

/// Node `k` writes one request of `ids` and acknowledges its new chunks: those of its
/// own partitions in process, the others with one Ack per owner.
async fn write(c: &mut Cluster, k: usize, ids: &[u64]) -> Result<Cost, Box<dyn std::error::Error>> {
    let fps: Vec<Fingerprint> = ids.iter().map(|&id| fingerprint(id)).collect();
    let node = &mut c.nodes[k];
    let before = node.router.metrics();
    let answers = node.router.lookup(&fps).await?;
    let after = node.router.metrics();
    let mut local = Vec::new();
    let mut remote = Vec::new();
    let mut owners = BTreeSet::new();
    {
        let map = c.map.read().expect("map");
        for ((&id, fp), answer) in ids.iter().zip(&fps).zip(&answers) {
            if *answer != Answer::New {
                continue;
            }
            // One chunk per container: each location is distinct and names the node.
            node.next += 1;
            let at = ChunkLocation {
                container: node.next,
                offset: 0,
                length: 4096,
            };
            let owner = map.owners[partition_of(fp, DEFAULT_PARTITIONS).0 as usize];
            if owner == node.id {
                local.push((*fp, at));
            } else {
                owners.insert(owner);
                remote.push((*fp, at));
            }
            c.stored.push(id);
        }
    }
    node.service.ack(node.id, &local)?;
    node.router.ack(&remote).await?;
    Ok(Cost {
        lookups: after.messages - before.messages,
        acks: owners.len() as u64,
        fingerprints_sent: after.fingerprints_sent - before.fingerprints_sent,
        ack_entries_sent: remote.len() as u64,
        local: after.local - before.local,
        new: (local.len() + remote.len()) as u64,
    })
}

/// The request's chunk ids: each new (a fresh id) with probability `p_new`, else a
/// copy of a stored one, drawn uniformly.
fn draw(c: &mut Cluster, rng: &mut Rng, chunks: usize, p_new: f64) -> Vec<u64> {
    (0..chunks)
        .map(|_| {
            if c.stored.is_empty() || rng.unit() < p_new {
                c.next_id += 1;
                c.next_id
            } else {
                c.stored[(rng.next() % c.stored.len() as u64) as usize]
            }
        })
        .collect()
}

fn server_totals(c: &Cluster) -> NodeStats {
    let mut t = NodeStats::default();
    for node in &c.nodes {
        let s = node.server.stats();
        t.lookup_messages_in += s.lookup_messages_in;
        t.lookup_fingerprints_in += s.lookup_fingerprints_in;
        t.ack_messages_in += s.ack_messages_in;
        t.ack_entries_in += s.ack_entries_in;
        t.stream_messages_out += s.stream_messages_out;
    }
    t
}

fn mean_and_error(v: &[f64]) -> (f64, f64) {
    let n = v.len() as f64;
    let mean = v.iter().sum::<f64>() / n;
    let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0).max(1.0);
    (mean, (var / n).sqrt())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let o = parse_options()?;
    println!(
        "messages per node per request: {} partitions, {} requests per node per row, {:.1}% new chunks, router cache {} entries; every node writes in turn",
        DEFAULT_PARTITIONS,
        o.requests,
        o.p_new * 100.0,
        o.cache
    );
    println!();
    println!("| n | request | chunk | c | lookup msgs | ack msgs | measured msgs/req (± s.e.) | model (Bernoulli) | model (paper, p_n c) | paper summed over all n | fps per lookup msg | entries per ack | local fps | new | z |");
    println!("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    let mut worst_z: f64 = 0.0;
    for &n in &o.nodes {
        let mut c = cluster(n, &o).await?;
        let mut rng = Rng(u64::from(n));
        // The first generation: 64 Ki chunks stored through node 1, not counted.
        for _ in 0..64 {
            let ids: Vec<u64> = (0..1024)
                .map(|_| {
                    c.next_id += 1;
                    c.next_id
                })
                .collect();
            write(&mut c, 0, &ids).await?;
        }
        for &request in &o.request_kib {
            for &chunk in &o.chunk_kib {
                let chunks = (request / chunk) as usize;
                let before = server_totals(&c);
                let mut costs = Vec::new();
                for _ in 0..o.requests {
                    for k in 0..c.nodes.len() {
                        let ids = draw(&mut c, &mut rng, chunks, o.p_new);
                        costs.push(write(&mut c, k, &ids).await?);
                    }
                }
                let after = server_totals(&c);
                let sum = |f: fn(&Cost) -> u64| costs.iter().map(f).sum::<u64>();
                // The owners saw exactly the messages the writers counted.
                assert_eq!(
                    after.lookup_messages_in - before.lookup_messages_in,
                    sum(|x| x.lookups)
                );
                assert_eq!(
                    after.ack_messages_in - before.ack_messages_in,
                    sum(|x| x.acks)
                );
                assert_eq!(
                    after.lookup_fingerprints_in - before.lookup_fingerprints_in,
                    sum(|x| x.fingerprints_sent)
                );
                // One response per lookup and per Ack.
                assert_eq!(
                    after.stream_messages_out - before.stream_messages_out,
                    sum(|x| x.lookups) + sum(|x| x.acks)
                );
                let per: Vec<f64> = costs
                    .iter()
                    .map(|x| (2 * x.lookups + x.acks) as f64)
                    .collect();
                let (mean, error) = mean_and_error(&per);
                let requests = costs.len() as f64;
                let model = Request::from_sizes(n, request << 10, chunk << 10, o.p_new);
                let bernoulli = model
                    .expected(Targets::Others, NewChunks::Bernoulli)
                    .total();
                let paper = model.expected(Targets::Others, NewChunks::Paper).total();
                let all = model.expected(Targets::All, NewChunks::Paper).total();
                let z = if error > 0.0 {
                    (mean - bernoulli) / error
                } else {
                    0.0
                };
                worst_z = worst_z.max(z.abs());
                let per_ack = if sum(|x| x.acks) == 0 {
                    0.0
                } else {
                    sum(|x| x.ack_entries_sent) as f64 / sum(|x| x.acks) as f64
                };
                println!(
                    "| {n} | {request} KiB | {chunk} KiB | {chunks} | {:.3} | {:.3} | {mean:.3} ± {error:.3} | {bernoulli:.3} | {paper:.3} | {all:.3} | {:.1} | {per_ack:.2} | {:.1}% | {:.2}% | {z:+.1} |",
                    sum(|x| x.lookups) as f64 / requests,
                    sum(|x| x.acks) as f64 / requests,
                    sum(|x| x.fingerprints_sent) as f64 / sum(|x| x.lookups).max(1) as f64,
                    100.0 * sum(|x| x.local) as f64 / (requests * chunks as f64),
                    100.0 * sum(|x| x.new) as f64 / (requests * chunks as f64),
                );
            }
        }
        for node in c.nodes {
            node.server.shutdown().await;
        }
    }
    println!();
    println!(
        "measured msgs/req = (lookups + their responses + Acks) per request; z = (measured - Bernoulli model) / s.e.; largest |z| {worst_z:.1}"
    );
    Ok(())
}
