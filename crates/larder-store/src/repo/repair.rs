//! Repair's reads of damaged containers and its writes (docs/design/repair.md). What
//! to salvage, which snapshots to rewrite and how is larder-engine's; this module
//! inspects containers against the index, and writes what the engine decided in the
//! commit order below.
//!
//! With something to delete (damaged containers or segments), the protocol is gc's,
//! with its plan file, so that `open` rolls a killed repair forward or back as it does
//! a killed collection; each step durable before the next starts:
//! 1. the plan names every current segment, the containers to delete, and the new
//!    containers;
//! 2. the new containers: the salvaged chunks (each verified again as it is copied),
//!    then the repaired trees' new chunks;
//! 3. index segment `<id>` names every intact container and every new one, no
//!    damaged one: the commit record;
//! 4. the repaired snapshots (their chunks are now indexed);
//! 5. the old segments are removed, then the damaged containers, then the plan.
//!
//! With nothing to delete, it commits as a backup does: the new containers, then a
//! segment naming them and every adopted container, then the snapshots.

use std::collections::BTreeMap;

use larder_hash::Fingerprint;

use super::gc::{hex, pack_groups, repack, CrashPoint};
use super::Repository;
use crate::backend::FileKind;
use crate::container::{stored_shares, ChunkEntry, ContainerBuilder, ParsedContainer};
use crate::error::{error_chain, Result, StoreError};
use crate::gc_plan::GcPlan;
use crate::segment::SegmentContainer;
use crate::snapshot::Snapshot;

/// What inspecting a container against the index found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ContainerHealth {
    /// Its structure verified and its table is the index's; with data read, every
    /// chunk verified too.
    Intact,
    /// Something of it is damaged (`reason`); `bad` are the positions, in the index's
    /// table, of the chunks that no longer verify (every one, when its file is gone).
    Damaged { reason: String, bad: Vec<usize> },
    /// A format version this larder does not read: not damage, and left alone.
    Unknown(String),
}

/// What repair writes: decided by the engine, written by [`Repository::apply_repair`].
#[derive(Debug, Default)]
pub struct RepairWork {
    /// Damaged indexed containers to salvage, by id: the index's table for each, and
    /// the positions in it of the chunks to copy (verified, and held by no intact
    /// container).
    pub salvage: BTreeMap<u64, (Vec<ChunkEntry>, Vec<usize>)>,
    /// Containers to delete: every damaged one, indexed or not.
    pub delete: Vec<u64>,
    /// New chunks with their raw bytes: the repaired trees' chunks that no container
    /// holds.
    pub new_chunks: Vec<(Fingerprint, Vec<u8>)>,
    /// The repaired snapshots, written once their chunks are committed.
    pub snapshots: Vec<Snapshot>,
}

/// How repair writes.
#[derive(Debug, Clone, Default)]
pub struct RepairWriteOptions {
    /// For crash tests: stop after this many file operations (writes, removals), as a
    /// process killed there would. The repository must then be dropped and opened
    /// again.
    pub crash_after_ops: Option<usize>,
}

/// What [`Repository::apply_repair`] wrote.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RepairWritten {
    pub containers_written: usize,
    /// The ids of the repaired snapshots written, in the order given.
    pub snapshots: Vec<String>,
    /// Set when `crash_after_ops` stopped it part way.
    pub interrupted: bool,
}

/// Whether an error reading a container is damage (the file is gone, short or
/// corrupt), or something else that must stop a repair (a permission, a dropped
/// connection): `Ok(None)` for damage, `Ok(Some(health))` for an unknown version.
fn classify(e: StoreError) -> Result<Option<ContainerHealth>> {
    match e {
        StoreError::Corrupt { .. } => Ok(None),
        StoreError::Io { ref source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
            Ok(None)
        }
        StoreError::UnsupportedVersion { .. } => {
            Ok(Some(ContainerHealth::Unknown(error_chain(&e))))
        }
        e => Err(e),
    }
}

impl Repository {
    /// Checks indexed container `id` against `table`, the index's table for it: its
    /// structure always (its own table must verify and equal `table`), and with
    /// `read_data` every chunk and an encrypted container's padding. A container whose
    /// structure fails is read chunk by chunk against `table`. Fails only for what is
    /// not damage.
    pub fn inspect_container(
        &self,
        id: u64,
        table: &[ChunkEntry],
        read_data: bool,
    ) -> Result<ContainerHealth> {
        if !read_data {
            match self.load_container_table(id) {
                Ok(t) if t.entries == table => return Ok(ContainerHealth::Intact),
                Ok(_) => {}
                Err(e) => {
                    if let Some(health) = classify(e)? {
                        return Ok(health);
                    }
                }
            }
        }
        let reason = match self.load_container(id) {
            Ok(c) if c.entries == table => {
                if !read_data {
                    return Ok(ContainerHealth::Intact);
                }
                let bad = bad_positions(&c, &self.codec());
                return Ok(match (bad.is_empty(), c.verify_padding()) {
                    (true, Ok(())) => ContainerHealth::Intact,
                    (true, Err(padding)) => ContainerHealth::Damaged {
                        reason: padding,
                        bad,
                    },
                    (false, _) => ContainerHealth::Damaged {
                        reason: format!("{} chunk(s) damaged", bad.len()),
                        bad,
                    },
                });
            }
            Ok(_) => "its table differs from the index's".to_string(),
            Err(e) => match classify(e) {
                Ok(None) => String::new(),
                Ok(Some(health)) => return Ok(health),
                Err(e) => return Err(e),
            },
        };
        let view = self.salvage_view(id, table)?;
        let reason = match (reason.is_empty(), view.file_len()) {
            (true, 0) => "its file is missing or empty".to_string(),
            (true, len) => format!("its structure does not verify ({len} bytes)"),
            (false, _) => reason,
        };
        Ok(ContainerHealth::Damaged {
            reason,
            bad: bad_positions(&view, &self.codec()),
        })
    }

