//! What a node does for clients (docs/design/cluster.md, "Backups and restores"): it
//! backs paths of its file system up into its own repository, asking the cluster's
//! owners about every fingerprint its repository and the backup do not hold, and
//! restores any node's snapshot through a view of every node's repository.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use larder_crypto::RepoKeys;
use larder_engine::{
    backup, restore, BackupOptions, EngineError, NoProgress, PatternList, RemoteIndex,
    RemoteLookup, RestoreOptions, DEFAULT_RESTORE_CACHE,
};
use larder_hash::Fingerprint;
use larder_index::ChunkLocation;
use larder_store::{LockMode, SegmentContainer, StoreError};
use serde_json::json;
use tokio::runtime::Handle;

use crate::ids::NodeId;
use crate::router::Router;
use crate::rpc::{Answer, GetAnswer, Grants, Job, LookupHandler, RpcError};
use crate::served::{fd_path, Served};
use crate::service::OwnerService;
use crate::storage::SharedStorage;
use crate::view::ClusterView;

/// The cluster's index as a backup on this node sees it: the router, called from the
/// engine's threads.
struct ClusterIndex {
    router: Arc<Router>,
    runtime: Handle,
}

impl RemoteIndex for ClusterIndex {
    fn lookup(&self, fps: Vec<Fingerprint>) -> RemoteLookup {
        let (reply, lookup) = RemoteLookup::channel();
        let router = self.router.clone();
        // Dropped unsent if the runtime shuts down: the backup then fails its lookup.
        self.runtime.spawn(async move {
            let answers = router.lookup(&fps).await;
            reply.send(answers.map_err(remote_failed).and_then(locations));
        });
        lookup
    }

    fn acknowledge(&self, entries: &[(Fingerprint, ChunkLocation)]) -> Result<(), EngineError> {
        self.runtime
            .block_on(self.router.ack(entries))
            .map_err(remote_failed)
    }
}

/// The router's failures as the engine reports them: retryable where the router's are.
fn remote_failed(e: RpcError) -> EngineError {
    EngineError::Remote {
        retryable: e.is_retryable(),
        message: e.to_string(),
    }
}

/// A lookup's answers as the engine takes them: where each chunk is, or `None` (new).
fn locations(answers: Vec<Answer>) -> Result<Vec<Option<ChunkLocation>>, EngineError> {
    answers
        .into_iter()
        .map(|a| match a {
            Answer::Known(at) => Ok(Some(at)),
            Answer::New => Ok(None),
            Answer::Moved => Err(EngineError::Remote {
                message: "a lookup answered Moved after its retries".to_string(),
                retryable: true,
            }),
        })
        .collect()
}

/// A node's lookup service and client jobs, behind its one listener.
#[derive(Clone)]
pub struct NodeHandler {
    id: NodeId,
    storage: SharedStorage,
    service: OwnerService,
    router: Arc<Router>,
    /// The cluster's key, in an encrypted cluster.
    keys: Option<Arc<RepoKeys>>,
    /// The paths backups may read and restores may write (with the client's grants).
    served: Arc<Served>,
}

/// Where node `id`'s repository holds chunks of a killed backup: containers sealed and
/// durable that no segment names yet (format.md, rule 6). Opening the repository
/// adopts them; the node acknowledges them to the cluster at its start, so that a
/// later backup of the same data finds them instead of storing them again.
pub fn adopted_chunks(
    storage: &SharedStorage,
    id: NodeId,
    keys: Option<&RepoKeys>,
) -> Result<Vec<(Fingerprint, ChunkLocation)>, StoreError> {
    let repo = storage.open_repository(id, LockMode::Exclusive, Duration::from_secs(60), keys)?;
    let mut entries = Vec::new();
    for &id in &repo.report().adopted_containers {
        let table = repo.load_container_table(id)?;
        entries.extend(
            SegmentContainer {
                id,
                entries: table.entries,
            }
            .locations(),
        );
    }
    Ok(entries)
}

fn failed(what: &str, e: impl std::fmt::Display) -> RpcError {
    RpcError::Handler {
        message: format!("{what}: {e}"),
        retryable: false,
    }
}

impl NodeHandler {
    pub fn new(
        id: NodeId,
        storage: SharedStorage,
        service: OwnerService,
        router: Arc<Router>,
        keys: Option<Arc<RepoKeys>>,
        served: Served,
    ) -> Self {
        Self {
            id,
            storage,
            service,
            router,
            keys,
            served: Arc::new(served),
        }
    }

