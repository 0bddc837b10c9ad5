//! `larder repair`: salvage what is intact in damaged containers, remove what is lost
//! from the index, and write copies of the snapshots that lost data without it,
//! naming every file left out (docs/design/repair.md).

use std::io::{self, Write};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Result;
use clap::Args;
use larder_engine::{
    display_path, BytesField, LostFile, Progress, RepairOptions, RepairReport, RepairedContainer,
    SnapshotLoss, TreeLoss,
};
use larder_store::LockMode;
use serde::Serialize;

use super::Globals;
use crate::output::{mb, Bar, Output, Render};

#[derive(Args)]
pub struct RepairArgs {
    /// Snapshots to rewrite (id prefixes, or `latest`) [default: every one that lost
    /// data]
    snapshots: Vec<String>,
    /// Read the chunk data of this container only (repeatable; the ids `check` names);
    /// the structure of every container is checked all the same
    #[arg(long = "container", value_name = "ID", value_parser = parse_container_id)]
    containers: Vec<u64>,
    /// Only report what would be salvaged, lost and rewritten; change nothing
    #[arg(long)]
    dry_run: bool,
}

/// A container id as `check` prints it: hex digits (a `.ctr` file name too).
fn parse_container_id(s: &str) -> Result<u64, String> {
    let digits = s.strip_suffix(".ctr").unwrap_or(s);
    u64::from_str_radix(digits, 16).map_err(|_| {
        format!("{s:?} is not a container id (hex digits, as `larder check` names them)")
    })
}

/// Exit code 3 when a snapshot lost data (the report names each file), 0 otherwise
/// and in a dry run.
pub fn run(args: RepairArgs, g: &Globals, out: &Output) -> Result<ExitCode> {
    let mut repo = g.repo.open(LockMode::Exclusive, out)?;
    repo.require_full_key("repair the repository")?;
    let bar = Arc::new(Bar::bytes(out));
    let opts = RepairOptions {
        dry_run: args.dry_run,
        containers: args.containers,
        snapshots: args.snapshots,
        progress: bar.clone() as Arc<dyn Progress>,
        crash_after_ops: None,
    };
    let report = larder_engine::repair(&mut repo, &opts)?;
    bar.finish();
    out.print(&Repaired::new(&report))?;
    Ok(match report.lost_data() && !report.dry_run {
        true => ExitCode::from(3),
        false => ExitCode::SUCCESS,
    })
}

/// The report, as `--json` prints it.
#[derive(Serialize)]
struct Repaired<'a> {
    dry_run: bool,
    containers_read: usize,
    bytes_read: u64,
    containers: Vec<ContainerJson<'a>>,
    unindexed_deleted: Vec<Unreadable<'a>>,
    left_alone: Vec<Unreadable<'a>>,
    segments_replaced: Vec<Unreadable<'a>>,
    adopted: Vec<String>,
    containers_written: usize,
    snapshots: Vec<SnapshotJson<'a>>,
    unreadable_snapshots: Vec<Unreadable<'a>>,
    files_lost: usize,
    bytes_lost: u64,
}

/// Something that is damaged or cannot be read, and why.
#[derive(Serialize)]
struct Unreadable<'a> {
    id: String,
    reason: &'a str,
}

#[derive(Serialize)]
struct ContainerJson<'a> {
    id: String,
    reason: &'a str,
    chunks: usize,
    damaged: usize,
    salvaged: usize,
    lost: usize,
    lost_bytes: u64,
}

#[derive(Serialize)]
struct SnapshotJson<'a> {
    id: &'a str,
    time: &'a str,
    hostname: &'a str,
    paths: &'a [String],
    /// The repaired copy: written now, or found (`existing`); null in a dry run.
    repaired: Option<&'a str>,
    existing: bool,
    tree: Option<TreeJson<'a>>,
    files: Vec<FileJson<'a>>,
}

