//! A cluster node's life (docs/design/cluster.md, "The node"): it serves lookups for
//! the partitions the map gives it, joins through a lease, campaigns for master and,
//! as master, keeps every partition owned by a live node, evenly. Partitions it gains
//! are taken over from shared storage; partitions it loses, or whose epoch was
//! overtaken (fenced), are dropped without another write. When its lease is lost (etcd
//! unreachable or without quorum) it stops serving, and joins again with a new lease
//! once etcd answers. In an encrypted cluster it holds the cluster's key
//! (docs/design/crypto.md, "Cluster").

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use larder_chunk::{ChunkerConfig, ChunkerKind};
use larder_crypto::RepoKeys;
use larder_hash::HashAlgo;
use larder_index::disk::{DiskIndexConfig, Lookup};
use larder_store::RepoConfig;
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::balance::plan_moves;
use crate::coord::{
    ClusterConfig, Election, Etcd, EtcdOptions, MapCache, Member, MemberEvent, Membership,
    MembershipOptions, PartitionMap, PartitionMapStore,
};
use crate::error::{ClusterError, Result};
use crate::ids::{NodeId, PartitionId};
use crate::jobs::NodeHandler;
use crate::partitions::PartitionStore;
use crate::router::{MapView, Router};
use crate::rpc::{LookupServer, Transport};
use crate::served::Served;
use crate::service::OwnerService;
use crate::storage::SharedStorage;

/// Fingerprints a node's router remembers (the paper's per-node LRU cache of
/// fingerprints looked up): 1 M, about 80 MB.
const ROUTER_CACHE: usize = 1 << 20;

/// Pauses between attempts to join again after the lease was lost: doubling from the
/// first to the last, so that a node follows an etcd outage of any length and joins
/// within seconds of its end. A membership that ended within `REJOIN_STEADY` of its
/// start (a task that fails at once, again and again) does not start over from the
/// first pause: the node does not churn etcd and the map.
const REJOIN_FIRST_PAUSE: Duration = Duration::from_millis(250);
const REJOIN_LAST_PAUSE: Duration = Duration::from_secs(4);
const REJOIN_STEADY: Duration = Duration::from_secs(60);

/// How a node runs.
#[derive(Debug, Clone)]
pub struct NodeOptions {
    pub id: NodeId,
    /// Where the lookup service listens (`127.0.0.1:0`: any free port).
    pub listen: SocketAddr,
    /// etcd endpoints (`http://host:port`) and the cluster's key prefix.
    pub etcd: Vec<String>,
    pub prefix: String,
    /// The cluster's shared storage (partitions and every node's repository).
    pub storage: SharedStorage,
    /// A lock on new not acknowledged within this passes to the next requester.
    pub lock_timeout: Duration,
    /// The member lease's TTL: a node silent this long is taken for dead.
    pub member_ttl_secs: i64,
    /// How often partitions acknowledged into are checkpointed.
    pub checkpoint_every: Duration,
    /// Each partition's disk index.
    pub index: DiskIndexConfig,
    pub lookup: Lookup,
    /// The cluster's key, unlocked from its slots in the shared storage: required in an
    /// encrypted cluster, refused in a plaintext one.
    pub keys: Option<Arc<RepoKeys>>,
    /// How its port is served and other nodes' reached: the node's certificate, or
    /// plaintext (loopback only).
    pub transport: Transport,
    /// How etcd is reached (its `tls` the node's etcd certificate).
    pub etcd_options: EtcdOptions,
    /// The paths its clients' jobs may read and write (none: it runs no jobs).
    pub served: Served,
}

