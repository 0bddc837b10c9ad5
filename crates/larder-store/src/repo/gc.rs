//! Garbage collection's sweep and its crash recovery (docs/design/gc.md). The mark,
//! which reads the snapshots' trees, is larder-engine's: it hands the sweep the set of
//! live fingerprints.
//!
//! The protocol, as a must-list (each step durable before the next starts):
//! 1. the plan `gc/<id>.plan` names the containers to delete, those to write and the
//!    segments to replace;
//! 2. the repacked containers are written;
//! 3. index segment `<id>` names every container kept and written, none deleted: its
//!    existence is the commit record;
//! 4. the old segments are removed, so no segment names a deleted container;
//! 5. only then are the deleted containers' files removed;
//! 6. the plan is removed.
//!
//! `open` with the exclusive lock finds a plan left by a killed collection and rolls
//! it forward (segment `<id>` exists: steps 4 to 6) or back (it does not: the
//! containers of step 2 are removed, then the plan). A collection that runs out of
//! space is rolled back and a smaller one takes its place (`gc_full.rs`), which may
//! leave a plan that rolls forward without its segment.

use std::collections::{BTreeMap, HashSet};
use std::fs;

use larder_hash::Fingerprint;
use serde::Serialize;

use super::gc_full::is_storage_full;
use super::{ChunkBytes, DiskState, RepoIndex, Repository};
use crate::backend::FileKind;
use crate::chunk_codec::ChunkCodec;
use crate::compression::FLAGS_ZSTD;
use crate::container::{
    sealed_container_len, stored_shares, unit_span, ChunkEntry, ContainerBuilder, ParsedContainer,
    CONTAINER_OVERHEAD, ENTRY_LEN,
};
use crate::error::{error_chain, Result, StoreError};
use crate::gc_plan::GcPlan;
use crate::segment::SegmentContainer;

/// Bytes of a segment besides its containers: header (24) and checksum (32).
const SEGMENT_BASE: u64 = 24 + 32;
/// Bytes of a segment per container besides its entries.
const SEGMENT_PER_CONTAINER: u64 = 16;

/// How a collection sweeps.
#[derive(Debug, Clone)]
pub struct GcOptions {
    /// A container whose live fraction (of its chunks' stored bytes) is below this
    /// percentage is repacked; 0 repacks nothing, 100 every container with a dead
    /// chunk.
    pub repack_threshold: u8,
    /// Decide and report, change nothing.
    pub dry_run: bool,
    /// For crash tests: stop after this many file operations (writes, fsynced
    /// removals), as a process killed there would, leaving the repository as it is.
    /// The repository must then be dropped and opened again.
    pub crash_after_ops: Option<usize>,
}

impl Default for GcOptions {
    fn default() -> Self {
        Self {
            repack_threshold: 50,
            dry_run: false,
            crash_after_ops: None,
        }
    }
}

/// What a collection did (or, with `dry_run`, would do). Byte counts are of files:
/// containers and index segments.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct GcReport {
    pub dry_run: bool,
    /// Containers with no live chunk: deleted.
    pub containers_deleted: usize,
    /// Containers below the threshold: their live chunks copied, then deleted.
    pub containers_repacked: usize,
    pub containers_kept: usize,
    /// New containers holding the repacked chunks.
    pub containers_written: usize,
    pub chunks_live: usize,
    /// Chunks that left the index with their containers.
    pub chunks_removed: usize,
    /// Stored bytes of the live chunks.
    pub live_bytes: u64,
    /// Bytes of the container and segment files before and after.
    pub bytes_before: u64,
    pub bytes_after: u64,
    /// `bytes_before - bytes_after`.
    pub bytes_reclaimed: i64,
    /// Set when `crash_after_ops` stopped the collection part way.
    #[serde(skip)]
    pub interrupted: bool,
    /// Set when the disk was full: only containers no snapshot uses were deleted,
    /// nothing was repacked (docs/design/gc.md, "A full disk").
    pub disk_was_full: bool,
}

