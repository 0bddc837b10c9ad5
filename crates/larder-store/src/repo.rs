//! The repository: config, lock, index loading and the commit protocol
//! (docs/design/format.md, "Commit order").

use std::collections::BTreeSet;
use std::fs;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use larder_chunk::ChunkerConfig;
use larder_crypto::{AeadKind, RepoKeys};
use larder_hash::HashAlgo;
use larder_index::CuckooIndex;

use serde::{Deserialize, Serialize};

use crate::backend::{Backend, FileKind, FileVersion, CONFIG_NAME};
use crate::chunk_codec::ChunkCodec;
use crate::compression::Compression;
use crate::container::{read_table, ContainerTable, ParsedContainer};
use crate::error::{error_chain, Result, StoreError};
use crate::lock::{LockMode, RepoLock};
use crate::segment::SegmentContainer;
use crate::snapshot::Snapshot;

/// Segments beyond this many are merged into one at the next commit.
const MAX_SEGMENTS: usize = 32;
/// Index entries inserted per parallel batch while loading: bounds the copy of a large
/// segment's entries that loading makes.
const LOAD_BATCH: usize = 1 << 16;
/// Bytes a segment spends besides its 48-byte entries: header and checksum (56), and
/// 16 per container, which the capacity estimate leaves out (an estimate a little high).
const SEGMENT_FIXED_BYTES: u64 = 56;

/// The container sizes a config may name (docs/design/format.md, config): a container
/// holds at most `container_size` plus one chunk of up to 16 MiB, far below the 4 GiB
/// its 32-bit table offsets reach.
const CONTAINER_SIZES: std::ops::RangeInclusive<usize> = (4 << 10)..=(1 << 30);

mod absorbed;
mod gc;
mod gc_full;
mod index;
mod objects;
mod open;
mod repair;
pub use absorbed::AbsorbedSegments;
pub use gc::{GcOptions, GcReport};
use index::Unusable;
pub use index::{
    ContainerRuns, DiskLookup, DiskShape, DiskState, IndexSettings, RepoDiskIndex, RepoIndex,
    MIN_INDEX_MEMORY,
};
pub use objects::config_is_sealed;
pub use repair::{ContainerHealth, RepairWork, RepairWriteOptions, RepairWritten};

/// The `config` file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RepoConfig {
    pub version: u32,
    pub id: String,
    pub chunker: ChunkerConfig,
    pub hash: HashAlgo,
    pub container_size: usize,
    /// Absent in configs written before format version 2: none.
    #[serde(default)]
    pub compression: Compression,
    /// Absent in configs written before the disk index, and in memory repositories'.
    #[serde(default, skip_serializing_if = "IndexSettings::is_memory")]
    pub index: IndexSettings,
    /// The first container id this repository numbers from: a cluster node's
    /// repository starts at its node id shifted into the top 16 bits, so that nodes
    /// sharing storage never number two containers alike (docs/design/cluster.md).
    /// Absent (0) in a repository of its own.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub container_base: u64,
    /// How the repository is encrypted (docs/design/crypto.md); absent: not at all.
    /// An encrypted repository's config is itself sealed (format version 3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encryption: Option<Encryption>,
}

/// The `encryption` field of an encrypted repository's config.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Encryption {
    /// The AEAD of every object.
    pub aead: AeadKind,
}