#[derive(Serialize)]
struct TreeJson<'a> {
    /// The last entry kept, as the snapshot stores it (for the text).
    #[serde(skip)]
    last: Option<&'a [u8]>,
    entries_kept: usize,
    #[serde(flatten)]
    last_kept: Option<BytesField<'a>>,
    bytes_lost: u64,
}

#[derive(Serialize)]
struct FileJson<'a> {
    /// The path as the snapshot stores it (for the text).
    #[serde(skip)]
    raw: &'a [u8],
    #[serde(flatten)]
    path: BytesField<'a>,
    size: u64,
    lost_bytes: u64,
    lost_chunks: usize,
    lost_ranges: Option<Vec<[u64; 2]>>,
}

fn hex(id: u64) -> String {
    format!("{id:016x}")
}

impl<'a> Repaired<'a> {
    fn new(r: &'a RepairReport) -> Self {
        let named = |list: &'a [(u64, String)]| {
            list.iter()
                .map(|(id, reason)| Unreadable {
                    id: hex(*id),
                    reason,
                })
                .collect()
        };
        let files = r.snapshots.iter().flat_map(|s| &s.files);
        Self {
            dry_run: r.dry_run,
            containers_read: r.containers_read,
            bytes_read: r.bytes_read,
            containers: r.containers.iter().map(ContainerJson::new).collect(),
            unindexed_deleted: named(&r.unindexed_deleted),
            left_alone: named(&r.left_alone),
            segments_replaced: r
                .segments_replaced
                .iter()
                .map(|(name, reason)| Unreadable {
                    id: name.clone(),
                    reason,
                })
                .collect(),
            adopted: r.adopted.iter().map(|&id| hex(id)).collect(),
            containers_written: r.containers_written,
            snapshots: r.snapshots.iter().map(SnapshotJson::new).collect(),
            unreadable_snapshots: r
                .unreadable_snapshots
                .iter()
                .map(|(id, reason)| Unreadable {
                    id: id.clone(),
                    reason,
                })
                .collect(),
            files_lost: files.clone().count(),
            bytes_lost: files.map(|f| f.lost_bytes).sum(),
        }
    }
}

impl<'a> ContainerJson<'a> {
    fn new(c: &'a RepairedContainer) -> Self {
        Self {
            id: hex(c.id),
            reason: &c.reason,
            chunks: c.chunks,
            damaged: c.damaged,
            salvaged: c.salvaged,
            lost: c.lost,
            lost_bytes: c.lost_bytes,
        }
    }
}

impl<'a> SnapshotJson<'a> {
    fn new(s: &'a SnapshotLoss) -> Self {
        Self {
            id: &s.id,
            time: &s.time,
            hostname: &s.hostname,
            paths: &s.paths,
            repaired: s.repaired.as_deref(),
            existing: s.existing,
            tree: s.tree.as_ref().map(|t: &TreeLoss| TreeJson {
                last: t.last_kept.as_deref(),
                entries_kept: t.entries_kept,
                last_kept: t
                    .last_kept
                    .as_ref()
                    .map(|p| BytesField::slash_path("last_kept", p)),
                bytes_lost: t.bytes_lost,
            }),
            files: s
                .files
                .iter()
                .map(|f: &LostFile| FileJson {
                    raw: &f.path,
                    path: BytesField::slash_path("path", &f.path),
                    size: f.size,
                    lost_bytes: f.lost_bytes,
                    lost_chunks: f.lost_chunks,
                    lost_ranges: f
                        .lost_ranges
                        .as_ref()
                        .map(|r| r.iter().map(|&(a, b)| [a, b]).collect()),
                })
                .collect(),
        }
    }
}