impl NodeOptions {
    /// Defaults for node `id` of the cluster under `prefix` in `etcd`, sharing
    /// `storage` (a directory, or a [`SharedStorage`]).
    pub fn new(
        id: NodeId,
        etcd: Vec<String>,
        prefix: &str,
        storage: impl Into<SharedStorage>,
    ) -> Self {
        Self {
            id,
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            etcd,
            prefix: prefix.to_string(),
            storage: storage.into(),
            lock_timeout: Duration::from_secs(30),
            member_ttl_secs: 5,
            checkpoint_every: Duration::from_secs(5),
            index: DiskIndexConfig {
                memory_budget: 1 << 20,
                expected_fingerprints: 1 << 16,
                buffered_chunk_bytes: 0,
                ..DiskIndexConfig::default()
            },
            lookup: Lookup::Eager,
            keys: None,
            transport: Transport::Plaintext,
            etcd_options: EtcdOptions::default(),
            served: Served::default(),
        }
    }
}

/// A running node: its service and what it sees of the cluster.
pub struct Node {
    pub id: NodeId,
    /// Where its lookup service listens.
    pub addr: SocketAddr,
    pub service: OwnerService,
    /// Its partitions on shared storage (the service's own; on object storage it puts
    /// the objects checkpoints queue).
    store: PartitionStore,
    /// The map and members as this node last saw them.
    pub view: Arc<RwLock<MapView>>,
    /// This node's lookups at the owners (its own partitions in process).
    pub router: Arc<Router>,
    stop: watch::Sender<bool>,
    tasks: JoinSet<Result<()>>,
    server: Option<LookupServer>,
    /// The node's membership while it has one: put by [`stay_member`] when it joins,
    /// taken when the lease is lost, and by a graceful stop to revoke it.
    membership: MemberSlot,
}

type MemberSlot = Arc<Mutex<Option<Membership>>>;

fn slot(m: &MemberSlot) -> std::sync::MutexGuard<'_, Option<Membership>> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// What a node needs to join (again) and serve while it is a member.
#[derive(Clone)]
struct Session {
    me: NodeId,
    addr: SocketAddr,
    ttl_secs: i64,
    partitions: u32,
    checkpoint_every: Duration,
    etcd: Etcd,
    maps: PartitionMapStore,
    cache: MapCache,
    service: OwnerService,
    store: PartitionStore,
    view: Arc<RwLock<MapView>>,
    router: Arc<Router>,
    membership: MemberSlot,
}

/// Where a cluster's coordination lives: etcd's endpoints, the cluster's key prefix,
/// and how etcd is reached (its certificates).
#[derive(Debug, Clone)]
pub struct EtcdTarget {
    pub endpoints: Vec<String>,
    pub prefix: String,
    pub options: EtcdOptions,
}

impl EtcdTarget {
    async fn connect(&self) -> Result<Etcd> {
        Ok(Etcd::connect(&self.endpoints, &self.prefix, self.options.clone()).await?)
    }
}

/// The cluster's parameters, written once (`larder cluster init`): a second init with
/// other parameters fails.
pub async fn init_cluster(etcd: &EtcdTarget, config: &ClusterConfig) -> Result<()> {
    let etcd = etcd.connect().await?;
    PartitionMapStore::new(&etcd).init_cluster(config).await?;
    Ok(())
}

/// The cluster's parameters, if it was initialized: what a node (or `cluster init`)
/// reads first, to know whether the cluster is encrypted.
pub async fn cluster_config(etcd: &EtcdTarget) -> Result<Option<ClusterConfig>> {
    let etcd = etcd.connect().await?;
    Ok(PartitionMapStore::new(&etcd).config().await?)
}

