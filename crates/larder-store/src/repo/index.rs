//! The repository's fingerprint index, in memory or on disk (docs/design/format.md,
//! "config" and "Disk index"). The segments and containers are the source of truth
//! for both: the memory index is built from them at every open; the disk index is
//! derived from them once and then caught up with what it lacks. An encrypted
//! repository's disk index is sealed page by page (docs/design/crypto.md, "Disk index
//! pages"), and so are its `held` record and the last backup's counters.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use larder_crypto::{IndexPart, ObjectKind, RepoKeys};
use larder_hash::Fingerprint;
use larder_index::disk::{DiskIndex, DiskIndexConfig, DiskIndexMetrics, IndexDir, Lookup};
use larder_index::{ChunkLocation, CuckooIndex, FingerprintIndex, IndexError};
use serde::{Deserialize, Serialize};

use super::absorbed::AbsorbedSegments;
use crate::backend::{sync_dir, FileVersion};
use crate::error::{Result, StoreError};
use crate::segment::SegmentContainer;

/// The smallest budget a config may name: the disk index needs a few pages of cache
/// and buffer to make progress.
pub const MIN_INDEX_MEMORY: u64 = 1 << 20;
/// The fewest fingerprints a new disk index is sized for.
const MIN_EXPECTED: u64 = 1 << 20;
/// Fingerprints a catch-up submits before it drains the answers.
const CATCH_UP_BATCH: usize = 1 << 16;

/// The config's `index` field: which index the repository keeps.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum IndexSettings {
    /// The in-memory cuckoo index, built from the segments at every open.
    #[default]
    Memory,
    /// The disk index under `index/disk/`, with its lookup strategy and memory budget.
    Disk { lookup: DiskLookup, memory: u64 },
}

/// `--index-lookup`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DiskLookup {
    Eager,
    Lazy,
}

impl DiskLookup {
    pub fn lookup(self) -> Lookup {
        match self {
            Self::Eager => Lookup::Eager,
            Self::Lazy => Lookup::Lazy,
        }
    }
}

impl IndexSettings {
    pub fn is_memory(&self) -> bool {
        *self == Self::Memory
    }

    pub fn validate(&self) -> Result<()> {
        match self {
            Self::Disk { memory, .. } if *memory < MIN_INDEX_MEMORY => Err(StoreError::Config(
                format!("index memory {memory} bytes is below the minimum of {MIN_INDEX_MEMORY}"),
            )),
            _ => Ok(()),
        }
    }

    /// A short description: `memory`, or `disk (lazy, 256 MiB)`.
    pub fn describe(&self) -> String {
        match self {
            Self::Memory => "memory".into(),
            Self::Disk { lookup, memory } => {
                let lookup = match lookup {
                    DiskLookup::Eager => "eager",
                    DiskLookup::Lazy => "lazy",
                };
                format!("disk ({lookup}, {} MiB)", memory >> 20)
            }
        }
    }
}

/// The disk index's token: the caller's number for a submitted fingerprint. Its files
/// are plain or sealed, as the repository is.
pub type RepoDiskIndex = DiskIndex<IndexDir, u64>;

/// Container ids as ascending, non-touching inclusive runs: the `held` file.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContainerRuns(Vec<(u64, u64)>);

const HELD_MAGIC: &[u8; 8] = b"LDXHELD1";

/// The first 8 bytes of the BLAKE3 hash of `bytes`: the trailing checksum of the disk
/// index's small records (`held`, the absorbed segments).
pub(super) fn checksum(bytes: &[u8]) -> u64 {
    u64::from_le_bytes(
        blake3::hash(bytes).as_bytes()[..8]
            .try_into()
            .expect("8 bytes"),
    )
}

impl ContainerRuns {
    pub fn contains(&self, id: u64) -> bool {
        let i = self.0.partition_point(|&(_, last)| last < id);
        self.0.get(i).is_some_and(|&(first, _)| first <= id)
    }

    /// Ids in the runs that `keep` refuses, if any: the first one found.
    pub fn first_outside(&self, keep: impl Fn(u64) -> bool) -> Option<u64> {
        self.0
            .iter()
            .flat_map(|&(first, last)| first..=last)
            .find(|&id| !keep(id))
    }

