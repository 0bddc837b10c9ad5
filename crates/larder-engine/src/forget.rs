//! Which snapshots `forget` removes under a retention policy (docs/design/gc.md,
//! "Forget"). restic's semantics: a snapshot kept by any rule is kept; `--keep-last N`
//! keeps the N newest; `--keep-daily N` the newest snapshot of each of the N newest
//! local calendar days that have one, and likewise for ISO weeks (Monday to Sunday)
//! and months. Snapshots are grouped by host and paths first, as restic does by
//! default, and each group is judged on its own. Checkpoints (partial snapshots of a
//! backup that was killed or is running) are neither counted nor removed by a policy:
//! the next complete backup of their paths removes them.

use std::collections::BTreeMap;

use larder_store::{IdentifiedSnapshot, Repository};
use serde::Serialize;

use crate::error::Result;
use crate::time::{civil_from_days, parse_utc_rfc3339};

/// How many snapshots each rule keeps.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct RetentionPolicy {
    pub last: usize,
    pub daily: usize,
    pub weekly: usize,
    pub monthly: usize,
}

impl RetentionPolicy {
    /// A policy with every count 0 would remove every snapshot: callers refuse it.
    pub fn keeps_nothing(&self) -> bool {
        *self == Self::default()
    }
}

/// Why a snapshot is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum KeepReason {
    Last,
    Daily,
    Weekly,
    Monthly,
    /// `forget` was given snapshot names, and not this one's.
    NotNamed,
    /// Its time does not parse, so no rule can place it.
    UnknownTime,
    /// A checkpoint: policies count complete snapshots only.
    Checkpoint,
}

impl KeepReason {
    /// The rules of a policy.
    pub const RULES: [KeepReason; 4] = [Self::Last, Self::Daily, Self::Weekly, Self::Monthly];

    pub fn name(self) -> &'static str {
        match self {
            Self::Last => "last",
            Self::Daily => "daily",
            Self::Weekly => "weekly",
            Self::Monthly => "monthly",
            Self::NotNamed => "not named",
            Self::UnknownTime => "unknown time",
            Self::Checkpoint => "checkpoint",
        }
    }

    fn count(self, policy: &RetentionPolicy) -> usize {
        match self {
            Self::Last => policy.last,
            Self::Daily => policy.daily,
            Self::Weekly => policy.weekly,
            Self::Monthly => policy.monthly,
            Self::NotNamed | Self::UnknownTime | Self::Checkpoint => 0,
        }
    }

    /// The bucket of a snapshot taken at local time `local` (seconds since the epoch
    /// of the local calendar): `index` for `last` (every snapshot its own bucket), the
    /// day, the week (Monday-based: 1970-01-01 was a Thursday) or the month.
    fn bucket(self, local: i64, index: usize) -> i64 {
        let day = local.div_euclid(86_400);
        match self {
            Self::Last | Self::NotNamed | Self::UnknownTime | Self::Checkpoint => index as i64,
            Self::Daily => day,
            Self::Weekly => (day + 3).div_euclid(7),
            Self::Monthly => {
                let (year, month, _) = civil_from_days(day);
                year * 12 + month
            }
        }
    }
}

/// For each of `local_times` (local times of one group's snapshots, oldest first),
/// the rules that keep it; an empty list means it is removed. Walks newest first:
/// each rule keeps a snapshot whose bucket differs from that of the last snapshot it
/// kept, until its count is spent, so it keeps the newest of each of its newest
/// buckets.
pub fn apply_policy(local_times: &[i64], policy: &RetentionPolicy) -> Vec<Vec<KeepReason>> {
    let mut reasons = vec![Vec::new(); local_times.len()];
    for rule in KeepReason::RULES {
        let mut left = rule.count(policy);
        let mut last_bucket = None;
        for i in (0..local_times.len()).rev() {
            if left == 0 {
                break;
            }
            let bucket = rule.bucket(local_times[i], i);
            if last_bucket != Some(bucket) {
                reasons[i].push(rule);
                left -= 1;
                last_bucket = Some(bucket);
            }
        }
    }
    reasons
}

/// One snapshot's fate.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ForgetDecision {
    pub id: String,
    pub time: String,
    pub hostname: String,
    pub paths: Vec<String>,
    /// Empty: removed.
    pub reasons: Vec<KeepReason>,
    /// A snapshot file that cannot be read, named by its id: only its id is known.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub unreadable: bool,
}

