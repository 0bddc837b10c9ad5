//! Garbage collection on a full disk (docs/design/gc.md, "A full disk"): a collection
//! whose writes fail for want of space is rolled back, and a smaller one runs in its
//! place that frees space before it needs any: its plan goes where the repository's
//! reserve was, then it deletes the containers no snapshot uses, and only then writes
//! its segment, in the space they left.
//!
//! Invariants:
//! - a container is deleted before the commit only when it holds no live chunk and a
//!   durable plan names it, with the lock held: no snapshot reads it, no backup runs
//!   until the next writer's `open` has finished the collection;
//! - a plan whose segment is absent and some of whose containers are gone can no
//!   longer be rolled back: it is rolled forward without its repacking (its new
//!   containers are removed, the segment names every container of its old segments
//!   but the gone ones). Only this module's collections leave such a plan.

use std::io::ErrorKind;

use super::Repository;
use crate::backend::FileKind;
use crate::error::{Result, StoreError};
use crate::gc_plan::GcPlan;
use crate::segment::SegmentContainer;

/// The reserve of a local repository: `reserve` at its top, space a collection on a
/// full disk frees to write its plan (format.md, "Layout").
const RESERVE: &str = "reserve";
/// Its size: a plan of 32,000 containers (8 bytes each) fits.
pub(crate) const RESERVE_LEN: usize = 256 << 10;

/// Whether `e` is a write refused for want of space (or quota).
pub(crate) fn is_storage_full(e: &StoreError) -> bool {
    let StoreError::Io { source, .. } = e else {
        return false;
    };
    matches!(
        source.kind(),
        ErrorKind::StorageFull | ErrorKind::QuotaExceeded
    ) || matches!(source.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT))
}

/// Makes the reserve of the local repository at `root`, if it has none; best effort
/// (a disk that cannot hold it now gets it after a collection freed space).
pub(crate) fn make_reserve(root: &std::path::Path) {
    let path = root.join(RESERVE);
    if path.exists() {
        return;
    }
    // Incompressible bytes: a compressing file system stores all of them.
    let mut bytes = vec![0u8; RESERVE_LEN];
    let seed = larder_crypto::random_id_hex(16);
    blake3::Hasher::new_derive_key("larder gc reserve")
        .update(seed.as_bytes())
        .finalize_xof()
        .fill(&mut bytes);
    let tmp = root.join("tmp").join("reserve.tmp");
    let made = crate::backend::private_file_options()
        .create_new(true)
        .open(&tmp)
        .and_then(|mut f| std::io::Write::write_all(&mut f, &bytes).and_then(|()| f.sync_all()))
        .and_then(|()| std::fs::rename(&tmp, &path));
    if made.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
}