    /// These runs and `ids`.
    pub fn with(&self, ids: impl IntoIterator<Item = u64>) -> Self {
        let mut all: Vec<(u64, u64)> = self.0.clone();
        all.extend(ids.into_iter().map(|id| (id, id)));
        all.sort_unstable();
        let mut runs: Vec<(u64, u64)> = Vec::with_capacity(all.len());
        for (first, last) in all {
            match runs.last_mut() {
                Some(prev) if first <= prev.1.saturating_add(1) => prev.1 = prev.1.max(last),
                _ => runs.push((first, last)),
            }
        }
        Self(runs)
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(24 + 16 * self.0.len());
        out.extend_from_slice(HELD_MAGIC);
        out.extend_from_slice(&1u32.to_le_bytes());
        out.extend_from_slice(&(self.0.len() as u32).to_le_bytes());
        for &(first, last) in &self.0 {
            out.extend_from_slice(&first.to_le_bytes());
            out.extend_from_slice(&last.to_le_bytes());
        }
        out.extend_from_slice(&checksum(&out).to_le_bytes());
        out
    }

    /// Parses a `held` file; never panics, whatever `raw` holds (the `held` fuzz
    /// target).
    pub fn decode(raw: &[u8]) -> Result<Self> {
        let bad = |reason: &str| StoreError::corrupt("disk index file", "held", reason);
        if raw.len() < 24 || &raw[..8] != HELD_MAGIC {
            return Err(bad("not a held file"));
        }
        let version = u32::from_le_bytes(raw[8..12].try_into().expect("4 bytes"));
        if version != 1 {
            return Err(StoreError::UnsupportedVersion {
                what: "disk index held file",
                version: u64::from(version),
                supported: "version 1",
            });
        }
        let n = u32::from_le_bytes(raw[12..16].try_into().expect("4 bytes")) as usize;
        if raw.len() != 24 + 16 * n {
            return Err(bad("length does not match the run count"));
        }
        let body = &raw[..16 + 16 * n];
        let sum = u64::from_le_bytes(raw[16 + 16 * n..].try_into().expect("8 bytes"));
        // Fuzzing builds (`cfg(fuzzing)`) go on past a wrong checksum, to reach the
        // checks below (docs/design/fuzzing.md).
        if checksum(body) != sum && !cfg!(fuzzing) {
            return Err(bad("checksum mismatch"));
        }
        let mut runs: Vec<(u64, u64)> = Vec::with_capacity(n);
        for chunk in body[16..].chunks_exact(16) {
            let first = u64::from_le_bytes(chunk[..8].try_into().expect("8 bytes"));
            let last = u64::from_le_bytes(chunk[8..].try_into().expect("8 bytes"));
            if first > last {
                return Err(bad("a run ends before it starts"));
            }
            if runs
                .last()
                .is_some_and(|&(_, prev)| first <= prev.saturating_add(1))
            {
                return Err(bad("runs out of order or touching"));
            }
            runs.push((first, last));
        }
        Ok(Self(runs))
    }
}

/// The disk index with the record of the containers it holds.
pub struct DiskState {
    index: RepoDiskIndex,
    held: ContainerRuns,
    /// The segments absorbed, as storage listed them; `None` where the record is
    /// missing or damaged.
    absorbed: Option<AbsorbedSegments>,
    dir: PathBuf,
    tmp: PathBuf,
    lookup: DiskLookup,
    memory: u64,
}

/// Why an existing disk index cannot be used as it is.
pub(crate) enum Unusable {
    /// Missing, dirty or damaged (which file, where): rebuild it.
    Rebuild(String),
    /// Anything else (an I/O error): fail.
    Fail(StoreError),
}

/// The share of `--index-memory` that a backup's stage 3 may fill with the bytes of
/// chunks waiting for lazy answers (docs/design/disk-index.md, "Memory budget"): a
/// quarter with the lazy lookup, none with the eager one (it answers at once).
fn held_chunk_share(lookup: DiskLookup, memory: u64) -> u64 {
    match lookup {
        DiskLookup::Eager => 0,
        DiskLookup::Lazy => memory / 4,
    }
}

