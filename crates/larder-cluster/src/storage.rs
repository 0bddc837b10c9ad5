//! Where a cluster keeps its partitions and its nodes' repositories
//! (docs/design/cluster.md, "Shared storage layout" and "Partitions on object
//! storage"): a directory every node mounts, or an S3-compatible bucket with a local
//! cache directory per node.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use larder_crypto::RepoKeys;
use larder_store::{
    config_is_sealed, Backend, LocalBackend, LockMode, ObjectBackend, RepoConfig, Repository,
    StoreError,
};

use crate::ids::{first_container, NodeId};

/// The name of a node repository's config, in its local directory and, on object
/// storage, as the object `nodes/<id>/config`.
const CONFIG: &str = "config";

/// A cluster's shared storage.
#[derive(Clone)]
pub enum SharedStorage {
    /// A directory every node mounts: `partitions/<p>/` and `nodes/<id>/`.
    Dir(PathBuf),
    /// An object store (`root`: `s3://BUCKET/PREFIX`); this node's partition indexes
    /// and the local part of its repositories (config, lock, tmp) are in `cache`.
    Object {
        root: Arc<ObjectBackend>,
        cache: PathBuf,
    },
}

impl std::fmt::Debug for SharedStorage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Dir(dir) => f.debug_tuple("Dir").field(dir).finish(),
            Self::Object { root, cache } => f
                .debug_struct("Object")
                .field("root", root)
                .field("cache", cache)
                .finish(),
        }
    }
}

impl From<PathBuf> for SharedStorage {
    fn from(dir: PathBuf) -> Self {
        Self::Dir(dir)
    }
}

impl From<&Path> for SharedStorage {
    fn from(dir: &Path) -> Self {
        Self::Dir(dir.to_path_buf())
    }
}

/// The directory of a storage URL that is not `s3://`: `file://PATH` or `PATH`.
pub fn parse_dir(url: &str) -> Result<PathBuf, StoreError> {
    if let Some(path) = url.strip_prefix("file://") {
        return Ok(PathBuf::from(path));
    }
    if url.contains("://") {
        return Err(StoreError::Config(format!(
            "storage {url}: a shared directory (file://PATH or PATH) or s3://BUCKET/PREFIX"
        )));
    }
    Ok(PathBuf::from(url))
}

impl SharedStorage {
    /// `s3://BUCKET/PREFIX` (endpoint and credentials from the AWS environment
    /// variables; `cache` required), or a directory (`file://PATH` or `PATH`).
    pub fn parse(url: &str, cache: Option<&Path>) -> Result<Self, StoreError> {
        if url.starts_with("s3://") {
            let cache = cache.ok_or_else(|| {
                StoreError::Config(format!(
                    "storage {url}: object storage needs a local cache directory (--cache DIR)"
                ))
            })?;
            let root = ObjectBackend::from_url(url)?;
            return Ok(Self::Object {
                root: Arc::new(root),
                cache: cache.to_path_buf(),
            });
        }
        parse_dir(url).map(Self::Dir)
    }

    /// Where this node keeps partition `p`'s disk index: in the shared directory, or
    /// in its cache.
    pub fn partition_dir(&self, p: u32) -> PathBuf {
        self.local_root().join("partitions").join(format!("{p:05}"))
    }

    fn local_root(&self) -> &Path {
        match self {
            Self::Dir(dir) => dir,
            Self::Object { cache, .. } => cache,
        }
    }

    /// The local directory of node `node`'s repository: all of it (a shared
    /// directory), or its config, lock and tmp (object storage).
    pub fn node_root(&self, node: NodeId) -> PathBuf {
        self.local_root().join("nodes").join(node.to_string())
    }

    /// Where the node repositories are, for messages.
    pub fn nodes_location(&self) -> PathBuf {
        match self {
            Self::Dir(dir) => dir.join("nodes"),
            Self::Object { root, .. } => root.describe("nodes"),
        }
    }

    /// Node `node`'s repository files.
    pub fn node_backend(&self, node: NodeId) -> Arc<dyn Backend> {
        match self {
            Self::Dir(_) => Arc::new(LocalBackend::new(self.node_root(node))),
            Self::Object { root, .. } => Arc::new(root.sub(&format!("nodes/{node}"))),
        }
    }

