//! Backups with chunking and fingerprinting on a device (docs/design/gpu.md, "Backups
//! on the GPU"), here the GPU backend's CPU emulation, which runs the very pipeline
//! code the GPU runs: it stores the CPU path's data chunks in the same containers,
//! the snapshot's tree is the same, and it restores exactly. A repository the device
//! cannot serve is refused before anything is read; a device that fails costs the
//! file it was chunking, with a warning, and nothing else.

use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use larder_chunk::{Chunker, ChunkerConfig, ChunkerKind};
use larder_engine::{
    backup, check, load_tree, restore, BackupOptions, ChunkDevice, ChunkReader, EngineError,
    GpuChunkDevice,
};
use larder_gpu::{EmulatedDevice, GpuConfig};
use larder_hash::{Fingerprint, HashAlgo};
use larder_store::{LockMode, RepoConfig, Repository, TreeEntry};

#[path = "support/bytes.rs"]
mod seeded;
use seeded::bytes;

#[path = "support/options.rs"]
mod options;

#[path = "support/chunks.rs"]
mod chunks;
use chunks::data_chunks;
use options::{backup_options, check_options, restore_options};

static EMULATED: EmulatedDevice = EmulatedDevice;

/// Small device blocks and several in flight, so that one 8 MiB block of stage 1 runs
/// through many of the pipeline's slots, leftovers and carried candidates.
const GPU_CONFIG: GpuConfig = GpuConfig {
    block_size: 1 << 20,
    stretch: 4096,
    slots: 4,
    streams: 3,
};

fn emulated(chunker: &ChunkerConfig) -> Arc<Mutex<Box<dyn ChunkDevice>>> {
    let device = GpuChunkDevice::new(&EMULATED, chunker, HashAlgo::Blake3, GPU_CONFIG).unwrap();
    Arc::new(Mutex::new(Box::new(device)))
}

/// A device that counts the bytes it is given.
struct Counted(Box<dyn ChunkDevice>, Arc<AtomicUsize>);

impl ChunkDevice for Counted {
    fn chunk_and_hash(&mut self, data: &[u8]) -> Result<Vec<(u32, Fingerprint)>, String> {
        self.1.fetch_add(data.len(), Ordering::Relaxed);
        self.0.chunk_and_hash(data)
    }
}

/// A tree with two files larger than a stage-1 block (text and noise, so that some
/// units compress and some do not), one just above the small-file limit, small files
/// and an empty one.
fn write_source(src: &Path) {
    fs::create_dir_all(src.join("small")).unwrap();
    let text: Vec<u8> = (0..600_000)
        .flat_map(|i| format!("line {i} of a long text, word {}\n", i % 89).into_bytes())
        .collect();
    fs::write(src.join("text.txt"), &text).unwrap();
    let mut noise = bytes(1, 19 << 20);
    noise[5 << 20..6 << 20].fill(0);
    fs::write(src.join("noise.bin"), &noise).unwrap();
    fs::write(src.join("just-large.bin"), bytes(2, (1 << 20) + 3)).unwrap();
    for i in 0..20 {
        fs::write(
            src.join(format!("small/{i}")),
            bytes(10 + i, 5000 * i as usize),
        )
        .unwrap();
    }
    fs::write(src.join("empty"), b"").unwrap();
}

fn init(root: &Path, chunker: ChunkerConfig) {
    Repository::init(root, &RepoConfig::new(chunker, HashAlgo::Blake3)).unwrap();
}

/// The regular files directly in `dir`, by name, with their bytes.
fn files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out: Vec<_> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_type().unwrap().is_file())
        .map(|e| {
            (
                e.file_name().into_string().unwrap(),
                fs::read(e.path()).unwrap(),
            )
        })
        .collect();
    out.sort();
    out
}

