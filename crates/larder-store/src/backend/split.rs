//! A repository whose config, key slots and lock are in a local directory and whose
//! other files are in another backend: a cluster node's repository on shared storage,
//! or a cluster's view of every node's (docs/design/cluster.md).

use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

use super::{Backend, FileKind, FileVersion, LocalBackend};
use crate::error::Result;

/// Routes the config, key slots and locks to `home` and everything else to `data`.
pub struct SplitBackend {
    home: LocalBackend,
    data: Arc<dyn Backend>,
}

impl SplitBackend {
    pub fn new(home: LocalBackend, data: Arc<dyn Backend>) -> Self {
        Self { home, data }
    }

    fn route(&self, kind: FileKind) -> &dyn Backend {
        match kind {
            FileKind::Config | FileKind::Key | FileKind::Lock => &self.home,
            _ => &*self.data,
        }
    }
}

impl Backend for SplitBackend {
    fn read(&self, kind: FileKind, name: &str) -> Result<Vec<u8>> {
        self.route(kind).read(kind, name)
    }

    fn read_ranges(
        &self,
        kind: FileKind,
        name: &str,
        ranges: &[Range<u64>],
    ) -> Result<Vec<Vec<u8>>> {
        self.route(kind).read_ranges(kind, name, ranges)
    }

    fn file_len(&self, kind: FileKind, name: &str) -> Result<u64> {
        self.route(kind).file_len(kind, name)
    }

    fn write(&self, kind: FileKind, name: &str, data: &[u8]) -> Result<()> {
        self.route(kind).write(kind, name, data)
    }

    fn write_new(&self, kind: FileKind, name: &str, data: &[u8]) -> Result<bool> {
        self.route(kind).write_new(kind, name, data)
    }

    fn sync(&self, kind: FileKind) -> Result<()> {
        self.route(kind).sync(kind)
    }

    fn list(&self, kind: FileKind) -> Result<Vec<String>> {
        self.route(kind).list(kind)
    }

    fn list_sizes(&self, kind: FileKind) -> Result<Vec<(String, u64)>> {
        self.route(kind).list_sizes(kind)
    }

    fn list_versions(&self, kind: FileKind) -> Result<Vec<(String, FileVersion)>> {
        self.route(kind).list_versions(kind)
    }

    fn remove(&self, kind: FileKind, name: &str) -> Result<()> {
        self.route(kind).remove(kind, name)
    }

    /// Both: the local directory's `tmp/`, and whatever the other backend keeps.
    fn clean_tmp(&self) -> Result<usize> {
        Ok(self.home.clean_tmp()? + self.data.clean_tmp()?)
    }

    fn flock_dir(&self) -> Option<&Path> {
        self.home.flock_dir()
    }

    fn location(&self) -> String {
        self.home.location()
    }

    fn written_name<'a>(&self, kind: FileKind, name: &'a str) -> &'a str {
        self.route(kind).written_name(kind, name)
    }
}