/// One container's fate.
enum Fate {
    Keep,
    Delete,
    /// Repack its live entries, each with its share of the stored bytes.
    Repack(Vec<(ChunkEntry, u64)>),
}

/// Counts file operations down to the crash point of a test.
pub(super) struct CrashPoint(pub(super) Option<usize>);

impl CrashPoint {
    /// Whether the process "dies" before the next operation.
    pub(super) fn reached(&mut self) -> bool {
        match &mut self.0 {
            Some(0) => true,
            Some(n) => {
                *n -= 1;
                false
            }
            None => false,
        }
    }
}

pub(super) fn hex(id: u64) -> String {
    format!("{id:016x}")
}

impl Repository {
    fn file_len(&self, kind: FileKind, name: &str) -> u64 {
        self.backend.file_len(kind, name).unwrap_or(0)
    }

    /// The table of every indexed container, by id, as the index holds it: from the
    /// segments that verify, and the adopted containers no segment names.
    pub fn indexed_tables(&self) -> Result<BTreeMap<u64, Vec<ChunkEntry>>> {
        let mut tables = BTreeMap::new();
        for name in &self.segments {
            if let Ok(containers) = self.read_segment(name) {
                for c in containers {
                    tables.entry(c.id).or_insert(c.entries);
                }
            }
        }
        for c in &self.pending {
            tables.entry(c.id).or_insert_with(|| c.entries.clone());
        }
        tables.retain(|id, _| self.indexed_containers.contains(id));
        Ok(tables)
    }

    /// Each indexed container's fate, counted into `report`.
    fn decide_fates(
        &self,
        tables: &BTreeMap<u64, Vec<ChunkEntry>>,
        live: &HashSet<Fingerprint>,
        repack_threshold: u8,
        report: &mut GcReport,
    ) -> Result<BTreeMap<u64, Fate>> {
        let mut fates = BTreeMap::new();
        for (&id, entries) in tables {
            // Live: a snapshot uses it, and this copy is the one the index names.
            let mut live_entries: Vec<(ChunkEntry, u64)> = Vec::new();
            let shares = stored_shares(entries);
            for (e, &share) in entries.iter().zip(&shares) {
                let canonical = Some(e.location(id));
                if live.contains(&e.fingerprint) && self.index.get(&e.fingerprint)? == canonical {
                    live_entries.push((*e, share));
                }
            }
            let total: u64 = shares.iter().sum();
            let live_bytes: u64 = live_entries.iter().map(|(_, share)| share).sum();
            report.chunks_live += live_entries.len();
            report.live_bytes += live_bytes;
            let fate = if live_entries.is_empty() {
                report.containers_deleted += 1;
                report.chunks_removed += entries.len();
                Fate::Delete
            } else if live_bytes * 100 < u64::from(repack_threshold) * total {
                report.containers_repacked += 1;
                report.chunks_removed += entries.len() - live_entries.len();
                Fate::Repack(live_entries)
            } else {
                report.containers_kept += 1;
                Fate::Keep
            };
            fates.insert(id, fate);
        }
        Ok(fates)
    }

    /// The repacked chunks in container and table order (stream order survives),
    /// packed into new containers by stored bytes as a backup fills them; with each
    /// new container's stored bytes (its entries' shares).
    fn pack(&self, fates: &BTreeMap<u64, Fate>) -> (Vec<Vec<(u64, ChunkEntry)>>, Vec<u64>) {
        let repacked = fates.iter().flat_map(|(&id, fate)| match fate {
            Fate::Repack(entries) => entries.iter().map(|&(e, share)| ((id, e), share)).collect(),
            _ => Vec::new(),
        });
        pack_groups(repacked, self.config.container_size as u64)
    }

    /// The file size of a new container of `data` stored bytes and `entries` table
    /// entries: padded to its size class in an encrypted repository (crypto.md).
    pub(super) fn container_len(&self, data: u64, entries: usize) -> u64 {
        match self.config.encryption {
            None => data + (ENTRY_LEN * entries + CONTAINER_OVERHEAD) as u64,
            Some(_) => {
                sealed_container_len(data as usize, entries, self.config.container_size) as u64
            }
        }
    }

