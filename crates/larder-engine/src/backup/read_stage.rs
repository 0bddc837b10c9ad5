//! Stage 1: reads the files a round takes and cuts them into chunks. Small files are
//! read whole and chunked in parallel across files; a large file is read block by
//! block, each block chunked on several threads with exactly the sequential cut points
//! (docs/design/chunking-parallel.md), or chunked and fingerprinted on a device (the
//! GPU: docs/design/gpu.md, "Backups on the GPU"). Batches leave in stream order.

use std::fs::{File, Metadata, OpenOptions};
use std::io::Read;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use larder_chunk::{cut_limit, Chunker, ParallelChunker};
use larder_hash::Fingerprint;
use rayon::prelude::*;

use super::device::ChunkDevice;
use super::gate::{BusySpan, SerialGate};
use crate::block_buf::{block_buffer, read_append};
use crate::error::Warning;

/// Files smaller than this are read whole and chunked in parallel across files.
pub(crate) const SMALL_FILE: u64 = 1 << 20;
/// Bytes a large file is read in; one batch each.
pub(super) const BLOCK: usize = 8 << 20;
/// Small files are grouped into batches of at most this many bytes and files.
pub(crate) const GROUP_BYTES: u64 = 8 << 20;
pub(crate) const GROUP_FILES: usize = 512;

/// Where a large file's bytes are read from, block by block: a file or a pipe, or
/// (`larder copy`) a recipe in another repository.
pub(crate) trait BlockSource {
    /// Appends at most `max` bytes to `buf`; returns how many, 0 at the end.
    fn read_append(&mut self, buf: &mut Vec<u8>, max: usize) -> std::io::Result<usize>;
}

/// A file or pipe as a [`BlockSource`].
struct Fd<'a, F>(&'a F);

impl<F: std::os::fd::AsRawFd> BlockSource for Fd<'_, F> {
    fn read_append(&mut self, buf: &mut Vec<u8>, max: usize) -> std::io::Result<usize> {
        read_append(self.0, buf, max)
    }
}

/// Where a file's bytes come from.
#[derive(Clone, Copy)]
pub(super) enum Source<'a> {
    Path(&'a Path),
    /// Standard input (`backup --stdin`), read to its end.
    Stdin,
}

/// A file stage 1 reads: the walk item it belongs to, and its size when walked.
pub(super) struct FileToRead<'a> {
    pub item: usize,
    pub source: Source<'a>,
    pub size: u64,
}

/// When stage 1 stops taking new files, ending the round: after `bytes` bytes of
/// files taken, or at `deadline`, but never before the first file. A file taken is
/// always read to its end.
pub(super) struct RoundEnd {
    pub bytes: u64,
    pub deadline: Option<Instant>,
}

impl RoundEnd {
    fn reached(&self, taken: u64) -> bool {
        taken >= self.bytes || self.deadline.is_some_and(|d| Instant::now() >= d)
    }
}

/// How a piece of a file ends.
pub(crate) enum PieceEnd {
    More,
    Done { size: u64 },
    Failed(Warning),
}

/// Consecutive bytes of one file, cut into chunks.
pub(crate) struct Piece {
    /// Index into the walk's items.
    pub item: usize,
    pub data: Vec<u8>,
    pub lens: Vec<u32>,
    /// The chunks' fingerprints when a device made them with the cuts; else empty,
    /// for stage 2 to fill.
    pub fps: Vec<Fingerprint>,
    pub end: PieceEnd,
}

impl Piece {
    pub(crate) fn failed(item: usize, warning: Warning) -> Self {
        Self {
            item,
            data: Vec::new(),
            lens: Vec::new(),
            fps: Vec::new(),
            end: PieceEnd::Failed(warning),
        }
    }
}

pub(crate) struct Batch {
    pub seq: u64,
    pub pieces: Vec<Piece>,
    /// One per chunk of `pieces`, in order; filled by stage 2.
    pub fps: Vec<Fingerprint>,
}

/// Opens a file for reading without following a symlink, and without updating its
/// access time where the kernel allows that (`O_NOATIME` needs the file's owner or
/// `CAP_FOWNER`; otherwise it is opened plainly).
fn open_file(path: &Path) -> std::io::Result<File> {
    let open = |flags| {
        OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | flags)
            .open(path)
    };
    match open(libc::O_NOATIME) {
        Err(e) if e.raw_os_error() == Some(libc::EPERM) => open(0),
        other => other,
    }
}

/// Whether a file changed while it was read: any of the fields the skip logic trusts.
fn changed(before: &Metadata, after: &Metadata) -> bool {
    before.len() != after.len()
        || before.mtime() != after.mtime()
        || before.mtime_nsec() != after.mtime_nsec()
        || before.ctime() != after.ctime()
        || before.ctime_nsec() != after.ctime_nsec()
        || before.ino() != after.ino()
}

fn changed_warning(path: &Path) -> Warning {
    Warning::error(path, "file changed while it was read; not backed up")
}