/// Applies `policy` to `snapshots` (oldest first, as [`Repository::snapshots`] gives
/// them), group by group, with `offset(utc)` the local zone's offset at a UTC time in
/// seconds. A snapshot whose time does not parse is kept (and named so), and so is a
/// checkpoint, which no rule counts. Returns the decisions, oldest first.
pub fn plan_forget(
    snapshots: &[IdentifiedSnapshot],
    policy: &RetentionPolicy,
    offset: impl Fn(i64) -> i64,
) -> Vec<ForgetDecision> {
    let mut groups: BTreeMap<(&str, &[String]), Vec<usize>> = BTreeMap::new();
    let mut decisions: Vec<ForgetDecision> = snapshots
        .iter()
        .enumerate()
        .map(|(i, (id, s))| {
            if !s.partial {
                groups
                    .entry((s.hostname.as_str(), s.paths.as_slice()))
                    .or_default()
                    .push(i);
            }
            ForgetDecision {
                id: id.clone(),
                time: s.time.clone(),
                hostname: s.hostname.clone(),
                paths: s.paths.clone(),
                reasons: match s.partial {
                    true => vec![KeepReason::Checkpoint],
                    false => Vec::new(),
                },
                unreadable: false,
            }
        })
        .collect();
    for members in groups.values() {
        let (timed, untimed): (Vec<usize>, Vec<usize>) = members
            .iter()
            .partition(|&&i| parse_utc_rfc3339(&snapshots[i].1.time).is_some());
        let local: Vec<i64> = timed
            .iter()
            .map(|&i| {
                let utc = parse_utc_rfc3339(&snapshots[i].1.time).expect("partitioned above");
                utc + offset(utc)
            })
            .collect();
        for (&i, reasons) in timed.iter().zip(apply_policy(&local, policy)) {
            decisions[i].reasons = reasons;
        }
        for i in untimed {
            decisions[i].reasons = vec![KeepReason::UnknownTime];
        }
    }
    decisions
}

/// The decisions of `forget` given snapshot names: `named` (full ids) are removed,
/// every other snapshot is kept. Oldest first, like `snapshots`; then the named ids
/// that are not among `snapshots` (files that cannot be read), removed too.
pub fn plan_forget_named(
    snapshots: &[IdentifiedSnapshot],
    named: &[String],
) -> Vec<ForgetDecision> {
    let mut decisions: Vec<ForgetDecision> = snapshots
        .iter()
        .map(|(id, s)| ForgetDecision {
            id: id.clone(),
            time: s.time.clone(),
            hostname: s.hostname.clone(),
            paths: s.paths.clone(),
            reasons: if named.contains(id) {
                Vec::new()
            } else {
                vec![KeepReason::NotNamed]
            },
            unreadable: false,
        })
        .collect();
    for id in named {
        if !decisions.iter().any(|d| d.id == *id) {
            decisions.push(ForgetDecision {
                id: id.clone(),
                time: String::new(),
                hostname: String::new(),
                paths: Vec::new(),
                reasons: Vec::new(),
                unreadable: true,
            });
        }
    }
    decisions
}