    /// Deletes what no snapshot uses: `live` holds every fingerprint the snapshots
    /// reach (their tree streams and file recipes). A chunk is live when its
    /// fingerprint is and it is the indexed copy. Needs the exclusive lock.
    pub fn collect_garbage(
        &mut self,
        live: &HashSet<Fingerprint>,
        opts: &GcOptions,
    ) -> Result<GcReport> {
        if opts.repack_threshold > 100 {
            return Err(StoreError::Config(format!(
                "repack threshold {}% is above 100%",
                opts.repack_threshold
            )));
        }
        if !opts.dry_run {
            self.require_deletes("collect garbage")?;
        }
        let tables = self.indexed_tables()?;
        let mut report = GcReport {
            dry_run: opts.dry_run,
            ..GcReport::default()
        };
        let fates = self.decide_fates(&tables, live, opts.repack_threshold, &mut report)?;
        let (groups, group_bytes) = self.pack(&fates);
        let old_segments: Vec<String> = self.segments.clone();
        let delete: Vec<u64> = fates
            .iter()
            .filter(|(_, f)| !matches!(f, Fate::Keep))
            .map(|(&id, _)| id)
            .collect();
        let kept_entries: u64 = fates
            .iter()
            .filter(|(_, f)| matches!(f, Fate::Keep))
            .map(|(id, _)| tables[id].len() as u64)
            .sum();
        let new_containers_len: u64 = groups
            .iter()
            .zip(&group_bytes)
            .map(|(g, &bytes)| self.container_len(bytes, g.len()))
            .sum();
        let new_entries: u64 = groups.iter().map(|g| g.len() as u64).sum();
        let new_segment_len = SEGMENT_BASE
            + SEGMENT_PER_CONTAINER * (report.containers_kept + groups.len()) as u64
            + ENTRY_LEN as u64 * (kept_entries + new_entries);
        let old_segments_len: u64 = old_segments
            .iter()
            .map(|n| self.file_len(FileKind::IndexSegment, n))
            .sum();
        let deleted_len: u64 = delete
            .iter()
            .map(|&id| self.file_len(FileKind::Container, &hex(id)))
            .sum();
        let all_containers_len: u64 = tables
            .keys()
            .map(|&id| self.file_len(FileKind::Container, &hex(id)))
            .sum();
        report.containers_written = groups.len();
        report.bytes_before = all_containers_len + old_segments_len;
        report.bytes_after = if delete.is_empty() {
            report.bytes_before
        } else {
            all_containers_len - deleted_len + new_containers_len + new_segment_len
        };
        report.bytes_reclaimed = report.bytes_before as i64 - report.bytes_after as i64;
        if opts.dry_run || delete.is_empty() {
            return Ok(report);
        }

        let plan = GcPlan {
            id: self.next_segment_seq(),
            old_segments: old_segments
                .iter()
                .filter_map(|n| u64::from_str_radix(n, 16).ok())
                .collect(),
            delete,
            new_containers: groups
                .iter()
                .map(|_| self.allocate_container_id())
                .collect(),
        };
        let mut crash = CrashPoint(opts.crash_after_ops);
        let kept: Vec<SegmentContainer> = fates
            .iter()
            .filter(|(_, f)| matches!(f, Fate::Keep))
            .map(|(id, _)| SegmentContainer {
                id: *id,
                entries: tables[id].clone(),
            })
            .collect();
        match self.gc_prepare(&plan, &groups, kept, &mut crash) {
            Ok(true) => {}
            Ok(false) => {
                report.interrupted = true;
                return Ok(report);
            }
            Err(e) => {
                // Nothing is committed: undo what was written, as `open` would.
                self.gc_roll_back(&plan)?;
                if !is_storage_full(&e) {
                    return Err(e);
                }
                return self.collect_on_full_disk_instead(&fates, &tables, report);
            }
        }
        if !self.gc_finish(&plan, &mut crash)? {
            report.interrupted = true;
            return Ok(report);
        }
        self.reload_index()?;
        self.restore_reserve();
        Ok(report)
    }

