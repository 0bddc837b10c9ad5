//! Stage 1: reads the files a round takes and cuts them into chunks. Small files are
//! read whole and chunked in parallel across files; a large file is read block by
//! block, each block chunked on several threads with exactly the sequential cut points
//! (docs/design/chunking-parallel.md), or chunked and fingerprinted on a device (the
//! GPU: docs/design/gpu.md, "Backups on the GPU"). Batches leave in stream order.
//!
//! The size the walk saw only sorts a file into small or large: it never bounds what
//! is read. A small file is read whole only up to [`SMALL_SLACK`] bytes past that size;
//! one that holds more (it grew, or it is a pseudo-file such as `/proc/PID/pagemap`,
//! whose size says 0 and which yields gigabytes) is read on in blocks, as a large file
//! is. Memory is therefore bounded by the pipeline's buffers whatever the files hold.
//! A file whose metadata changed while it was read is stored as read, marked, with a
//! warning (docs/design/format.md, "Tree stream").

use std::fs::{File, Metadata, OpenOptions};
use std::io::{self, Read};
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
use crate::meta::read_attr_flags;

/// Files the walk saw smaller than this are read whole and chunked in parallel across
/// files.
pub(crate) const SMALL_FILE: u64 = 1 << 20;
/// Bytes a small file may hold past the size the walk saw and still be read whole; one
/// that holds more is read on in blocks. A group of small files so holds at most
/// `GROUP_BYTES + GROUP_FILES * (SMALL_SLACK + 1)` bytes (16 MiB), whatever its files
/// hold.
const SMALL_SLACK: u64 = 16 << 10;
/// Bytes a large file is read in; one batch each.
pub(super) const BLOCK: usize = 8 << 20;
/// What every read of a block asks for a multiple of.
const READ_ALIGN: usize = 4096;
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
    /// A file at a path, and the identity the walk saw there (`None` in tests that
    /// read files no walk listed).
    Path(&'a Path, Option<FileId>),
    /// Standard input (`backup --stdin`), read to its end.
    Stdin,
}

/// A file's identity as `lstat` gave it to the walk: its device and inode. The file
/// opened for reading must have the same, so that a path whose parent was swapped for
/// a symlink since the walk (by a user who can write there) is refused instead of
/// read: a cluster job or a root backup never stores a file the walk did not list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct FileId {
    pub device: u64,
    pub inode: u64,
}

/// A file stage 1 reads: the walk item it belongs to, and its size when walked (which
/// decides how it is read, never how much).
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
    Done(FileEnd),
    Failed(Warning),
}

/// What stage 1 found of a file it read to its end.
pub(crate) struct FileEnd {
    /// The bytes read.
    pub size: u64,
    /// Its attribute flags (`chattr`), read from the descriptor it was read through;
    /// `None` where it was not read from a file (standard input, a copy).
    pub attr_flags: Option<u32>,
    /// It changed while it was read: the warning that says so. Its bytes are stored
    /// as read, and its entry is marked.
    pub changed: Option<Warning>,
}

impl FileEnd {
    /// The end of a stream that is not a file: `size` bytes, nothing else known.
    pub(crate) fn sized(size: u64) -> Self {
        Self {
            size,
            attr_flags: None,
            changed: None,
        }
    }
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

/// Opens a file for reading without following a symlink, without blocking (a FIFO
/// put in its place since the walk would block `open` until a writer came), and
/// without updating its access time where the kernel allows that (`O_NOATIME` needs
/// the file's owner or `CAP_FOWNER`; otherwise it is opened plainly). `O_NONBLOCK`
/// changes nothing for a regular file's reads; a pseudo-file that honours it
/// (`/proc/kmsg`) fails with `EAGAIN` instead of blocking the backup forever.
fn open_file(path: &Path) -> std::io::Result<File> {
    let open = |flags| {
        OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | flags)
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

fn read_failed(path: &Path, e: impl std::fmt::Display) -> Warning {
    Warning::error(path, format!("cannot read file: {e}"))
}

/// A file open for reading, and its metadata before the first read.
struct Opened<'p> {
    item: usize,
    path: &'p Path,
    file: File,
    before: Metadata,
}

impl<'p> Opened<'p> {
    /// Opens the file at `path`, which must still be a regular file, and the one the
    /// walk listed (`walked`).
    fn open(item: usize, path: &'p Path, walked: Option<FileId>) -> io::Result<Self> {
        let file = open_file(path)?;
        let before = file.metadata()?;
        if !before.is_file() {
            return Err(io::Error::other(
                "it is no longer a regular file (replaced since it was listed)",
            ));
        }
        let now = FileId {
            device: before.dev(),
            inode: before.ino(),
        };
        if walked.is_some_and(|w| w != now) {
            return Err(io::Error::other(
                "it is another file than the one listed (it or a directory above it \
                 was replaced since)",
            ));
        }
        Ok(Self {
            item,
            path,
            file,
            before,
        })
    }

