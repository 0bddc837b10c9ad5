//! Repair's view of the containers (docs/design/repair.md, "What it reads" and "What
//! counts as lost"): which are damaged, which of their chunks are salvaged, which
//! have another copy, which are lost; and, for the snapshots, whether a chunk is
//! usable after the repair and how long it is.

use std::collections::{BTreeMap, HashMap, HashSet};

use larder_hash::Fingerprint;
use larder_store::{position, ChunkEntry, ContainerHealth, Repository, StoreError};
use rayon::prelude::*;

use crate::error::Result;
use crate::Progress;

/// The index's table of every indexed container, by id.
pub(super) type Tables = BTreeMap<u64, Vec<ChunkEntry>>;

/// One damaged indexed container.
pub(super) struct DamagedContainer {
    pub reason: String,
    /// Positions in its table of the chunks that no longer verify.
    pub bad: Vec<usize>,
}

/// What reading the containers found.
#[derive(Default)]
pub(super) struct Scan {
    pub damaged: BTreeMap<u64, DamagedContainer>,
    /// Containers no segment names that failed verification: deleted.
    pub unindexed: Vec<(u64, String)>,
    /// Containers of a format this larder does not read: left alone.
    pub unknown: Vec<(u64, String)>,
    pub containers_read: usize,
    pub bytes_read: u64,
}

/// Reads every indexed container against its table, the data of those `read_data`
/// says, on every core; then the unindexed ones that failed verification at open.
pub(super) fn scan(
    repo: &Repository,
    tables: &Tables,
    read_data: &(dyn Fn(u64) -> bool + Sync),
    progress: &dyn Progress,
) -> Result<Scan> {
    let stored = |id: &u64| larder_store::stored_bytes(&tables[id]);
    let total = tables.keys().filter(|id| read_data(**id)).map(stored).sum();
    progress.set_total(total);
    let health: Vec<(u64, ContainerHealth)> = tables
        .par_iter()
        .map(|(&id, table)| {
            let h = repo.inspect_container(id, table, read_data(id))?;
            if read_data(id) {
                progress.advance(stored(&id));
            }
            Ok((id, h))
        })
        .collect::<Result<_, StoreError>>()?;
    let mut scan = Scan {
        containers_read: tables.len(),
        bytes_read: total,
        ..Scan::default()
    };
    for (id, h) in health {
        match h {
            ContainerHealth::Intact => {}
            ContainerHealth::Damaged { reason, bad } => {
                scan.damaged.insert(id, DamagedContainer { reason, bad });
            }
            ContainerHealth::Unknown(reason) => scan.unknown.push((id, reason)),
        }
    }
    for (id, _) in &repo.report().bad_containers {
        match repo.inspect_unindexed(*id)? {
            ContainerHealth::Intact => {}
            ContainerHealth::Damaged { reason, .. } => scan.unindexed.push((*id, reason)),
            ContainerHealth::Unknown(reason) => scan.unknown.push((*id, reason)),
        }
    }
    Ok(scan)
}

/// Where each chunk will be after the repair: the chunks to salvage, the copies that
/// replace damaged ones, and the chunks lost.
pub(super) struct Availability<'r> {
    repo: &'r Repository,
    tables: &'r Tables,
    damaged: HashSet<u64>,
    /// Chunks whose indexed copy is in a damaged container but which verify somewhere:
    /// where they are read from (a damaged container's copy that is salvaged, or
    /// another copy in an intact container).
    pub relocated: HashMap<Fingerprint, (u64, ChunkEntry)>,
    /// Positions to copy out of each damaged container, ascending.
    pub salvage: BTreeMap<u64, Vec<usize>>,
    /// Lost chunks and their raw lengths.
    pub lost: HashMap<Fingerprint, u32>,
}

impl<'r> Availability<'r> {
    /// Decides, for every chunk of a damaged container, whether it is salvaged, has
    /// another copy, or is lost.
    pub fn new(repo: &'r Repository, tables: &'r Tables, scan: &Scan) -> Result<Self> {
        let damaged: HashSet<u64> = scan.damaged.keys().copied().collect();
        let index = repo.index();
        // The chunks of damaged containers whose indexed copy is in one of them: only
        // these need a new home.
        let mut homeless: HashSet<Fingerprint> = HashSet::new();
        for id in scan.damaged.keys() {
            for e in &tables[id] {
                if index
                    .get(&e.fingerprint)?
                    .is_none_or(|l| damaged.contains(&l.container))
                {
                    homeless.insert(e.fingerprint);
                }
            }
        }
        let mut relocated = HashMap::new();
        for (&id, table) in tables.iter().filter(|(id, _)| !damaged.contains(id)) {
            for e in table.iter().filter(|e| homeless.contains(&e.fingerprint)) {
                relocated.entry(e.fingerprint).or_insert((id, *e));
            }
        }
        let mut salvage: BTreeMap<u64, Vec<usize>> = BTreeMap::new();
        let mut lost = HashMap::new();
        for (&id, d) in &scan.damaged {
            let bad: HashSet<usize> = d.bad.iter().copied().collect();
            for (i, e) in tables[&id].iter().enumerate() {
                let fp = e.fingerprint;
                if !homeless.contains(&fp) || relocated.contains_key(&fp) {
                    continue;
                }
                if bad.contains(&i) {
                    lost.insert(fp, e.raw_len);
                } else {
                    relocated.insert(fp, (id, *e));
                    salvage.entry(id).or_default().push(i);
                }
            }
        }
        lost.retain(|fp, _| !relocated.contains_key(fp));
        Ok(Self {
            repo,
            tables,
            damaged,
            relocated,
            salvage,
            lost,
        })
    }

    pub fn is_damaged(&self, container: u64) -> bool {
        self.damaged.contains(&container)
    }

    /// Whether chunk `fp` can be read after the repair.
    pub fn usable(&self, fp: &Fingerprint) -> Result<bool> {
        if self.relocated.contains_key(fp) {
            return Ok(true);
        }
        if self.lost.contains_key(fp) {
            return Ok(false);
        }
        Ok(self
            .repo
            .index()
            .get(fp)?
            .is_some_and(|l| !self.damaged.contains(&l.container)))
    }

    /// The raw length of chunk `fp`, if any table says it: a usable chunk's, or a lost
    /// one's from its damaged container; `None` for a chunk no index names.
    pub fn raw_len(&self, fp: &Fingerprint) -> Result<Option<u32>> {
        if let Some((_, e)) = self.relocated.get(fp) {
            return Ok(Some(e.raw_len));
        }
        if let Some(&len) = self.lost.get(fp) {
            return Ok(Some(len));
        }
        let Some(loc) = self.repo.index().get(fp)? else {
            return Ok(None);
        };
        let Some(entries) = self.tables.get(&loc.container) else {
            return Ok(None);
        };
        Ok(position(entries, loc.offset, fp).map(|i| entries[i].raw_len))
    }
}
