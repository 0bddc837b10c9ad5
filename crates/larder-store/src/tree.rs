//! The tree stream: a snapshot's directory tree with every file's recipe
//! (docs/design/format.md, "Tree stream").

use larder_hash::Fingerprint;

use crate::container::{le_u32, le_u64};
use crate::error::{Result, StoreError};

const MAGIC: &[u8; 8] = b"LARDERT1";
/// Fixed part of an entry after the path: mode, mtime, uid, gid, size.
const FIXED_LEN: usize = 4 + 8 + 4 + 4 + 4 + 8;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    File,
    Dir,
    Symlink,
}

impl EntryKind {
    fn code(self) -> u8 {
        match self {
            Self::File => 1,
            Self::Dir => 2,
            Self::Symlink => 3,
        }
    }
}

/// One file, directory or symlink of a snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TreeEntry {
    pub kind: EntryKind,
    /// Relative path, components joined by `/`, raw bytes.
    pub path: Vec<u8>,
    pub mode: u32,
    pub mtime_sec: i64,
    pub mtime_nsec: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    /// The file's recipe (files only).
    pub chunks: Vec<Fingerprint>,
    /// The link target (symlinks only).
    pub target: Vec<u8>,
}

impl TreeEntry {
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.push(self.kind.code());
        out.extend_from_slice(&(self.path.len() as u32).to_le_bytes());
        out.extend_from_slice(&self.path);
        out.extend_from_slice(&self.mode.to_le_bytes());
        out.extend_from_slice(&self.mtime_sec.to_le_bytes());
        out.extend_from_slice(&self.mtime_nsec.to_le_bytes());
        out.extend_from_slice(&self.uid.to_le_bytes());
        out.extend_from_slice(&self.gid.to_le_bytes());
        out.extend_from_slice(&self.size.to_le_bytes());
        match self.kind {
            EntryKind::File => {
                out.extend_from_slice(&(self.chunks.len() as u64).to_le_bytes());
                for fp in &self.chunks {
                    out.extend_from_slice(fp.as_bytes());
                }
            }
            EntryKind::Symlink => {
                out.extend_from_slice(&(self.target.len() as u32).to_le_bytes());
                out.extend_from_slice(&self.target);
            }
            EntryKind::Dir => {}
        }
    }
}

/// The bytes every tree stream starts with.
pub fn encode_tree_header(out: &mut Vec<u8>) {
    out.extend_from_slice(MAGIC);
}

/// True if `path` is a non-empty relative path of normal components: no empty
/// component, no `.` or `..`, no leading `/`, no NUL. Restore relies on this to keep
/// every entry inside its target.
pub fn is_safe_relative_path(path: &[u8]) -> bool {
    !path.is_empty()
        && !path.contains(&0)
        && path
            .split(|&b| b == b'/')
            .all(|c| !c.is_empty() && c != b"." && c != b"..")
}

/// Reads entries back from a whole tree stream. Yields an error (and then nothing) on
/// malformed input or an unsafe path; never panics.
pub struct TreeDecoder<'a> {
    data: &'a [u8],
    pos: usize,
    done: bool,
}