/// What stage 3 may hold with the lazy lookup however small the budget: two of the
/// engine's 8 MiB blocks. A lazy buffer bucket fills over several of stage 3's batches
/// (one block each), so a share smaller than a batch made stage 3 look everything up
/// after every batch: at `--index-memory 1MiB` (a 256 KiB share) a backup made 3x the
/// lookup I/Os it makes with this floor (docs/performance.md, "Lazy lookup inside
/// backups"). From 64 MiB on the quarter share is at least this and the floor does
/// nothing.
const HELD_FLOOR: u64 = 16 << 20;

/// The disk index's config: the one place the store and the engine say how the budget
/// is split. The index gets what stage 3's held chunk bytes leave, and reserves no
/// chunk bytes of its own (`buffered_chunk_bytes: 0`): the chunks of buffered fingerprints
/// wait in stage 3, within [`held_chunk_share`].
fn disk_config(lookup: DiskLookup, memory: u64, expected: u64) -> DiskIndexConfig {
    DiskIndexConfig {
        memory_budget: memory - held_chunk_share(lookup, memory),
        expected_fingerprints: expected.max(MIN_EXPECTED),
        buffered_chunk_bytes: 0,
        ..DiskIndexConfig::default()
    }
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> StoreError + '_ {
    move |e| StoreError::io(path, e)
}

impl DiskState {
    /// `root/index/disk`.
    pub fn dir_of(root: &Path) -> PathBuf {
        root.join("index").join("disk")
    }

