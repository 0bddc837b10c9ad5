//! The benchmark corpus: 64 MiB of real files from `/usr/lib` and `/usr/share` (no
//! single file above 4 MiB, so many formats mix), padded with pseudo-random bytes
//! where the system has too few. Shared by the chunking benchmarks.
//!
//! `LARDER_BENCH_CORPUS=FILE` uses FILE, whole, instead (for example a 1 GiB
//! concatenation of release tarballs: `docs/performance.md` says how it was made).

use std::path::Path;

const CORPUS_LEN: usize = 64 << 20;
/// Directories to read files from, and how many bytes to take from each.
const SOURCES: [(&str, usize); 2] = [("/usr/lib", 48 << 20), ("/usr/share", 16 << 20)];
/// No single file may fill more than this, so that the corpus mixes many formats.
const FILE_CAP: usize = 4 << 20;

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
            if let Ok(mut data) = std::fs::read(&path) {
                data.truncate(FILE_CAP.min(limit - out.len()));
                out.extend_from_slice(&data);
            }
        }
    }
}

pub fn corpus() -> Vec<u8> {
    if let Some(path) = std::env::var_os("LARDER_BENCH_CORPUS") {
        let data = std::fs::read(&path)
            .unwrap_or_else(|e| panic!("LARDER_BENCH_CORPUS={}: {e}", path.to_string_lossy()));
        eprintln!("corpus: {} bytes of {}", data.len(), path.to_string_lossy());
        return data;
    }
    let mut data = Vec::with_capacity(CORPUS_LEN);
    for (dir, len) in SOURCES {
        let limit = (data.len() + len).min(CORPUS_LEN);
        append_files(Path::new(dir), &mut data, limit);
    }
    let real = data.len();
    data.extend(pseudo_random(CORPUS_LEN - real));
    eprintln!(
        "corpus: {real} bytes of real files, {} of padding",
        CORPUS_LEN - real
    );
    data
}

/// `len` pseudo-random bytes (splitmix64): padding and random inputs only have to look
/// random to a chunker.
#[allow(dead_code)] // Not every bench that includes this file uses it directly.
pub fn pseudo_random(len: usize) -> Vec<u8> {
    let mut data = Vec::with_capacity(len + 8);
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    while data.len() < len {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        data.extend_from_slice(&(z ^ (z >> 31)).to_le_bytes());
    }
    data.truncate(len);
    data
}
