//! Stage 2: fingerprints every chunk of a batch, on several threads; batches may leave
//! out of order (stage 3 puts them back by sequence number). A batch's chunks are
//! hashed together, across SIMD lanes (`ChunkCodec::fingerprint_many`).

use std::time::Duration;

use crossbeam_channel::{Receiver, Sender};
use larder_store::ChunkCodec;

use super::gate::SerialGate;
use super::read_stage::Batch;

/// One fingerprinting thread: takes batches until stage 1 stops.
pub(super) fn run(
    codec: &ChunkCodec,
    gate: &SerialGate,
    rx: &Receiver<Batch>,
    tx: &Sender<Batch>,
) -> Duration {
    let mut busy = Duration::ZERO;
    for mut batch in rx {
        let span = gate.begin();
        let mut chunks = Vec::with_capacity(batch.pieces.iter().map(|p| p.lens.len()).sum());
        for piece in &batch.pieces {
            let mut start = 0;
            for &len in &piece.lens {
                let end = start + len as usize;
                chunks.push(&piece.data[start..end]);
                start = end;
            }
        }
        batch.fps = codec.fingerprint_many(&chunks);
        busy += span.end();
        if tx.send(batch).is_err() {
            break;
        }
    }
    busy
}
