//! The receiving node's side of a lookup (docs/design/cluster.md, "Lookups"): a
//! request's fingerprints grouped by the node owning their partition, one lookup
//! message per owner, all in flight at once; the node's LRU cache of fingerprints it
//! looked up answers repeats without a message; `Moved` answers are asked again once
//! the partition map has caught up.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use larder_hash::Fingerprint;
use larder_index::disk::LruCache;
use larder_index::ChunkLocation;
use tokio::task::JoinSet;

use crate::ids::{partition_of, NodeId, PartitionId};
use crate::rpc::{Answer, LookupHandler, NodeClient, RpcError, Transport};
use crate::service::OwnerService;

/// Where partitions are: their owners and the nodes' addresses, as the node's watch of
/// etcd last saw them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MapView {
    /// `owners[p]`: partition `p`'s owner, 0 while it has none.
    pub owners: Vec<NodeId>,
    /// Lookup service address (`host:port`) of each live node: the members, whose
    /// lookups and acknowledgements the node's owner takes (`OwnerService`).
    pub addrs: HashMap<NodeId, String>,
}

/// Counters of a receiving node's lookups, for the paper's equation (1).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct RouterMetrics {
    /// Requests (batches) looked up, and their fingerprints.
    pub requests: u64,
    pub fingerprints: u64,
    /// Fingerprints the LRU cache answered.
    pub cached: u64,
    /// Lookup messages sent to other nodes (one per owner per request and retry), and
    /// fingerprints in them.
    pub messages: u64,
    pub fingerprints_sent: u64,
    /// Fingerprints of partitions this node owns, answered in process (no message).
    pub local: u64,
    /// Acknowledgement messages sent to other nodes.
    pub ack_messages: u64,
    /// Fingerprints answered `Moved` and asked again.
    pub moved: u64,
}

/// How long `lookup` keeps asking again while answers are `Moved` or owners cannot be
/// reached, before it gives up: long enough for a failover (lease expiry plus
/// reassignment).
const RETRY_FOR: Duration = Duration::from_secs(60);
const RETRY_PAUSE: Duration = Duration::from_millis(100);