/// The format version of encrypted repositories.
pub const ENCRYPTED_VERSION: u32 = 3;

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl RepoConfig {
    /// A new repository's config with the default compression
    /// ([`Compression::DEFAULT`]); see [`RepoConfig::with_compression`].
    pub fn new(chunker: ChunkerConfig, hash: HashAlgo) -> Self {
        let seed = format!(
            "{:?}{}{:p}",
            std::time::SystemTime::now(),
            std::process::id(),
            &chunker
        );
        Self {
            version: Compression::DEFAULT.format_version(),
            id: blake3::hash(seed.as_bytes()).to_hex()[..32].to_string(),
            chunker,
            hash,
            container_size: 4 << 20,
            compression: Compression::DEFAULT,
            index: IndexSettings::Memory,
            container_base: 0,
            encryption: None,
        }
    }

    /// The same config, encrypted with `aead` (format version 3, or 4 with
    /// compression units).
    pub fn with_encryption(mut self, aead: AeadKind) -> Self {
        self.encryption = Some(Encryption { aead });
        self.version = self.needed_version();
        self
    }

    /// The oldest format version that can hold this config: its compression's, and
    /// at least [`ENCRYPTED_VERSION`] if it is encrypted.
    fn needed_version(&self) -> u32 {
        let encrypted = if self.encryption.is_some() {
            ENCRYPTED_VERSION
        } else {
            0
        };
        self.compression.format_version().max(encrypted)
    }

    /// The repository id as 16 bytes (what key material binds).
    pub fn id_bytes(&self) -> Result<[u8; 16]> {
        let bad =
            || StoreError::Config(format!("repository id {:?} is not 32 hex digits", self.id));
        if self.id.len() != 32 {
            return Err(bad());
        }
        let mut out = [0u8; 16];
        for (i, b) in out.iter_mut().enumerate() {
            *b = u8::from_str_radix(self.id.get(2 * i..2 * i + 2).ok_or_else(bad)?, 16)
                .map_err(|_| bad())?;
        }
        Ok(out)
    }

    /// The same config with the index `index`.
    pub fn with_index(mut self, index: IndexSettings) -> Self {
        self.index = index;
        self
    }

    /// The same config with `compression`, and the format version that goes with it.
    pub fn with_compression(mut self, compression: Compression) -> Self {
        self.compression = compression;
        self.version = self.needed_version();
        self
    }

    /// Parses the bytes of a `config` file, plaintext or sealed (opened with `keys`,
    /// which must be the repository's: the config's id must equal the key's); `name`
    /// says where they came from in errors.
    pub fn decode_with(raw: &[u8], name: &str, keys: Option<&RepoKeys>) -> Result<Self> {
        objects::decode_config(raw, name, keys)
    }

    /// Parses and validates the bytes of a `config` file; `name` says where they came
    /// from in errors. The repository version is checked before the fields are, so
    /// that a newer larder's config is refused as a newer version, not as damage.
    /// Never panics, whatever `raw` holds (the `config` fuzz target).
    pub fn decode(raw: &[u8], name: &str) -> Result<Self> {
        let version = serde_json::from_slice::<serde_json::Value>(raw)
            .ok()
            .and_then(|v| v.get("version").and_then(|v| v.as_u64()));
        match version {
            Some(1..=4) => {}
            Some(v) => {
                return Err(StoreError::UnsupportedVersion {
                    what: "repository",
                    version: v,
                    supported: "versions 1 to 4",
                })
            }
            None => return Err(StoreError::Config(format!("{name} is not a larder config"))),
        }
        let config: Self =
            serde_json::from_slice(raw).map_err(|e| StoreError::Config(format!("{name}: {e}")))?;
        config.validate()?;
        Ok(config)
    }

    /// Checks the id (32 hex digits), the chunker, the container size, the
    /// compression, and that a version 1 config does not name compression (a version 1
    /// larder would ignore the field and misread the data). A chunker that needs a key (`keyed`) needs an encrypted
    /// repository: only it holds one.
    pub fn validate(&self) -> Result<()> {
        // The id names local directories (a remote repository's cache): 32 hex
        // digits, never a path.
        self.id_bytes()?;
        self.chunker
            .validate()
            .map_err(|e| StoreError::Config(e.to_string()))?;
        if self.chunker.kind.needs_key() && self.encryption.is_none() {
            return Err(StoreError::Config(format!(
                "the {} chunker needs a secret key, which only an encrypted repository \
                 holds: choose another chunker (fastcdc) or encryption",
                self.chunker.kind.name()
            )));
        }
        if !CONTAINER_SIZES.contains(&self.container_size) {
            return Err(StoreError::Config(format!(
                "container size {} is outside {}..={} bytes",
                self.container_size,
                CONTAINER_SIZES.start(),
                CONTAINER_SIZES.end()
            )));
        }
        self.compression.validate()?;
        self.index.validate()?;
        match (self.version, self.encryption.is_some()) {
            (ENCRYPTED_VERSION, false) => {
                return Err(StoreError::Config(format!(
                    "format version {ENCRYPTED_VERSION} is for encrypted repositories, but this config names no encryption"
                )))
            }
            (v, true) if v < ENCRYPTED_VERSION => {
                return Err(StoreError::Config(format!(
                    "an encrypted repository's config is format version {ENCRYPTED_VERSION} or later, not {v}"
                )))
            }
            _ => {}
        }
        if self.encryption.is_some() && self.hash == HashAlgo::Sha1 {
            return Err(StoreError::Config(
                "an encrypted repository cannot use SHA-1 fingerprints".into(),
            ));
        }
        if self.version < self.compression.format_version() {
            return Err(StoreError::Config(format!(
                "format version {} cannot use compression {}; it needs version {}",
                self.version,
                self.compression.name(),
                self.compression.format_version()
            )));
        }
        Ok(())
    }
}

