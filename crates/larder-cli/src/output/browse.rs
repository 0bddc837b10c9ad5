//! What `ls` and `diff` print. Paths show as the source paths they were backed up
//! from (with a leading `/`); in text, names that could disturb a terminal are
//! escaped (`larder_engine::escape_name`); in JSON, a name that is not UTF-8 comes
//! with its exact bytes in hex beside the lossily decoded string.

use std::io::{self, BufWriter, Write};

use larder_engine::{
    display_path, escape_name, utc_rfc3339, ChangeKind, SnapshotPath, SnapshotTree, TreeDiff,
};
use larder_store::{EntryKind, TreeEntry};
use serde_json::{json, Map, Value};

use larder_bench::plot::format_size;

use super::Output;

impl Output {
    /// `ls`: one path a line, or with `long` a line like `ls -l`; with `--json`, one
    /// object holding every entry.
    pub fn listing(
        &self,
        tree: &SnapshotTree,
        under: &SnapshotPath,
        entries: &[&TreeEntry],
        long: bool,
    ) -> io::Result<()> {
        let mut w = BufWriter::new(io::stdout().lock());
        if self.json {
            let mut object = Map::new();
            object.insert("snapshot".into(), json!(tree.id));
            insert_bytes(&mut object, "path", &slash_path(under.as_bytes()));
            object.insert("count".into(), json!(entries.len()));
            let list: Vec<Value> = entries.iter().map(|e| entry_json(e)).collect();
            object.insert("entries".into(), Value::Array(list));
            writeln!(w, "{}", Value::Object(object))?;
        } else if !self.quiet {
            for entry in entries {
                if long {
                    writeln!(w, "{}", long_line(entry))?;
                } else {
                    writeln!(w, "{}", display_path(&entry.path))?;
                }
            }
        }
        w.flush()
    }

    /// `diff`: a line per changed path (`+` added, `-` removed, `M` modified, with
    /// what changed), then the counts; with `--json`, one object.
    pub fn diff(&self, old: &SnapshotTree, new: &SnapshotTree, d: &TreeDiff<'_>) -> io::Result<()> {
        let mut w = BufWriter::new(io::stdout().lock());
        if self.json {
            let changes: Vec<Value> = d
                .changes
                .iter()
                .map(|c| {
                    let mut v = Map::new();
                    v.insert("change".into(), json!(change_name(c.kind)));
                    insert_bytes(&mut v, "path", &slash_path(c.path()));
                    if let Some(entry) = c.new.or(c.old) {
                        v.insert("type".into(), json!(kind_name(entry.kind)));
                    }
                    if c.kind == ChangeKind::Modified {
                        let fields: Vec<&str> = c.fields.iter().map(|f| f.name()).collect();
                        v.insert("changed".into(), json!(fields));
                        if let (Some(o), Some(n)) = (c.old, c.new) {
                            if o.kind != n.kind {
                                v.insert("old_type".into(), json!(kind_name(o.kind)));
                            }
                        }
                    }
                    Value::Object(v)
                })
                .collect();
            let object = json!({
                "snapshot1": old.id, "snapshot2": new.id,
                "added": d.added, "removed": d.removed, "modified": d.modified,
                "bytes_added": d.bytes_added, "bytes_removed": d.bytes_removed,
                "unknown_chunks": d.unknown_chunks, "duplicate_paths": d.duplicate_paths,
                "changes": changes,
            });
            writeln!(w, "{object}")?;
            return w.flush();
        }
        if self.quiet {
            return Ok(());
        }
        for c in &d.changes {
            let entry = c.new.or(c.old);
            let is_dir = entry.is_some_and(|e| e.kind == EntryKind::Dir);
            let shown = format!(
                "{}{}",
                display_path(c.path()),
                if is_dir { "/" } else { "" }
            );
            match c.kind {
                ChangeKind::Added => writeln!(w, "+ {shown}")?,
                ChangeKind::Removed => writeln!(w, "- {shown}")?,
                ChangeKind::Modified => {
                    let fields: Vec<String> = c
                        .fields
                        .iter()
                        .map(|f| match (f, c.old, c.new) {
                            (larder_engine::ChangedField::Type, Some(o), Some(n)) => {
                                format!("type {} -> {}", kind_name(o.kind), kind_name(n.kind))
                            }
                            _ => f.name().to_string(),
                        })
                        .collect();
                    writeln!(w, "M {shown} ({})", fields.join(", "))?;
                }
            }
        }
        writeln!(
            w,
            "{} -> {}: {} added, {} removed, {} modified; data added {}, removed {} (stored chunks only one snapshot uses)",
            old.short_id(),
            new.short_id(),
            d.added,
            d.removed,
            d.modified,
            format_size(d.bytes_added as f64),
            format_size(d.bytes_removed as f64)
        )?;
        w.flush()
    }
}

fn change_name(kind: ChangeKind) -> &'static str {
    match kind {
        ChangeKind::Added => "added",
        ChangeKind::Removed => "removed",
        ChangeKind::Modified => "modified",
    }
}

fn kind_name(kind: EntryKind) -> &'static str {
    match kind {
        EntryKind::File => "file",
        EntryKind::Dir => "dir",
        EntryKind::Symlink => "symlink",
        EntryKind::Fifo => "fifo",
        EntryKind::CharDevice => "chardev",
        EntryKind::BlockDevice => "blockdev",
    }
}

/// `path` with the leading `/` it had as a source path.
fn slash_path(path: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(path.len() + 1);
    out.push(b'/');
    out.extend_from_slice(path);
    out
}

/// Sets `key` to `bytes` as a string: exact where they are UTF-8; otherwise decoded
/// lossily, with the exact bytes in hex under `KEY_hex`.
fn insert_bytes(v: &mut Map<String, Value>, key: &str, bytes: &[u8]) {
    match std::str::from_utf8(bytes) {
        Ok(s) => {
            v.insert(key.into(), json!(s));
        }
        Err(_) => {
            v.insert(key.into(), json!(String::from_utf8_lossy(bytes)));
            let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
            v.insert(format!("{key}_hex"), json!(hex));
        }
    }
}

fn entry_json(e: &TreeEntry) -> Value {
    let mut v = Map::new();
    insert_bytes(&mut v, "path", &slash_path(&e.path));
    v.insert("type".into(), json!(kind_name(e.kind)));
    v.insert("mode".into(), json!(e.mode));
    v.insert("permissions".into(), json!(permissions(e.kind, e.mode)));
    v.insert("uid".into(), json!(e.uid));
    v.insert("gid".into(), json!(e.gid));
    v.insert("size".into(), json!(e.size));
    v.insert(
        "mtime".into(),
        json!(utc_rfc3339(e.mtime_sec, e.mtime_nsec)),
    );
    match e.kind {
        EntryKind::File => {
            v.insert("chunks".into(), json!(e.chunks.len()));
        }
        EntryKind::Symlink => insert_bytes(&mut v, "target", &e.target),
        EntryKind::CharDevice | EntryKind::BlockDevice => {
            v.insert("device".into(), json!(e.rdev));
        }
        EntryKind::Dir | EntryKind::Fifo => {}
    }
    Value::Object(v)
}

/// `-rw-r--r--  1000  1000         1234 2026-11-22 15:04:05 /home/me/a.txt`, and
/// ` -> TARGET` for a symlink.
fn long_line(e: &TreeEntry) -> String {
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
}