/// Removes the snapshots `ids` (full ids). Their data stays until `gc`.
pub fn forget(repo: &Repository, ids: &[String]) -> Result<()> {
    if !ids.is_empty() {
        repo.require_deletes("forget snapshots")?;
    }
    for id in ids {
        repo.remove_snapshot(id)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    const DAY: i64 = 86_400;

    /// The policy restated: for each rule, group the snapshots by bucket, take the
    /// `count` newest buckets, keep the newest snapshot of each.
    fn model(times: &[i64], policy: &RetentionPolicy) -> Vec<BTreeSet<KeepReason>> {
        let mut keep = vec![BTreeSet::new(); times.len()];
        for rule in KeepReason::RULES {
            let mut newest: BTreeMap<i64, usize> = BTreeMap::new();
            for (i, &t) in times.iter().enumerate() {
                let b = rule.bucket(t, i);
                let e = newest.entry(b).or_insert(i);
                if (times[*e], *e) < (t, i) {
                    *e = i;
                }
            }
            for (_, &i) in newest.iter().rev().take(rule.count(policy)) {
                keep[i].insert(rule);
            }
        }
        keep
    }

    #[test]
    fn known_calendar() {
        // 2026-11-16 is a Monday. Snapshots at noon on each day of two weeks, and two
        // on the last day. All in one month: the second monthly slot stays unused.
        let monday = crate::time::parse_utc_rfc3339("2026-11-16T12:00:00Z").unwrap();
        let mut times: Vec<i64> = (0..14).map(|d| monday + d * DAY).collect();
        times.push(monday + 13 * DAY + 3600);
        let policy = RetentionPolicy {
            last: 2,
            daily: 3,
            weekly: 2,
            monthly: 2,
        };
        let kept: Vec<(usize, Vec<KeepReason>)> = apply_policy(&times, &policy)
            .into_iter()
            .enumerate()
            .filter(|(_, r)| !r.is_empty())
            .collect();
        use KeepReason::*;
        assert_eq!(
            kept,
            vec![
                (6, vec![Weekly]), // Sunday 2026-11-22, end of the first week
                (11, vec![Daily]), // 2026-11-27
                (12, vec![Daily]), // 2026-11-28
                (13, vec![Last]),  // 2026-11-29 noon
                (14, vec![Last, Daily, Weekly, Monthly]), // 2026-11-29 13:00
            ]
        );
    }

    #[test]
    fn weeks_are_iso_weeks() {
        // 2021-01-03 (a Sunday) is in ISO week 2020-W53; 2021-01-04 starts 2021-W01.
        let sunday = crate::time::parse_utc_rfc3339("2021-01-03T23:00:00Z").unwrap();
        let monday = crate::time::parse_utc_rfc3339("2021-01-04T01:00:00Z").unwrap();
        let saturday = crate::time::parse_utc_rfc3339("2021-01-02T01:00:00Z").unwrap();
        let w = |t| KeepReason::Weekly.bucket(t, 0);
        assert_eq!(w(sunday), w(saturday));
        assert_eq!(w(monday), w(sunday) + 1);
    }

    #[test]
    fn groups_are_judged_apart_and_the_local_zone_decides_the_day() {
        use larder_store::{Snapshot, SnapshotSummary, TreeRef};
        let snap = |time: &str, host: &str| Snapshot {
            version: 1,
            time: time.into(),
            hostname: host.into(),
            username: String::new(),
            paths: vec!["/data".into()],
            tree: TreeRef {
                size: 0,
                chunks: Vec::new(),
            },
            summary: SnapshotSummary::default(),
            partial: false,
            parents: Vec::new(),
            original: None,
            repaired_from: None,
        };
        let snaps: Vec<IdentifiedSnapshot> = vec![
            ("a".into(), snap("2026-11-20T22:30:00Z", "h1")),
            ("b".into(), snap("2026-11-20T23:30:00Z", "h1")),
            ("c".into(), snap("2026-11-20T23:45:00Z", "h2")),
        ];
        let daily = RetentionPolicy {
            daily: 2,
            ..Default::default()
        };
        let kept = |offset: i64| -> Vec<String> {
            plan_forget(&snaps, &daily, |_| offset)
                .into_iter()
                .filter(|d| !d.reasons.is_empty())
                .map(|d| d.id)
                .collect()
        };
        // In UTC a and b fall on one day; an hour east, b is on the next day.
        assert_eq!(kept(0), ["b", "c"]);
        assert_eq!(kept(3600), ["a", "b", "c"]);
        // A newer checkpoint is kept as a checkpoint and takes no rule's place.
        let mut with_checkpoint = snaps.clone();
        let mut partial = snap("2026-11-21T10:00:00Z", "h1");
        partial.partial = true;
        with_checkpoint.push(("d".into(), partial));
        let decisions = plan_forget(&with_checkpoint, &daily, |_| 0);
        let reasons: Vec<&[KeepReason]> = decisions.iter().map(|d| d.reasons.as_slice()).collect();
        assert_eq!(
            reasons,
            [
                &[][..],
                &[KeepReason::Daily],
                &[KeepReason::Daily],
                &[KeepReason::Checkpoint]
            ]
        );
    }

    proptest! {
        #[test]
        fn policy_matches_the_model(
            mut times in proptest::collection::vec(0i64..400 * DAY, 0..60),
            last in 0usize..5, daily in 0usize..8, weekly in 0usize..6, monthly in 0usize..5,
        ) {
            times.sort();
            let policy = RetentionPolicy { last, daily, weekly, monthly };
            let got: Vec<BTreeSet<KeepReason>> = apply_policy(&times, &policy)
                .into_iter()
                .map(|r| r.into_iter().collect())
                .collect();
            prop_assert_eq!(got, model(&times, &policy));
        }
    }
}
