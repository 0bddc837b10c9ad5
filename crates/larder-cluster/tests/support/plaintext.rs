//! Looking for plaintext in stored files: what an encrypted cluster's storage must not
//! show (docs/design/crypto.md, "Cluster"), and a plaintext one does.

use std::path::{Path, PathBuf};

use larder_hash::HashAlgo;

/// Every file under `root`, recursively.
pub fn stored_files(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// The files under `root` whose path (below `root`) or content holds `needle`.
pub fn files_containing(root: &Path, needle: &[u8]) -> Vec<PathBuf> {
    stored_files(root)
        .into_iter()
        .filter(|path| {
            let name = path.strip_prefix(root).unwrap().to_string_lossy();
            let content = std::fs::read(path).unwrap();
            contains(name.as_bytes(), needle) || contains(&content, needle)
        })
        .collect()
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// What would give a chunk away: its plain BLAKE3 and SHA-256 digests, whole and
/// their first 16 bytes.
pub fn digests(chunk: &[u8]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for algo in [HashAlgo::Blake3, HashAlgo::Sha256] {
        let fp = algo.fingerprint(chunk);
        out.push(fp.as_bytes().to_vec());
        out.push(fp.as_bytes()[..16].to_vec());
    }
    out
}
