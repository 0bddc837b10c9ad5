//! Snapshot entries as `ls` and `diff` show them. Paths show as the source paths they
//! were backed up from (with a leading `/`); in text, names that could disturb a
//! terminal are escaped (`larder_engine::escape_name`); in JSON, a name that is not
//! UTF-8 comes with its exact bytes in hex beside the lossily decoded string
//! (`larder_engine::BytesField`).

use larder_engine::{display_path, escape_name, utc_rfc3339, BytesField};
use larder_store::{attr_flag_letters, EntryKind, TreeEntry};
use serde::ser::{Serialize, Serializer};

pub fn kind_name(kind: EntryKind) -> &'static str {
    match kind {
        EntryKind::File => "file",
        EntryKind::Dir => "dir",
        EntryKind::Symlink => "symlink",
        EntryKind::Fifo => "fifo",
        EntryKind::CharDevice => "chardev",
        EntryKind::BlockDevice => "blockdev",
    }
}

/// One entry in `ls --json`.
pub struct EntryJson<'a>(pub &'a TreeEntry);

impl Serialize for EntryJson<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        #[derive(serde::Serialize)]
        struct Fields<'a> {
            #[serde(flatten)]
            path: BytesField<'a>,
            #[serde(rename = "type")]
            kind: &'static str,
            mode: u32,
            permissions: String,
            uid: u32,
            gid: u32,
            size: u64,
            mtime: String,
            /// Files only.
            #[serde(skip_serializing_if = "Option::is_none")]
            chunks: Option<usize>,
            /// Symlinks only.
            #[serde(flatten)]
            target: Option<BytesField<'a>>,
            /// Device nodes only: the device number.
            #[serde(skip_serializing_if = "Option::is_none")]
            device: Option<u64>,
            /// `chattr` flags, `+ia`; only where the entry has some.
            #[serde(skip_serializing_if = "Option::is_none")]
            attr_flags: Option<String>,
            /// Only where the file changed while the backup read it.
            #[serde(skip_serializing_if = "std::ops::Not::not")]
            changed_while_read: bool,
        }
        let e = self.0;
        Fields {
            path: BytesField::slash_path("path", &e.path),
            kind: kind_name(e.kind),
            mode: e.mode,
            permissions: permissions(e.kind, e.mode),
            uid: e.uid,
            gid: e.gid,
            size: e.size,
            mtime: utc_rfc3339(e.mtime_sec, e.mtime_nsec),
            chunks: (e.kind == EntryKind::File).then_some(e.chunks.len()),
            target: (e.kind == EntryKind::Symlink).then(|| BytesField::new("target", &e.target)),
            device: e.kind.is_device().then_some(e.rdev),
            attr_flags: (e.attr_flags != 0).then(|| attr_flag_letters(e.attr_flags)),
            changed_while_read: e.changed_while_read,
        }
        .serialize(s)
    }
}

/// `-rw-r--r--  1000  1000         1234 2026-11-22 15:04:05 /home/me/a.txt`, and
/// ` -> TARGET` for a symlink, ` [attrs +ia]` for an entry with `chattr` flags,
/// ` [changed while read]` for a file that changed while the backup read it.
pub fn long_line(e: &TreeEntry) -> String {
    let time = utc_rfc3339(e.mtime_sec, e.mtime_nsec);
    let (date, clock) = time.split_once('T').unwrap_or((&time, ""));
    let mut line = format!(
        "{} {:>5} {:>5} {:>12} {} {} {}",
        permissions(e.kind, e.mode),
        e.uid,
        e.gid,
        e.size,
        date,
        clock.get(..8).unwrap_or(clock),
        display_path(&e.path)
    );
    if e.kind == EntryKind::Symlink {
        line.push_str(" -> ");
        line.push_str(&escape_name(&e.target));
    }
    if e.attr_flags != 0 {
        line.push_str(" [attrs ");
        line.push_str(&attr_flag_letters(e.attr_flags));
        line.push(']');
    }
    if e.changed_while_read {
        line.push_str(" [changed while read]");
    }
    line
}

/// `ls -l`'s mode column: the type from the entry's kind, then the permission bits
/// with setuid, setgid and sticky shown as `s`/`S` and `t`/`T`.
fn permissions(kind: EntryKind, mode: u32) -> String {
    let mut s = String::with_capacity(10);
    s.push(match kind {
        EntryKind::File => '-',
        EntryKind::Dir => 'd',
        EntryKind::Symlink => 'l',
        EntryKind::Fifo => 'p',
        EntryKind::CharDevice => 'c',
        EntryKind::BlockDevice => 'b',
    });
    for (shift, special_bit, special) in [(6, 0o4000, 's'), (3, 0o2000, 's'), (0, 0o1000, 't')] {
        let bits = (mode >> shift) & 7;
        s.push(if bits & 4 != 0 { 'r' } else { '-' });
        s.push(if bits & 2 != 0 { 'w' } else { '-' });
        s.push(match (mode & special_bit != 0, bits & 1 != 0) {
            (true, true) => special,
            (true, false) => special.to_ascii_uppercase(),
            (false, true) => 'x',
            (false, false) => '-',
        });
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permissions_read_like_ls() {
        assert_eq!(permissions(EntryKind::File, 0o100644), "-rw-r--r--");
        assert_eq!(permissions(EntryKind::Dir, 0o40755), "drwxr-xr-x");
        assert_eq!(permissions(EntryKind::Symlink, 0o120777), "lrwxrwxrwx");
        assert_eq!(permissions(EntryKind::File, 0o104755), "-rwsr-xr-x");
        assert_eq!(permissions(EntryKind::File, 0o102644), "-rw-r-Sr--");
        assert_eq!(permissions(EntryKind::Dir, 0o41777), "drwxrwxrwt");
        assert_eq!(permissions(EntryKind::Dir, 0o41776), "drwxrwxrwT");
    }

    /// A name that is not UTF-8 keeps its exact bytes beside the lossy string.
    #[test]
    fn bytes_fields_add_hex_only_when_not_utf8() {
        let json = |f: BytesField| serde_json::to_value(f).unwrap().to_string();
        assert_eq!(json(BytesField::new("path", b"a")), r#"{"path":"a"}"#);
        assert_eq!(
            json(BytesField::slash_path("path", b"a\xff")),
            "{\"path\":\"/a\u{fffd}\",\"path_hex\":\"2f61ff\"}"
        );
    }
}
