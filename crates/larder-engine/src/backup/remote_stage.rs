//! Stage 3 with the memory index and a remote index (a cluster's owners): each batch,
//! in stream order, is decided as far as the repository and this backup can, and the
//! rest is asked of the remote index at once, up to [`LOOKUPS_AHEAD`] batches ahead of
//! the oldest one still waiting for its answers. Answers are applied, and batches sent
//! on to stage 4, in stream order, so every decision and recipe is the one asking a
//! batch at a time gave: a fingerprint is in one lookup in flight at most
//! ([`Indexer::ask`]), and a later copy of it is decided not new, as it was once its
//! first copy's answer was in.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use crossbeam_channel::{select, Receiver, RecvTimeoutError};
use larder_index::CuckooIndex;

use super::gate::SerialGate;
use super::index_stage::{Asked, Indexer, StageOut};
use super::read_stage::Batch;
use super::remote::{dropped, RemoteAnswers, RemoteIndex, RemoteLookup};
use crate::error::Result;

/// Lookups a backup keeps in flight. Each holds its batch (up to a block, 8 MiB) in
/// stage 3 until its answers come; one at a time left the owners idle while a batch
/// was chunked, hashed and written, and the node waiting on a round trip per block.
pub(super) const LOOKUPS_AHEAD: usize = 4;

/// How long stage 3 waits on a lookup, with nothing else to do, before it asks stage 4
/// to seal the open container. A fingerprint another backup holds the lock on is
/// answered only once that backup acknowledges it, and a backup acknowledges a chunk
/// only once its container is sealed and written: two backups each holding a chunk the
/// other waits for in an open container would wait until the locks expired (the
/// owner's `--lock-timeout`, 30 s).
const SEAL_AFTER: Duration = Duration::from_millis(50);

/// A batch whose lookup is in flight.
struct Asking {
    batch: Batch,
    asked: Asked,
    lookup: RemoteLookup,
}

/// What stage 3 waits for next.
enum Event {
    /// A batch from stage 2, or `None` once its queue is closed.
    Batch(Option<Batch>),
    /// The answers of the oldest lookup in flight.
    Answered(RemoteAnswers),
    /// Neither, for [`SEAL_AFTER`].
    Waited,
}

/// Runs stage 3 over the batches of `rx`, asking `remote` ahead.
pub(super) fn run(
    indexer: &mut Indexer,
    index: &CuckooIndex,
    remote: &dyn RemoteIndex,
    rx: &Receiver<Batch>,
    out: &StageOut<'_>,
    gate: &SerialGate,
) -> Result<Duration> {
    // In serial mode the stages take turns: one lookup at a time, as before.
    let ahead = if gate.is_serial() { 1 } else { LOOKUPS_AHEAD };
    let mut busy = Duration::ZERO;
    let mut reorder: BTreeMap<u64, Batch> = BTreeMap::new();
    let mut next = 0u64;
    let mut asking: VecDeque<Asking> = VecDeque::new();
    let mut open = true;
    // Whether stage 4 was sent new chunks since its open container was last sealed
    // at this stage's request.
    let mut unsealed = false;
    loop {
        while asking.len() < ahead {
            let Some(batch) = reorder.remove(&next) else {
                break;
            };
            next += 1;
            let span = gate.begin();
            let (asked, lookup) = indexer.ask(index, remote, &batch.fps);
            asking.push_back(Asking {
                batch,
                asked,
                lookup,
            });
            busy += span.end();
        }
        let Some(oldest) = asking.front() else {
            if !open {
                return Ok(busy);
            }
            match rx.recv() {
                Ok(batch) => {
                    reorder.insert(batch.seq, batch);
                }
                Err(_) => open = false,
            }
            continue;
        };
        let event = if open && asking.len() < ahead {
            next_event(rx, oldest)
        } else {
            match wait_oldest(oldest, &mut unsealed, out, gate, &mut busy) {
                Some(answers) => Event::Answered(answers),
                None => return Ok(busy),
            }
        };
        match event {
            Event::Batch(Some(batch)) => {
                reorder.insert(batch.seq, batch);
            }
            Event::Batch(None) => open = false,
            // Stage 2 may be short of buffers that stage 4 holds.
            Event::Waited => {
                if unsealed && !out.seal() {
                    return Ok(busy);
                }
                unsealed = false;
            }
            Event::Answered(answers) => {
                let Asking { batch, asked, .. } = asking.pop_front().expect("the oldest");
                let span = gate.begin();
                let new = indexer.answered(&batch.fps, asked, answers)?;
                let write = indexer.emit(batch, &new, out.progress, out.warnings);
                busy += span.end();
                unsealed |= !write.chunks.is_empty();
                if !out.send(write) {
                    return Ok(busy);
                }
            }
        }
    }
}

/// Waits for the oldest lookup's answers with nothing else to do: stage 3's work, its
/// time counted busy. Past [`SEAL_AFTER`], stage 4 is first asked to seal its open
/// container when it holds chunks sent since it was last asked. `None` once stage 4
/// has stopped.
fn wait_oldest(
    oldest: &Asking,
    unsealed: &mut bool,
    out: &StageOut<'_>,
    gate: &SerialGate,
    busy: &mut Duration,
) -> Option<RemoteAnswers> {
    let span = gate.begin();
    let answers = oldest.lookup.receiver().recv_timeout(SEAL_AFTER);
    *busy += span.end();
    match answers {
        Ok(answers) => return Some(answers),
        Err(RecvTimeoutError::Disconnected) => return Some(Err(dropped())),
        Err(RecvTimeoutError::Timeout) => {}
    }
    if *unsealed && !out.seal() {
        return None;
    }
    *unsealed = false;
    // Outside the gate: in serial mode stage 4 needs it to seal.
    let waited = Instant::now();
    let answers = oldest.lookup.receiver().recv();
    *busy += waited.elapsed();
    Some(answers.unwrap_or_else(|_| Err(dropped())))
}

/// Waits for a batch from stage 2 or the answers of the oldest lookup, whichever comes
/// first, for at most [`SEAL_AFTER`].
fn next_event(rx: &Receiver<Batch>, oldest: &Asking) -> Event {
    select! {
        recv(rx) -> batch => Event::Batch(batch.ok()),
        recv(oldest.lookup.receiver()) -> answers => {
            Event::Answered(answers.unwrap_or_else(|_| Err(dropped())))
        }
        default(SEAL_AFTER) => Event::Waited,
    }
}