    /// The partitions' objects (object storage only).
    pub fn partition_objects(&self) -> Option<ObjectBackend> {
        match self {
            Self::Dir(_) => None,
            Self::Object { root, .. } => Some(root.sub("partitions")),
        }
    }

    /// The nodes with files under `nodes/<id>/`, in order; with `with_config` only
    /// those whose repository has its config (in the directory, or as the object
    /// `nodes/<id>/config`).
    pub fn nodes(&self, with_config: bool) -> Result<Vec<NodeId>, StoreError> {
        let mut ids = Vec::new();
        match self {
            Self::Dir(dir) => {
                let nodes = dir.join("nodes");
                let listing = match std::fs::read_dir(&nodes) {
                    Ok(listing) => listing,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(ids),
                    Err(e) => return Err(StoreError::io(nodes, e)),
                };
                for entry in listing {
                    let entry = entry.map_err(|e| StoreError::io(&nodes, e))?;
                    let id = entry.file_name().to_str().and_then(|n| n.parse().ok());
                    if let Some(id) =
                        id.filter(|_| !with_config || entry.path().join(CONFIG).is_file())
                    {
                        ids.push(id);
                    }
                }
            }
            Self::Object { root, .. } => {
                for name in root.list_dirs("nodes")? {
                    let Ok(id) = name.parse::<NodeId>() else {
                        continue;
                    };
                    if with_config {
                        match root.get(&format!("nodes/{id}/{CONFIG}")) {
                            Ok(_) => {}
                            Err(StoreError::Io { source, .. })
                                if source.kind() == std::io::ErrorKind::NotFound =>
                            {
                                continue
                            }
                            Err(e) => return Err(e),
                        }
                    }
                    ids.push(id);
                }
            }
        }
        ids.sort_unstable();
        Ok(ids)
    }

    /// Creates node `id`'s repository if it has none, with `template`'s parameters (the
    /// cluster's hash and chunker, and in an encrypted cluster its AEAD and id) and
    /// containers numbered from the node's range; encrypted with `keys` when given, and
    /// then with no key slot of its own (docs/design/crypto.md, "Cluster"). On object
    /// storage the config is put as the object `nodes/<id>/config` too, and a fresh
    /// cache takes it from there. A repository already there must be encrypted exactly
    /// when `keys` are given.
    pub fn ensure_repository(
        &self,
        id: NodeId,
        template: &RepoConfig,
        keys: Option<&RepoKeys>,
    ) -> Result<(), StoreError> {
        let local = self.node_root(id);
        let config_path = local.join(CONFIG);
        if config_path.is_file() {
            let raw = std::fs::read(&config_path).map_err(|e| StoreError::io(&config_path, e))?;
            return match (config_is_sealed(&raw), keys.is_some()) {
                (true, false) => Err(StoreError::NeedsKey(local)),
                (false, true) => Err(StoreError::Config(format!(
                    "{} is a plaintext repository in an encrypted cluster",
                    local.display()
                ))),
                _ => Ok(()),
            };
        }
        let mut config = template.clone();
        config.container_base = first_container(id);
        let init = |local: &Path, config: &RepoConfig| match keys {
            Some(keys) => Repository::init_encrypted_without_slot(local, config, keys),
            None => Repository::init(local, config),
        };
        let Self::Object { root, .. } = self else {
            return init(&local, &config);
        };
        let key = format!("nodes/{id}/{CONFIG}");
        match root.get(&key) {
            Ok(bytes) => config = RepoConfig::decode_with(&bytes, &key, keys)?,
            Err(StoreError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
            }
            Err(e) => return Err(e),
        }
        // A cache left half-made by a crash is made again.
        if local.exists() {
            std::fs::remove_dir_all(&local).map_err(|e| StoreError::io(&local, e))?;
        }
        init(&local, &config)?;
        let bytes = std::fs::read(&config_path).map_err(|e| StoreError::io(&local, e))?;
        // Create-only: a config already there (this node's, from another cache) stays.
        root.put(&key, &bytes, true).map(drop)
    }

    /// Opens node `id`'s repository.
    pub fn open_repository(
        &self,
        id: NodeId,
        mode: LockMode,
        wait: Duration,
        keys: Option<&RepoKeys>,
    ) -> Result<Repository, StoreError> {
        Repository::open_with(
            &self.node_root(id),
            mode,
            wait,
            self.node_backend(id),
            keys.cloned(),
        )
    }
}
