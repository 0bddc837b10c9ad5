//! What `forget`, `gc` and `unlock` print.

use larder_engine::{ForgetDecision, GcSummary};
use larder_store::LockHolder;
use serde_json::json;

use super::{mb, secs, Output};

fn gc_json(s: &GcSummary) -> serde_json::Value {
    let mut v = serde_json::to_value(&s.sweep).expect("a gc report serializes");
    v["snapshots"] = json!(s.snapshots);
    v["seconds"] = json!(secs(s.duration));
    v
}

impl Output {
    pub fn forget_done(&self, decisions: &[ForgetDecision], dry_run: bool, gc: Option<&GcSummary>) {
        let (keep, remove): (Vec<&ForgetDecision>, Vec<&ForgetDecision>) =
            decisions.iter().partition(|d| !d.reasons.is_empty());
        if self.json {
            let keep: Vec<_> = keep
                .iter()
                .map(|d| {
                    let reasons: Vec<&str> = d.reasons.iter().map(|r| r.name()).collect();
                    json!({ "id": d.id, "time": d.time, "hostname": d.hostname, "paths": d.paths, "reasons": reasons })
                })
                .collect();
            let remove: Vec<_> = remove
                .iter()
                .map(|d| json!({ "id": d.id, "time": d.time, "hostname": d.hostname, "paths": d.paths }))
                .collect();
            println!(
                "{}",
                json!({ "dry_run": dry_run, "keep": keep, "remove": remove, "gc": gc.map(gc_json) })
            );
            return;
        }
        if !self.text() {
            return;
        }
        let line = |d: &ForgetDecision, why: &str| {
            println!(
                "  {}  {}  {}  {}{why}",
                &d.id[..8.min(d.id.len())],
                d.time.get(..19).unwrap_or(&d.time),
                d.hostname,
                d.paths.join(" ")
            );
        };
        println!("keep {} snapshot(s):", keep.len());
        for d in &keep {
            let names: Vec<&str> = d.reasons.iter().map(|r| r.name()).collect();
            line(d, &format!("  ({})", names.join(", ")));
        }
        let verb = if dry_run { "would remove" } else { "removed" };
        println!("{verb} {} snapshot(s):", remove.len());
        for d in &remove {
            line(d, "");
        }
        if dry_run {
            println!("dry run: nothing was changed");
        } else if let Some(s) = gc {
            self.gc_done(s);
        } else if !remove.is_empty() {
            println!("their data stays in the repository until `larder gc`");
        }
    }

    pub fn gc_done(&self, s: &GcSummary) {
        if self.json {
            println!("{}", gc_json(s));
            return;
        }
        if !self.text() {
            return;
        }
        let r = &s.sweep;
        let would = if r.dry_run { "would be " } else { "" };
        println!(
            "gc: {} snapshot(s) marked {} live chunks ({})",
            s.snapshots,
            r.chunks_live,
            mb(r.live_bytes)
        );
        println!(
            "  containers  {} {would}deleted, {} {would}repacked into {}, {} kept",
            r.containers_deleted, r.containers_repacked, r.containers_written, r.containers_kept
        );
        println!("  chunks      {} {would}removed", r.chunks_removed);
        println!(
            "  reclaimed   {} {would}reclaimed ({} -> {} of containers and index)",
            mb(r.bytes_reclaimed.max(0) as u64),
            mb(r.bytes_before),
            mb(r.bytes_after)
        );
        println!("  time        {:.3} s", s.duration.as_secs_f64());
        if r.dry_run {
            println!("dry run: nothing was changed");
        }
    }

    pub fn unlock_done(&self, removed: Option<&LockHolder>) {
        if self.json {
            println!("{}", json!({ "removed": removed }));
        } else if self.text() {
            match removed {
                Some(h) => println!(
                    "removed the stale lock note of pid {} on {} (`{}`); the repository is not locked",
                    h.pid, h.hostname, h.command
                ),
                None => println!("the repository is not locked; nothing to remove"),
            }
        }
    }
}