/// Reads and chunks one small file whole.
fn read_small(item: usize, path: &Path, chunker: &dyn Chunker) -> Piece {
    let read = (|| {
        let mut f = open_file(path)?;
        let before = f.metadata()?;
        let mut data = Vec::with_capacity(before.len() as usize);
        f.read_to_end(&mut data)?;
        let after = f.metadata()?;
        Ok::<_, std::io::Error>((data, changed(&before, &after)))
    })();
    match read {
        Ok((_, true)) => Piece::failed(item, changed_warning(path)),
        Ok((data, false)) => {
            let lens = chunker
                .chunk_lengths(&data)
                .into_iter()
                .map(|l| l as u32)
                .collect();
            let size = data.len() as u64;
            Piece {
                item,
                data,
                lens,
                fps: Vec::new(),
                end: PieceEnd::Done { size },
            }
        }
        Err(e) => Piece::failed(item, Warning::error(path, format!("cannot read file: {e}"))),
    }
}

/// Block buffers travel from stage 1 down the pipeline and back here, so that large
/// files are read without fresh allocations (page faults) or zero-filling.
pub(crate) struct BufferPool {
    pub free: Receiver<Vec<u8>>,
    pub size: usize,
}

impl BufferPool {
    /// An empty buffer with room for `size` bytes.
    fn get(&self) -> Vec<u8> {
        let mut buf = self
            .free
            .try_recv()
            .unwrap_or_else(|_| block_buffer(self.size));
        buf.clear();
        buf
    }
}

/// Hands block buffers back to stage 1; dropped if the pool is full or they are not
/// block buffers.
pub(super) fn recycle(pool: &Sender<Vec<u8>>, buffers: impl IntoIterator<Item = Vec<u8>>) {
    for data in buffers {
        if data.capacity() >= BLOCK {
            let _ = pool.try_send(data);
        }
    }
}

/// Stage 1's view of the pipeline: its threads, buffers and queue.
pub(crate) struct Reader<'a, 'g> {
    pub chunker: &'a dyn Chunker,
    /// Chunks and fingerprints large files' blocks instead of `chunker` and stage 2;
    /// small files stay on the CPU, where a device's per-call cost would outweigh them.
    pub device: Option<&'a Mutex<Box<dyn ChunkDevice>>>,
    pub threads: &'a rayon::ThreadPool,
    pub pool: &'a BufferPool,
    pub gate: &'g SerialGate,
    pub tx: &'a Sender<Batch>,
}

