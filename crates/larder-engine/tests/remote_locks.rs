//! A backup waiting on a remote index's lock held by another backup, which waits in
//! turn on a chunk this backup holds in its open container: a cluster's owners answer
//! a fingerprint locked by another backup only once that backup acknowledges it, and a
//! backup acknowledges chunks only once their container is sealed and written
//! (docs/design/cluster.md, "Lock on new"). Stage 3 seals the open container when a
//! lookup keeps it waiting, so the backup finishes without a lock running out
//! (docs/design/pipeline.md, "Stage 3 with a remote index").

use std::collections::HashSet;
use std::fs;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use larder_chunk::ChunkerConfig;
use larder_engine::{backup, EngineError, RemoteAnswers, RemoteIndex, RemoteLookup};
use larder_hash::{Fingerprint, HashAlgo};
use larder_index::ChunkLocation;
use larder_store::{FileKind, LockMode, RepoConfig, Repository};

#[path = "support/bytes.rs"]
mod seeded;
use seeded::bytes;

#[path = "support/options.rs"]
mod options;
use options::backup_options;

/// How long a lookup waits on another backup's lock before the model gives up: far
/// longer than a prompt acknowledgement takes, far shorter than the cluster's 30 s.
const LOCK_WAIT: Duration = Duration::from_secs(10);

/// Where the other backup stores the chunks it holds.
const OTHERS: ChunkLocation = ChunkLocation {
    container: 9 << 48,
    offset: 0,
    length: 1,
};

/// The chunk index as the owners keep it, with another backup in it: that backup holds
/// the locks of `held` and acknowledges them only once this backup has acknowledged
/// every chunk of `awaited`.
struct Owners {
    held: HashSet<Fingerprint>,
    awaited: HashSet<Fingerprint>,
    state: Arc<Mutex<State>>,
}

#[derive(Default)]
struct State {
    acknowledged: HashSet<Fingerprint>,
    asked: HashSet<Fingerprint>,
    released: bool,
}

impl RemoteIndex for Owners {
    /// Answers from another thread once none of `fps` is held by the other backup:
    /// those are then stored (at [`OTHERS`]), the rest new, locked for this backup.
    fn lookup(&self, fps: Vec<Fingerprint>) -> RemoteLookup {
        let state = self.state.clone();
        let waits = fps.iter().any(|fp| self.held.contains(fp));
        let held = self.held.clone();
        let (reply, lookup) = RemoteLookup::channel();
        std::thread::spawn(move || reply.send(answer(&state, &fps, &held, waits)));
        lookup
    }

    fn acknowledge(&self, entries: &[(Fingerprint, ChunkLocation)]) -> Result<(), EngineError> {
        let mut state = self.state.lock().unwrap();
        state.acknowledged.extend(entries.iter().map(|(fp, _)| *fp));
        if self.awaited.is_subset(&state.acknowledged) {
            state.released = true;
        }
        Ok(())
    }
}

fn answer(
    state: &Mutex<State>,
    fps: &[Fingerprint],
    held: &HashSet<Fingerprint>,
    waits: bool,
) -> RemoteAnswers {
    let asked = Instant::now();
    while waits && !state.lock().unwrap().released {
        if asked.elapsed() > LOCK_WAIT {
            return Err(EngineError::Remote {
                message: format!("a lookup waited {LOCK_WAIT:?} on another backup's locks"),
                retryable: false,
            });
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut state = state.lock().unwrap();
    state.asked.extend(fps);
    Ok(fps
        .iter()
        .map(|fp| held.contains(fp).then_some(OTHERS))
        .collect())
}

/// Each chunk's fingerprint, as the default chunker cuts `data`.
fn fingerprints(data: &[u8]) -> HashSet<Fingerprint> {
    let chunker = ChunkerConfig::default().build();
    let mut at = 0;
    chunker
        .chunk_lengths(data)
        .into_iter()
        .map(|len| {
            at += len;
            HashAlgo::Blake3.fingerprint(&data[at - len..at])
        })
        .collect()
}

#[test]
fn a_lookup_held_by_another_backup_has_the_open_container_sealed() {
    // Two large files, a batch each, 2 MiB together less than a container: without a
    // seal, the first file's chunks stay in the open container until the backup ends.
    let (first, second) = (bytes(31, 1 << 20), bytes(32, 1 << 20));
    let data = tempfile::tempdir().unwrap();
    let src = data.path().join("src");
    fs::create_dir_all(&src).unwrap();
    fs::write(src.join("a.bin"), &first).unwrap();
    fs::write(src.join("b.bin"), &second).unwrap();

    let owners = Arc::new(Owners {
        held: fingerprints(&second),
        awaited: fingerprints(&first),
        state: Arc::default(),
    });
    let dir = tempfile::tempdir().unwrap();
    let mut config = RepoConfig::new(ChunkerConfig::default(), HashAlgo::Blake3);
    config.container_base = 1 << 48;
    Repository::init(dir.path(), &config).unwrap();
    let mut repo = Repository::open(dir.path(), LockMode::Exclusive).unwrap();
    let mut options = backup_options(2);
    options.remote = Some(owners.clone());
    backup(&mut repo, &[src], &options).unwrap();

    let state = owners.state.lock().unwrap();
    assert!(state.released, "the other backup's locks were released");
    assert!(
        owners.held.is_subset(&state.asked),
        "the second file was asked"
    );
    assert!(owners.awaited.is_subset(&state.acknowledged));
    // The second file's chunks are the other backup's: stored there, not here.
    let mut here = HashSet::new();
    for name in repo.backend().list(FileKind::Container).unwrap() {
        let id = u64::from_str_radix(&name, 16).unwrap();
        let entries = repo.load_container_table(id).unwrap().entries;
        here.extend(entries.iter().map(|e| e.fingerprint));
    }
    assert!(owners.awaited.is_subset(&here));
    assert!(owners.held.is_disjoint(&here));
}
