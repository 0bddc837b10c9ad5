//! Every node's repository seen as one (docs/design/cluster.md, "Restores"): a
//! read-only [`Backend`] over the shared storage's `nodes/<id>/` repositories (in the
//! shared directory or on object storage), so that
//! any node restores, lists and checks any node's snapshots with the engine's own code.
//! A container is read from its writer's repository (its id names the writer); segments
//! and snapshots are the union of all nodes'. In an encrypted cluster every node
//! repository has the cluster's id and key (docs/design/crypto.md, "Cluster"), so one
//! key opens all of them.

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use larder_crypto::RepoKeys;
use larder_store::{Backend, FileKind, LockMode, Repository, StoreError};

use crate::ids::{container_writer, NodeId};
use crate::storage::SharedStorage;

/// The shared storage's node repositories, read-only.
pub struct ClusterView {
    /// Names the storage in errors.
    storage: PathBuf,
    nodes: BTreeMap<NodeId, Arc<dyn Backend>>,
}

/// Writes through a view are refused: it only reads.
fn read_only(storage: &std::path::Path) -> StoreError {
    StoreError::io(
        storage,
        std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            "the cluster's view of every node's repository is read-only",
        ),
    )
}

/// A segment's name in the view: its node's id, a dash, its name in that node's
/// repository (segment names are only unique within a repository).
fn segment_name(node: NodeId, name: &str) -> String {
    format!("{node:05}-{name}")
}

impl ClusterView {
    /// The repositories of `storage` now (those with a config).
    pub fn new(storage: &SharedStorage) -> Result<Self, StoreError> {
        let nodes = storage
            .nodes(true)?
            .into_iter()
            .map(|id| (id, storage.node_backend(id)))
            .collect();
        Ok(Self {
            storage: storage.nodes_location(),
            nodes,
        })
    }

    /// Opens every node's snapshots and chunks as one repository, under node `me`'s
    /// config and shared lock, with the cluster's key in an encrypted cluster.
    pub fn open(
        storage: &SharedStorage,
        me: NodeId,
        keys: Option<&RepoKeys>,
    ) -> Result<Repository, StoreError> {
        let view = Arc::new(Self::new(storage)?);
        Repository::open_with(
            &storage.node_root(me),
            LockMode::Shared,
            Duration::from_secs(60),
            view,
            keys.cloned(),
        )
    }

    /// The backend holding file `name` of `kind`.
    fn route(&self, kind: FileKind, name: &str) -> Result<(&Arc<dyn Backend>, String), StoreError> {
        let missing = || {
            StoreError::io(
                &self.storage,
                std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    format!("no node's repository holds {} {name}", kind.dir()),
                ),
            )
        };
        match kind {
            FileKind::Container => {
                let id = u64::from_str_radix(name, 16).map_err(|_| missing())?;
                let node = self.nodes.get(&container_writer(id)).ok_or_else(missing)?;
                Ok((node, name.to_string()))
            }
            FileKind::IndexSegment => {
                let (node, inner) = name.split_once('-').ok_or_else(missing)?;
                let node: NodeId = node.parse().map_err(|_| missing())?;
                let backend = self.nodes.get(&node).ok_or_else(missing)?;
                Ok((backend, inner.to_string()))
            }
            // The view's config, key slots and lock are node `me`'s own, in its
            // directory (`Repository::open_with`).
            FileKind::Config | FileKind::Key | FileKind::Lock => Err(missing()),
            FileKind::Snapshot | FileKind::GcPlan => self
                .nodes
                .values()
                .find(|b| b.file_len(kind, name).is_ok())
                .map(|b| (b, name.to_string()))
                .ok_or_else(missing),
        }
    }
}

impl Backend for ClusterView {
    fn read(&self, kind: FileKind, name: &str) -> Result<Vec<u8>, StoreError> {
        let (backend, name) = self.route(kind, name)?;
        backend.read(kind, &name)
    }

    fn read_ranges(
        &self,
        kind: FileKind,
        name: &str,
        ranges: &[Range<u64>],
    ) -> Result<Vec<Vec<u8>>, StoreError> {
        let (backend, name) = self.route(kind, name)?;
        backend.read_ranges(kind, &name, ranges)
    }

    fn file_len(&self, kind: FileKind, name: &str) -> Result<u64, StoreError> {
        let (backend, name) = self.route(kind, name)?;
        backend.file_len(kind, &name)
    }

    fn write(&self, _kind: FileKind, _name: &str, _data: &[u8]) -> Result<(), StoreError> {
        Err(read_only(&self.storage))
    }

    fn write_new(&self, _kind: FileKind, _name: &str, _data: &[u8]) -> Result<bool, StoreError> {
        Err(read_only(&self.storage))
    }

    fn sync(&self, _kind: FileKind) -> Result<(), StoreError> {
        Err(read_only(&self.storage))
    }

    fn list(&self, kind: FileKind) -> Result<Vec<String>, StoreError> {
        let mut names = Vec::new();
        for (&node, backend) in &self.nodes {
            let listed = match backend.list(kind) {
                Ok(listed) => listed,
                // A node that has not written this kind yet.
                Err(StoreError::Io { source, .. })
                    if source.kind() == std::io::ErrorKind::NotFound =>
                {
                    continue
                }
                Err(e) => return Err(e),
            };
            match kind {
                FileKind::IndexSegment => {
                    names.extend(listed.iter().map(|n| segment_name(node, n)))
                }
                _ => names.extend(listed),
            }
        }
        names.sort();
        Ok(names)
    }

    fn remove(&self, _kind: FileKind, _name: &str) -> Result<(), StoreError> {
        Err(read_only(&self.storage))
    }

    fn location(&self) -> String {
        self.storage.display().to_string()
    }

    /// A segment's name in its node's repository, without the node this view adds.
    fn written_name<'a>(&self, kind: FileKind, name: &'a str) -> &'a str {
        match kind {
            FileKind::IndexSegment => name.split_once('-').map_or(name, |(_, inner)| inner),
            _ => name,
        }
    }
}