impl<'g> Reader<'_, 'g> {
    /// Reads `files` in order until the round's end, sending batches in stream order.
    /// Returns the time worked and how many of `files` were taken.
    pub(super) fn run(&self, files: &[FileToRead<'_>], end: &RoundEnd) -> (Duration, usize) {
        let mut busy = Duration::ZERO;
        let mut seq = 0u64;
        let mut send = |pieces: Vec<Piece>, span: BusySpan<'g>, busy: &mut Duration| -> bool {
            *busy += span.end();
            let ok = self
                .tx
                .send(Batch {
                    seq,
                    pieces,
                    fps: Vec::new(),
                })
                .is_ok();
            seq += 1;
            ok
        };
        let mut group: Vec<(usize, &Path)> = Vec::new();
        let mut group_bytes = 0u64;
        let mut taken_bytes = 0u64;
        let mut taken = 0;
        for file in files {
            // Every round takes at least one file, so rounds always make progress.
            if taken > 0 && end.reached(taken_bytes) {
                break;
            }
            taken += 1;
            taken_bytes += file.size;
            if let (Source::Path(path), true) = (file.source, file.size < SMALL_FILE) {
                group.push((file.item, path));
                group_bytes += file.size;
                if group.len() >= GROUP_FILES || group_bytes >= GROUP_BYTES {
                    let span = self.gate.begin();
                    let pieces = self.read_group(&mut group);
                    group_bytes = 0;
                    if !send(pieces, span, &mut busy) {
                        return (busy, taken);
                    }
                }
                continue;
            }
            if !group.is_empty() {
                let span = self.gate.begin();
                let pieces = self.read_group(&mut group);
                group_bytes = 0;
                if !send(pieces, span, &mut busy) {
                    return (busy, taken);
                }
            }
            if !self.read_large(
                file,
                &mut |piece, span, busy| send(vec![piece], span, busy),
                &mut busy,
            ) {
                return (busy, taken);
            }
        }
        if !group.is_empty() {
            let span = self.gate.begin();
            let pieces = self.read_group(&mut group);
            send(pieces, span, &mut busy);
        }
        (busy, taken)
    }

    /// Reads and chunks a group of small files on the stage's own threads, so that
    /// `threads` bounds stage 1 as it bounds the others.
    fn read_group(&self, group: &mut Vec<(usize, &Path)>) -> Vec<Piece> {
        let pieces = self.threads.install(|| {
            group
                .par_iter()
                .map(|&(item, path)| read_small(item, path, self.chunker))
                .collect()
        });
        group.clear();
        pieces
    }

    /// Reads a large file (or standard input) block by block. A chunk is cut only
    /// when at least `max_size` bytes follow its start or the file has ended, so cut
    /// points equal those of chunking the whole file at once; the uncut tail is
    /// carried into the next block.
    fn read_large(
        &self,
        file: &FileToRead<'_>,
        send: &mut dyn FnMut(Piece, BusySpan<'g>, &mut Duration) -> bool,
        busy: &mut Duration,
    ) -> bool {
        let span = self.gate.begin();
        match file.source {
            Source::Path(path) => {
                let opened = open_file(path).and_then(|f| f.metadata().map(|m| (f, m)));
                match opened {
                    Ok((f, before)) => {
                        let after = || f.metadata();
                        self.read_blocks(
                            file.item,
                            path,
                            &mut Fd(&f),
                            Some((&before, &after)),
                            span,
                            send,
                            busy,
                        )
                    }
                    Err(e) => send(
                        Piece::failed(
                            file.item,
                            Warning::error(path, format!("cannot read file: {e}")),
                        ),
                        span,
                        busy,
                    ),
                }
            }
            Source::Stdin => {
                let stdin = std::io::stdin();
                self.read_blocks(
                    file.item,
                    Path::new("<stdin>"),
                    &mut Fd(&stdin),
                    None,
                    span,
                    send,
                    busy,
                )
            }
        }
    }

    /// Reads `source` to its end in blocks and sends each chunked block; `check` is
    /// the metadata before reading and how to get it after, for a file.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn read_blocks(
        &self,
        item: usize,
        path: &Path,
        source: &mut dyn BlockSource,
        check: Option<(&Metadata, &dyn Fn() -> std::io::Result<Metadata>)>,
        mut span: BusySpan<'g>,
        send: &mut dyn FnMut(Piece, BusySpan<'g>, &mut Duration) -> bool,
        busy: &mut Duration,
    ) -> bool {
        let chunker = ParallelChunker::new(self.chunker, self.threads);
        // `carry` holds the uncut tail of the previous block, less than `max_size` bytes.
        let mut carry: Vec<u8> = Vec::new();
        let mut total = 0u64;
        loop {
            let mut buf = self.pool.get();
            buf.extend_from_slice(&carry);
            let mut eof = false;
            while buf.len() < BLOCK {
                let room = BLOCK - buf.len();
                match source.read_append(&mut buf, room) {
                    Ok(0) => {
                        eof = true;
                        break;
                    }
                    Ok(_) => {}
                    Err(e) => {
                        let w = Warning::error(path, format!("cannot read file: {e}"));
                        return send(Piece::failed(item, w), span, busy);
                    }
                }
            }
            let (lens, fps, pos) = match self.device {
                None => {
                    let block = chunker.chunk_block(&buf, eof);
                    // A chunk is at most 16 MiB (`ChunkerConfig`'s largest maximum).
                    let lens = block.lengths.iter().map(|&len| len as u32).collect();
                    (lens, Vec::new(), block.consumed)
                }
                Some(device) => match on_device(device, &buf, eof, self.chunker.max_size()) {
                    Ok(cut) => cut,
                    Err(e) => {
                        let w = Warning::error(path, format!("the GPU failed: {e}"));
                        return send(Piece::failed(item, w), span, busy);
                    }
                },
            };
            carry.clear();
            carry.extend_from_slice(&buf[pos..]);
            buf.truncate(pos);
            total += buf.len() as u64;
            let end = match (eof, check) {
                (false, _) => PieceEnd::More,
                (true, None) => PieceEnd::Done { size: total },
                (true, Some((before, after))) => match after() {
                    Ok(after) if changed(before, &after) => PieceEnd::Failed(changed_warning(path)),
                    Ok(_) => PieceEnd::Done { size: total },
                    Err(e) => PieceEnd::Failed(Warning::error(path, e)),
                },
            };
            let piece = Piece {
                item,
                data: buf,
                lens,
                fps,
                end,
            };
            if !send(piece, span, busy) {
                return false;
            }
            if eof {
                return true;
            }
            span = self.gate.begin();
        }
    }
}

/// The chunks of block `buf` whose cut is final, cut and fingerprinted by `device`:
/// it chunks the block as a whole stream (the block starts at a chunk boundary), and
/// the chunks starting before [`cut_limit`] are kept, exactly those the CPU path cuts.
/// Returns their lengths, fingerprints and the bytes they cover.
fn on_device(
    device: &Mutex<Box<dyn ChunkDevice>>,
    buf: &[u8],
    eof: bool,
    max_size: usize,
) -> Result<(Vec<u32>, Vec<Fingerprint>, usize), String> {
    let chunks = device
        .lock()
        .map_err(|_| "a stage using the device panicked".to_string())?
        .chunk_and_hash(buf)?;
    let limit = cut_limit(buf.len(), max_size, eof);
    let mut pos = 0;
    let kept = chunks
        .iter()
        .take_while(|(len, _)| {
            let start = pos;
            pos += *len as usize;
            start < limit
        })
        .count();
    let (lens, fps) = chunks[..kept].iter().copied().unzip();
    let covered = chunks[..kept].iter().map(|&(len, _)| len as usize).sum();
    Ok((lens, fps, covered))
}
