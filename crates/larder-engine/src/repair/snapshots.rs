//! Repair's view of the snapshots (docs/design/repair.md, "The repaired snapshot"):
//! what each one loses, tree and files, against what the repository holds after the
//! repair, and the entries its repaired copy keeps.

use larder_hash::Fingerprint;
use larder_store::{
    EntryKind, ParsedContainer, Repository, Snapshot, StoreError, TreeDecoder, TreeEntry,
};

use super::damage::{Availability, Tables};
use crate::error::{EngineError, Result};
use crate::tree_io::ChunkReader;

/// What a snapshot's tree stream lost: everything from its first lost chunk on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TreeLoss {
    /// Entries decoded before the loss, which the repaired copy keeps.
    pub entries_kept: usize,
    /// The path of the last of them (none when nothing could be decoded).
    pub last_kept: Option<Vec<u8>>,
    /// Bytes of the stream lost.
    pub bytes_lost: u64,
}

/// A file that lost data, left out of the repaired copy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LostFile {
    /// Its path in the snapshot (the source path without its leading `/`), raw bytes.
    pub path: Vec<u8>,
    pub size: u64,
    /// Its size less the raw length of the chunks it keeps.
    pub lost_bytes: u64,
    pub lost_chunks: usize,
    /// The byte ranges lost, `[start, end)`, adjacent ones merged; `None` when a lost
    /// chunk's length is unknown (no table names it).
    pub lost_ranges: Option<Vec<(u64, u64)>>,
}

/// What one snapshot loses, and the entries its repaired copy keeps.
pub(super) struct Loss {
    pub tree: Option<TreeLoss>,
    pub files: Vec<LostFile>,
    pub kept: Vec<TreeEntry>,
}

/// Reads the chunks of tree streams as they will be after the repair: a chunk whose
/// indexed copy is in a damaged container from its salvaged or other copy, the rest
/// through the index.
pub(super) struct TreeReader<'r> {
    repo: &'r Repository,
    tables: &'r Tables,
    chunks: ChunkReader<'r>,
    /// The container a relocated chunk was last read from.
    view: Option<ParsedContainer>,
    /// Whether only some containers' data were read (`--container`): a damaged chunk
    /// elsewhere is then news, and stops the repair.
    limited: bool,
}

impl<'r> TreeReader<'r> {
    pub fn new(repo: &'r Repository, tables: &'r Tables, limited: bool) -> Self {
        Self {
            repo,
            tables,
            chunks: ChunkReader::new(repo),
            view: None,
            limited,
        }
    }

    fn read(
        &mut self,
        avail: &Availability<'_>,
        fp: &Fingerprint,
        out: &mut Vec<u8>,
    ) -> Result<()> {
        let Some(&(id, entry)) = avail.relocated.get(fp) else {
            return match self.chunks.read_into(fp, out) {
                Err(EngineError::Store(StoreError::Corrupt { name, reason, .. })) if self.limited => {
                    Err(EngineError::RepairStopped(format!(
                        "container {name} holds a damaged tree chunk ({reason}), and --container did not name it: run `larder repair --container {name}` with the others, or `larder repair` alone"
                    )))
                }
                read => read,
            };
        };
        if self.view.as_ref().is_none_or(|v| v.id != id) {
            self.view = Some(match avail.is_damaged(id) {
                true => self.repo.salvage_view(id, &self.tables[&id])?,
                false => self.repo.load_container(id)?,
            });
        }
        let view = self.view.as_ref().expect("loaded above");
        Ok(view.read_chunk(&entry, &self.repo.codec(), out)?)
    }
}

