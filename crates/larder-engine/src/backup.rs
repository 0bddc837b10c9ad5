//! The backup pipeline (docs/design/pipeline.md) and what runs around it
//! (docs/design/nightly.md).
//!
//! ```text
//! walk ─▶ skip logic ─▶ [1 read, chunk] ─▶ [2 fingerprint × N] ─▶ [3 index] ─▶ [4 compress × N, write] ─▶ syncers
//!                                                                                  └─▶ tree saver ─▶ commit
//! ```
//! One module per part: `walk` lists the sources; `previous` decides which files
//! need reading; `read_stage` (1) reads and chunks them; `fingerprint_stage` (2);
//! `index_stage` and `disk_stage` (3) decide which chunks are new and build recipes;
//! `write_stage` (4) compresses and packs new chunks into containers that syncer
//! threads write; `tree_saver` stores the tree stream; `round` runs the stages once
//! over a share of the files; `commit` makes a round durable and writes its snapshot
//! (a checkpoint, or the backup's own). Queues are bounded, so memory stays bounded
//! whatever the input size.

mod commit;
mod device;
mod disk_stage;
mod exclude_tags;
mod fingerprint_stage;
mod gate;
mod index_stage;
mod previous;
mod read_stage;
mod remote;
mod remote_stage;
mod round;
mod summary;
mod tree_saver;
mod walk;
mod write_stage;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use larder_store::{Compression, EntryKind, RepoIndex, Repository, TreeEntry};

#[cfg(feature = "gpu")]
pub use device::GpuChunkDevice;
pub use device::{check_usable as check_device, ChunkDevice};
pub use exclude_tags::ExcludeTag;
pub use previous::{Parents, SkipRules, RACY_WINDOW};
pub use remote::{RemoteAnswers, RemoteIndex, RemoteLookup, RemoteReply};
pub use summary::{BackupSummary, StageTimes};

// The parts of the pipeline `copy` runs too (docs/design/copy.md).
pub(crate) use gate::{BusySpan, SerialGate};
pub(crate) use index_stage::{Indexer, NewChunk};
pub(crate) use read_stage::{
    Batch, BlockSource, FileEnd, Piece, PieceEnd, Reader, GROUP_BYTES, GROUP_FILES, SMALL_FILE,
};
pub(crate) use round::{collect, Pipeline};
pub(crate) use walk::Item;
pub(crate) use write_stage::{spawn_syncers, ContainerWriter, SYNC_THREADS};

use crate::error::{EngineError, Result, Warning};
use crate::pattern::PatternList;
use crate::{NoProgress, Progress};
use commit::Committer;
use previous::Previous;
use read_stage::{FileId, FileToRead, RoundEnd, Source};
use walk::{walk, WalkOptions, Walked};

/// A checkpoint is written after each this many parts of the bytes to read.
const CHECKPOINT_SHARES: u64 = 20;
/// ...but no more often than after this many bytes.
const CHECKPOINT_MIN_BYTES: u64 = 64 << 20;

pub struct BackupOptions {
    /// Fingerprinting threads; 0 means one per core.
    pub threads: usize,
    pub hostname: String,
    pub username: String,
    /// Patterns matched against snapshot paths; what they select is not backed up
    /// (docs/design/patterns.md). `.larderignore` files are honoured as well.
    pub exclude: PatternList,
    /// Tag files whose directories are backed up with the tag file alone
    /// (`--exclude-caches`, `--exclude-if-present`).
    pub exclude_tags: Vec<ExcludeTag>,
    /// Do not cross into other file systems below a source path: a mount point is
    /// recorded as a directory, its contents are not (`--one-file-system`).
    pub one_file_system: bool,
    pub progress: Arc<dyn Progress>,
    /// The stages take turns instead of overlapping: at most one stage works at any
    /// moment, each batch passing through chunk, fingerprint, index and write in turn.
    /// With `threads` 1 this is P-Dedupe's serial baseline, which `larder bench
    /// report` measures against the pipeline; it only ever slows a backup down. The
    /// queue to the container syncers is then unbounded (a bounded one could fill
    /// while the writer holds the gate the syncers wait for), so memory is bounded by
    /// the backup's new data rather than by the queue depths. Off by default.
    pub serial: bool,
    /// The index of a cluster (docs/design/cluster.md): fingerprints that neither this
    /// repository nor this backup holds are asked there, and this backup's new chunks
    /// are acknowledged to it once the commit made them durable. `None`: this
    /// repository's own index decides alone.
    pub remote: Option<Arc<dyn RemoteIndex>>,
    /// Which snapshots files are compared with to skip unchanged ones.
    pub parents: Parents,
    /// What the comparison leaves out.
    pub skip: SkipRules,
    /// Record extended attributes (POSIX ACLs among them).
    pub xattrs: bool,
    /// Write a checkpoint at least this often, and after each twentieth of the bytes
    /// to read (at least 64 MiB apart); `None`: no checkpoints.
    pub checkpoint_interval: Option<Duration>,
    /// Chunks and fingerprints large files on this device (the GPU) instead of the
    /// CPU, with the same results; `None`: the CPU. Only a plaintext FastCDC 2020
    /// repository can use one ([`check_device`]).
    pub device: Option<Arc<Mutex<Box<dyn ChunkDevice>>>>,
}

