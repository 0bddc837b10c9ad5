//! Membership through leases: a node's key `members/<id>` lives as long as the node
//! keeps its lease alive. A node that stops (crash, kill -9, partition) loses its key
//! within the TTL; a node whose keepalive finds the lease gone learns it through
//! `lost()` and must stop serving partitions.

use std::collections::BTreeMap;
use std::time::Duration;

use etcd_client::{EventType, KeyValue, WatchOptions};
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::{unix_millis, CoordError, Etcd};

/// `members/<id>`'s value (JSON).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    /// Node id, 1..=65535.
    pub id: u16,
    /// The node's gRPC address, `host:port`.
    pub address: String,
    /// Cores the node uses.
    pub cores: u32,
    /// When the node joined, Unix milliseconds.
    pub started: u64,
}

impl Member {
    /// A member record started now.
    pub fn new(id: u16, address: impl Into<String>, cores: u32) -> Self {
        Self {
            id,
            address: address.into(),
            cores,
            started: unix_millis(),
        }
    }
}

/// A change seen by [`Membership::watch`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MemberEvent {
    Joined(Member),
    Left(u16),
}

#[derive(Debug, Clone)]
pub struct MembershipOptions {
    /// The lease's TTL in seconds; etcd may grant a longer one (never below its
    /// election timeout), and the keepalive follows the TTL granted.
    pub ttl_secs: i64,
}

impl Default for MembershipOptions {
    fn default() -> Self {
        Self { ttl_secs: 5 }
    }
}

/// A joined node: its lease, kept alive by a background task until `leave` or drop.
/// Dropping without `leave` stops the keepalive without revoking, as a crash would:
/// the key then disappears when the lease expires.
pub struct Membership {
    etcd: Etcd,
    member: Member,
    lease: i64,
    lost: watch::Receiver<bool>,
    keepalive: JoinHandle<()>,
}

const MEMBERS: &str = "members/";

fn member_key(id: u16) -> String {
    format!("{MEMBERS}{id}")
}

fn parse_member(etcd: &Etcd, kv: &KeyValue) -> Result<Member, CoordError> {
    serde_json::from_slice(kv.value()).map_err(|e| CoordError::Malformed {
        key: String::from_utf8_lossy(kv.key()).into_owned(),
        detail: format!("{e} ({} bytes, prefix {})", kv.value().len(), etcd.prefix()),
    })
}

/// The id in `<prefix>members/<id>`.
fn member_id_of_key(etcd: &Etcd, key: &[u8]) -> Option<u16> {
    let key = std::str::from_utf8(key).ok()?;
    key.strip_prefix(etcd.prefix())?
        .strip_prefix(MEMBERS)?
        .parse()
        .ok()
}

impl Membership {
    /// Grants a lease, puts `members/<id>` attached to it, and starts keeping it alive.
    pub async fn join(
        etcd: &Etcd,
        member: Member,
        options: MembershipOptions,
    ) -> Result<Self, CoordError> {
        if member.id == 0 {
            return Err(CoordError::Config("node id 0 is reserved".into()));
        }
        let granted_at = Instant::now();
        let grant = etcd.lease_grant(options.ttl_secs).await?;
        let lease = grant.id();
        let value = serde_json::to_vec(&member).map_err(|e| CoordError::Config(e.to_string()))?;
        etcd.put(&member_key(member.id), value, Some(lease)).await?;
        let (lost_sender, lost) = watch::channel(false);
        let deadline = granted_at + Duration::from_secs(grant.ttl().max(1) as u64);
        let keepalive = tokio::spawn(keep_alive(etcd.clone(), lease, deadline, lost_sender));
        Ok(Self {
            etcd: etcd.clone(),
            member,
            lease,
            lost,
            keepalive,
        })
    }

    pub fn member(&self) -> &Member {
        &self.member
    }

    /// The node's lease id (elections and other keys of the node attach to it).
    pub fn lease(&self) -> i64 {
        self.lease
    }

    /// Becomes `true`, once and for good, when the lease is gone or may have expired.
    pub fn lost(&self) -> watch::Receiver<bool> {
        self.lost.clone()
    }

    /// Leaves the cluster: revokes the lease, so `members/<id>` (and every key on the
    /// lease, such as an election candidacy) disappears at once. A lease etcd no
    /// longer knows (expired, or revoked by an earlier attempt) has left already.
    pub async fn leave(self) -> Result<(), CoordError> {
        self.keepalive.abort();
        Self::revoke(&self.etcd, self.lease).await
    }

    /// Revokes `lease`, a membership's that was dropped (its holder lost it): every key
    /// on it goes at once. A lease etcd no longer knows is gone already.
    pub async fn revoke(etcd: &Etcd, lease: i64) -> Result<(), CoordError> {
        match etcd.lease_revoke(lease).await {
            Err(CoordError::Etcd {
                source: etcd_client::Error::GRpcStatus(status),
                ..
            }) if status.code() == tonic::Code::NotFound => Ok(()),
            other => other,
        }
    }

    /// The live members, by id.
    pub async fn members(etcd: &Etcd) -> Result<Vec<Member>, CoordError> {
        let response = etcd.get_prefix(MEMBERS).await?;
        let mut members = response
            .kvs()
            .iter()
            .map(|kv| parse_member(etcd, kv))
            .collect::<Result<Vec<_>, _>>()?;
        members.sort_by_key(|m| m.id);
        Ok(members)
    }