/// What `snap` loses after the repair `avail` describes; `None` when it stays whole.
pub(super) fn examine(
    reader: &mut TreeReader<'_>,
    avail: &Availability<'_>,
    snap: &Snapshot,
) -> Result<Option<Loss>> {
    let fps = snap.tree.fingerprints()?;
    let mut stream = Vec::with_capacity(snap.tree.size.min(256 << 20) as usize);
    let mut cut = false;
    for fp in &fps {
        if !avail.usable(fp)? {
            cut = true;
            break;
        }
        reader.read(avail, fp, &mut stream)?;
    }
    // Entries up to the first that does not decode: the prefix before a lost chunk
    // is a valid tree (each directory precedes its contents).
    let mut kept = Vec::new();
    let mut decoded_all = false;
    if let Ok(decoder) = TreeDecoder::new(&stream) {
        decoded_all = true;
        for entry in decoder {
            match entry {
                Ok(e) => kept.push(e),
                Err(_) => {
                    decoded_all = false;
                    break;
                }
            }
        }
    }
    let tree = (cut || !decoded_all).then(|| TreeLoss {
        entries_kept: kept.len(),
        last_kept: kept.last().map(|e| e.path.clone()),
        bytes_lost: snap.tree.size.saturating_sub(stream.len() as u64),
    });
    let mut files = Vec::new();
    let mut keep = Vec::with_capacity(kept.len());
    for entry in kept {
        match lost_file(avail, &entry)? {
            Some(lost) => files.push(lost),
            None => keep.push(entry),
        }
    }
    Ok((tree.is_some() || !files.is_empty()).then_some(Loss {
        tree,
        files,
        kept: keep,
    }))
}

/// What file `entry` loses, if it loses anything.
fn lost_file(avail: &Availability<'_>, entry: &TreeEntry) -> Result<Option<LostFile>> {
    if entry.kind != EntryKind::File {
        return Ok(None);
    }
    let mut usable = Vec::with_capacity(entry.chunks.len());
    for fp in &entry.chunks {
        usable.push(avail.usable(fp)?);
    }
    let lost_chunks = usable.iter().filter(|u| !**u).count();
    if lost_chunks == 0 {
        return Ok(None);
    }
    let (mut offset, mut kept_bytes) = (0u64, 0u64);
    let mut ranges: Option<Vec<(u64, u64)>> = Some(Vec::new());
    for (fp, ok) in entry.chunks.iter().zip(usable) {
        let Some(len) = avail.raw_len(fp)?.map(u64::from) else {
            // Every later offset is unknown.
            ranges = None;
            continue;
        };
        if ok {
            kept_bytes += len;
        } else if let Some(ranges) = ranges.as_mut() {
            match ranges.last_mut() {
                Some(last) if last.1 == offset => last.1 += len,
                _ => ranges.push((offset, offset + len)),
            }
        }
        offset += len;
    }
    Ok(Some(LostFile {
        path: entry.path.clone(),
        size: entry.size,
        lost_bytes: entry.size.saturating_sub(kept_bytes),
        lost_chunks,
        lost_ranges: ranges,
    }))
}

/// The summary of a repaired copy: the original's, less what it lost. When the tree
/// lost entries (their count is unknown) the entry counts are those of the entries
/// kept.
pub(super) fn repaired_summary(snap: &Snapshot, loss: &Loss) -> larder_store::SnapshotSummary {
    let mut s = snap.summary.clone();
    if loss.tree.is_some() {
        let count = |kind: &dyn Fn(EntryKind) -> bool| {
            loss.kept.iter().filter(|e| kind(e.kind)).count() as u64
        };
        s.files = count(&|k| k == EntryKind::File);
        s.dirs = count(&|k| k == EntryKind::Dir);
        s.symlinks = count(&|k| k == EntryKind::Symlink);
        s.specials =
            count(&|k| !matches!(k, EntryKind::File | EntryKind::Dir | EntryKind::Symlink));
        s.bytes_in = loss.kept.iter().map(|e| e.size).sum();
    } else {
        s.files = s.files.saturating_sub(loss.files.len() as u64);
        s.bytes_in = s
            .bytes_in
            .saturating_sub(loss.files.iter().map(|f| f.size).sum());
    }
    s
}