    /// Runs the full-disk collection (`gc_full.rs`) in place of the one planned with
    /// `fates`, and reports what it did.
    fn collect_on_full_disk_instead(
        &mut self,
        fates: &BTreeMap<u64, Fate>,
        tables: &BTreeMap<u64, Vec<ChunkEntry>>,
        mut report: GcReport,
    ) -> Result<GcReport> {
        let empty: Vec<u64> = fates
            .iter()
            .filter(|(_, f)| matches!(f, Fate::Delete))
            .map(|(&id, _)| id)
            .collect();
        let kept: Vec<SegmentContainer> = fates
            .iter()
            .filter(|(_, f)| !matches!(f, Fate::Delete))
            .map(|(id, _)| SegmentContainer {
                id: *id,
                entries: tables[id].clone(),
            })
            .collect();
        let deleted = self.collect_on_full_disk(&empty, kept)?;
        report.disk_was_full = true;
        report.containers_deleted = deleted.len();
        report.containers_kept = tables.len() - deleted.len();
        report.containers_repacked = 0;
        report.containers_written = 0;
        report.chunks_removed = deleted.iter().map(|id| tables[id].len()).sum();
        report.bytes_after = [FileKind::Container, FileKind::IndexSegment]
            .into_iter()
            .map(|kind| {
                let sizes = self.backend.list_sizes(kind)?;
                Ok(sizes.iter().map(|(_, len)| len).sum::<u64>())
            })
            .sum::<Result<u64>>()?;
        report.bytes_reclaimed = report.bytes_before as i64 - report.bytes_after as i64;
        self.restore_reserve();
        Ok(report)
    }

    /// Steps 1 to 3 of the protocol. Returns `false` if the crash point stopped it.
    fn gc_prepare(
        &mut self,
        plan: &GcPlan,
        groups: &[Vec<(u64, ChunkEntry)>],
        mut segment: Vec<SegmentContainer>,
        crash: &mut CrashPoint,
    ) -> Result<bool> {
        if crash.reached() {
            return Ok(false);
        }
        self.backend.write(
            FileKind::GcPlan,
            &plan.name(),
            &self.seal_file(FileKind::GcPlan, &plan.name(), plan.encode())?,
        )?;
        self.backend.sync(FileKind::GcPlan)?;

        let codec = self.codec();
        let mut source: Option<ParsedContainer> = None;
        for (group, &new_id) in groups.iter().zip(&plan.new_containers) {
            let data: usize = group.iter().map(|(_, e)| e.stored_len as usize).sum();
            let mut builder = ContainerBuilder::for_codec(
                new_id,
                &codec,
                data + ENTRY_LEN * group.len(),
                self.config.container_size,
            );
            let mut rest = &group[..];
            while let Some(&(src, _)) = rest.first() {
                if source.as_ref().is_none_or(|c| c.id != src) {
                    source = Some(self.load_container(src)?);
                }
                let c = source.as_ref().expect("loaded above");
                let taken = repack(c, rest, &codec, &mut builder).map_err(gc_stopped)?;
                rest = &rest[taken..];
            }
            let (bytes, entries) = builder.seal();
            if crash.reached() {
                return Ok(false);
            }
            self.backend
                .write(FileKind::Container, &hex(new_id), &bytes)?;
            segment.push(SegmentContainer {
                id: new_id,
                entries,
            });
        }
        self.backend.sync(FileKind::Container)?;
        segment.sort_by_key(|c| c.id);
        if crash.reached() {
            return Ok(false);
        }
        self.write_segment(&plan.name(), &segment)?;
        self.backend.sync(FileKind::IndexSegment)?;
        Ok(true)
    }