    /// Checks a container that no segment names and that failed verification when
    /// the repository was opened: damaged (nothing of it can be trusted), of an
    /// unknown version, or intact after all.
    pub fn inspect_unindexed(&self, id: u64) -> Result<ContainerHealth> {
        match self.load_container(id) {
            Ok(_) => Ok(ContainerHealth::Intact),
            Err(e) => {
                let reason = error_chain(&e);
                Ok(classify(e)?.unwrap_or(ContainerHealth::Damaged {
                    reason,
                    bad: Vec::new(),
                }))
            }
        }
    }

    /// Container `id` read against `table` (the index's), for salvage: whatever of
    /// its file there is ([`ParsedContainer::salvage`]).
    pub fn salvage_view(&self, id: u64, table: &[ChunkEntry]) -> Result<ParsedContainer> {
        let bytes = match self.backend.read(FileKind::Container, &hex(id)) {
            Ok(bytes) => bytes,
            // Damage reads as an empty file: every chunk of it then fails.
            Err(e) => classify(e).map(|_| Vec::new())?,
        };
        Ok(ParsedContainer::salvage(
            bytes,
            id,
            table.to_vec(),
            &self.codec(),
        ))
    }

    /// Writes what repair decided, in the order of the module's protocol. Needs the
    /// exclusive lock.
    pub fn apply_repair(
        &mut self,
        work: RepairWork,
        opts: &RepairWriteOptions,
    ) -> Result<RepairWritten> {
        let mut crash = CrashPoint(opts.crash_after_ops);
        if work.delete.is_empty() && self.report.bad_segments.is_empty() {
            return self.repair_as_backup(work, &mut crash);
        }
        self.require_deletes("repair the repository")?;
        let groups = self.repair_groups(&work);
        let plan = GcPlan {
            id: self.next_segment_seq(),
            old_segments: self
                .segments
                .iter()
                .filter_map(|n| u64::from_str_radix(n, 16).ok())
                .collect(),
            delete: work.delete.clone(),
            new_containers: groups
                .iter()
                .map(|_| self.allocate_container_id())
                .collect(),
        };
        let mut written = RepairWritten {
            containers_written: groups.len(),
            ..RepairWritten::default()
        };
        match self.repair_prepare(&plan, &work, &groups, &mut crash) {
            Ok(true) => {}
            Ok(false) => return Ok(interrupted(written)),
            Err(e) => {
                // Nothing is committed: undo what was written, as `open` would.
                self.gc_roll_back(&plan)?;
                return Err(e);
            }
        }
        if !self.save_repaired(&work.snapshots, &mut written, &mut crash)?
            || !self.gc_finish(&plan, &mut crash)?
        {
            return Ok(interrupted(written));
        }
        self.reload_index()?;
        Ok(written)
    }

    /// With nothing to delete: the new chunks' containers, a segment naming them and
    /// every adopted container (a backup's commit), then the snapshots.
    fn repair_as_backup(
        &mut self,
        work: RepairWork,
        crash: &mut CrashPoint,
    ) -> Result<RepairWritten> {
        let groups = self.repair_groups(&work);
        let mut written = RepairWritten {
            containers_written: groups.len(),
            ..RepairWritten::default()
        };
        let mut containers = Vec::new();
        for group in &groups {
            let id = self.allocate_container_id();
            match self.write_new_container(id, &work, group, crash)? {
                Some(c) => containers.push(c),
                None => return Ok(interrupted(written)),
            }
        }
        if crash.reached() {
            return Ok(interrupted(written));
        }
        self.commit(containers)?;
        if !self.save_repaired(&work.snapshots, &mut written, crash)? {
            return Ok(interrupted(written));
        }
        Ok(written)
    }