impl<'a> TreeDecoder<'a> {
    pub fn new(data: &'a [u8]) -> Result<Self> {
        if data.get(..8) != Some(MAGIC.as_slice()) {
            return Err(StoreError::corrupt("tree", "", "bad magic"));
        }
        Ok(Self {
            data,
            pos: 8,
            done: false,
        })
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.data.len());
        let end = end.ok_or_else(|| {
            StoreError::corrupt("tree", "", format!("truncated at byte {}", self.pos))
        })?;
        let s = &self.data[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn entry(&mut self, code: u8) -> Result<TreeEntry> {
        let kind = match code {
            1 => EntryKind::File,
            2 => EntryKind::Dir,
            3 => EntryKind::Symlink,
            k => {
                return Err(StoreError::corrupt(
                    "tree",
                    "",
                    format!("unknown entry kind {k}"),
                ))
            }
        };
        let path_len = le_u32(self.take(4)?) as usize;
        let path = self.take(path_len)?.to_vec();
        if !is_safe_relative_path(&path) {
            return Err(StoreError::corrupt(
                "tree",
                "",
                format!("unsafe path {:?}", String::from_utf8_lossy(&path)),
            ));
        }
        let f = self.take(FIXED_LEN)?;
        let mut entry = TreeEntry {
            kind,
            path,
            mode: le_u32(&f[0..4]),
            mtime_sec: le_u64(&f[4..12]) as i64,
            mtime_nsec: le_u32(&f[12..16]),
            uid: le_u32(&f[16..20]),
            gid: le_u32(&f[20..24]),
            size: le_u64(&f[24..32]),
            chunks: Vec::new(),
            target: Vec::new(),
        };
        match kind {
            EntryKind::File => {
                let count = le_u64(self.take(8)?);
                let bytes = usize::try_from(count)
                    .ok()
                    .and_then(|c| c.checked_mul(Fingerprint::LEN))
                    .ok_or_else(|| StoreError::corrupt("tree", "", "chunk count overflows"))?;
                entry.chunks = self
                    .take(bytes)?
                    .chunks_exact(Fingerprint::LEN)
                    .map(|c| {
                        let mut fp = [0u8; 32];
                        fp.copy_from_slice(c);
                        Fingerprint(fp)
                    })
                    .collect();
            }
            EntryKind::Symlink => {
                let len = le_u32(self.take(4)?) as usize;
                entry.target = self.take(len)?.to_vec();
            }
            EntryKind::Dir => {}
        }
        Ok(entry)
    }
}

impl Iterator for TreeDecoder<'_> {
    type Item = Result<TreeEntry>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let result = match self.take(1) {
            Ok([0]) => {
                self.done = true;
                return (self.pos != self.data.len()).then(|| {
                    Err(StoreError::corrupt(
                        "tree",
                        "",
                        "bytes after the end marker",
                    ))
                });
            }
            Ok(code) => self.entry(code[0]),
            Err(e) => Err(e),
        };
        if result.is_err() {
            self.done = true;
        }
        Some(result)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn entry(kind: EntryKind, path: &[u8]) -> TreeEntry {
        TreeEntry {
            kind,
            path: path.to_vec(),
            mode: 0o100644,
            mtime_sec: -5,
            mtime_nsec: 999_999_999,
            uid: 1000,
            gid: 100,
            size: 12,
            chunks: if kind == EntryKind::File {
                vec![Fingerprint([9; 32]); 3]
            } else {
                vec![]
            },
            target: if kind == EntryKind::Symlink {
                b"../x".to_vec()
            } else {
                vec![]
            },
        }
    }

    fn stream(entries: &[TreeEntry]) -> Vec<u8> {
        let mut out = Vec::new();
        encode_tree_header(&mut out);
        for e in entries {
            e.encode(&mut out);
        }
        out.push(0);
        out
    }

    #[test]
    fn round_trips_every_kind_and_raw_names() {
        let entries = vec![
            entry(EntryKind::Dir, b"a"),
            entry(EntryKind::File, b"a/\xff\xfe-not-utf8"),
            entry(EntryKind::Symlink, b"a/link"),
        ];
        let bytes = stream(&entries);
        let back: Vec<_> = TreeDecoder::new(&bytes)
            .unwrap()
            .collect::<Result<_>>()
            .unwrap();
        assert_eq!(back, entries);
    }

    #[test]
    fn hostile_paths_are_rejected() {
        for path in [
            &b"../etc/passwd"[..],
            b"/etc/passwd",
            b"a/../../b",
            b"a//b",
            b"./a",
            b"",
            b"a/\0b",
        ] {
            let bytes = stream(&[entry(EntryKind::File, path)]);
            let first = TreeDecoder::new(&bytes).unwrap().next().unwrap();
            assert!(
                first.is_err(),
                "accepted {:?}",
                String::from_utf8_lossy(path)
            );
        }
    }

    #[test]
    fn truncation_is_an_error_not_a_short_tree() {
        let bytes = stream(&[entry(EntryKind::File, b"f")]);
        for cut in 8..bytes.len() {
            let results: Vec<_> = TreeDecoder::new(&bytes[..cut]).unwrap().collect();
            assert!(
                results.iter().any(|r| r.is_err()),
                "cut at {cut} decoded cleanly"
            );
        }
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(tail in proptest::collection::vec(any::<u8>(), 0..256)) {
            let mut bytes = MAGIC.to_vec();
            bytes.extend(tail);
            for r in TreeDecoder::new(&bytes).unwrap() {
                let _ = r;
            }
        }
    }
}
