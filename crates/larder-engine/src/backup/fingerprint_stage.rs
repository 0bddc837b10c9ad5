//! Stage 2: fingerprints every chunk of a batch, on several threads; batches may leave
//! out of order (stage 3 puts them back by sequence number). A batch's chunks are
//! hashed together, across SIMD lanes (`ChunkCodec::fingerprint_many`), but for those
//! of pieces a device already fingerprinted.

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
        // Pieces a device fingerprinted with its cuts keep their fingerprints.
        let mut chunks = Vec::new();
        for piece in batch.pieces.iter().filter(|p| p.fps.len() != p.lens.len()) {
            let mut start = 0;
            for &len in &piece.lens {
                let end = start + len as usize;
                chunks.push(&piece.data[start..end]);
                start = end;
            }
        }
        let mut hashed = codec.fingerprint_many(&chunks).into_iter();
        let mut fps = Vec::with_capacity(batch.pieces.iter().map(|p| p.lens.len()).sum());
        for piece in &batch.pieces {
            match piece.fps.len() == piece.lens.len() {
                true => fps.extend_from_slice(&piece.fps),
                false => fps.extend(hashed.by_ref().take(piece.lens.len())),
            }
        }
        batch.fps = fps;
        busy += span.end();
        if tx.send(batch).is_err() {
            break;
        }
    }
    busy
}