/// The config every node repository of the cluster `config` describes is created
/// with (but for its container range): the cluster's chunker and hash; in an
/// encrypted cluster its AEAD and the cluster id, which `keys` must have. Refuses a
/// node without the key of an encrypted cluster, and with a key in a plaintext one.
fn node_repository(config: &ClusterConfig, keys: Option<&RepoKeys>) -> Result<RepoConfig> {
    let corrupt = |reason: String| ClusterError::Corrupt {
        what: "cluster config".into(),
        reason,
    };
    let algo = HashAlgo::from_name(&config.hash)
        .ok_or_else(|| corrupt(format!("unknown hash {}", config.hash)))?;
    let kind = ChunkerKind::from_name(&config.chunking)
        .ok_or_else(|| corrupt(format!("unknown chunker {}", config.chunking)))?;
    let chunker = ChunkerConfig {
        kind,
        ..ChunkerConfig::default()
    };
    let mut repo = RepoConfig::new(chunker, algo);
    match (&config.encryption, keys) {
        (None, None) => {}
        (Some(encryption), Some(keys)) => {
            encryption.check(keys)?;
            repo = repo.with_encryption(encryption.aead);
            repo.id = encryption.id.clone();
        }
        (Some(_), None) => return Err(ClusterError::Key(
            "the cluster is encrypted: a node needs the cluster's key, unlocked with its password"
                .into(),
        )),
        (None, Some(_)) => {
            return Err(ClusterError::Key(
                "the cluster is not encrypted: its nodes take no key".into(),
            ))
        }
    }
    repo.validate().map_err(|e| corrupt(e.to_string()))?;
    Ok(repo)
}

impl Node {
    /// Starts node `options.id`: binds its lookup service, joins, and starts following
    /// the map (and campaigning for master). Fails if the cluster was never
    /// initialized.
    pub async fn start(options: NodeOptions) -> Result<Node> {
        let etcd =
            Etcd::connect(&options.etcd, &options.prefix, options.etcd_options.clone()).await?;
        let maps = PartitionMapStore::new(&etcd);
        let config = maps
            .config()
            .await?
            .ok_or_else(|| ClusterError::Uninitialised {
                prefix: options.prefix.clone(),
            })?;
        let keys = options.keys.clone();
        let template = node_repository(&config, keys.as_deref())?;
        let store = PartitionStore::with_storage(
            options.storage.clone(),
            config.partitions,
            template.hash,
            keys.clone(),
            options.index.clone(),
            options.lookup,
        );
        let view = Arc::new(RwLock::new(MapView {
            owners: vec![0; config.partitions as usize],
            addrs: HashMap::new(),
        }));
        let service = OwnerService::new(
            store.clone(),
            config.partitions,
            options.lock_timeout,
            view.clone(),
        );
        options
            .storage
            .ensure_repository(options.id, &template, keys.as_deref())
            .map_err(|source| ClusterError::Store {
                what: format!("node {}'s repository", options.id),
                source,
            })?;
        let router = Arc::new(
            Router::new(options.id, config.partitions, view.clone(), ROUTER_CACHE)
                .with_local(service.clone())
                .with_transport(options.transport.clone()),
        );
        let handler = NodeHandler::new(
            options.id,
            options.storage.clone(),
            service.clone(),
            router.clone(),
            keys.clone(),
            options.served.clone(),
        );
        let server =
            LookupServer::bind_with(options.listen, Arc::new(handler), options.transport.clone())
                .await
                .map_err(|source| ClusterError::Io {
                    what: format!("listen on {}", options.listen),
                    source,
                })?;
        let addr = server.local_addr();
        let session = Session {
            me: options.id,
            addr,
            ttl_secs: options.member_ttl_secs,
            partitions: config.partitions,
            checkpoint_every: options.checkpoint_every,
            cache: maps.cache().await?,
            etcd,
            maps,
            service: service.clone(),
            store: store.clone(),
            view: view.clone(),
            router: router.clone(),
            membership: Arc::new(Mutex::new(None)),
        };
        let membership = session.join().await?;
        let (stop, stopped) = watch::channel(false);
        let mut tasks = JoinSet::new();
        tasks.spawn(stay_member(session.clone(), membership, stopped.clone()));
        tasks.spawn(expire_locks(service.clone(), stopped));
        let adopted = crate::jobs::adopted_chunks(&options.storage, options.id, keys.as_deref())
            .map_err(|source| ClusterError::Store {
                what: format!("node {}'s repository", options.id),
                source,
            })?;
        if !adopted.is_empty() {
            tasks.spawn(acknowledge_adopted(options.id, router.clone(), adopted));
        }
        tracing::info!(node = options.id, %addr, "node started");
        Ok(Node {
            id: options.id,
            addr,
            service,
            store,
            view,
            router,
            stop,
            tasks,
            server: Some(server),
            membership: session.membership,
        })
    }