/// Bytes of the chunks in indexed containers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ChunkBytes {
    /// What the chunks are: their bytes before compression.
    pub raw: u64,
    /// What their containers hold for them: after compression.
    pub stored: u64,
}

/// A snapshot with its id (the BLAKE3 of its encoded bytes, in hex).
pub type IdentifiedSnapshot = (String, Snapshot);

/// What `open` found and repaired.
#[derive(Debug, Default, Clone)]
pub struct OpenReport {
    /// Sealed containers that no segment named (a killed backup's, or a lost
    /// segment's); indexed now.
    pub adopted_containers: Vec<u64>,
    /// Those of them whose ids lie below a container a segment names. A killed
    /// backup never leaves one: every commit names the containers adopted at its
    /// open, and ids only grow. So a segment that named them was lost (or is
    /// damaged: see `bad_segments`); docs/design/repair.md.
    pub adopted_below_named: Vec<u64>,
    /// Containers that failed verification while being adopted.
    pub bad_containers: Vec<(u64, String)>,
    /// Segments that failed verification; their containers were read directly.
    pub bad_segments: Vec<(String, String)>,
    /// Leftover files removed from `tmp/`.
    pub removed_tmp: usize,
    /// Interrupted garbage collections that `open` finished (they had committed).
    pub finished_gc: Vec<u64>,
    /// Interrupted garbage collections that `open` rolled back (they had not).
    pub rolled_back_gc: Vec<u64>,
    /// GC plans that failed verification: removed, nothing deleted (docs/design/gc.md).
    pub bad_gc_plans: Vec<(String, String)>,
    /// Containers the disk index lacked and now holds (rule 2 of "Disk index").
    pub disk_caught_up: Vec<u64>,
    /// Why the disk index was rebuilt from the segments at open, if it was.
    pub disk_rebuilt: Option<String>,
    /// Why a reader fell back to the memory index, if it did (the disk index was
    /// missing, dirty, damaged or stale; a writer's open repairs it).
    pub disk_fallback: Option<String>,
    /// Why the lock note could not be written, if it could not (a full disk): the
    /// lock is held all the same (docs/design/format.md, "Locking").
    pub lock_note_failure: Option<String>,
}

/// Why a disk index that names deleted containers is not used.
const STALE: &str = "stale (it names deleted containers)";

/// An open repository with its index loaded.
pub struct Repository {
    /// The local directory of the repository's local state (the disk index): the
    /// repository's own directory, or a remote repository's cache.
    state: PathBuf,
    backend: Arc<dyn Backend>,
    config: RepoConfig,
    index: RepoIndex,
    mode: LockMode,
    indexed_containers: BTreeSet<u64>,
    chunk_bytes: ChunkBytes,
    /// Adopted containers that no durable segment names yet.
    pending: Vec<SegmentContainer>,
    segments: Vec<String>,
    next_container: AtomicU64,
    report: OpenReport,
    /// The key the repository was opened with, if it is encrypted.
    keys: Option<Arc<RepoKeys>>,
    /// Whether the storage removes files, once probed ([`Repository::require_deletes`]).
    deletes_allowed: std::sync::OnceLock<bool>,
    /// Held for the repository's lifetime; declared last so that it is released last.
    lock: RepoLock,
}

fn lock_disk(m: &mut Mutex<DiskState>) -> &mut DiskState {
    m.get_mut().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> StoreError + '_ {
    move |e| StoreError::io(path, e)
}