    /// How the file ends once `size` bytes were read to its end: its attribute flags,
    /// and whether its metadata changed since it was opened.
    fn end(&self, size: u64) -> PieceEnd {
        match self.file.metadata() {
            Ok(after) => PieceEnd::Done(FileEnd {
                size,
                attr_flags: Some(read_attr_flags(&self.file)),
                changed: changed(&self.before, &after).then(|| {
                    Warning::error(
                        self.path,
                        "file changed while it was read; stored as read and marked \
                         changed in the snapshot",
                    )
                }),
            }),
            Err(e) => PieceEnd::Failed(read_failed(self.path, e)),
        }
    }
}

/// A small file waiting in a group: its item, its path with the identity the walk
/// listed it with, and its walked size.
type SmallFile<'p> = (usize, (&'p Path, Option<FileId>), u64);

/// What reading one file of a group of small files gave.
enum SmallRead<'p> {
    /// The file, read whole and chunked (or why it could not be).
    Whole(Piece),
    /// A file holding more than [`SMALL_SLACK`] bytes past its walked size, and the
    /// bytes read from it so far: it is read on in blocks.
    Longer(Opened<'p>, Vec<u8>),
}

/// Reads and chunks one small file whole, if it holds at most `walked + SMALL_SLACK`
/// bytes (`walked`: its size when walked).
fn read_small<'p>(
    item: usize,
    (path, id): (&'p Path, Option<FileId>),
    walked: u64,
    chunker: &dyn Chunker,
) -> SmallRead<'p> {
    let read = (|| {
        let opened = Opened::open(item, path, id)?;
        let limit = walked.saturating_add(SMALL_SLACK);
        let mut data = Vec::new();
        let ended = read_up_to(
            &opened.file,
            &mut data,
            opened.before.len().min(limit),
            limit,
        )?;
        Ok::<_, io::Error>((opened, data, ended))
    })();
    match read {
        Err(e) => SmallRead::Whole(Piece::failed(item, read_failed(path, e))),
        Ok((opened, data, false)) => SmallRead::Longer(opened, data),
        Ok((opened, data, true)) => {
            let end = opened.end(data.len() as u64);
            if let PieceEnd::Failed(w) = end {
                return SmallRead::Whole(Piece::failed(item, w));
            }
            let lens = chunker
                .chunk_lengths(&data)
                .into_iter()
                .map(|l| l as u32)
                .collect();
            SmallRead::Whole(Piece {
                item,
                data,
                lens,
                fps: Vec::new(),
                end,
            })
        }
    }
}