    /// Runs until `shutdown` resolves or a task fails (not for a lost lease: the node
    /// then joins again), then stops. Tasks that finish their work (the
    /// acknowledgement of a killed backup's chunks) end without stopping the node.
    pub async fn run(mut self, shutdown: impl std::future::Future<Output = ()>) -> Result<()> {
        tokio::pin!(shutdown);
        let outcome = loop {
            tokio::select! {
                () = &mut shutdown => break Ok(()),
                done = self.tasks.join_next() => match done {
                    None => break Ok(()),
                    Some(Ok(Ok(()))) => continue,
                    Some(Ok(Err(e))) => break Err(e),
                    Some(Err(e)) => break Err(ClusterError::Task { what: "a node task".into(), reason: e.to_string() }),
                },
            }
        };
        let stopped = self.stop().await;
        outcome.and(stopped)
    }

    /// Leaves the cluster in good order: stops serving, checkpoints every partition
    /// still held under its epoch, and revokes the lease so that the master moves the
    /// partitions at once. A node out of the cluster (its lease lost) writes no
    /// partition: one a takeover finished after it left is no longer its to write.
    pub async fn stop(&mut self) -> Result<()> {
        let _ = self.stop.send(true);
        self.tasks.abort_all();
        while self.tasks.join_next().await.is_some() {}
        let member = self.is_member();
        let mut result = Ok(());
        for (p, _) in self.service.owned() {
            if let Err(e) = self.service.release(p, member) {
                result = Err(e);
            }
        }
        let store = self.store.clone();
        match tokio::task::spawn_blocking(move || store.upload()).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => result = Err(e),
            Err(e) => {
                result = Err(ClusterError::Task {
                    what: "the last upload".into(),
                    reason: e.to_string(),
                })
            }
        }
        if let Some(server) = self.server.take() {
            server.shutdown().await;
        }
        let membership = slot(&self.membership).take();
        if let Some(membership) = membership {
            membership.leave().await?;
        }
        result
    }

    /// Whether the node is a member now (it holds a lease it believes alive).
    pub fn is_member(&self) -> bool {
        slot(&self.membership).is_some()
    }
}