    /// Runs `job` for a client holding `grants`: a backup reads and a restore writes
    /// only beneath paths both the node serves and the grants name.
    async fn run(&self, job: Job, grants: Grants) -> Result<String, RpcError> {
        let storage = self.storage.clone();
        let id = self.id;
        let keys = self.keys.clone();
        match job {
            Job::Backup { paths } => {
                for path in &paths {
                    self.served.check_source(&grants, Path::new(path))?;
                }
                let remote: Arc<dyn RemoteIndex> = Arc::new(ClusterIndex {
                    router: self.router.clone(),
                    runtime: Handle::current(),
                });
                let summary = tokio::task::spawn_blocking(move || {
                    let mut repo = storage.open_repository(
                        id,
                        LockMode::Exclusive,
                        Duration::from_secs(60),
                        keys.as_deref(),
                    )?;
                    let options = BackupOptions {
                        hostname: format!("larder-node-{id}"),
                        username: std::env::var("USER").unwrap_or_else(|_| "larder".into()),
                        remote: Some(remote),
                        ..BackupOptions::default()
                    };
                    let paths: Vec<PathBuf> = paths.iter().map(PathBuf::from).collect();
                    backup(&mut repo, &paths, &options)
                })
                .await
                .map_err(|e| failed("backup task", e))?
                .map_err(|e| failed("backup", e))?;
                serde_json::to_string(&summary).map_err(|e| failed("backup summary", e))
            }
            Job::Restore { snapshot, target } => {
                let served = self.served.clone();
                let summary = tokio::task::spawn_blocking(move || {
                    let target = served.open_target(&grants, Path::new(&target))?;
                    let repo = ClusterView::open(&storage, id, keys.as_deref())
                        .map_err(|e| failed("restore", e))?;
                    let options = RestoreOptions {
                        overwrite: false,
                        include: PatternList::default(),
                        exclude: PatternList::default(),
                        cache_size: DEFAULT_RESTORE_CACHE,
                        progress: Arc::new(NoProgress),
                        ..RestoreOptions::default()
                    };
                    // Through the opened directory: no name is resolved again.
                    restore(&repo, &snapshot, &fd_path(&target), &options)
                        .map_err(|e| failed("restore", e))
                })
                .await
                .map_err(|e| failed("restore task", e))??;
                serde_json::to_string(&summary).map_err(|e| failed("restore summary", e))
            }
            Job::Snapshots => {
                let list = tokio::task::spawn_blocking(move || {
                    let repo = ClusterView::open(&storage, id, keys.as_deref())?;
                    let (snapshots, _) = repo.snapshots()?;
                    Ok::<_, StoreError>(
                        snapshots
                            .iter()
                            .map(|(id, s)| {
                                json!({
                                    "id": id,
                                    "time": s.time,
                                    "hostname": s.hostname,
                                    "paths": s.paths,
                                })
                            })
                            .collect::<Vec<_>>(),
                    )
                })
                .await
                .map_err(|e| failed("snapshots task", e))?
                .map_err(|e| failed("snapshots", e))?;
                Ok(serde_json::Value::Array(list).to_string())
            }
        }
    }
}

impl LookupHandler for NodeHandler {
    fn lookup(
        &self,
        from: u16,
        fps: Vec<Fingerprint>,
    ) -> impl std::future::Future<Output = Result<Vec<Answer>, RpcError>> + Send {
        LookupHandler::lookup(&self.service, from, fps)
    }

    fn ack(
        &self,
        from: u16,
        entries: Vec<(Fingerprint, ChunkLocation)>,
    ) -> impl std::future::Future<Output = Result<(), RpcError>> + Send {
        LookupHandler::ack(&self.service, from, entries)
    }

    fn get(
        &self,
        fps: Vec<Fingerprint>,
    ) -> impl std::future::Future<Output = Result<Vec<GetAnswer>, RpcError>> + Send {
        LookupHandler::get(&self.service, fps)
    }

    fn job(
        &self,
        job: Job,
        grants: Grants,
    ) -> impl std::future::Future<Output = Result<String, RpcError>> + Send {
        let handler = self.clone();
        async move { handler.run(job, grants).await }
    }
}
