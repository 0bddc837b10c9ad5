//! Directories that exclude their own contents by holding a tag file
//! (`--exclude-caches`, `--exclude-if-present FILE[:HEADER]`), as restic's options of
//! the same names: a directory holding a tag file named `FILE` (starting with `HEADER`,
//! when one is given) is backed up with its tag file only. `--exclude-caches` is the
//! tag `CACHEDIR.TAG` with the header of the Cache Directory Tagging Specification
//! (<https://bford.info/cachedir/>).

use std::ffi::OsStr;
use std::fs::{FileType, OpenOptions};
use std::io::{self, Read};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use crate::error::Warning;

/// The header a valid `CACHEDIR.TAG` starts with.
const CACHEDIR_TAG_HEADER: &[u8] = b"Signature: 8a477f597d28d172789f06886806bc55";

/// A tag file whose presence in a directory excludes the directory's other contents.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExcludeTag {
    /// The tag file's name: one component.
    name: Vec<u8>,
    /// What the tag file must start with; empty: its presence is enough.
    header: Vec<u8>,
}

impl ExcludeTag {
    /// `CACHEDIR.TAG` with its specification's header (`--exclude-caches`).
    pub fn cachedir() -> Self {
        Self {
            name: b"CACHEDIR.TAG".to_vec(),
            header: CACHEDIR_TAG_HEADER.to_vec(),
        }
    }

    /// `FILE[:HEADER]` (`--exclude-if-present`): the name before the first `:`, the
    /// header after it. Fails on a name that is not one component.
    pub fn parse(spec: &[u8]) -> Result<Self, String> {
        let (name, header) = match spec.iter().position(|&b| b == b':') {
            Some(i) => (&spec[..i], &spec[i + 1..]),
            None => (spec, &[][..]),
        };
        if name.is_empty() || name == b"." || name == b".." || name.contains(&b'/') {
            return Err(format!(
                "\"{}\" is not a file name: --exclude-if-present takes FILE[:HEADER], FILE one \
                 name without `/`",
                crate::names::escape_name(spec)
            ));
        }
        Ok(Self {
            name: name.to_vec(),
            header: header.to_vec(),
        })
    }

    pub fn name(&self) -> &OsStr {
        OsStr::from_bytes(&self.name)
    }
}

/// Whether `dir`, whose entries include `names` (each with its type where known), is
/// tagged by one of `tags`; if so, the names of the tag files that tag it, which are
/// kept. A tag file whose header does not match is a notice, and tags nothing.
pub(super) fn tagged<'n>(
    dir: &Path,
    names: impl Iterator<Item = (&'n OsStr, Option<FileType>)> + Clone,
    tags: &[ExcludeTag],
    warnings: &mut Vec<Warning>,
) -> Vec<&'n OsStr> {
    let mut kept = Vec::new();
    for tag in tags {
        let Some((name, file_type)) = names.clone().find(|(n, _)| n.as_bytes() == tag.name) else {
            continue;
        };
        if tag.header.is_empty() {
            kept.push(name);
            continue;
        }
        let path = dir.join(name);
        match starts_with(&path, file_type, &tag.header) {
            Ok(true) => kept.push(name),
            Ok(false) => warnings.push(Warning::notice(
                &path,
                "does not start with the header it is a tag with, so its directory is backed up",
            )),
            Err(e) => warnings.push(Warning::notice(
                &path,
                format!("cannot read this tag file ({e}), so its directory is backed up"),
            )),
        }
    }
    kept.dedup();
    kept
}

/// Whether the regular file at `path` starts with `header`; reads no more than the
/// header's length, and never opens a symlink, FIFO or device in its place.
fn starts_with(path: &Path, file_type: Option<FileType>, header: &[u8]) -> io::Result<bool> {
    if file_type.is_some_and(|t| !t.is_file()) {
        return Ok(false);
    }
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)?;
    if !file.metadata()?.is_file() {
        return Ok(false);
    }
    let mut start = Vec::with_capacity(header.len());
    Read::take(&file, header.len() as u64).read_to_end(&mut start)?;
    Ok(start == header)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_like_restics() {
        let tag = ExcludeTag::parse(b".nobackup").unwrap();
        assert_eq!(
            (tag.name.as_slice(), tag.header.as_slice()),
            (&b".nobackup"[..], &b""[..])
        );
        let tag =
            ExcludeTag::parse(b"CACHEDIR.TAG:Signature: 8a477f597d28d172789f06886806bc55").unwrap();
        assert_eq!(tag, ExcludeTag::cachedir());
        for bad in [&b""[..], b":x", b"a/b", b"..", b"."] {
            assert!(ExcludeTag::parse(bad).is_err(), "{bad:?}");
        }
        let err = ExcludeTag::parse(b"a/\xff\x1b[2J").unwrap_err();
        assert!(
            err.starts_with(r#""a/\xff\x1b[2J" is not a file name"#),
            "{err}"
        );
    }
}