impl Session {
    /// Joins the cluster with a new lease (`members/<id>` on it).
    async fn join(&self) -> Result<Membership> {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get() as u32);
        Ok(Membership::join(
            &self.etcd,
            Member::new(self.me, self.addr.to_string(), cores),
            MembershipOptions {
                ttl_secs: self.ttl_secs,
            },
        )
        .await?)
    }

    /// Serves as a member holding `lease` until `lost` fires or a task of the
    /// membership fails: follows the map and the members, campaigns for master, and
    /// checkpoints. Returns why it stopped, once its tasks have ended (a takeover or
    /// checkpoint already on a blocking thread finishes there: a takeover's partition
    /// is set against the map when the node joins again, a checkpoint passed its
    /// fencing check).
    async fn serve(&self, lease: i64, mut lost: watch::Receiver<bool>) -> ClusterError {
        let (_keep, stopped) = watch::channel(false);
        let mut tasks = JoinSet::new();
        tasks.spawn(follow_map(
            self.me,
            self.maps.clone(),
            self.cache.clone(),
            self.service.clone(),
            self.view.clone(),
            stopped.clone(),
        ));
        tasks.spawn(follow_members(
            self.etcd.clone(),
            self.view.clone(),
            stopped.clone(),
        ));
        tasks.spawn(lead(
            self.etcd.clone(),
            lease,
            self.me,
            self.partitions,
            stopped.clone(),
        ));
        tasks.spawn(checkpoint(
            self.maps.clone(),
            self.service.clone(),
            self.store.clone(),
            self.checkpoint_every,
            stopped,
        ));
        let why = loop {
            tokio::select! {
                changed = lost.wait_for(|&l| l) => {
                    let _ = changed;
                    break ClusterError::LeaseLost;
                }
                done = tasks.join_next() => match done {
                    Some(Ok(Ok(()))) => continue,
                    Some(Ok(Err(e))) => break e,
                    Some(Err(e)) => break ClusterError::Task { what: "a member task".into(), reason: e.to_string() },
                    None => break ClusterError::WatchEnded("the member tasks".into()),
                },
            }
        };
        // Every task ended before the caller detaches: none writes the view after.
        tasks.shutdown().await;
        why
    }

    /// Stops serving at once, writing nothing (the master may already have given the
    /// partitions to others): releases every partition, forgets the map and the
    /// members (so no node's lookup or acknowledgement is taken), and fails this
    /// node's lookups with `why` until it joins again.
    fn detach(&self, why: &ClusterError) -> Result<()> {
        self.router.set_offline(Some(format!(
            "node {} is out of the cluster until it joins again ({why}; it retries until etcd answers)",
            self.me
        )));
        {
            let mut view = self.view.write().unwrap_or_else(|p| p.into_inner());
            view.owners.iter_mut().for_each(|o| *o = 0);
            view.addrs.clear();
        }
        for (p, _) in self.service.owned() {
            self.service.release(p, false)?;
        }
        // Stops the keepalive without revoking: etcd may be unreachable; the old lease
        // is revoked before the next join.
        drop(slot(&self.membership).take());
        Ok(())
    }

    /// Joins again after the lease `old` was lost: revokes it (its candidacy and member
    /// key go at once; etcd may still hold it if quorum came back and renewed it),
    /// then takes a new lease.
    async fn rejoin(&self, old: i64) -> Result<Membership> {
        Membership::revoke(&self.etcd, old).await?;
        self.join().await
    }
}

/// Keeps the node a member for as long as it runs: serves under `membership`; when the
/// lease is lost (or a task of the membership fails), stops serving, then joins again
/// with a new lease as soon as etcd answers, trying with growing pauses for as long as
/// etcd is away, and serves what the map gives it then.
async fn stay_member(
    session: Session,
    membership: Membership,
    mut stopped: watch::Receiver<bool>,
) -> Result<()> {
    let mut lease = membership.lease();
    let mut lost = membership.lost();
    *slot(&session.membership) = Some(membership);
    let mut pause = REJOIN_FIRST_PAUSE;
    loop {
        let joined_at = tokio::time::Instant::now();
        let why = tokio::select! {
            why = session.serve(lease, lost) => why,
            _ = stopped.changed() => return Ok(()),
        };
        tracing::warn!(
            node = session.me,
            "stopped serving: {why}; joining again once etcd answers"
        );
        session.detach(&why)?;
        if joined_at.elapsed() >= REJOIN_STEADY {
            pause = REJOIN_FIRST_PAUSE;
        }
        let membership = loop {
            tokio::select! {
                _ = tokio::time::sleep(pause) => {}
                _ = stopped.changed() => return Ok(()),
            }
            let joined = tokio::select! {
                joined = session.rejoin(lease) => joined,
                _ = stopped.changed() => return Ok(()),
            };
            pause = (pause * 2).min(REJOIN_LAST_PAUSE);
            match joined {
                Ok(membership) => break membership,
                Err(e) => tracing::warn!(
                    node = session.me,
                    "joining again failed (trying again in {pause:?}): {e}"
                ),
            }
        };
        lease = membership.lease();
        lost = membership.lost();
        *slot(&session.membership) = Some(membership);
        session.router.set_offline(None);
        tracing::info!(node = session.me, lease, "joined the cluster again");
    }
}