impl Default for BackupOptions {
    /// One thread per core, no excludes, no progress, the pipeline, the repository's
    /// own index, the newest snapshots as parents, extended attributes recorded, a
    /// checkpoint at least every five minutes; host and user names empty.
    fn default() -> Self {
        Self {
            threads: 0,
            hostname: String::new(),
            username: String::new(),
            exclude: PatternList::default(),
            exclude_tags: Vec::new(),
            one_file_system: false,
            progress: Arc::new(NoProgress),
            serial: false,
            remote: None,
            parents: Parents::Auto,
            skip: SkipRules::default(),
            xattrs: true,
            checkpoint_interval: Some(Duration::from_secs(300)),
            device: None,
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Backs up `paths` into `repo` and commits a snapshot.
///
/// Files whose metadata says they did not change since the previous snapshots are
/// not read ([`BackupOptions::parents`]). Problems with single files, and source
/// paths that do not exist, become warnings in the summary (a backup none of whose
/// paths exists is an error); anything that puts the repository at risk (a failed
/// write, a full disk) stops the backup with an error, and no snapshot is written. Chunks already
/// written are reused by the next backup, and the files of its last checkpoint are
/// not read again.
pub fn backup(
    repo: &mut Repository,
    paths: &[PathBuf],
    opts: &BackupOptions,
) -> Result<BackupSummary> {
    if opts.remote.is_some() && matches!(repo.index(), RepoIndex::Disk(_)) {
        // Stage 3 asks a remote index only beside the memory index: refused before
        // anything is read, rather than a backup that silently ignores the cluster.
        return Err(EngineError::Remote {
            message: "this repository keeps its index on disk, which a cluster backup does \
                      not consult: a node's repository uses the memory index \
                      (init --index memory)"
                .into(),
            retryable: false,
        });
    }
    if opts.device.is_some() {
        device::check_usable(repo.config())?;
    }
    let started = Instant::now();
    let began = SystemTime::now();
    let mut stages = StageTimes::default();
    let mut warnings = Vec::new();
    let roots = walk::existing_roots(walk::source_roots(paths)?, &mut warnings)?;
    let threads = thread_pool(thread_count(opts.threads), "larder-walk")?;
    let walk_opts = WalkOptions {
        exclude: &opts.exclude,
        exclude_tags: &opts.exclude_tags,
        one_file_system: opts.one_file_system,
        threads: &threads,
    };
    let root_paths: Vec<PathBuf> = roots.iter().map(|(root, _)| root.clone()).collect();
    // The walk and the loading of the previous entries overlap: neither needs the
    // other. Then the entries are completed from the previous ones.
    let (walked, previous) = std::thread::scope(|s| {
        let loading = s.spawn(|| {
            let mut loading_warnings = Vec::new();
            let started = Instant::now();
            let previous = load_previous(repo, &root_paths, opts, &mut loading_warnings);
            (previous, loading_warnings, started.elapsed())
        });
        let walked = walk(&roots, &walk_opts, &mut warnings);
        stages.walk = started.elapsed();
        let loaded = loading.join();
        (walked, loaded)
    });
    let (previous, loading_warnings, loading_time) = previous
        .map_err(|_| EngineError::Pipeline("loading the previous snapshots panicked".into()))?;
    stages.previous = loading_time;
    warnings.extend(loading_warnings);
    let Walked {
        mut items,
        excluded,
    } = walked?;
    let previous = previous?;
    let completing = Instant::now();
    warnings.extend(walk::complete(
        &mut items,
        &previous,
        opts.skip,
        opts.xattrs,
        &threads,
    ));
    stages.walk += completing.elapsed();
    for w in &warnings {
        opts.progress.warn(w);
    }
    let snapshot_paths = root_paths.iter().map(|r| r.display().to_string()).collect();
    let job = Job {
        items,
        excluded,
        snapshot_paths,
        stdin: false,
        began,
    };
    run(repo, job, previous, opts, started, stages, warnings)
}

/// Backs up standard input, read to its end, as the file `name` (a relative path,
/// `/` between components) of a new snapshot (`backup --stdin`). Nothing is compared
/// with earlier snapshots, and no checkpoint is written.
pub fn backup_stdin(
    repo: &mut Repository,
    name: &str,
    opts: &BackupOptions,
) -> Result<BackupSummary> {
    if opts.device.is_some() {
        device::check_usable(repo.config())?;
    }
    let started = Instant::now();
    let began = SystemTime::now();
    let path = name.trim_start_matches('/');
    if !larder_store::is_safe_relative_path(path.as_bytes()) {
        return Err(EngineError::Source {
            path: PathBuf::from(name),
            reason: "not a valid file name for standard input: use components without `.`, `..` or empty ones".into(),
        });
    }
    let now = began
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default();
    // SAFETY: getuid and getgid cannot fail and touch no memory.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let entry = |kind: EntryKind, path: &str, mode: u32| {
        let mut e = TreeEntry::new(kind, path.as_bytes().to_vec());
        e.mode = mode;
        (e.mtime_sec, e.mtime_nsec) = (now.as_secs() as i64, now.subsec_nanos());
        (e.ctime_sec, e.ctime_nsec) = (e.mtime_sec, e.mtime_nsec);
        (e.uid, e.gid) = (uid, gid);
        Item {
            abs: PathBuf::from("/").join(path),
            entry: e,
        }
    };
    let mut items: Vec<Item> = path
        .match_indices('/')
        .map(|(i, _)| entry(EntryKind::Dir, &path[..i], 0o40755))
        .collect();
    items.push(entry(EntryKind::File, path, 0o100644));
    let job = Job {
        items,
        excluded: 0,
        snapshot_paths: vec![format!("/{path}")],
        stdin: true,
        began,
    };
    // Standard input has nothing to compare with, and one file to checkpoint.
    let opts = BackupOptions {
        parents: Parents::None,
        checkpoint_interval: None,
        exclude: PatternList::default(),
        progress: opts.progress.clone(),
        remote: opts.remote.clone(),
        hostname: opts.hostname.clone(),
        username: opts.username.clone(),
        device: opts.device.clone(),
        ..BackupOptions::default()
    };
    run(
        repo,
        job,
        Previous::default(),
        &opts,
        started,
        StageTimes::default(),
        Vec::new(),
    )
}

/// What one backup takes in: the walked items and where they came from.
struct Job {
    items: Vec<Item>,
    excluded: u64,
    /// What the snapshot records as its paths.
    snapshot_paths: Vec<String>,
    /// The one file is standard input.
    stdin: bool,
    /// When the backup began: its snapshots' time.
    began: SystemTime,
}

pub(crate) fn thread_count(threads: usize) -> usize {
    match threads {
        0 => std::thread::available_parallelism().map_or(2, |n| n.get()),
        n => n,
    }
}

/// Whether the repository was opened with a write-only key: its backups cannot read
/// earlier snapshots (so skip nothing) and write no checkpoints.
fn write_only(repo: &Repository) -> bool {
    repo.keys().is_some_and(|k| !k.is_full())
}

/// The previous entries of the files under `roots` (docs/design/nightly.md); what
/// could not be read goes into `warnings`, which [`backup`] shows once the walk is
/// done, with the walk's own.
fn load_previous(
    repo: &Repository,
    roots: &[PathBuf],
    opts: &BackupOptions,
    warnings: &mut Vec<Warning>,
) -> Result<Previous> {
    Previous::load(
        repo,
        roots,
        &opts.hostname,
        &opts.parents,
        opts.skip.racy_window,
        warnings,
    )
}

/// Decides what to read, runs the rounds and commits each.
fn run(
    repo: &mut Repository,
    mut job: Job,
    previous: Previous,
    opts: &BackupOptions,
    started: Instant,
    mut stages: StageTimes,
    warnings: Vec<Warning>,
) -> Result<BackupSummary> {
    let previous_started = Instant::now();
    let mut decisions = previous.decide(&mut job.items, opts.skip, |fps| {
        Ok(repo
            .index()
            .get_batch(fps)?
            .iter()
            .map(Option::is_some)
            .collect())
    })?;
    stages.previous += previous_started.elapsed();

    let config = repo.config().clone();
    let chunker = repo.chunker();
    let threads = thread_count(opts.threads);
    // The reused recipes become the indexer's; the files without one are read.
    let reused = std::mem::take(&mut decisions.reused);
    let files: Vec<FileToRead<'_>> = job
        .items
        .iter()
        .enumerate()
        .filter(|(i, it)| it.entry.kind == EntryKind::File && reused[*i].is_none())
        .map(|(item, it)| FileToRead {
            item,
            source: if job.stdin {
                Source::Stdin
            } else {
                Source::Path(
                    &it.abs,
                    Some(FileId {
                        device: it.entry.device,
                        inode: it.entry.inode,
                    }),
                )
            },
            size: it.entry.size,
        })
        .collect();
    let to_read: u64 = files.iter().map(|f| f.size).sum();
    opts.progress.set_total(to_read);
    let sizes = job.items.iter().map(|i| i.entry.size).collect();
    let mut indexer = Indexer::new(repo, sizes, reused, opts.remote.clone());
    let warnings = Mutex::new(warnings);
    let pipeline = Pipeline {
        items: &job.items,
        chunker: chunker.as_ref(),
        codec: repo.codec(),
        threads,
        chunk_threads: thread_pool(threads, "larder-chunk")?,
        compress_threads: match config.compression {
            Compression::None => None,
            Compression::Zstd { .. } => Some(thread_pool(threads, "larder-compress")?),
        },
        gate: SerialGate::new(opts.serial),
        progress: opts.progress.as_ref(),
        warnings: &warnings,
        remote: opts.remote.clone(),
        device: opts.device.as_deref(),
    };
    // A write-only key writes no checkpoints: it could never read one back to resume.
    let checkpoint_interval = opts.checkpoint_interval.filter(|_| !write_only(repo));
    let round_bytes = match checkpoint_interval {
        Some(_) => (to_read / CHECKPOINT_SHARES).max(CHECKPOINT_MIN_BYTES),
        None => u64::MAX,
    };
    let mut committer = Committer::new(opts, &job.snapshot_paths, job.began, &decisions);
    let disk_before = repo.index().disk_metrics();
    let mut next = 0;
    loop {
        let end = RoundEnd {
            bytes: round_bytes,
            deadline: checkpoint_interval.map(|d| Instant::now() + d),
        };
        let out = repo.lend_index(|repo, index| {
            pipeline.round(repo, &mut indexer, index, &files[next..], &end, &mut stages)
        })?;
        next += out.taken;
        let complete = next == files.len();
        committer.commit_round(
            repo,
            &job.items,
            out,
            &mut indexer,
            &warnings,
            complete,
            &mut stages,
        )?;
        if complete {
            break;
        }
    }
    drop(pipeline);
    let warnings = warnings.into_inner().unwrap_or_else(|p| p.into_inner());
    let disk_index = repo
        .index()
        .disk_metrics()
        .zip(disk_before)
        .map(|(after, before)| disk_stage::metrics_since(&after, &before));
    let mut summary = committer.summary(&indexer, warnings);
    summary.excluded = job.excluded;
    summary.disk_index = disk_index;
    summary.stages = stages;
    summary.elapsed = started.elapsed();
    Ok(summary)
}

pub(crate) fn thread_pool(threads: usize, name: &'static str) -> Result<rayon::ThreadPool> {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(move |i| format!("{name}-{i}"))
        .build()
        .map_err(|e| EngineError::Pipeline(format!("cannot start {name} threads: {e}")))
}
