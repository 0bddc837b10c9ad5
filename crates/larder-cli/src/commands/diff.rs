//! `larder diff`: what changed between two snapshots: added, removed and modified
//! entries, and the data each snapshot alone uses. Takes the repository's shared lock.

use std::io::{self, Write};
use std::process::ExitCode;

use anyhow::Result;
use clap::Args;
use larder_bench::plot::format_size;
use larder_engine::{
    diff_snapshots, display_path, BytesField, Change, ChangeKind, ChangedField, SnapshotTree,
    TreeDiff,
};
use larder_store::{EntryKind, LockMode};
use serde::Serialize;

use super::Globals;
use crate::output::tree::kind_name;
use crate::output::{Output, Render};

#[derive(Args)]
pub struct DiffArgs {
    /// The earlier snapshot: an id prefix, or `latest`
    snapshot1: String,
    /// The later snapshot: an id prefix, or `latest`
    snapshot2: String,
}

pub fn run(args: DiffArgs, g: &Globals, out: &Output) -> Result<ExitCode> {
    let repo = g.repo.open(LockMode::Shared, out)?;
    repo.require_full_key("compare snapshots")?;
    let old = SnapshotTree::load(&repo, &args.snapshot1)?;
    let new = SnapshotTree::load(&repo, &args.snapshot2)?;
    let diff = diff_snapshots(&repo, &old, &new);
    if diff.duplicate_paths > 0 {
        out.warn(&format!(
            "{} entries repeat a path of their snapshot (a damaged or crafted tree); the first entry of each path was compared",
            diff.duplicate_paths
        ));
    }
    if diff.unknown_chunks > 0 {
        out.warn(&format!(
            "{} chunks are not in the index, so the byte counts leave them out (run `larder check`)",
            diff.unknown_chunks
        ));
    }
    out.print(&Compared::new(&old, &new, &diff))?;
    Ok(ExitCode::SUCCESS)
}

/// The differences; text: a line per changed path (`+` added, `-` removed, `M`
/// modified, with what changed), then the counts.
#[derive(Serialize)]
struct Compared<'a> {
    snapshot1: &'a str,
    snapshot2: &'a str,
    added: u64,
    removed: u64,
    modified: u64,
    bytes_added: u64,
    bytes_removed: u64,
    unknown_chunks: u64,
    duplicate_paths: u64,
    changes: Vec<ChangeJson<'a>>,
    #[serde(skip)]
    short_ids: (&'a str, &'a str),
}

impl<'a> Compared<'a> {
    fn new(old: &'a SnapshotTree, new: &'a SnapshotTree, d: &'a TreeDiff<'a>) -> Self {
        Self {
            snapshot1: &old.id,
            snapshot2: &new.id,
            added: d.added,
            removed: d.removed,
            modified: d.modified,
            bytes_added: d.bytes_added,
            bytes_removed: d.bytes_removed,
            unknown_chunks: d.unknown_chunks,
            duplicate_paths: d.duplicate_paths,
            changes: d.changes.iter().map(ChangeJson).collect(),
            short_ids: (old.short_id(), new.short_id()),
        }
    }
}

/// One changed path.
struct ChangeJson<'a>(&'a Change<'a>);

impl Serialize for ChangeJson<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct Fields {
            change: &'static str,
            #[serde(flatten)]
            path: BytesField<'static>,
            /// Absent only for a change without entries, which no diff makes.
            #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
            kind: Option<&'static str>,
            /// Modified entries only: the fields that differ.
            #[serde(skip_serializing_if = "Option::is_none")]
            changed: Option<Vec<&'static str>>,
            /// Modified entries whose type changed: the earlier one.
            #[serde(skip_serializing_if = "Option::is_none")]
            old_type: Option<&'static str>,
        }
        let c = self.0;
        let modified = c.kind == ChangeKind::Modified;
        let old_type = match (c.old, c.new) {
            (Some(o), Some(n)) if modified && o.kind != n.kind => Some(kind_name(o.kind)),
            _ => None,
        };
        Fields {
            change: match c.kind {
                ChangeKind::Added => "added",
                ChangeKind::Removed => "removed",
                ChangeKind::Modified => "modified",
            },
            path: BytesField::slash_path("path", c.path()),
            kind: c.new.or(c.old).map(|e| kind_name(e.kind)),
            changed: modified.then(|| c.fields.iter().map(|f| f.name()).collect()),
            old_type,
        }
        .serialize(s)
    }
}

impl Render for Compared<'_> {
    fn write_text(&self, w: &mut dyn Write) -> io::Result<()> {
        for ChangeJson(c) in &self.changes {
            write_change(w, c)?;
        }
        writeln!(
            w,
            "{} -> {}: {} added, {} removed, {} modified; data added {}, removed {} (stored chunks only one snapshot uses)",
            self.short_ids.0,
            self.short_ids.1,
            self.added,
            self.removed,
            self.modified,
            format_size(self.bytes_added as f64),
            format_size(self.bytes_removed as f64)
        )
    }
}

fn write_change(w: &mut dyn Write, c: &Change<'_>) -> io::Result<()> {
    let is_dir = c.new.or(c.old).is_some_and(|e| e.kind == EntryKind::Dir);
    let shown = format!(
        "{}{}",
        display_path(c.path()),
        if is_dir { "/" } else { "" }
    );
    match c.kind {
        ChangeKind::Added => writeln!(w, "+ {shown}"),
        ChangeKind::Removed => writeln!(w, "- {shown}"),
        ChangeKind::Modified => {
            let fields: Vec<String> = c
                .fields
                .iter()
                .map(|f| match (f, c.old, c.new) {
                    (ChangedField::Type, Some(o), Some(n)) => {
                        format!("type {} -> {}", kind_name(o.kind), kind_name(n.kind))
                    }
                    _ => f.name().to_string(),
                })
                .collect();
            writeln!(w, "M {shown} ({})", fields.join(", "))
        }
    }
}