    /// Opens the disk index of the repository at `root`, sealed with `keys` in an
    /// encrypted repository.
    pub(crate) fn open(
        root: &Path,
        lookup: DiskLookup,
        memory: u64,
        keys: Option<&RepoKeys>,
    ) -> std::result::Result<Self, Unusable> {
        let dir = Self::dir_of(root);
        let held = match fs::read(dir.join("held")) {
            Ok(raw) => raw,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(Unusable::Rebuild("missing".into()))
            }
            Err(e) => return Err(Unusable::Fail(StoreError::io(dir.join("held"), e))),
        };
        let io = IndexDir::open(&dir, keys).map_err(|e| Unusable::Fail(StoreError::io(&dir, e)))?;
        // The expected count only sizes a new index; an existing one keeps its own.
        let mut index = DiskIndex::open(io, disk_config(lookup, memory, 0), lookup.lookup())
            .map_err(unusable)?;
        let held = match index.io_mut() {
            IndexDir::Plain(_) => held,
            IndexDir::Sealed(io) => io.open_held(&held).map_err(unusable)?,
        };
        let held = ContainerRuns::decode(&held)
            .map_err(|e| Unusable::Rebuild(format!("damaged (held: {e})")))?;
        Ok(Self {
            index,
            held,
            absorbed: AbsorbedSegments::load(&dir),
            dir,
            tmp: root.join("tmp"),
            lookup,
            memory,
        })
    }

    /// Builds the disk index of the repository at `root` afresh from `containers` (in
    /// ascending id, chunks in table order), replacing what `index/disk/` held.
    pub(crate) fn rebuild(
        root: &Path,
        lookup: DiskLookup,
        memory: u64,
        containers: &[SegmentContainer],
        keys: Option<&RepoKeys>,
    ) -> Result<Self> {
        let dir = Self::dir_of(root);
        if dir.exists() {
            fs::remove_dir_all(&dir).map_err(io_err(&dir))?;
        }
        crate::backend::create_private_dir(&dir).map_err(io_err(&dir))?;
        sync_dir(&root.join("index"))?;
        let chunks: u64 = containers.iter().map(|c| c.entries.len() as u64).sum();
        let io = IndexDir::open(&dir, keys).map_err(io_err(&dir))?;
        // Filled by an eager index, which answers in submission order, so that the
        // metadata array keeps the containers' order; then opened as configured.
        let config = disk_config(lookup, memory, 2 * chunks);
        let mut eager = DiskIndex::create(io, config.clone(), Lookup::Eager)?;
        let all: Vec<_> = containers
            .iter()
            .flat_map(SegmentContainer::locations)
            .collect();
        fill(&mut eager, &all)?;
        let index = DiskIndex::open(eager.close()?, config, lookup.lookup())?;
        // No record of segments until the caller absorbs what it built from: a crash
        // before then makes the next open rebuild again.
        let mut state = Self {
            index,
            held: ContainerRuns::default(),
            absorbed: None,
            dir,
            tmp: root.join("tmp"),
            lookup,
            memory,
        };
        state.record(containers.iter().map(|c| c.id))?;
        Ok(state)
    }

    pub fn held(&self) -> &ContainerRuns {
        &self.held
    }

    /// Why the disk index may hold chunks of another history of the repository than
    /// storage's segments `listing` (rule 5 of "Disk index"), if it may.
    pub(crate) fn foreign_to(&self, listing: &[(String, FileVersion)]) -> Option<String> {
        match &self.absorbed {
            None => Some(
                "without a record of the segments it absorbed (an older larder's, or lost)".into(),
            ),
            Some(record) => record
                .foreign_to(listing)
                .map(|why| format!("of another history of the repository ({why})")),
        }
    }

    /// Whether segment `name` is recorded as absorbed.
    pub(crate) fn absorbed(&self, name: &str) -> bool {
        self.absorbed.as_ref().is_some_and(|r| r.contains(name))
    }

    /// Records `segments` (their containers held: rule 6 of "Disk index") as what the
    /// disk index absorbed, durably, if that is news.
    pub(crate) fn absorb(&mut self, segments: AbsorbedSegments) -> Result<()> {
        if self.absorbed.as_ref() != Some(&segments) {
            segments.save(&self.dir, &self.tmp)?;
            self.absorbed = Some(segments);
        }
        Ok(())
    }

    pub fn index_mut(&mut self) -> &mut RepoDiskIndex {
        &mut self.index
    }

    pub fn index(&self) -> &RepoDiskIndex {
        &self.index
    }

    pub fn lookup(&self) -> DiskLookup {
        self.lookup
    }

    pub fn memory(&self) -> u64 {
        self.memory
    }

    /// Bytes of chunks a backup's stage 3 may hold in memory while they wait for
    /// answers: [`held_chunk_share`] of the budget, and with the lazy lookup at least
    /// [`HELD_FLOOR`] (what passes the share is outside the budget).
    pub fn held_chunk_bytes(&self) -> u64 {
        match self.lookup {
            DiskLookup::Eager => 0,
            DiskLookup::Lazy => held_chunk_share(self.lookup, self.memory).max(HELD_FLOOR),
        }
    }

    /// Indexes every chunk of `containers` that the index lacks (the first copy stays
    /// canonical), then syncs and records them in `held` (rule 2 of "Disk index").
    /// Idempotent: a container already held costs lookups only.
    pub(crate) fn catch_up(&mut self, containers: &[SegmentContainer]) -> Result<()> {
        let all: Vec<_> = containers
            .iter()
            .flat_map(SegmentContainer::locations)
            .collect();
        fill(&mut self.index, &all)?;
        self.record(containers.iter().map(|c| c.id))
    }

    /// Inserts the chunks of a backup's committed containers (their segment is
    /// durable): each was answered `New` to the backup and awaits its insert; any
    /// other (not submitted by this process) is caught up. Then syncs and records.
    pub(crate) fn add_committed(&mut self, containers: &[SegmentContainer]) -> Result<()> {
        let mut others = Vec::new();
        for (fp, location) in containers.iter().flat_map(SegmentContainer::locations) {
            match self.index.insert(fp, location) {
                Ok(()) => {}
                Err(IndexError::NotPending(_)) => others.push((fp, location)),
                Err(e) => return Err(e.into()),
            }
        }
        fill(&mut self.index, &others)?;
        self.record(containers.iter().map(|c| c.id))
    }

    /// Syncs the index, then names `ids` in `held` durably (sealed for the index's
    /// build in an encrypted repository).
    fn record(&mut self, ids: impl IntoIterator<Item = u64>) -> Result<()> {
        self.index.sync()?;
        let held = self.held.with(ids);
        let bytes = match self.index.io_mut() {
            IndexDir::Plain(_) => held.encode(),
            IndexDir::Sealed(io) => io.seal_held(&held.encode())?,
        };
        let tmp = self.tmp.join(format!("held-{}.tmp", std::process::id()));
        crate::direct::write_durable(&tmp, &bytes).map_err(io_err(&tmp))?;
        let dest = self.dir.join("held");
        fs::rename(&tmp, &dest).map_err(io_err(&dest))?;
        sync_dir(&self.dir)?;
        self.held = held;
        Ok(())
    }

    /// Gives up on the answers of a failed backup: fingerprints answered `New` are
    /// forgotten (their containers, if written, are caught up at the next open).
    pub fn abandon(&mut self) {
        self.index.abandon();
        while self.index.poll().is_some() {}
    }

    pub fn get(&mut self, fp: &Fingerprint) -> Result<Option<ChunkLocation>> {
        Ok(self.index.get(fp)?)
    }

    /// Bytes the index's files take on disk: their allocated blocks, so that the
    /// sparse table's holes count nothing (0 where the file system does not say).
    fn allocated_bytes(&self) -> u64 {
        use std::os::unix::fs::MetadataExt;
        fs::read_dir(&self.dir)
            .into_iter()
            .flatten()
            .filter_map(|e| e.ok()?.metadata().ok())
            .filter(|m| m.is_file())
            .map(|m| m.blocks() * 512)
            .sum()
    }
}