/// Serves exactly the partitions the map gives this node, at their epochs: takes over
/// the new ones (replaying the containers their checkpoints do not cover) and drops
/// the others without writing them (their new owner may already have them open).
async fn follow_map(
    me: NodeId,
    maps: PartitionMapStore,
    cache: MapCache,
    service: OwnerService,
    view: Arc<RwLock<MapView>>,
    mut stopped: watch::Receiver<bool>,
) -> Result<()> {
    // The map as etcd has it now, not as the cache last saw it: after an outage the
    // cache may still be catching up.
    let mut next = Some(Arc::new(maps.load().await?));
    let mut seen = -1;
    loop {
        let map = match next.take() {
            Some(map) => map,
            None => tokio::select! {
                map = cache.wait_until(|m| m.revision > seen) => map?,
                _ = stopped.changed() => return Ok(()),
            },
        };
        seen = map.revision;
        {
            let mut view = view.write().unwrap_or_else(|p| p.into_inner());
            for owner in view.owners.iter_mut() {
                *owner = 0;
            }
            for (&p, a) in &map.partitions {
                if let Some(slot) = view.owners.get_mut(p as usize) {
                    *slot = a.owner;
                }
            }
        }
        apply(me, &map, &service).await?;
    }
}

/// Brings the service's partitions in line with `map`.
async fn apply(me: NodeId, map: &PartitionMap, service: &OwnerService) -> Result<()> {
    let want: BTreeMap<PartitionId, u64> = map
        .partitions
        .iter()
        .filter(|(_, a)| a.owner == me)
        .map(|(&p, a)| (PartitionId(p), a.epoch as u64))
        .collect();
    let have: BTreeMap<PartitionId, u64> = service.owned().into_iter().collect();
    for (p, epoch) in &have {
        if want.get(p) != Some(epoch) {
            service.release(*p, false)?;
        }
    }
    let mut by_epoch: BTreeMap<u64, Vec<PartitionId>> = BTreeMap::new();
    for (p, epoch) in want {
        if have.get(&p) != Some(&epoch) {
            by_epoch.entry(epoch).or_default().push(p);
        }
    }
    for (epoch, parts) in by_epoch {
        let service = service.clone();
        let started = std::time::Instant::now();
        let replay = tokio::task::spawn_blocking(move || service.take_over(&parts, epoch))
            .await
            .map_err(|e| ClusterError::Task {
                what: "the takeover".into(),
                reason: e.to_string(),
            })??;
        tracing::info!(
            node = me,
            epoch,
            rebuilt = replay.rebuilt,
            containers = replay.containers_read,
            inserted = replay.inserted,
            ms = started.elapsed().as_millis() as u64,
            "took partitions over"
        );
    }
    Ok(())
}

/// Keeps the view's node addresses current.
async fn follow_members(
    etcd: Etcd,
    view: Arc<RwLock<MapView>>,
    mut stopped: watch::Receiver<bool>,
) -> Result<()> {
    let (members, mut events) = Membership::watch(&etcd).await?;
    view.write().unwrap_or_else(|p| p.into_inner()).addrs =
        members.into_iter().map(|m| (m.id, m.address)).collect();
    loop {
        let event = tokio::select! {
            event = events.recv() => event,
            _ = stopped.changed() => return Ok(()),
        };
        let mut view = view.write().unwrap_or_else(|p| p.into_inner());
        match event {
            Some(MemberEvent::Joined(m)) => {
                view.addrs.insert(m.id, m.address);
            }
            Some(MemberEvent::Left(id)) => {
                view.addrs.remove(&id);
            }
            None => return Err(ClusterError::WatchEnded("the membership watch".into())),
        }
    }
}

