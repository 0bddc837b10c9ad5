//! Backups that share a remote index (a cluster's, docs/design/cluster.md): the same
//! data backed up through two repositories sharing one index stores exactly the unique
//! chunks and bytes one repository stores alone, whichever repository receives which
//! part; every new chunk is acknowledged once, at its committed location; a backup
//! keeps several lookups in flight, and never asks a fingerprint again before its
//! acknowledgement (docs/design/pipeline.md, "Stage 3 with a remote index").

use std::collections::{HashMap, HashSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use larder_chunk::ChunkerConfig;
use larder_engine::{backup, EngineError, RemoteAnswers, RemoteIndex, RemoteLookup};
use larder_hash::{Fingerprint, HashAlgo};
use larder_index::ChunkLocation;
use larder_store::{DiskLookup, IndexSettings, LockMode, RepoConfig, Repository};

#[path = "support/bytes.rs"]
mod seeded;
use seeded::bytes;

#[path = "support/options.rs"]
mod options;
use options::backup_options;

/// The index a cluster's owners keep, as one map: the first asker of a fingerprint is
/// told it is new and must acknowledge it before anyone asks again (the backups here
/// run one after another; the lock's waiting is the cluster crate's to test).
struct Model {
    stored: Mutex<HashMap<Fingerprint, Option<ChunkLocation>>>,
    /// The zero chunk, which a repository decides alone: never asked, never
    /// acknowledged.
    zero: Fingerprint,
    /// Lookups sent and not answered yet, and the most there ever were.
    in_flight: Arc<AtomicUsize>,
    most_in_flight: AtomicUsize,
}

/// How long the model holds a lookup's answers while no other lookup is in flight.
const HOLD: Duration = Duration::from_millis(100);

/// A model's refusal: the backup broke a rule of the remote index.
fn broken(message: String) -> EngineError {
    EngineError::Remote {
        message,
        retryable: false,
    }
}

impl Model {
    fn answer(&self, fps: &[Fingerprint]) -> RemoteAnswers {
        let mut stored = self.stored.lock().unwrap();
        if fps.contains(&self.zero) {
            return Err(broken("the zero chunk was asked".into()));
        }
        fps.iter()
            .map(|fp| match stored.get(fp) {
                Some(Some(at)) => Ok(Some(*at)),
                Some(None) => Err(broken(format!(
                    "{} asked again before its acknowledgement",
                    fp.to_hex()
                ))),
                None => {
                    stored.insert(*fp, None);
                    Ok(None)
                }
            })
            .collect()
    }
}

impl RemoteIndex for Model {
    /// Decided at once, answered later from another thread, as a cluster's owners
    /// answer over the network: held while it is the only lookup in flight (for at
    /// most 100 ms), so that a backup asking ahead has its next lookup in flight
    /// meanwhile.
    fn lookup(&self, fps: Vec<Fingerprint>) -> RemoteLookup {
        let answers = self.answer(&fps);
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.most_in_flight.fetch_max(now, Ordering::SeqCst);
        let in_flight = self.in_flight.clone();
        let (reply, lookup) = RemoteLookup::channel();
        std::thread::spawn(move || {
            let asked = Instant::now();
            while in_flight.load(Ordering::SeqCst) < 2 && asked.elapsed() < HOLD {
                std::thread::sleep(Duration::from_millis(1));
            }
            in_flight.fetch_sub(1, Ordering::SeqCst);
            reply.send(answers);
        });
        lookup
    }

    fn acknowledge(&self, entries: &[(Fingerprint, ChunkLocation)]) -> Result<(), EngineError> {
        let mut stored = self.stored.lock().unwrap();
        if entries.iter().any(|(fp, _)| *fp == self.zero) {
            return Err(broken("the zero chunk was acknowledged".into()));
        }
        for (fp, at) in entries {
            match stored.get_mut(fp) {
                Some(slot @ None) => *slot = Some(*at),
                Some(Some(_)) => return Err(broken(format!("{} acknowledged twice", fp.to_hex()))),
                None => return Err(broken(format!("{} acknowledged, never asked", fp.to_hex()))),
            }
        }
        Ok(())
    }
}

fn repo(root: &Path, base: u64) -> Repository {
    let mut config = RepoConfig::new(ChunkerConfig::default(), HashAlgo::Blake3);
    config.container_base = base;
    Repository::init(root, &config).unwrap();
    Repository::open(root, LockMode::Exclusive).unwrap()
}

/// Three sources sharing much of their data, each a directory of files.
fn sources(dir: &Path) -> Vec<PathBuf> {
    let shared = bytes(1, 3 << 20);
    (0..3u64)
        .map(|i| {
            let src = dir.join(format!("src{i}"));
            fs::create_dir_all(&src).unwrap();
            fs::write(src.join("shared.bin"), &shared).unwrap();
            let mut edited = shared.clone();
            edited[(i as usize + 1) * 300_000..][..5000].copy_from_slice(&bytes(10 + i, 5000));
            fs::write(src.join("edited.bin"), edited).unwrap();
            fs::write(src.join("own.bin"), bytes(20 + i, 1 << 20)).unwrap();
            // Long runs of zeros: cut into chunks of the largest size, all alike.
            fs::write(src.join("zeros.bin"), vec![0u8; 1 << 20]).unwrap();
            src
        })
        .collect()
}

/// Every (fingerprint, stored length) of the repository's data chunks. Tree chunks are
/// left out: the tree records the metadata of the sources' parent directories, up to
/// the temporary directory, which other processes change between backups.
fn chunks(repo: &Repository) -> Vec<(Fingerprint, u32)> {
    let mut tree: HashSet<Fingerprint> = HashSet::new();
    for (_, s) in repo.snapshots().unwrap().0 {
        tree.extend(s.tree.fingerprints().unwrap());
    }
    let backend = repo.backend();
    let mut out = Vec::new();
    for name in backend.list(larder_store::FileKind::Container).unwrap() {
        let id = u64::from_str_radix(&name, 16).unwrap();
        let entries = repo.load_container_table(id).unwrap().entries;
        out.extend(
            entries
                .iter()
                .filter(|e| !tree.contains(&e.fingerprint))
                .map(|e| (e.fingerprint, e.stored_len)),
        );
    }
    out
}

#[test]
fn two_repositories_sharing_an_index_store_what_one_stores() {
    let data = tempfile::tempdir().unwrap();
    let srcs = sources(data.path());
    let dir = tempfile::tempdir().unwrap();

    let mut alone = repo(&dir.path().join("alone"), 0);
    for src in &srcs {
        backup(&mut alone, std::slice::from_ref(src), &backup_options(2)).unwrap();
    }
    let mut expected = chunks(&alone);
    expected.sort();

    let zero = HashAlgo::Blake3.fingerprint(&vec![0u8; ChunkerConfig::default().max_chunk_size()]);
    let model = Arc::new(Model {
        stored: Mutex::default(),
        zero,
        in_flight: Arc::default(),
        most_in_flight: AtomicUsize::new(0),
    });
    let mut options = backup_options(2);
    options.remote = Some(model.clone());
    let mut one = repo(&dir.path().join("node1"), 1 << 48);
    let mut two = repo(&dir.path().join("node2"), 2 << 48);
    // Sources 0 and 2 through node 1, source 1 through node 2, interleaved.
    backup(&mut one, &srcs[0..1], &options).unwrap();
    let second = backup(&mut two, &srcs[1..2], &options).unwrap();
    backup(&mut one, &srcs[2..3], &options).unwrap();
    let mut got = chunks(&one);
    got.extend(chunks(&two));
    got.sort();
    // The zero chunk is each repository's own: once in each node that met zeros (both
    // did), once alone. Every other chunk is stored once across the nodes, the same
    // chunks as alone.
    for repo in [&one, &two] {
        assert_eq!(chunks(repo).iter().filter(|(fp, _)| *fp == zero).count(), 1);
    }
    assert_eq!(expected.iter().filter(|(fp, _)| *fp == zero).count(), 1);
    got.retain(|(fp, _)| *fp != zero);
    expected.retain(|(fp, _)| *fp != zero);
    let unique: std::collections::HashSet<_> = got.iter().map(|(fp, _)| *fp).collect();
    assert_eq!(
        unique.len(),
        got.len(),
        "a chunk stored twice across the nodes"
    );
    assert!(
        got == expected,
        "the nodes stored other chunks than one repository alone"
    );
    assert!(
        second.chunks_new < second.chunks,
        "node 2 found node 1's shared chunks"
    );
    assert!(
        model.most_in_flight.load(Ordering::SeqCst) >= 2,
        "stage 3 asks the next batch while a lookup is in flight"
    );

    // Containers carry their writer's base; every chunk was acknowledged at the
    // location its container holds it.
    let stored = model.stored.lock().unwrap();
    for repo in [&one, &two] {
        let base = if std::ptr::eq(repo, &one) {
            1u64 << 48
        } else {
            2 << 48
        };
        for name in repo
            .backend()
            .list(larder_store::FileKind::Container)
            .unwrap()
        {
            let id = u64::from_str_radix(&name, 16).unwrap();
            assert_eq!(id >> 48, base >> 48, "container {name}");
            for e in repo
                .load_container_table(id)
                .unwrap()
                .entries
                .into_iter()
                .filter(|e| e.fingerprint != zero)
            {
                let at = ChunkLocation {
                    container: id,
                    offset: e.offset,
                    length: e.stored_len,
                };
                assert_eq!(stored[&e.fingerprint], Some(at));
            }
        }
    }
    assert!(
        stored.values().all(Option::is_some),
        "every new chunk acknowledged"
    );
}

/// A repository with the disk index cannot take part: its stage 3 never asks the
/// remote index, so the backup is refused before it reads anything.
#[test]
fn a_disk_index_repository_refuses_a_cluster_backup() {
    let data = tempfile::tempdir().unwrap();
    let src = data.path().join("src");
    fs::create_dir_all(&src).unwrap();
    fs::write(src.join("file.bin"), bytes(3, 100_000)).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("disk");
    let config = RepoConfig::new(ChunkerConfig::default(), HashAlgo::Blake3).with_index(
        IndexSettings::Disk {
            lookup: DiskLookup::Lazy,
            memory: 4 << 20,
        },
    );
    Repository::init(&root, &config).unwrap();
    let mut repo = Repository::open(&root, LockMode::Exclusive).unwrap();
    let model = Arc::new(Model {
        stored: Mutex::default(),
        zero: HashAlgo::Blake3.fingerprint(&[]),
        in_flight: Arc::default(),
        most_in_flight: AtomicUsize::new(0),
    });
    let mut options = backup_options(2);
    options.remote = Some(model.clone());
    let err = backup(&mut repo, &[src], &options).unwrap_err();
    assert!(
        matches!(&err, EngineError::Remote { retryable: false, message } if message.contains("memory index")),
        "{err}"
    );
    assert!(repo.snapshots().unwrap().0.is_empty());
    assert!(model.stored.lock().unwrap().is_empty(), "nothing was asked");
}