/// Why an error of the disk index's open makes it unusable.
fn unusable(e: IndexError) -> Unusable {
    match e {
        IndexError::NeedsRebuild => {
            Unusable::Rebuild("dirty (a crash while it was written)".into())
        }
        IndexError::Corrupt {
            file,
            offset,
            reason,
        } => Unusable::Rebuild(format!("damaged ({file} at byte {offset}: {reason})")),
        IndexError::Missing(_) => Unusable::Rebuild("missing".into()),
        e => Unusable::Fail(e.into()),
    }
}

/// The name of the last backup's counters in `index/disk/`: sealed in an encrypted
/// repository (docs/design/crypto.md, "`held` and the last backup's counters").
fn last_backup_name(keys: Option<&RepoKeys>) -> &'static str {
    match keys {
        None => "last-backup.json",
        Some(_) => "last-backup",
    }
}

impl super::Repository {
    /// Records the last backup's disk index counters (JSON) for `stats --index`:
    /// informational, written without the durability protocol (docs/design/format.md,
    /// "Disk index").
    pub fn save_last_backup_counters(&self, json: &[u8]) -> Result<()> {
        let keys = self.keys.as_deref();
        let path = DiskState::dir_of(&self.state).join(last_backup_name(keys));
        let bytes = match keys {
            None => json.to_vec(),
            Some(k) => k.seal_object(
                ObjectKind::DiskIndexPage,
                &IndexPart::LastBackup.name(0),
                json,
            ),
        };
        crate::backend::private_file_options()
            .create(true)
            .truncate(true)
            .open(&path)
            .and_then(|mut f| std::io::Write::write_all(&mut f, &bytes))
            .map_err(io_err(&path))
    }

    /// The counters [`Self::save_last_backup_counters`] wrote, if they are there and
    /// open.
    pub fn last_backup_counters(&self) -> Option<Vec<u8>> {
        let keys = self.keys.as_deref();
        let raw = fs::read(DiskState::dir_of(&self.state).join(last_backup_name(keys))).ok()?;
        match keys {
            None => Some(raw),
            Some(k) => k
                .open_object(
                    ObjectKind::DiskIndexPage,
                    &IndexPart::LastBackup.name(0),
                    &raw,
                )
                .ok(),
        }
    }
}

/// Looks every chunk of `all` up and inserts those the index lacks; of the copies of
/// one fingerprint, the first stays canonical.
fn fill(index: &mut RepoDiskIndex, all: &[(Fingerprint, ChunkLocation)]) -> Result<()> {
    for part in all.chunks(CATCH_UP_BATCH) {
        for (token, (fp, _)) in part.iter().enumerate() {
            index.submit(*fp, token as u64)?;
        }
        index.finish()?;
        // Inserting a `New` answers the copies waiting on it: drain until none is left.
        while let Some(r) = index.poll() {
            if r.answer == larder_index::disk::Answer::New {
                index.insert(r.fp, part[r.token as usize].1)?;
            }
        }
    }
    Ok(())
}

/// The repository's index: the one place that tells the two kinds apart.
pub enum RepoIndex {
    Memory(CuckooIndex),
    /// Behind a mutex: its lookups move its cache, and readers share the repository.
    Disk(Box<Mutex<DiskState>>),
}

impl Default for RepoIndex {
    fn default() -> Self {
        Self::Memory(CuckooIndex::new())
    }
}