/// Campaigns for master; once elected, reassigns partitions whenever a node joins or
/// leaves (and every second, in case a write failed), for as long as it stays master.
async fn lead(
    etcd: Etcd,
    lease: i64,
    me: NodeId,
    partitions: u32,
    mut stopped: watch::Receiver<bool>,
) -> Result<()> {
    let election = Election::new(&etcd);
    let value = me.to_string();
    let leadership = tokio::select! {
        won = election.campaign(lease, &value) => won?,
        _ = stopped.changed() => return Ok(()),
    };
    tracing::info!(node = me, "elected master");
    let maps = PartitionMapStore::new(&etcd);
    let (_, mut events) = Membership::watch(&etcd).await?;
    loop {
        let live: Vec<NodeId> = Membership::members(&etcd)
            .await?
            .iter()
            .map(|m| m.id)
            .collect();
        let map = maps.load().await?;
        let owners: Vec<NodeId> = (0..partitions)
            .map(|p| map.get(p).map_or(0, |a| a.owner))
            .collect();
        let moves: Vec<(u32, u16)> = plan_moves(&owners, &live)
            .into_iter()
            .map(|(p, n)| (p.0, n))
            .collect();
        if !moves.is_empty() {
            maps.assign(&moves, &leadership).await?;
            tracing::info!(node = me, moves = moves.len(), live = ?live, "reassigned partitions");
        }
        tokio::select! {
            event = events.recv() => {
                if event.is_none() {
                    return Err(ClusterError::WatchEnded(
                        "the master's membership watch".into(),
                    ));
                }
            }
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            _ = stopped.changed() => return Ok(()),
        }
    }
}

/// Unlocks locks whose acknowledgement did not come in time.
async fn expire_locks(service: OwnerService, mut stopped: watch::Receiver<bool>) -> Result<()> {
    loop {
        let next = service.expire()?;
        let pause = next.map_or(Duration::from_millis(200), |at| {
            at.saturating_duration_since(std::time::Instant::now())
                .min(Duration::from_millis(200))
        });
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            _ = stopped.changed() => return Ok(()),
        }
    }
}

/// Checkpoints the partitions acknowledged into, after dropping those whose epoch was
/// overtaken (the fencing check: a fenced owner writes nothing more); on object storage
/// then puts the objects the checkpoints queued, outside the service's lock, and drops
/// the partitions a newer epoch's objects fence. A failed put is tried again next
/// time (the replay covers what no object holds).
async fn checkpoint(
    maps: PartitionMapStore,
    service: OwnerService,
    store: PartitionStore,
    every: Duration,
    mut stopped: watch::Receiver<bool>,
) -> Result<()> {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = stopped.changed() => return Ok(()),
        }
        let owned: Vec<(u32, i64)> = service
            .owned()
            .into_iter()
            .map(|(p, e)| (p.0, e as i64))
            .collect();
        for p in maps.check_epochs(&owned).await? {
            tracing::warn!(partition = p, "fenced: dropping the partition");
            service.release(PartitionId(p), false)?;
        }
        let (service, store) = (service.clone(), store.clone());
        tokio::task::spawn_blocking(move || {
            service.checkpoint()?;
            match store.upload() {
                Ok(fenced) => {
                    for p in fenced {
                        tracing::warn!(
                            partition = p.0,
                            "fenced by a newer owner's objects: dropping the partition"
                        );
                        service.release(p, false)?;
                    }
                }
                Err(e) => tracing::warn!("putting partition objects (tried again next time): {e}"),
            }
            Ok::<_, ClusterError>(())
        })
        .await
        .map_err(|e| ClusterError::Task {
            what: "a checkpoint".into(),
            reason: e.to_string(),
        })??;
    }
}

/// Acknowledges the chunks of a killed backup's containers, once their partitions
/// have owners (the router retries until they do). A failure only costs
/// deduplication: the next copies are stored again.
async fn acknowledge_adopted(
    me: NodeId,
    router: Arc<Router>,
    entries: Vec<(larder_hash::Fingerprint, larder_index::ChunkLocation)>,
) -> Result<()> {
    match router.ack(&entries).await {
        Ok(()) => tracing::info!(
            node = me,
            chunks = entries.len(),
            "acknowledged a killed backup's chunks"
        ),
        Err(e) => tracing::warn!(node = me, "acknowledging a killed backup's chunks: {e}"),
    }
    Ok(())
}