/// Reads `file` into `data` to its end, unless it holds more than `limit` bytes:
/// returns whether it ended, having read at most `limit + SMALL_SLACK + 32` bytes.
/// As `read_to_end` does, it reads the `expected` bytes (the size `fstat` gives, at
/// most `limit`), then probes for the end with a small read, so that a file that holds
/// what it says takes no more memory than that; reads after the probe ask for
/// [`SMALL_SLACK`] bytes. Every read asks for a multiple of 8 bytes but the first
/// (`expected`, which pseudo-files give as 0): `/proc/PID/pagemap` refuses others.
fn read_up_to(file: &File, data: &mut Vec<u8>, expected: u64, limit: u64) -> io::Result<bool> {
    while (data.len() as u64) < expected {
        if read_append(file, data, (expected - data.len() as u64) as usize)? == 0 {
            return Ok(true);
        }
    }
    let mut probe = [0u8; 32];
    let n = loop {
        match (&*file).read(&mut probe) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            other => break other?,
        }
    };
    if n == 0 {
        return Ok(true);
    }
    data.extend_from_slice(&probe[..n]);
    while data.len() as u64 <= limit {
        if read_append(file, data, SMALL_SLACK as usize)? == 0 {
            return Ok(true);
        }
    }
    Ok(false)
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
        let mut group: Vec<SmallFile<'_>> = Vec::new();
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
            if let (Source::Path(path, id), true) = (file.source, file.size < SMALL_FILE) {
                group.push((file.item, (path, id), file.size));
                group_bytes += file.size;
                if group.len() >= GROUP_FILES || group_bytes >= GROUP_BYTES {
                    group_bytes = 0;
                    if !self.read_group(&mut group, &mut send, &mut busy) {
                        return (busy, taken);
                    }
                }
                continue;
            }
            if !group.is_empty() && !self.read_group(&mut group, &mut send, &mut busy) {
                return (busy, taken);
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
            self.read_group(&mut group, &mut send, &mut busy);
        }
        (busy, taken)
    }

    /// Reads and chunks a group of small files (item, path, walked size) on the
    /// stage's own threads, so that `threads` bounds stage 1 as it bounds the others,
    /// and sends them in order: those read whole in batches, and each one that holds
    /// more than it may ([`SmallRead::Longer`]) read on in blocks between them.
    /// Returns `false` once the queue is closed.
    fn read_group(
        &self,
        group: &mut Vec<SmallFile<'_>>,
        send: &mut dyn FnMut(Vec<Piece>, BusySpan<'g>, &mut Duration) -> bool,
        busy: &mut Duration,
    ) -> bool {
        // At most one span is held at a time: in serial mode each holds the gate.
        let mut span = Some(self.gate.begin());
        let reads: Vec<SmallRead<'_>> = self.threads.install(|| {
            group
                .par_iter()
                .map(|&(item, path, walked)| read_small(item, path, walked, self.chunker))
                .collect()
        });
        group.clear();
        let mut pieces = Vec::new();
        for read in reads {
            match read {
                SmallRead::Whole(piece) => pieces.push(piece),
                SmallRead::Longer(opened, data) => {
                    if !pieces.is_empty() {
                        let span = span.take().unwrap_or_else(|| self.gate.begin());
                        if !send(std::mem::take(&mut pieces), span, busy) {
                            return false;
                        }
                    }
                    let span = span.take().unwrap_or_else(|| self.gate.begin());
                    let mut send_one =
                        |piece, span, busy: &mut Duration| send(vec![piece], span, busy);
                    if !self.read_opened(&opened, data, span, &mut send_one, busy) {
                        return false;
                    }
                }
            }
        }
        match (pieces.is_empty(), span) {
            (true, Some(span)) => {
                *busy += span.end();
                true
            }
            (true, None) => true,
            (false, span) => send(pieces, span.unwrap_or_else(|| self.gate.begin()), busy),
        }
    }

    /// Reads an opened file on in blocks after the bytes `read` already read from it.
    fn read_opened(
        &self,
        opened: &Opened<'_>,
        read: Vec<u8>,
        span: BusySpan<'g>,
        send: &mut dyn FnMut(Piece, BusySpan<'g>, &mut Duration) -> bool,
        busy: &mut Duration,
    ) -> bool {
        let end = |size| opened.end(size);
        self.read_blocks_after(
            read,
            opened.item,
            opened.path,
            &mut Fd(&opened.file),
            Some(&end),
            span,
            send,
            busy,
        )
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
            Source::Path(path, id) => match Opened::open(file.item, path, id) {
                Ok(opened) => self.read_opened(&opened, Vec::new(), span, send, busy),
                Err(e) => send(Piece::failed(file.item, read_failed(path, e)), span, busy),
            },
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

    /// Reads `source` to its end in blocks and sends each chunked block; `end` gives
    /// the last piece's end from the bytes read, for a file (`None`: nothing to check).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn read_blocks(
        &self,
        item: usize,
        path: &Path,
        source: &mut dyn BlockSource,
        end: Option<&dyn Fn(u64) -> PieceEnd>,
        span: BusySpan<'g>,
        send: &mut dyn FnMut(Piece, BusySpan<'g>, &mut Duration) -> bool,
        busy: &mut Duration,
    ) -> bool {
        self.read_blocks_after(Vec::new(), item, path, source, end, span, send, busy)
    }

    /// [`Reader::read_blocks`] for a source whose first bytes, `read` (fewer than
    /// [`BLOCK`]), were read already.
    #[allow(clippy::too_many_arguments)]
    fn read_blocks_after(
        &self,
        read: Vec<u8>,
        item: usize,
        path: &Path,
        source: &mut dyn BlockSource,
        end: Option<&dyn Fn(u64) -> PieceEnd>,
        mut span: BusySpan<'g>,
        send: &mut dyn FnMut(Piece, BusySpan<'g>, &mut Duration) -> bool,
        busy: &mut Duration,
    ) -> bool {
        let chunker = ParallelChunker::new(self.chunker, self.threads);
        // `carry` holds the bytes not cut yet: the uncut tail of the previous block
        // (less than `max_size` bytes), or at first the bytes read already.
        let mut carry: Vec<u8> = read;
        let mut total = 0u64;
        loop {
            let mut buf = self.pool.get();
            buf.extend_from_slice(&carry);
            let mut eof = false;
            // Every read asks for whole pages, as some pseudo-files require
            // (`/proc/PID/pagemap`: multiples of 8 bytes); the block is full once less
            // than a page is left. Cut points do not depend on where blocks end.
            while BLOCK - buf.len() >= READ_ALIGN {
                let room = (BLOCK - buf.len()) / READ_ALIGN * READ_ALIGN;
                match source.read_append(&mut buf, room) {
                    Ok(0) => {
                        eof = true;
                        break;
                    }
                    Ok(_) => {}
                    Err(e) => return send(Piece::failed(item, read_failed(path, e)), span, busy),
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
            let piece_end = match (eof, end) {
                (false, _) => PieceEnd::More,
                (true, None) => PieceEnd::Done(FileEnd::sized(total)),
                (true, Some(end)) => end(total),
            };
            let piece = Piece {
                item,
                data: buf,
                lens,
                fps,
                end: piece_end,
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

#[cfg(test)]
mod tests {
    use std::io::Write;

    use crossbeam_channel::unbounded;
    use larder_chunk::ChunkerConfig;

    use super::*;

    /// Reads `files` (path, size the walk saw) with stage 1 and returns every piece it
    /// sent, in order.
    fn read_all(files: &[(&Path, u64)]) -> Vec<Piece> {
        let listed: Vec<_> = files.iter().map(|&(p, size)| (p, size, None)).collect();
        read_listed(&listed)
    }

    /// As [`read_all`], each file with the identity the walk saw.
    fn read_listed(files: &[(&Path, u64, Option<FileId>)]) -> Vec<Piece> {
        let chunker = ChunkerConfig::default().build();
        let threads = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        let (_free_tx, free) = unbounded();
        let pool = BufferPool {
            free,
            size: BLOCK + chunker.max_size(),
        };
        let gate = SerialGate::new(false);
        let (tx, rx) = unbounded();
        let reader = Reader {
            chunker: chunker.as_ref(),
            device: None,
            threads: &threads,
            pool: &pool,
            gate: &gate,
            tx: &tx,
        };
        let to_read: Vec<FileToRead<'_>> = files
            .iter()
            .enumerate()
            .map(|(item, &(path, size, id))| FileToRead {
                item,
                source: Source::Path(path, id),
                size,
            })
            .collect();
        let end = RoundEnd {
            bytes: u64::MAX,
            deadline: None,
        };
        reader.run(&to_read, &end);
        drop(tx);
        rx.iter().flat_map(|batch: Batch| batch.pieces).collect()
    }

    /// Guards against reading a small file whole whatever it holds: a file the walk
    /// saw empty that holds 20 MiB by the time it is read (a pseudo-file such as
    /// `/proc/PID/pagemap` says 0 and yields gigabytes) is read in pieces of at most a
    /// block, all of its bytes, in order, between the files around it.
    #[test]
    fn a_file_holding_more_than_the_walk_saw_is_read_in_blocks() {
        let dir = tempfile::tempdir().unwrap();
        let content: Vec<u8> = (0..20u32 << 20)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
            .collect();
        let paths = ["before", "grown", "after"].map(|n| dir.path().join(n));
        std::fs::write(&paths[0], b"small").unwrap();
        std::fs::File::create(&paths[1])
            .unwrap()
            .write_all(&content)
            .unwrap();
        std::fs::write(&paths[2], b"also small").unwrap();
        let pieces = read_all(&[(&paths[0], 5), (&paths[1], 0), (&paths[2], 10)]);
        let largest = pieces.iter().map(|p| p.data.len()).max().unwrap();
        assert!(largest <= BLOCK, "a piece of {largest} bytes");
        let items: Vec<usize> = pieces.iter().map(|p| p.item).collect();
        assert_eq!(items.first(), Some(&0));
        assert_eq!(items.last(), Some(&2));
        assert!(
            items.windows(2).all(|w| w[0] <= w[1]),
            "out of order: {items:?}"
        );
        let read: Vec<u8> = pieces
            .iter()
            .filter(|p| p.item == 1)
            .flat_map(|p| p.data.iter().copied())
            .collect();
        assert!(read == content, "the bytes read differ from the file's");
        let ends: Vec<u64> = pieces
            .iter()
            .filter_map(|p| match &p.end {
                PieceEnd::Done(end) => Some(end.size),
                _ => None,
            })
            .collect();
        assert_eq!(ends, [5, 20 << 20, 10]);
    }

    /// Guards against a FIFO put in a file's place after the walk hanging the backup
    /// (`open` waits for a writer): it is refused at once, naming why.
    #[test]
    fn a_fifo_in_a_files_place_is_refused_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("was-a-file");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: `c` is a valid NUL-terminated path; mkfifo does not retain it.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
        let (tx, rx) = std::sync::mpsc::channel();
        let path = fifo.clone();
        std::thread::spawn(move || {
            let _ = tx.send(read_all(&[(&path, 10)]));
        });
        let pieces = rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("reading a FIFO blocked");
        assert!(
            matches!(&pieces[0].end, PieceEnd::Failed(w) if w.message.contains("no longer a regular file")),
            "{:?}",
            pieces.iter().map(|p| p.data.len()).collect::<Vec<_>>()
        );
    }

    /// A pseudo-file whose size says 0 is read to its end all the same.
    #[test]
    fn a_proc_file_that_says_it_is_empty_is_read() {
        let path = Path::new("/proc/self/status");
        if !path.exists() {
            eprintln!("skipped: no /proc here");
            return;
        }
        let pieces = read_all(&[(path, 0)]);
        assert_eq!(pieces.len(), 1);
        assert!(matches!(&pieces[0].end, PieceEnd::Done(end) if end.size > 0));
        assert!(pieces[0].data.starts_with(b"Name:"));
    }

    /// Guards against a user who can write beside a listed file swapping a directory
    /// above it for a symlink between the walk and the read (a cluster job's granted
    /// path, a root backup of a shared directory): the file the symlink leads to is
    /// not read, whether it is small or large.
    #[test]
    fn a_file_reached_through_a_parent_swapped_since_the_walk_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let listed = dir.path().join("shared/file");
        std::fs::create_dir(dir.path().join("shared")).unwrap();
        std::fs::write(&listed, b"public").unwrap();
        let meta = std::fs::symlink_metadata(&listed).unwrap();
        let walked = Some(FileId {
            device: meta.dev(),
            inode: meta.ino(),
        });
        std::fs::create_dir(dir.path().join("secret")).unwrap();
        std::fs::write(dir.path().join("secret/file"), vec![7u8; 3 << 20]).unwrap();
        std::fs::rename(dir.path().join("shared"), dir.path().join("moved")).unwrap();
        std::os::unix::fs::symlink(dir.path().join("secret"), dir.path().join("shared")).unwrap();
        for size in [6, 3 << 20] {
            let pieces = read_listed(&[(&listed, size, walked)]);
            assert!(
                pieces.iter().all(|p| p.data.is_empty()),
                "secret bytes read"
            );
            assert!(
                matches!(&pieces[0].end, PieceEnd::Failed(w) if w.message.contains("another file")),
                "a swapped parent was followed"
            );
        }
    }
}