    /// The live members now, and a channel of later joins and leaves. The watch is
    /// reopened after a stream error or a compaction, and the membership reloaded:
    /// differences since the last known state arrive as events, so none is missed
    /// (though a member that left and rejoined in between shows as a single join).
    /// The task ends when the receiver is dropped.
    pub async fn watch(
        etcd: &Etcd,
    ) -> Result<(Vec<Member>, mpsc::UnboundedReceiver<MemberEvent>), CoordError> {
        let (known, revision) = load_members(etcd).await?;
        let (sender, receiver) = mpsc::unbounded_channel();
        let initial = known.values().cloned().collect();
        tokio::spawn(watch_members(etcd.clone(), known, revision, sender));
        Ok((initial, receiver))
    }
}

impl Drop for Membership {
    fn drop(&mut self) {
        self.keepalive.abort();
    }
}

async fn load_members(etcd: &Etcd) -> Result<(BTreeMap<u16, Member>, i64), CoordError> {
    let response = etcd.get_prefix(MEMBERS).await?;
    let revision = response.header().map(|h| h.revision()).unwrap_or(0);
    let mut known = BTreeMap::new();
    for kv in response.kvs() {
        let member = parse_member(etcd, kv)?;
        known.insert(member.id, member);
    }
    Ok((known, revision))
}

/// Keeps `lease` alive every quarter of its TTL, each attempt limited to a quarter
/// of the TTL too, so that a frozen etcd endpoint costs one short attempt and a
/// health probe, not the lease (tests/coord.rs `a_frozen_etcd_member_is_skipped`).
/// Invariant: `lost` turns true before `deadline` (the latest time etcd may still
/// hold the lease, counted from when the last successful keepalive was sent) passes
/// without a successful keepalive, and as soon as etcd answers that the lease is gone.
async fn keep_alive(etcd: Etcd, lease: i64, mut deadline: Instant, lost: watch::Sender<bool>) {
    let ttl = deadline.saturating_duration_since(Instant::now());
    let quarter = (ttl / 4).max(Duration::from_millis(100));
    let mut pause = quarter;
    loop {
        tokio::time::sleep(pause).await;
        pause = quarter;
        let sent = Instant::now();
        let attempt = etcd.lease_keep_alive_once(lease, quarter);
        match tokio::time::timeout_at(deadline, attempt).await {
            Ok(Ok(left)) if left > 0 => {
                deadline = sent + Duration::from_secs(left as u64);
            }
            Ok(Ok(_)) => {
                tracing::warn!(lease, "lease gone: this node is no longer a member");
                break;
            }
            Ok(Err(error)) => {
                tracing::warn!(lease, %error, "lease keepalive failed");
                if Instant::now() >= deadline {
                    break;
                }
                pause = Duration::from_millis(100);
            }
            Err(_) => {
                tracing::warn!(
                    lease,
                    "lease may have expired: no keepalive answered in time"
                );
                break;
            }
        }
    }
    let _ = lost.send(true);
}

async fn watch_members(
    etcd: Etcd,
    mut known: BTreeMap<u16, Member>,
    mut revision: i64,
    events: mpsc::UnboundedSender<MemberEvent>,
) {
    loop {
        let options = WatchOptions::new()
            .with_prefix()
            .with_start_revision(revision + 1);
        let stream = tokio::select! {
            _ = events.closed() => return,
            stream = etcd.watch(MEMBERS, options) => stream,
        };
        if let Ok(mut stream) = stream {
            loop {
                let message = tokio::select! {
                    _ = events.closed() => return,
                    message = stream.message() => message,
                };
                let response = match message {
                    Ok(Some(response)) if !response.canceled() => response,
                    _ => break,
                };
                for event in response.events() {
                    let Some(kv) = event.kv() else { continue };
                    revision = revision.max(kv.mod_revision());
                    let Some(id) = member_id_of_key(&etcd, kv.key()) else {
                        continue;
                    };
                    let change = match event.event_type() {
                        EventType::Put => match parse_member(&etcd, kv) {
                            Ok(member) if known.get(&id) != Some(&member) => {
                                known.insert(id, member.clone());
                                Some(MemberEvent::Joined(member))
                            }
                            Ok(_) => None,
                            Err(error) => {
                                tracing::warn!(%error, "ignoring a malformed member record");
                                None
                            }
                        },
                        EventType::Delete => known.remove(&id).map(|_| MemberEvent::Left(id)),
                    };
                    if let Some(change) = change {
                        if events.send(change).is_err() {
                            return;
                        }
                    }
                }
            }
        }
        // The stream failed or was cancelled (compaction): reload and send the diff.
        tokio::time::sleep(Duration::from_millis(100)).await;
        let Ok((fresh, fresh_revision)) = load_members(&etcd).await else {
            continue;
        };
        let left: Vec<u16> = known
            .keys()
            .filter(|id| !fresh.contains_key(id))
            .copied()
            .collect();
        let mut changes: Vec<MemberEvent> = left.into_iter().map(MemberEvent::Left).collect();
        for (id, member) in &fresh {
            if known.get(id) != Some(member) {
                changes.push(MemberEvent::Joined(member.clone()));
            }
        }
        for change in changes {
            if events.send(change).is_err() {
                return;
            }
        }
        known = fresh;
        revision = fresh_revision;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// docs/design/cluster.md's `members/<id>` value, byte for byte, and back.
    #[test]
    fn member_value_is_the_documented_json() {
        let member = Member {
            id: 3,
            address: "10.0.0.3:7000".into(),
            cores: 2,
            started: 1764072000000,
        };
        let json = r#"{"id":3,"address":"10.0.0.3:7000","cores":2,"started":1764072000000}"#;
        assert_eq!(serde_json::to_string(&member).unwrap(), json);
        assert_eq!(serde_json::from_str::<Member>(json).unwrap(), member);
    }
}