    /// Steps 1 to 3: the plan, the new containers, the segment. Returns `false` if
    /// the crash point stopped it.
    fn repair_prepare(
        &mut self,
        plan: &GcPlan,
        work: &RepairWork,
        groups: &[NewContainer],
        crash: &mut CrashPoint,
    ) -> Result<bool> {
        if crash.reached() {
            return Ok(false);
        }
        let sealed = self.seal_file(FileKind::GcPlan, &plan.name(), plan.encode())?;
        self.backend
            .write(FileKind::GcPlan, &plan.name(), &sealed)?;
        self.backend.sync(FileKind::GcPlan)?;
        let mut segment: Vec<SegmentContainer> = self
            .indexed_tables()?
            .into_iter()
            .filter(|(id, _)| !plan.delete.contains(id))
            .map(|(id, entries)| SegmentContainer { id, entries })
            .collect();
        for (group, &id) in groups.iter().zip(&plan.new_containers) {
            match self.write_new_container(id, work, group, crash)? {
                Some(c) => segment.push(c),
                None => return Ok(false),
            }
        }
        self.backend.sync(FileKind::Container)?;
        if crash.reached() {
            return Ok(false);
        }
        // Committing under a lock that may have been taken as stale would race
        // another writer.
        self.check_lock()?;
        self.write_segment(&plan.name(), &segment)?;
        self.backend.sync(FileKind::IndexSegment)?;
        Ok(true)
    }

    /// The new containers' contents: the salvaged chunks in container and table order,
    /// packed by stored bytes, then the new chunks packed by raw bytes.
    fn repair_groups(&self, work: &RepairWork) -> Vec<NewContainer> {
        let limit = self.config.container_size as u64;
        let salvaged = work.salvage.iter().flat_map(|(&id, (table, take))| {
            let shares = stored_shares(table);
            take.iter()
                .map(|&i| ((id, table[i]), shares[i]))
                .collect::<Vec<_>>()
        });
        let fresh = (work.new_chunks.iter().enumerate()).map(|(i, (_, raw))| (i, raw.len() as u64));
        let (salvaged, _) = pack_groups(salvaged, limit);
        let (fresh, _) = pack_groups(fresh, limit);
        let salvaged = salvaged.into_iter().map(NewContainer::Salvaged);
        salvaged
            .chain(fresh.into_iter().map(NewContainer::Fresh))
            .collect()
    }

    /// Builds and writes new container `id` with `content`; `None` if the crash point
    /// stopped it before the write. Salvaged chunks are verified again as they are
    /// copied: nothing unverified enters a new container.
    fn write_new_container(
        &self,
        id: u64,
        work: &RepairWork,
        content: &NewContainer,
        crash: &mut CrashPoint,
    ) -> Result<Option<SegmentContainer>> {
        let codec = self.codec();
        let size = self.config.container_size;
        let mut builder = ContainerBuilder::for_codec(id, &codec, size, size);
        match content {
            NewContainer::Fresh(chunks) => {
                for &i in chunks {
                    let (fp, raw) = &work.new_chunks[i];
                    match codec.compress(raw)? {
                        Some(frame) => builder.push_stored(*fp, &frame, raw.len() as u32, true),
                        None => builder.push_stored(*fp, raw, raw.len() as u32, false),
                    };
                }
            }
            NewContainer::Salvaged(chunks) => {
                let mut source: Option<ParsedContainer> = None;
                let mut rest = &chunks[..];
                while let Some(&(src, _)) = rest.first() {
                    if source.as_ref().is_none_or(|c| c.id != src) {
                        source = Some(self.salvage_view(src, &work.salvage[&src].0)?);
                    }
                    let c = source.as_ref().expect("loaded above");
                    rest = &rest[repack(c, rest, &codec, &mut builder)?..];
                }
            }
        }
        let (bytes, entries) = builder.seal();
        if crash.reached() {
            return Ok(None);
        }
        self.backend.write(FileKind::Container, &hex(id), &bytes)?;
        Ok(Some(SegmentContainer { id, entries }))
    }

    /// Step 4: the repaired snapshots, each durable. Returns `false` if the crash
    /// point stopped it.
    fn save_repaired(
        &self,
        snapshots: &[Snapshot],
        written: &mut RepairWritten,
        crash: &mut CrashPoint,
    ) -> Result<bool> {
        for snapshot in snapshots {
            if crash.reached() {
                return Ok(false);
            }
            written.snapshots.push(self.save_snapshot(snapshot)?);
        }
        Ok(true)
    }
}

/// What one new container holds: salvaged chunks (each with its damaged container
/// and its entry there), or new chunks (positions in the work's `new_chunks`).
enum NewContainer {
    Salvaged(Vec<(u64, ChunkEntry)>),
    Fresh(Vec<usize>),
}

fn interrupted(written: RepairWritten) -> RepairWritten {
    RepairWritten {
        interrupted: true,
        ..written
    }
}

/// The positions of `c`'s entries whose chunks no longer decode or verify.
fn bad_positions(c: &ParsedContainer, codec: &crate::chunk_codec::ChunkCodec) -> Vec<usize> {
    let mut raw = Vec::new();
    c.entries
        .iter()
        .enumerate()
        .filter(|(_, e)| {
            raw.clear();
            c.read_chunk(e, codec, &mut raw).is_err()
        })
        .map(|(i, _)| i)
        .collect()
}