impl Repository {
    /// Frees the reserve, if the repository is local and has one; whether it did.
    fn release_reserve(&self) -> Result<bool> {
        let Some(root) = self.backend.flock_dir() else {
            return Ok(false);
        };
        let path = root.join(RESERVE);
        match std::fs::remove_file(&path) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(false),
            Err(e) => Err(StoreError::io(path, e)),
        }
    }

    /// Makes the reserve again after a collection freed space.
    pub(super) fn restore_reserve(&self) {
        if let Some(root) = self.backend.flock_dir() {
            make_reserve(root);
        }
    }

    /// The collection that runs where a full one found no space: deletes `empty`
    /// (indexed containers with no live chunk, at most as many as a plan in the
    /// reserve names), keeps every other indexed container whole (`kept`), repacks
    /// nothing. Returns the containers it deleted.
    pub(super) fn collect_on_full_disk(
        &mut self,
        empty: &[u64],
        kept: Vec<SegmentContainer>,
    ) -> Result<Vec<u64>> {
        let most = (RESERVE_LEN - 1024) / 8;
        let (delete, spared) = empty.split_at(empty.len().min(most));
        if delete.is_empty() {
            return Err(StoreError::Config(
                "the disk is full, and every container holds a chunk a snapshot uses: \
                 forget snapshots, or free space outside the repository, then run gc again"
                    .into(),
            ));
        }
        let plan = GcPlan {
            id: self.next_segment_seq(),
            old_segments: self.old_segment_ids(),
            delete: delete.to_vec(),
            new_containers: Vec::new(),
        };
        let sealed = self.seal_file(FileKind::GcPlan, &plan.name(), plan.encode())?;
        match self.backend.write(FileKind::GcPlan, &plan.name(), &sealed) {
            Err(e) if is_storage_full(&e) && self.release_reserve()? => {
                self.backend
                    .write(FileKind::GcPlan, &plan.name(), &sealed)?
            }
            written => written?,
        }
        self.backend.sync(FileKind::GcPlan)?;
        for &id in delete {
            self.backend
                .remove(FileKind::Container, &format!("{id:016x}"))?;
        }
        self.backend.sync(FileKind::Container)?;
        let mut segment = kept;
        segment.extend(self.spared_tables(spared)?);
        segment.sort_by_key(|c| c.id);
        self.write_segment(&plan.name(), &segment)?;
        self.backend.sync(FileKind::IndexSegment)?;
        self.finish_plan(&plan)?;
        self.reload_index()?;
        Ok(delete.to_vec())
    }

    /// The tables of the empty containers a full-disk collection leaves for later.
    fn spared_tables(&self, spared: &[u64]) -> Result<Vec<SegmentContainer>> {
        if spared.is_empty() {
            return Ok(Vec::new());
        }
        let tables = self.indexed_tables()?;
        Ok(spared
            .iter()
            .filter_map(|id| {
                tables.get(id).map(|entries| SegmentContainer {
                    id: *id,
                    entries: entries.clone(),
                })
            })
            .collect())
    }

    /// The ids of the segments a collection replaces: every segment now.
    fn old_segment_ids(&self) -> Vec<u64> {
        self.segments
            .iter()
            .filter_map(|n| u64::from_str_radix(n, 16).ok())
            .collect()
    }

    /// Rolls forward an uncommitted `plan` some of whose containers (`gone`) were
    /// deleted already, as a full-disk collection does before its commit: its new
    /// containers are removed, the plan is narrowed to the gone containers (replacing
    /// the file: a crash from here on repeats this), and its segment names every
    /// container of its old segments but those.
    pub(super) fn roll_forward_without_repacking(
        &self,
        plan: &GcPlan,
        gone: Vec<u64>,
    ) -> Result<()> {
        for &id in &plan.new_containers {
            self.backend
                .remove(FileKind::Container, &format!("{id:016x}"))?;
        }
        self.backend.sync(FileKind::Container)?;
        let narrowed = GcPlan {
            id: plan.id,
            old_segments: plan.old_segments.clone(),
            delete: gone,
            new_containers: Vec::new(),
        };
        let name = narrowed.name();
        let sealed = self.seal_file(FileKind::GcPlan, &name, narrowed.encode())?;
        self.backend.write(FileKind::GcPlan, &name, &sealed)?;
        self.backend.sync(FileKind::GcPlan)?;
        let mut segment: Vec<SegmentContainer> = Vec::new();
        for &old in &narrowed.old_segments {
            // A segment that does not verify names nothing here: its containers are
            // adopted by the next open, as any unnamed container is.
            if let Ok(containers) = self.read_segment(&format!("{old:016x}")) {
                segment.extend(containers);
            }
        }
        segment.retain(|c| !narrowed.delete.contains(&c.id));
        segment.sort_by_key(|c| c.id);
        segment.dedup_by_key(|c| c.id);
        self.write_segment(&name, &segment)?;
        self.backend.sync(FileKind::IndexSegment)?;
        self.finish_plan(&narrowed)
    }

    /// Which containers of uncommitted `plan` are gone already (a full-disk
    /// collection deleted them before its commit).
    pub(super) fn gone_containers(&self, plan: &GcPlan) -> Result<Vec<u64>> {
        let listed = self.backend.list(FileKind::Container)?;
        Ok(plan
            .delete
            .iter()
            .copied()
            .filter(|id| listed.binary_search(&format!("{id:016x}")).is_err())
            .collect())
    }
}