impl RepoIndex {
    /// Where `fp` is stored, if it is indexed.
    pub fn get(&self, fp: &Fingerprint) -> Result<Option<ChunkLocation>> {
        match self {
            Self::Memory(index) => Ok(index.get(fp)),
            Self::Disk(state) => lock(state).get(fp),
        }
    }

    /// `get` of each of `fps`, in order.
    pub fn get_batch(&self, fps: &[Fingerprint]) -> Result<Vec<Option<ChunkLocation>>> {
        match self {
            Self::Memory(index) => Ok(index.get_batch(fps)),
            Self::Disk(state) => {
                let mut state = lock(state);
                fps.iter().map(|fp| state.get(fp)).collect()
            }
        }
    }

    /// Fingerprints indexed.
    pub fn len(&self) -> u64 {
        match self {
            Self::Memory(index) => index.len() as u64,
            Self::Disk(state) => lock(state).index.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The disk index's counters since the repository was opened; `None` in memory.
    pub fn disk_metrics(&self) -> Option<DiskIndexMetrics> {
        match self {
            Self::Memory(_) => None,
            Self::Disk(state) => Some(*lock(state).index.metrics()),
        }
    }

    /// What the disk index is: buckets, files' bytes, Bloom filter; `None` in memory.
    pub fn disk_shape(&self) -> Option<DiskShape> {
        match self {
            Self::Memory(_) => None,
            Self::Disk(state) => {
                let state = lock(state);
                let index = &state.index;
                Some(DiskShape {
                    fingerprints: index.len(),
                    disk_bytes: index.disk_bytes(),
                    allocated_bytes: state.allocated_bytes(),
                    table_buckets: index.buckets().0,
                    buffer_buckets: index.buckets().1,
                    bloom_bytes: index.bloom().bytes(),
                    bloom_false_positive_rate: index.bloom_false_positive_rate(),
                    memory_estimate: index.memory_estimate(),
                })
            }
        }
    }
}

/// The disk index's size and shape, for `stats --index`.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct DiskShape {
    pub fingerprints: u64,
    /// Bytes of the files in the plaintext layout, the table's holes included.
    pub disk_bytes: u64,
    /// Bytes the files take on disk (allocated blocks: the holes count nothing; a
    /// sealed index's headers and tags count).
    pub allocated_bytes: u64,
    pub table_buckets: u64,
    pub buffer_buckets: u64,
    pub bloom_bytes: u64,
    /// The Bloom filter's false-positive rate at the current count.
    pub bloom_false_positive_rate: f64,
    /// The memory the budget covers at full use.
    pub memory_estimate: u64,
}

fn lock(m: &Mutex<DiskState>) -> std::sync::MutexGuard<'_, DiskState> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_merge_and_round_trip() {
        let runs = ContainerRuns::default().with([5, 1, 2, 3, 9, 10, 7]);
        assert_eq!(runs.0, vec![(1, 3), (5, 5), (7, 7), (9, 10)]);
        let runs = runs.with([4, 6, 8]);
        assert_eq!(runs.0, vec![(1, 10)]);
        for id in 0..12 {
            assert_eq!(runs.contains(id), (1..=10).contains(&id), "{id}");
        }
        let bytes = runs.encode();
        assert_eq!(ContainerRuns::decode(&bytes).unwrap(), runs);
        assert_eq!(runs.first_outside(|id| id != 4), Some(4));
    }

    #[test]
    fn damaged_held_files_are_refused() {
        let bytes = ContainerRuns::default().with([1, 3, 5]).encode();
        for i in 0..bytes.len() {
            let mut b = bytes.clone();
            b[i] ^= 1;
            assert!(ContainerRuns::decode(&b).is_err(), "flip at {i}");
        }
        assert!(ContainerRuns::decode(&bytes[..bytes.len() - 1]).is_err());
        // Touching runs, even with a good checksum.
        let mut raw = b"LDXHELD1".to_vec();
        raw.extend_from_slice(&1u32.to_le_bytes());
        raw.extend_from_slice(&2u32.to_le_bytes());
        for v in [1u64, 2, 3, 4] {
            raw.extend_from_slice(&v.to_le_bytes());
        }
        let sum = checksum(&raw);
        raw.extend_from_slice(&sum.to_le_bytes());
        assert!(ContainerRuns::decode(&raw).is_err());
    }
}