    /// Steps 4 to 6: after the commit, each removal is durable before the next kind
    /// of removal starts. Returns `false` if the crash point stopped it.
    pub(super) fn gc_finish(&self, plan: &GcPlan, crash: &mut CrashPoint) -> Result<bool> {
        let steps = [
            (FileKind::IndexSegment, &plan.old_segments),
            (FileKind::Container, &plan.delete),
        ];
        for (kind, ids) in steps {
            for &id in ids {
                if crash.reached() {
                    return Ok(false);
                }
                self.backend.remove(kind, &hex(id))?;
            }
            self.backend.sync(kind)?;
        }
        if crash.reached() {
            return Ok(false);
        }
        self.backend.remove(FileKind::GcPlan, &plan.name())?;
        self.backend.sync(FileKind::GcPlan)?;
        Ok(true)
    }

    /// Undoes an uncommitted collection: its segment (if the commit itself failed
    /// part way it is absent), its new containers, then its plan.
    pub(super) fn gc_roll_back(&self, plan: &GcPlan) -> Result<()> {
        self.backend.remove(FileKind::IndexSegment, &plan.name())?;
        self.backend.sync(FileKind::IndexSegment)?;
        for &id in &plan.new_containers {
            self.backend.remove(FileKind::Container, &hex(id))?;
        }
        self.backend.sync(FileKind::Container)?;
        self.backend.remove(FileKind::GcPlan, &plan.name())?;
        self.backend.sync(FileKind::GcPlan)
    }

    /// Finishes or rolls back each collection a killed process left (called by `open`
    /// with the exclusive lock, before the index is loaded). A plan that fails
    /// verification is removed and nothing is deleted, which is always safe: what it
    /// wrote is then adopted like a killed backup's containers, and a later gc
    /// collects it.
    pub(super) fn recover_gc(&mut self) -> Result<()> {
        for name in self.backend.list(FileKind::GcPlan)? {
            let bytes = self.backend.read(FileKind::GcPlan, &name)?;
            match self
                .open_file(FileKind::GcPlan, &name, bytes)
                .and_then(|plain| GcPlan::decode(&plain, &name))
            {
                Ok(plan) => {
                    let committed = self
                        .backend
                        .list(FileKind::IndexSegment)?
                        .contains(&plan.name());
                    let gone = match committed {
                        true => Vec::new(),
                        false => self.gone_containers(&plan)?,
                    };
                    if committed {
                        self.gc_finish(&plan, &mut CrashPoint(None))?;
                        self.report.finished_gc.push(plan.id);
                    } else if !gone.is_empty() {
                        self.roll_forward_without_repacking(&plan, gone)?;
                        self.report.finished_gc.push(plan.id);
                    } else {
                        self.gc_roll_back(&plan)?;
                        self.report.rolled_back_gc.push(plan.id);
                    }
                }
                Err(e) => {
                    self.backend.remove(FileKind::GcPlan, &name)?;
                    self.backend.sync(FileKind::GcPlan)?;
                    self.report.bad_gc_plans.push((name, error_chain(&e)));
                }
            }
        }
        Ok(())
    }

    /// Every container the plans of interrupted collections (or repairs) delete or
    /// write: until the next writer finishes or rolls them back, no segment may name
    /// them, and that is no damage. Plans that fail verification name nothing.
    pub(super) fn planned_containers(&self) -> Result<std::collections::BTreeSet<u64>> {
        let mut out = std::collections::BTreeSet::new();
        for name in self.backend.list(FileKind::GcPlan)? {
            let plan = self
                .backend
                .read(FileKind::GcPlan, &name)
                .and_then(|bytes| self.open_file(FileKind::GcPlan, &name, bytes))
                .and_then(|plain| GcPlan::decode(&plain, &name));
            if let Ok(plan) = plan {
                out.extend(plan.delete.iter().chain(&plan.new_containers));
            }
        }
        Ok(out)
    }

    /// Names of the plans of interrupted collections (for `check` to mention).
    pub fn pending_gc_plans(&self) -> Result<Vec<String>> {
        self.backend.list(FileKind::GcPlan)
    }

