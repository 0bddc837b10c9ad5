//! Real files from the system as one buffer, for tests and benchmarks on real data:
//! binaries, libraries, text and compressed files mixed as in a backup.

use std::fs::File;
use std::io::Read;
use std::path::Path;

/// Where to read from, and how many bytes to take from each directory at most.
pub struct Source {
    pub dir: &'static str,
    pub bytes: usize,
}

/// No single file may fill more than this, so that the buffer mixes many formats.
pub const FILE_CAP: usize = 4 << 20;

/// Regular files under each source's directory, in sorted path order (so the buffer is
/// the same on every run of one machine), each truncated to [`FILE_CAP`]. Missing or
/// unreadable directories and files are skipped: the buffer may be shorter than asked,
/// or empty.
pub fn gather(sources: &[Source]) -> Vec<u8> {
    let mut out = Vec::with_capacity(sources.iter().map(|s| s.bytes).sum());
    for source in sources {
        let limit = out.len() + source.bytes;
        append_files(Path::new(source.dir), &mut out, limit);
    }
    out
}

/// Appends regular files under `dir`, in sorted order, until `out` holds `limit` bytes.
fn append_files(dir: &Path, out: &mut Vec<u8>, limit: usize) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut paths: Vec<_> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
    paths.sort();
    for path in paths {
        if out.len() >= limit {
            return;
        }
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        if meta.is_dir() {
            append_files(&path, out, limit);
        } else if meta.is_file() {
            let take = FILE_CAP.min(limit - out.len()) as u64;
            let before = out.len();
            let read = File::open(&path).and_then(|file| file.take(take).read_to_end(out));
            if read.is_err() {
                out.truncate(before);
            }
        }
    }
}