impl Render for Repaired<'_> {
    fn write_text(&self, w: &mut dyn Write) -> io::Result<()> {
        let would = if self.dry_run { "would be " } else { "" };
        writeln!(
            w,
            "checked {} container(s), read {}",
            self.containers_read,
            mb(self.bytes_read)
        )?;
        for c in &self.containers {
            writeln!(
                w,
                "container {}: {}; {} of {} chunk(s) {would}salvaged, {} lost ({} bytes); {would}deleted",
                c.id, c.reason, c.salvaged, c.chunks, c.lost, c.lost_bytes
            )?;
        }
        for c in &self.unindexed_deleted {
            writeln!(
                w,
                "container {}: not indexed and damaged ({}); {would}deleted",
                c.id, c.reason
            )?;
        }
        for c in &self.left_alone {
            writeln!(w, "container {}: left alone ({})", c.id, c.reason)?;
        }
        for s in &self.segments_replaced {
            writeln!(
                w,
                "index segment {}: damaged ({}); {would}replaced",
                s.id, s.reason
            )?;
        }
        if !self.adopted.is_empty() {
            writeln!(
                w,
                "{} container(s) no index segment named {would}indexed",
                self.adopted.len()
            )?;
        }
        for s in &self.snapshots {
            s.write_text(w, self.dry_run)?;
        }
        for s in &self.unreadable_snapshots {
            let short = s.id.get(..8).unwrap_or(&s.id);
            writeln!(
                w,
                "snapshot {short} is unreadable ({}); `larder forget {short}` removes it",
                s.reason
            )?;
        }
        self.write_summary(w)
    }
}

impl Repaired<'_> {
    fn write_summary(&self, w: &mut dyn Write) -> io::Result<()> {
        if !self.dry_run && self.containers_written > 0 {
            writeln!(w, "wrote {} new container(s)", self.containers_written)?;
        }
        if !self.snapshots.is_empty() {
            writeln!(
                w,
                "{} file(s) lost data, {} bytes; the original snapshots are kept: a backup of the same files makes them whole again, and `larder forget` removes them",
                self.files_lost, self.bytes_lost
            )?;
        }
        if self.dry_run {
            writeln!(w, "dry run: nothing was changed")?;
        }
        Ok(())
    }
}

impl SnapshotJson<'_> {
    fn write_text(&self, w: &mut dyn Write, dry_run: bool) -> io::Result<()> {
        let short = self.id.get(..8).unwrap_or(self.id);
        let copy = match (self.repaired, self.existing, dry_run) {
            (Some(id), true, _) => {
                format!("its repaired copy {} exists", id.get(..8).unwrap_or(id))
            }
            (Some(id), false, _) => format!("repaired copy {} written", id.get(..8).unwrap_or(id)),
            (None, _, true) => "a repaired copy would be written".into(),
            (None, _, false) => "no repaired copy was written".into(),
        };
        writeln!(
            w,
            "snapshot {short} ({} {} {}): {} file(s) lost data; {copy}",
            self.time.get(..19).unwrap_or(self.time),
            self.hostname,
            self.paths.join(" "),
            self.files.len()
        )?;
        if let Some(t) = &self.tree {
            let after = match t.last {
                Some(p) => format!(", up to {}", display_path(p)),
                None => String::new(),
            };
            writeln!(
                w,
                "  its tree lost {} bytes: {} entries kept{after}; the rest are lost",
                t.bytes_lost, t.entries_kept
            )?;
        }
        for f in &self.files {
            f.write_text(w)?;
        }
        Ok(())
    }
}

impl FileJson<'_> {
    fn write_text(&self, w: &mut dyn Write) -> io::Result<()> {
        let ranges = match &self.lost_ranges {
            Some(r) => {
                let list: Vec<String> = r.iter().map(|[a, b]| format!("{a}..{b}")).collect();
                format!(" (bytes {})", list.join(", "))
            }
            None => String::new(),
        };
        writeln!(
            w,
            "  {}: lost {} of {} bytes{ranges}",
            display_path(self.raw),
            self.lost_bytes,
            self.size
        )
    }
}