    /// Steps 4 to 6 of `plan`, which committed.
    pub(super) fn finish_plan(&self, plan: &GcPlan) -> Result<()> {
        self.gc_finish(plan, &mut CrashPoint(None)).map(drop)
    }

    /// Loads the index again from the files, as `open` does.
    pub(super) fn reload_index(&mut self) -> Result<()> {
        if !self.config.index.is_memory() {
            // The disk index has no delete: without its `held` file the load below
            // rebuilds it, without the deleted containers (and so would the next open,
            // after a crash here).
            self.index = RepoIndex::default();
            let held = DiskState::dir_of(&self.state).join("held");
            if held.exists() {
                fs::remove_file(&held).map_err(|e| StoreError::io(&held, e))?;
            }
        }
        self.index = RepoIndex::default();
        self.indexed_containers.clear();
        self.chunk_bytes = ChunkBytes::default();
        self.pending.clear();
        self.load_index()
    }
}

/// Packs `items` (each with its stored bytes), in their order, into groups of at most
/// `limit` stored bytes (a group holds at least one item); returns the groups and
/// each one's stored bytes.
pub(super) fn pack_groups<T>(
    items: impl IntoIterator<Item = (T, u64)>,
    limit: u64,
) -> (Vec<Vec<T>>, Vec<u64>) {
    let mut groups: Vec<Vec<T>> = Vec::new();
    let mut filled: Vec<u64> = Vec::new();
    for (item, bytes) in items {
        if filled.last().is_none_or(|&f| f + bytes > limit) {
            groups.push(Vec::new());
            filled.push(0);
        }
        *filled.last_mut().expect("a group was pushed") += bytes;
        groups.last_mut().expect("a group was pushed").push(item);
    }
    (groups, filled)
}

/// Copies the chunks at the start of `group` that lie in `c` into `builder`, after
/// verifying each (neither gc nor repair ever spreads damage), and returns how many
/// it took: a chunk stored alone, copied as stored; a whole unit whose members all
/// come next, copied as stored; a member whose unit is not all copied, compressed
/// again on its own.
pub(super) fn repack(
    c: &ParsedContainer,
    group: &[(u64, ChunkEntry)],
    codec: &ChunkCodec,
    builder: &mut ContainerBuilder,
) -> Result<usize> {
    let e = group[0].1;
    let i = c.position(e.offset, &e.fingerprint).ok_or_else(|| {
        StoreError::corrupt("container", hex(c.id), "a live chunk left its table")
    })?;
    let span = unit_span(&c.entries, i);
    let members = &c.entries[span.clone()];
    let whole = i == span.start
        && group.len() >= members.len()
        && group[..members.len()]
            .iter()
            .zip(members)
            .all(|((src, g), m)| *src == c.id && g == m);
    let take = if whole { members.len() } else { 1 };
    let mut raw = Vec::new();
    for (_, m) in &group[..take] {
        raw.clear();
        c.read_chunk(m, codec, &mut raw)?;
    }
    let mut stored = Vec::new();
    if e.is_member() && !whole {
        match codec.compress(&raw)? {
            Some(frame) => builder.push_stored(e.fingerprint, &frame, e.raw_len, true),
            None => builder.push_stored(e.fingerprint, &raw, e.raw_len, false),
        };
        return Ok(1);
    }
    c.encoded_chunk(i, &mut stored)?;
    if e.is_member() {
        let list: Vec<_> = members.iter().map(|m| (m.fingerprint, m.raw_len)).collect();
        builder.push_unit(&stored, &list);
    } else {
        builder.push_stored(e.fingerprint, &stored, e.raw_len, e.flags == FLAGS_ZSTD);
    }
    Ok(take)
}

/// A damaged live chunk's error, telling that gc stopped and what fixes it.
fn gc_stopped(e: StoreError) -> StoreError {
    match e {
        StoreError::Corrupt { what, name, reason } => StoreError::Corrupt {
            what,
            name,
            reason: format!(
                "live {reason}; gc stopped and deleted nothing (`larder repair` salvages the container)"
            ),
        },
        other => other,
    }
}