/// A node's connections to the owners, with its map view and cache.
pub struct Router {
    me: NodeId,
    partitions: u32,
    map: Arc<RwLock<MapView>>,
    /// This node's own partitions, asked in process.
    local: Option<OwnerService>,
    /// How the owners' ports are reached (plaintext only on loopback).
    transport: Transport,
    clients: Mutex<HashMap<NodeId, Arc<NodeClient>>>,
    cache: Mutex<LruCache>,
    metrics: Mutex<RouterMetrics>,
    /// Why this node cannot look anything up now (it is out of the cluster: its lease
    /// was lost), or `None`.
    offline: Mutex<Option<String>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Router {
    /// A router for node `me` of a cluster of `partitions` partitions, reading the map
    /// from `map` (kept up to date by the node's watch), with a cache of
    /// `cache_entries` fingerprints.
    pub fn new(
        me: NodeId,
        partitions: u32,
        map: Arc<RwLock<MapView>>,
        cache_entries: usize,
    ) -> Self {
        Self {
            me,
            partitions,
            map,
            local: None,
            transport: Transport::Plaintext,
            clients: Mutex::new(HashMap::new()),
            cache: Mutex::new(LruCache::new(cache_entries)),
            metrics: Mutex::new(RouterMetrics::default()),
            offline: Mutex::new(None),
        }
    }

    /// Fails every lookup and acknowledgement, those in flight at their next round,
    /// with `why` (not retryable) until called with `None`: the node is out of the
    /// cluster, and a backup must fail with the reason instead of waiting.
    pub fn set_offline(&self, why: Option<String>) {
        *lock(&self.offline) = why;
    }

    fn check_online(&self) -> Result<(), RpcError> {
        match &*lock(&self.offline) {
            None => Ok(()),
            Some(why) => Err(RpcError::Handler {
                message: why.clone(),
                retryable: false,
            }),
        }
    }

    /// Answers the fingerprints of partitions this node owns (`local` serves them) in
    /// process, without a message.
    pub fn with_local(mut self, local: OwnerService) -> Self {
        self.local = Some(local);
        self
    }

    /// Reaches the owners over `transport` (this node's certificate under TLS).
    pub fn with_transport(mut self, transport: Transport) -> Self {
        self.transport = transport;
        self
    }

    pub fn metrics(&self) -> RouterMetrics {
        *lock(&self.metrics)
    }

    /// Looks up one request's fingerprints: answers in order, `Known` or `New`
    /// (locked for this node, which must store the chunk and [`Router::ack`] it).
    /// Never `Moved`: those are asked again until the map has caught up, for at most
    /// a minute.
    pub async fn lookup(&self, fps: &[Fingerprint]) -> Result<Vec<Answer>, RpcError> {
        let mut answers: Vec<Option<Answer>> = vec![None; fps.len()];
        {
            let mut cache = lock(&self.cache);
            for (a, fp) in answers.iter_mut().zip(fps) {
                *a = cache.get(fp).map(Answer::Known);
            }
        }
        let cached = answers.iter().filter(|a| a.is_some()).count() as u64;
        {
            let mut m = lock(&self.metrics);
            m.requests += 1;
            m.fingerprints += fps.len() as u64;
            m.cached += cached;
        }
        let started = tokio::time::Instant::now();
        loop {
            let todo: Vec<usize> = (0..fps.len()).filter(|&i| answers[i].is_none()).collect();
            if todo.is_empty() {
                break;
            }
            self.check_online()?;
            match self.round(fps, &todo, &mut answers).await {
                Ok(()) => {}
                Err(e) if e.is_retryable() && started.elapsed() < RETRY_FOR => {
                    tracing::debug!("lookup round failed, retrying: {e}");
                }
                Err(e) => return Err(e),
            }
            if answers.iter().any(Option::is_none) {
                if started.elapsed() >= RETRY_FOR {
                    return Err(RpcError::Handler {
                        message: format!("partitions still moving after {} s", RETRY_FOR.as_secs()),
                        retryable: true,
                    });
                }
                tokio::time::sleep(RETRY_PAUSE).await;
            }
        }
        let answers: Vec<Answer> = answers
            .into_iter()
            .map(|a| a.expect("all answered"))
            .collect();
        let mut cache = lock(&self.cache);
        for (fp, a) in fps.iter().zip(&answers) {
            if let Answer::Known(location) = a {
                cache.insert(*fp, *location);
            }
        }
        Ok(answers)
    }

    /// Tells the owners where this node stored chunks it was answered `New` for, once
    /// their containers are durable: one message per owner. Retried like lookups; an
    /// owner that moved meanwhile gets them as late acknowledgements.
    pub async fn ack(&self, entries: &[(Fingerprint, ChunkLocation)]) -> Result<(), RpcError> {
        let started = tokio::time::Instant::now();
        let mut left: Vec<(Fingerprint, ChunkLocation)> = entries.to_vec();
        while !left.is_empty() {
            self.check_online()?;
            let groups = self.group(left.iter().map(|(fp, _)| fp));
            let mut failed = Vec::new();
            let mut calls = JoinSet::new();
            for (node, members) in groups {
                let part: Vec<(Fingerprint, ChunkLocation)> =
                    members.iter().map(|&i| left[i]).collect();
                match self.client(node).await {
                    Ok(client) => {
                        calls.spawn(async move { (client.ack(&part).await, part) });
                    }
                    Err(e) => {
                        self.forget(node);
                        failed.push((e, part));
                    }
                }
            }
            while let Some(done) = calls.join_next().await {
                let (result, part) = done.expect("ack tasks do not panic");
                if let Err(e) = result {
                    failed.push((e, part));
                }
            }
            left.clear();
            for (e, part) in failed {
                if !e.is_retryable() || started.elapsed() >= RETRY_FOR {
                    return Err(e);
                }
                left.extend(part);
            }
            if !left.is_empty() {
                tokio::time::sleep(RETRY_PAUSE).await;
            }
        }
        let mut cache = lock(&self.cache);
        for (fp, location) in entries {
            cache.insert(*fp, *location);
        }
        Ok(())
    }

    /// One round: a message to each owner of the fingerprints in `todo`, all at once.
    async fn round(
        &self,
        fps: &[Fingerprint],
        todo: &[usize],
        answers: &mut [Option<Answer>],
    ) -> Result<(), RpcError> {
        let groups = self.group(todo.iter().map(|&i| &fps[i]));
        let mut calls = JoinSet::new();
        let mut failure = None;
        for (node, members) in groups {
            let positions: Vec<usize> = members.iter().map(|&k| todo[k]).collect();
            let batch: Vec<Fingerprint> = positions.iter().map(|&i| fps[i]).collect();
            if let Some(local) = self.local.as_ref().filter(|_| node == self.me) {
                lock(&self.metrics).local += batch.len() as u64;
                let local = local.clone();
                let me = self.me;
                calls.spawn(async move {
                    (
                        node,
                        positions,
                        LookupHandler::lookup(&local, me, batch).await,
                    )
                });
                continue;
            }
            let client = match self.client(node).await {
                Ok(client) => client,
                Err(e) => {
                    self.forget(node);
                    failure.get_or_insert(e);
                    continue;
                }
            };
            {
                let mut m = lock(&self.metrics);
                m.messages += 1;
                m.fingerprints_sent += batch.len() as u64;
            }
            calls.spawn(async move { (node, positions, client.lookup(&batch).await) });
        }
        while let Some(done) = calls.join_next().await {
            let (node, positions, result) = done.expect("lookup tasks do not panic");
            match result {
                Ok(got) => {
                    let mut moved = 0;
                    for (i, a) in positions.into_iter().zip(got) {
                        if a == Answer::Moved {
                            moved += 1;
                        } else {
                            answers[i] = Some(a);
                        }
                    }
                    lock(&self.metrics).moved += moved;
                }
                Err(e) => {
                    if matches!(e, RpcError::ConnectionLost { .. }) {
                        self.forget(node);
                    }
                    failure.get_or_insert(e);
                }
            }
        }
        failure.map_or(Ok(()), Err)
    }

    /// The items' positions grouped by the owner of their partitions; items of
    /// partitions without an owner are left out (asked again next round).
    fn group<'a>(&self, fps: impl Iterator<Item = &'a Fingerprint>) -> HashMap<NodeId, Vec<usize>> {
        let map = self
            .map
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let mut groups: HashMap<NodeId, Vec<usize>> = HashMap::new();
        for (i, fp) in fps.enumerate() {
            let PartitionId(p) = partition_of(fp, self.partitions);
            match map.owners.get(p as usize) {
                Some(&owner) if owner != 0 => groups.entry(owner).or_default().push(i),
                _ => {}
            }
        }
        groups
    }

    /// The open connection to `node`, connecting if there is none (or it broke).
    async fn client(&self, node: NodeId) -> Result<Arc<NodeClient>, RpcError> {
        if let Some(client) = lock(&self.clients).get(&node) {
            if !client.is_closed() {
                return Ok(client.clone());
            }
        }
        let addr = {
            let map = self
                .map
                .read()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            map.addrs.get(&node).cloned()
        };
        let Some(addr) = addr else {
            return Err(RpcError::Handler {
                message: format!("node {node} has no known address"),
                retryable: true,
            });
        };
        let client =
            Arc::new(NodeClient::connect_to(&addr, Some(node), self.me, &self.transport).await?);
        lock(&self.clients).insert(node, client.clone());
        Ok(client)
    }

    fn forget(&self, node: NodeId) {
        lock(&self.clients).remove(&node);
    }
}