impl Repository {
    /// Records `containers` as indexed (ids and chunk bytes); returns those that were
    /// not.
    fn note_containers<'c>(
        &mut self,
        containers: &'c [SegmentContainer],
    ) -> Vec<&'c SegmentContainer> {
        let mut new = Vec::new();
        for c in containers {
            if !self.indexed_containers.insert(c.id) {
                continue;
            }
            for e in &c.entries {
                self.chunk_bytes.raw += u64::from(e.raw_len);
            }
            self.chunk_bytes.stored += crate::container::stored_bytes(&c.entries);
            new.push(c);
        }
        new
    }

    /// Indexes the containers not indexed yet; into the memory index on every core (the
    /// index's threads own disjoint partitions; the result is that of inserting one
    /// entry after another). A disk index gets its entries at the commit instead.
    fn add_containers(&mut self, containers: &[SegmentContainer]) {
        let new = self.note_containers(containers);
        let RepoIndex::Memory(index) = &mut self.index else {
            return;
        };
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        let mut batch = Vec::with_capacity(LOAD_BATCH);
        for c in new {
            batch.extend(c.locations());
            if batch.len() >= LOAD_BATCH {
                index.insert_batch(&batch, threads);
                batch.clear();
            }
        }
        index.insert_batch(&batch, threads);
    }

    /// How many entries the segments hold, from their file sizes alone (a little more
    /// than there are: container headers count as entries); 0 if a size is unknown.
    fn segment_entry_estimate(&self) -> usize {
        let entry_bytes = crate::container::ENTRY_LEN as u64;
        self.segments
            .iter()
            .map(|name| {
                self.backend
                    .file_len(FileKind::IndexSegment, name)
                    .map_or(0, |len| {
                        len.saturating_sub(SEGMENT_FIXED_BYTES) / entry_bytes
                    })
            })
            .sum::<u64>() as usize
    }

    fn load_index(&mut self) -> Result<()> {
        match self.config.index {
            IndexSettings::Memory => self.load_memory_index(),
            IndexSettings::Disk { lookup, memory } => self.load_disk_index(lookup, memory),
        }
    }

    fn load_memory_index(&mut self) -> Result<()> {
        self.segments = self.backend.list(FileKind::IndexSegment)?;
        self.index = RepoIndex::Memory(CuckooIndex::with_capacity(self.segment_entry_estimate()));
        for name in self.segments.clone() {
            match self.read_segment(&name) {
                Ok(containers) => self.add_containers(&containers),
                Err(e) => self.report.bad_segments.push((name, error_chain(&e))),
            }
        }
        self.adopt_containers(|_, _| Ok(()))
    }

    /// Reads the containers no segment names (a killed backup's), verifies them and
    /// indexes them (`index` gets each one adopted); sets the next container id.
    fn adopt_containers(
        &mut self,
        mut index: impl FnMut(&mut Self, &SegmentContainer) -> Result<()>,
    ) -> Result<()> {
        let mut max_id = 0;
        let max_named = self.indexed_containers.last().copied();
        // An interrupted gc's or repair's containers are no lost segment's.
        let planned = self.planned_containers()?;
        for name in self.backend.list(FileKind::Container)? {
            let Ok(id) = u64::from_str_radix(&name, 16) else {
                continue;
            };
            max_id = max_id.max(id);
            if self.indexed_containers.contains(&id) {
                continue;
            }
            match self.load_container(id) {
                Ok(parsed) => {
                    let c = SegmentContainer {
                        id,
                        entries: parsed.entries,
                    };
                    self.add_containers(std::slice::from_ref(&c));
                    index(self, &c)?;
                    self.report.adopted_containers.push(id);
                    if max_named.is_some_and(|named| id < named) && !planned.contains(&id) {
                        self.report.adopted_below_named.push(id);
                    }
                    self.pending.push(c);
                }
                Err(e) => self.report.bad_containers.push((id, error_chain(&e))),
            }
        }
        let max_indexed = self.indexed_containers.last().copied().unwrap_or(0);
        let next = (max_id.max(max_indexed) + 1).max(self.config.container_base);
        self.next_container = AtomicU64::new(next);
        Ok(())
    }

    /// Opens the disk index and, with the exclusive lock, catches it up with the
    /// containers it lacks, or rebuilds it (docs/design/format.md, "Disk index"). A
    /// reader that finds it unusable falls back to the memory index.
    fn load_disk_index(&mut self, lookup: DiskLookup, memory: u64) -> Result<()> {
        let writable = self.mode == LockMode::Exclusive;
        let listing = self.backend.list_versions(FileKind::IndexSegment)?;
        let opened = DiskState::open(&self.state, lookup, memory, self.keys.as_deref());
        // A disk index that may hold another history's chunks (a copy of the
        // repository, storage rolled back) is unusable as a damaged one is.
        let opened = opened.and_then(|state| match state.foreign_to(&listing) {
            Some(why) => Err(Unusable::Rebuild(why)),
            None => Ok(state),
        });
        let mut state = match opened {
            Ok(state) => Some(state),
            Err(Unusable::Fail(e)) => return Err(e),
            Err(Unusable::Rebuild(why)) if writable => {
                self.report.disk_rebuilt = Some(why);
                None
            }
            Err(Unusable::Rebuild(why)) => {
                self.report.disk_fallback = Some(why);
                return self.load_memory_index();
            }
        };
        self.segments = listing.iter().map(|(n, _)| n.clone()).collect();
        // What the disk index held at open, and the containers the segments it
        // absorbed name: only those are confirmed to be this history's.
        let held_at_open = state.as_ref().map(|s| s.held().clone());
        let mut confirmed = BTreeSet::new();
        for name in self.segments.clone() {
            let containers = match self.read_segment(&name) {
                Ok(containers) => containers,
                Err(e) => {
                    self.report.bad_segments.push((name, error_chain(&e)));
                    continue;
                }
            };
            if state.as_ref().is_some_and(|s| s.absorbed(&name)) {
                confirmed.extend(containers.iter().map(|c| c.id));
            }
            let new = self.note_containers(&containers);
            if let Some(state) = state.as_mut().filter(|_| writable) {
                let lacking: Vec<SegmentContainer> = new
                    .into_iter()
                    .filter(|c| !state.held().contains(c.id))
                    .cloned()
                    .collect();
                if !lacking.is_empty() {
                    state.catch_up(&lacking)?;
                    self.report
                        .disk_caught_up
                        .extend(lacking.iter().map(|c| c.id));
                }
            }
        }
        self.adopt_containers(|repo, c| match state.as_mut().filter(|_| writable) {
            Some(state) if !state.held().contains(c.id) => {
                state.catch_up(std::slice::from_ref(c))?;
                repo.report.disk_caught_up.push(c.id);
                Ok(())
            }
            _ => Ok(()),
        })?;
        // A container held but gone (an older larder's gc) leaves stale locations; a
        // container held that no absorbed segment names (adopted, or named only by a
        // segment written since) may be another history's under the same id.
        let stale = state.as_ref().and_then(|s| {
            let gone = s
                .held()
                .first_outside(|id| self.indexed_containers.contains(&id));
            if gone.is_some() {
                return Some(STALE.to_string());
            }
            let unconfirmed = held_at_open
                .as_ref()?
                .first_outside(|id| confirmed.contains(&id))?;
            Some(format!(
                "holding container {unconfirmed:016x}, which no segment it absorbed names"
            ))
        });
        let state = match state {
            Some(_) if stale.is_some() && !writable => {
                self.report.disk_fallback = stale;
                self.indexed_containers.clear();
                self.chunk_bytes = ChunkBytes::default();
                self.pending.clear();
                self.report.adopted_containers.clear();
                self.report.adopted_below_named.clear();
                return self.load_memory_index();
            }
            Some(state) if stale.is_none() => state,
            _ => {
                if stale.is_some() {
                    self.report.disk_rebuilt = stale;
                }
                DiskState::rebuild(
                    &self.state,
                    lookup,
                    memory,
                    &self.indexed_tables_in_order()?,
                    self.keys.as_deref(),
                )?
            }
        };
        self.index = RepoIndex::Disk(Box::new(Mutex::new(state)));
        match writable {
            true => self.absorb_segments(listing),
            false => Ok(()),
        }
    }

    /// Records the segments of `listing` (storage's, taken after every segment this
    /// process knows was durable) that the repository knows as what its disk index
    /// absorbed (rules 5 and 6 of docs/design/format.md "Disk index"). Nothing for
    /// the memory index.
    fn absorb_segments(&mut self, listing: Vec<(String, FileVersion)>) -> Result<()> {
        let RepoIndex::Disk(state) = &mut self.index else {
            return Ok(());
        };
        let known: BTreeSet<&str> = self.segments.iter().map(String::as_str).collect();
        let absorbed = absorbed::AbsorbedSegments::new(
            listing
                .into_iter()
                .filter(|(name, _)| known.contains(name.as_str())),
        );
        lock_disk(state).absorb(absorbed)
    }

    /// [`Repository::absorb_segments`] with a listing taken now.
    fn absorb_listed_segments(&mut self) -> Result<()> {
        if self.config.index.is_memory() {
            return Ok(());
        }
        let listing = self.backend.list_versions(FileKind::IndexSegment)?;
        self.absorb_segments(listing)
    }

    /// Every indexed container with its table: the segments' in their order, then the
    /// adopted ones (the order the memory index inserts them in).
    fn indexed_tables_in_order(&self) -> Result<Vec<SegmentContainer>> {
        let mut seen = BTreeSet::new();
        let mut out = Vec::new();
        for name in &self.segments {
            if let Ok(containers) = self.read_segment(name) {
                out.extend(containers.into_iter().filter(|c| seen.insert(c.id)));
            }
        }
        out.extend(self.pending.iter().filter(|c| seen.insert(c.id)).cloned());
        Ok(out)
    }

    /// The local directory of the repository's local state (the disk index): the
    /// repository's own directory, or a remote repository's cache. Never the place of
    /// its files: those are the backend's.
    pub fn state_dir(&self) -> &Path {
        &self.state
    }

    /// Where the repository is, for messages: a path or a URL.
    pub fn location(&self) -> String {
        self.backend.location()
    }

    pub fn config(&self) -> &RepoConfig {
        &self.config
    }

    pub fn algo(&self) -> HashAlgo {
        self.config.hash
    }

    /// The codec every chunk of this repository is written and read through.
    pub fn codec(&self) -> ChunkCodec {
        match &self.keys {
            Some(keys) => {
                ChunkCodec::encrypted(self.config.compression, self.config.hash, keys.clone())
            }
            None => ChunkCodec::new(self.config.compression, self.config.hash),
        }
    }

    pub fn report(&self) -> &OpenReport {
        &self.report
    }

    pub fn backend(&self) -> Arc<dyn Backend> {
        self.backend.clone()
    }

    pub fn index(&self) -> &RepoIndex {
        &self.index
    }

    /// Ids of every indexed container, ascending.
    pub fn indexed_containers(&self) -> &BTreeSet<u64> {
        &self.indexed_containers
    }

    /// Raw and stored bytes of the chunks of every indexed container.
    pub fn chunk_bytes(&self) -> ChunkBytes {
        self.chunk_bytes
    }

    pub fn segment_count(&self) -> usize {
        self.segments.len()
    }

    /// A fresh container id; never reused, even across killed processes (ids above
    /// every container file on disk).
    pub fn allocate_container_id(&self) -> u64 {
        self.next_container.fetch_add(1, Ordering::Relaxed)
    }

    /// Lends the index to `f` (a backup's index stage owns it while the repository is
    /// shared with its writer threads) and takes it back when `f` returns, whatever
    /// it returns. Inside `f`, the repository's own index is empty.
    pub fn lend_index<T>(&mut self, f: impl FnOnce(&Self, &mut RepoIndex) -> T) -> T {
        let mut index = std::mem::take(&mut self.index);
        let out = f(self, &mut index);
        self.index = index;
        out
    }

    /// Reads and verifies a container (not its chunk data).
    pub fn load_container(&self, id: u64) -> Result<ParsedContainer> {
        let bytes = self
            .backend
            .read(FileKind::Container, &format!("{id:016x}"))?;
        ParsedContainer::parse_with(bytes, id, &self.codec())
    }

    /// Reads and verifies container `id`'s header, table and footer, not its chunk
    /// data (a few small reads), with what opens its chunks in an encrypted repository.
    pub fn load_container_table(&self, id: u64) -> Result<ContainerTable> {
        read_table(&*self.backend, id, &self.codec())
    }

    /// The bytes of each range of container `id`, one read per range with the file
    /// opened once: chunk data for a reader that knows the table (see
    /// [`Repository::load_container_table`]).
    pub fn read_container_ranges(&self, id: u64, ranges: &[Range<u64>]) -> Result<Vec<Vec<u8>>> {
        self.backend
            .read_ranges(FileKind::Container, &format!("{id:016x}"), ranges)
    }

    /// Makes `written` containers (already created with [`create_file`](crate::create_file)) and any
    /// adopted ones durable in the index: rules 1 and 2 of the commit order. Their
    /// chunks enter the index in memory here: a backup's index stage records only that
    /// they are new, since their locations are decided when they are written.
    pub fn commit(&mut self, written: Vec<SegmentContainer>) -> Result<()> {
        let mut containers = std::mem::take(&mut self.pending);
        self.add_containers(&written);
        containers.extend(written);
        if containers.is_empty() {
            return Ok(());
        }
        self.check_lock()?;
        self.backend.sync(FileKind::Container)?;
        let name = self.next_segment_name();
        self.create_segment(&name, &containers)?;
        self.backend.sync(FileKind::IndexSegment)?;
        self.segments.push(name);
        if let RepoIndex::Disk(state) = &mut self.index {
            // The segment is durable: the disk index may hold its chunks now.
            lock_disk(state).add_committed(&containers)?;
        }
        // Append-only storage keeps every segment: merging would only add copies.
        if self.segments.len() > MAX_SEGMENTS && self.deletes_allowed()? {
            self.compact_segments()?;
        }
        self.absorb_listed_segments()
    }

    /// The number of the next segment: above every segment's (never reused while
    /// any segment remains).
    fn next_segment_seq(&self) -> u64 {
        let last = self
            .segments
            .last()
            .and_then(|n| u64::from_str_radix(n, 16).ok())
            .unwrap_or(0);
        last + 1
    }

    fn next_segment_name(&self) -> String {
        format!("{:016x}", self.next_segment_seq())
    }

    /// Merges every segment into one. The merged segment is durable before the old
    /// ones are removed, so a crash in between leaves duplicates, which are harmless.
    fn compact_segments(&mut self) -> Result<()> {
        let mut all = Vec::new();
        for name in &self.segments {
            all.extend(self.read_segment(name)?);
        }
        let merged = self.next_segment_name();
        self.create_segment(&merged, &all)?;
        self.backend.sync(FileKind::IndexSegment)?;
        for name in std::mem::replace(&mut self.segments, vec![merged]) {
            self.backend.remove(FileKind::IndexSegment, &name)?;
        }
        self.backend.sync(FileKind::IndexSegment)
    }

    /// Rebuilds the index from the containers alone: reads and verifies every
    /// container, writes one segment naming all that verify, then removes the old
    /// segments. Returns the ids of containers that failed verification (left out).
    /// Needs the exclusive lock.
    pub fn rebuild_index(&mut self) -> Result<Vec<(u64, String)>> {
        let mut good = Vec::new();
        let mut bad = Vec::new();
        for name in self.backend.list(FileKind::Container)? {
            let Ok(id) = u64::from_str_radix(&name, 16) else {
                continue;
            };
            match self.load_container(id) {
                Ok(c) => good.push(SegmentContainer {
                    id,
                    entries: c.entries,
                }),
                Err(e) => bad.push((id, error_chain(&e))),
            }
        }
        let name = self.next_segment_name();
        let old = std::mem::take(&mut self.segments);
        self.backend.sync(FileKind::Container)?;
        self.create_segment(&name, &good)?;
        self.backend.sync(FileKind::IndexSegment)?;
        for n in &old {
            self.backend.remove(FileKind::IndexSegment, n)?;
        }
        self.backend.sync(FileKind::IndexSegment)?;
        self.segments = vec![name];
        self.indexed_containers.clear();
        self.chunk_bytes = ChunkBytes::default();
        self.pending.clear();
        match self.config.index {
            IndexSettings::Memory => {
                let entries = good.iter().map(|c| c.entries.len()).sum();
                self.index = RepoIndex::Memory(CuckooIndex::with_capacity(entries));
                self.add_containers(&good);
            }
            IndexSettings::Disk { lookup, memory } => {
                self.note_containers(&good);
                let state =
                    DiskState::rebuild(&self.state, lookup, memory, &good, self.keys.as_deref())?;
                self.index = RepoIndex::Disk(Box::new(Mutex::new(state)));
            }
        }
        self.absorb_listed_segments()?;
        Ok(bad)
    }

    /// Changes the repository's index to `to` (`larder index convert`): writes the
    /// config durably, then builds the disk index from the segments, or removes it.
    /// Needs the exclusive lock.
    pub fn convert_index(&mut self, to: IndexSettings) -> Result<()> {
        to.validate()?;
        let config = self.config.clone().with_index(to);
        let bytes = objects::encode_config(&config, self.keys.as_deref());
        self.backend.write(FileKind::Config, CONFIG_NAME, &bytes)?;
        self.backend.sync(FileKind::Config)?;
        self.config = config;
        let tables = self.indexed_tables_in_order()?;
        match to {
            IndexSettings::Memory => {
                let dir = DiskState::dir_of(&self.state);
                if dir.exists() {
                    fs::remove_dir_all(&dir).map_err(io(&dir))?;
                }
                self.index = RepoIndex::Memory(CuckooIndex::with_capacity(
                    tables.iter().map(|c| c.entries.len()).sum(),
                ));
                self.indexed_containers.clear();
                self.chunk_bytes = ChunkBytes::default();
                self.add_containers(&tables);
            }
            IndexSettings::Disk { lookup, memory } => {
                open::prepare_state(&self.state)?;
                let state =
                    DiskState::rebuild(&self.state, lookup, memory, &tables, self.keys.as_deref())?;
                self.index = RepoIndex::Disk(Box::new(Mutex::new(state)));
            }
        }
        self.absorb_listed_segments()
    }

    /// Removes snapshot `id` durably (`forget`); its chunks stay until `gc`. Needs the
    /// exclusive lock.
    pub fn remove_snapshot(&self, id: &str) -> Result<()> {
        self.backend.remove(FileKind::Snapshot, id)?;
        self.backend.sync(FileKind::Snapshot)
    }

    /// Every readable snapshot, oldest first (of snapshots of the same time, repaired
    /// copies after the others, so that `latest` is a repaired copy rather than its
    /// damaged original), and an [`StoreError::UnreadableSnapshot`] naming each
    /// unreadable one (a transient error, a dropped connection, comes as it is: it
    /// says nothing about the snapshot).
    pub fn snapshots(&self) -> Result<(Vec<IdentifiedSnapshot>, Vec<StoreError>)> {
        self.require_full_key("read snapshots")?;
        let mut good = Vec::new();
        let mut bad = Vec::new();
        for id in self.backend.list(FileKind::Snapshot)? {
            match self.read_snapshot(&id) {
                Ok(s) => good.push((id, s)),
                Err(e) if e.is_transient() => bad.push(e),
                Err(e) => bad.push(unreadable(id, &e)),
            }
        }
        good.sort_by(|(a_id, a), (b_id, b)| {
            let repaired = |s: &Snapshot| s.repaired_from.is_some();
            (a.time.cmp(&b.time))
                .then(repaired(a).cmp(&repaired(b)))
                .then(a_id.cmp(b_id))
        });
        Ok((good, bad))
    }

    /// The ids of every snapshot file, readable or not, ascending: the names of the
    /// files, which a snapshot's id is.
    pub fn snapshot_ids(&self) -> Result<Vec<String>> {
        self.backend.list(FileKind::Snapshot)
    }

    /// The id of the snapshot `name` names: `latest`, the newest complete snapshot that
    /// can be read (never a checkpoint); otherwise a unique prefix of a snapshot file's
    /// name, whether or not that file can be read, so that a damaged snapshot can be
    /// named (to `forget` it, say).
    pub fn resolve_snapshot(&self, name: &str) -> Result<String> {
        if name == "latest" {
            return Ok(self.find_snapshot(name)?.0);
        }
        let ids = self.snapshot_ids()?;
        let mut matches = ids.into_iter().filter(|id| id.starts_with(name));
        match (matches.next(), matches.next()) {
            (Some(found), None) if !name.is_empty() => Ok(found),
            (Some(_), Some(_)) => Err(StoreError::AmbiguousSnapshot(name.into())),
            _ => Err(StoreError::NoSuchSnapshot(name.into())),
        }
    }

    /// The snapshot named by `latest` (the newest complete one: never a checkpoint)
    /// or by a unique prefix of its id; one that cannot be read is an
    /// [`StoreError::UnreadableSnapshot`] naming it.
    pub fn find_snapshot(&self, name: &str) -> Result<IdentifiedSnapshot> {
        if name != "latest" {
            self.require_full_key("read snapshots")?;
            let id = self.resolve_snapshot(name)?;
            return match self.read_snapshot(&id) {
                Ok(s) => Ok((id, s)),
                Err(e) if e.is_transient() => Err(e),
                Err(e) => Err(unreadable(id, &e)),
            };
        }
        let (all, _) = self.snapshots()?;
        all.into_iter()
            .rev()
            .find(|(_, s)| !s.partial)
            .ok_or_else(|| StoreError::NoSuchSnapshot(name.into()))
    }
}

/// Why snapshot `id` cannot be read, naming it (once).
fn unreadable(id: String, e: &StoreError) -> StoreError {
    let reason = match e {
        StoreError::Corrupt { reason, .. } => reason.clone(),
        e => error_chain(e),
    };
    StoreError::UnreadableSnapshot { id, reason }
}