#[test]
fn the_emulated_device_backs_up_byte_for_byte_as_the_cpu() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    write_source(&src);
    let chunker = ChunkerConfig::default();
    let given = Arc::new(AtomicUsize::new(0));
    let device = GpuChunkDevice::new(&EMULATED, &chunker, HashAlgo::Blake3, GPU_CONFIG).unwrap();
    let counted: Box<dyn ChunkDevice> = Box::new(Counted(Box::new(device), given.clone()));
    let runs = [("cpu", None), ("gpu", Some(Arc::new(Mutex::new(counted))))];
    for (name, _) in &runs {
        init(&dir.path().join(name), chunker);
    }
    let mut snapshots = Vec::new();
    for (name, device) in runs {
        let mut repo = Repository::open(&dir.path().join(name), LockMode::Exclusive).unwrap();
        let opts = BackupOptions {
            device,
            ..backup_options(2)
        };
        let summary = backup(&mut repo, std::slice::from_ref(&src), &opts).unwrap();
        assert!(summary.warnings.is_empty(), "{:?}", summary.warnings);
        snapshots.push((name, summary.snapshot_id));
    }
    let (mut trees, mut stored) = (Vec::new(), Vec::new());
    for (name, id) in &snapshots {
        let repo = Repository::open(&dir.path().join(name), LockMode::Exclusive).unwrap();
        trees.push(entries_below(&repo, id, &src));
        stored.push(data_chunks(&repo));
        let report = check(&repo, &check_options(true)).unwrap();
        assert!(report.is_ok(), "{name}: {:?}", report.damage);
        let target = dir.path().join(format!("restored-{name}"));
        restore(&repo, id, &target, &restore_options(1 << 20)).unwrap();
        let restored = target.join(src.strip_prefix("/").unwrap());
        assert_eq!(files(&restored), files(&src), "{name}");
        assert_eq!(files(&restored.join("small")), files(&src.join("small")));
    }
    // Every byte of the three large files went through the device, the carried
    // tails of blocks more than once.
    let large: u64 = ["text.txt", "noise.bin", "just-large.bin"]
        .iter()
        .map(|f| fs::metadata(src.join(f)).unwrap().len())
        .sum();
    assert!(
        given.load(Ordering::Relaxed) as u64 > large,
        "{given:?} of {large}"
    );
    assert!(trees[0] == trees[1], "the snapshots' trees differ");
    assert!(stored[0].len() > 3, "{} containers", stored[0].len());
    assert!(stored[0] == stored[1], "the stored data differs");
}

/// The entries of snapshot `id` at and below `src`: the tree without `src`'s
/// ancestors, whose recorded times change whenever another test creates or removes a
/// directory beside them.
fn entries_below(repo: &Repository, id: &str, src: &Path) -> Vec<TreeEntry> {
    let (_, snap) = repo.find_snapshot(id).unwrap();
    let fps = snap.tree.fingerprints().unwrap();
    let prefix = src.strip_prefix("/").unwrap().as_os_str().as_bytes();
    let below = |path: &[u8]| {
        path.strip_prefix(prefix)
            .is_some_and(|rest| rest.is_empty() || rest[0] == b'/')
    };
    let entries = load_tree(&mut ChunkReader::new(repo), &fps).unwrap();
    entries.into_iter().filter(|e| below(&e.path)).collect()
}

#[test]
fn repositories_the_device_cannot_serve_are_refused_before_reading() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    write_source(&src);
    for (kind, seed) in [
        (ChunkerKind::Fastcdc2016, 0),
        (ChunkerKind::Fastcdc2020, 666),
    ] {
        let chunker = ChunkerConfig {
            kind,
            seed,
            ..ChunkerConfig::default()
        };
        let root = dir.path().join(format!("{}-{seed}", kind.name()));
        init(&root, chunker);
        let mut repo = Repository::open(&root, LockMode::Exclusive).unwrap();
        let opts = BackupOptions {
            device: Some(emulated(&ChunkerConfig::default())),
            ..backup_options(2)
        };
        let err = backup(&mut repo, std::slice::from_ref(&src), &opts).unwrap_err();
        assert!(matches!(err, EngineError::Device(_)), "{err}");
        assert!(err.to_string().contains("--device cpu"), "{err}");
        assert!(repo.snapshots().unwrap().0.is_empty());
    }
}

/// Fails on its second call.
struct FailingDevice(usize);

impl ChunkDevice for FailingDevice {
    fn chunk_and_hash(&mut self, data: &[u8]) -> Result<Vec<(u32, Fingerprint)>, String> {
        self.0 += 1;
        if self.0 == 2 {
            return Err("out of device memory".into());
        }
        let lens = larder_chunk::FastCdc2020::new(2048, 8192, 65536, 2).chunk_lengths(data);
        let mut at = 0;
        Ok(lens
            .into_iter()
            .map(|len| {
                let fp = HashAlgo::Blake3.fingerprint(&data[at..at + len]);
                at += len;
                (len as u32, fp)
            })
            .collect())
    }
}

#[test]
fn a_failing_device_costs_the_file_it_was_chunking_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    write_source(&src);
    let root = dir.path().join("repo");
    init(&root, ChunkerConfig::default());
    let mut repo = Repository::open(&root, LockMode::Exclusive).unwrap();
    let device: Box<dyn ChunkDevice> = Box::new(FailingDevice(0));
    let opts = BackupOptions {
        device: Some(Arc::new(Mutex::new(device))),
        ..backup_options(2)
    };
    let summary = backup(&mut repo, std::slice::from_ref(&src), &opts).unwrap();
    assert_eq!(summary.warnings.len(), 1, "{:?}", summary.warnings);
    let warning = summary.warnings[0].to_string();
    assert!(
        warning.contains("the GPU failed: out of device memory"),
        "{warning}"
    );
    assert!(summary.is_partial());
    let report = check(&repo, &check_options(true)).unwrap();
    assert!(report.is_ok(), "{:?}", report.damage);
}
