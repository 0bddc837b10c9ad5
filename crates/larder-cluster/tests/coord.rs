//! The etcd coordination layer against a real etcd cluster (tests/support/etcd.rs):
//! membership leases, master election, the partition map with its epochs and the
//! fencing check, and all of them with one etcd member of three killed.

mod support;

use std::time::{Duration, Instant};

use larder_cluster::coord::{
    ClusterConfig, CoordError, Election, Etcd, EtcdOptions, Member, MemberEvent, Membership,
    MembershipOptions, PartitionMapStore, COORD_FORMAT_VERSION, MOVES_PER_TXN,
};
use support::etcd::EtcdCluster;
use tokio::sync::mpsc::UnboundedReceiver;

/// The lease TTL of the members whose expiry a test waits for (etcd's minimum with
/// its default election timeout is 2 s; 3 s leaves a keepalive room on a busy machine).
const TTL: i64 = 3;
/// `MembershipOptions::default()`'s TTL.
const DEFAULT_TTL: Duration = Duration::from_secs(5);
/// Slack on every wait: generous, for a busy 2-core CI machine.
const SLACK: Duration = Duration::from_secs(10);

async fn connect(endpoints: &[String]) -> Etcd {
    Etcd::connect(endpoints, "/larder-test", EtcdOptions::default())
        .await
        .expect("connect to etcd")
}

async fn join(etcd: &Etcd, id: u16) -> Membership {
    let member = Member::new(id, format!("127.0.0.1:{}", 7000 + id), 2);
    Membership::join(etcd, member, MembershipOptions { ttl_secs: TTL })
        .await
        .expect("join")
}

/// A member with the production TTL (5 s), for tests that do not wait for an expiry:
/// while an etcd member is down or frozen, a keepalive may wait for a raft election
/// (1 s) and a health probe, and on a busy machine a shorter TTL could run out
/// (the node would then declare itself lost: safe, but not what the test is about).
async fn join_with_default_ttl(etcd: &Etcd, id: u16) -> Membership {
    let member = Member::new(id, format!("127.0.0.1:{}", 7000 + id), 2);
    Membership::join(etcd, member, MembershipOptions::default())
        .await
        .expect("join")
}

async fn member_ids(etcd: &Etcd) -> Vec<u16> {
    Membership::members(etcd)
        .await
        .expect("list members")
        .iter()
        .map(|m| m.id)
        .collect()
}

async fn next_event(events: &mut UnboundedReceiver<MemberEvent>) -> MemberEvent {
    tokio::time::timeout(SLACK, events.recv())
        .await
        .expect("a member event within the slack")
        .expect("the member watch is running")
}

fn config(partitions: u32) -> ClusterConfig {
    ClusterConfig {
        format_version: COORD_FORMAT_VERSION,
        partitions,
        chunking: "fastcdc 2048/8192/65536 level 2".into(),
        hash: "blake3".into(),
        encryption: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn member_key_expires_within_ttl_after_keepalive_stops_and_revoke_removes_it_at_once() {
    let cluster = EtcdCluster::start(3).await;
    let etcd = connect(&cluster.endpoints()).await;
    let (initial, mut events) = Membership::watch(&etcd).await.unwrap();
    assert!(initial.is_empty());

    let first = join(&etcd, 1).await;
    let second = join(&etcd, 2).await;
    assert_eq!(member_ids(&etcd).await, [1, 2]);
    let MemberEvent::Joined(joined) = next_event(&mut events).await else {
        panic!("expected a join")
    };
    assert_eq!(&joined, first.member());
    assert_eq!(
        next_event(&mut events).await,
        MemberEvent::Joined(second.member().clone())
    );

    // A process that stops keeping alive (dropped, not revoked) loses its key when
    // the lease expires: not at once, and within the TTL plus slack.
    drop(first);
    let stopped = Instant::now();
    assert_eq!(next_event(&mut events).await, MemberEvent::Left(1));
    assert!(
        stopped.elapsed() >= Duration::from_millis(1000),
        "the key vanished after {:?}, before its lease could expire",
        stopped.elapsed()
    );
    assert_eq!(member_ids(&etcd).await, [2]);
    // Meanwhile the live member's keepalive held its key beyond its TTL.
    assert!(!*second.lost().borrow());

    second.leave().await.unwrap();
    assert_eq!(member_ids(&etcd).await, Vec::<u16>::new());
    assert_eq!(next_event(&mut events).await, MemberEvent::Left(2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_signal_fires_when_the_lease_is_revoked_behind_the_node() {
    let cluster = EtcdCluster::start(1).await;
    let etcd = connect(&cluster.endpoints()).await;
    let node = join(&etcd, 7).await;
    let mut lost = node.lost();
    assert!(!*lost.borrow());
    etcd.lease_revoke(node.lease()).await.unwrap();
    tokio::time::timeout(SLACK, lost.wait_for(|lost| *lost))
        .await
        .expect("lost within the slack")
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_signal_fires_when_etcd_is_unreachable_past_the_ttl() {
    let mut cluster = EtcdCluster::start(1).await;
    let etcd = connect(&cluster.endpoints()).await;
    let node = join(&etcd, 7).await;
    let mut lost = node.lost();
    cluster.kill(0);
    let killed = Instant::now();
    tokio::time::timeout(
        Duration::from_secs(TTL as u64) + SLACK,
        lost.wait_for(|lost| *lost),
    )
    .await
    .expect("lost within TTL plus slack")
    .unwrap();
    // Not before the lease could have expired: the last keepalive was at most a third
    // of the TTL before the kill.
    assert!(
        killed.elapsed() >= Duration::from_millis(1000),
        "lost after {:?}",
        killed.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn election_has_one_leader_and_moves_to_the_other_candidate_when_its_lease_ends() {
    let cluster = EtcdCluster::start(3).await;
    let etcd = connect(&cluster.endpoints()).await;
    let election = Election::new(&etcd);
    assert_eq!(election.leader().await.unwrap(), None);
    let mut observed = election.observe();

    let mut nodes = [Some(join(&etcd, 1).await), Some(join(&etcd, 2).await)];
    let mut campaigns: Vec<_> = nodes
        .iter()
        .map(|node| {
            let node = node.as_ref().unwrap();
            let (election, lease, value) =
                (election.clone(), node.lease(), node.member().id.to_string());
            tokio::spawn(async move { election.campaign(lease, &value).await })
        })
        .collect();
    let (first, winner) = tokio::time::timeout(SLACK, async {
        let [zero, one] = &mut campaigns[..] else {
            unreachable!("two candidates")
        };
        tokio::select! {
            result = zero => (0, result),
            result = one => (1, result),
        }
    })
    .await
    .expect("a leader within the slack");
    let leadership = winner.unwrap().unwrap();
    let other = 1 - first;
    let winner_value = (first + 1).to_string();
    assert_eq!(leadership.value(), winner_value);
    assert_eq!(election.leader().await.unwrap(), Some(winner_value.clone()));
    tokio::time::timeout(
        SLACK,
        observed.wait_for(|v| v.as_deref() == Some(winner_value.as_str())),
    )
    .await
    .expect("observe sees the leader")
    .unwrap();
    // One leader: the other candidate keeps waiting while the leader's lease lives.
    tokio::time::sleep(Duration::from_secs(TTL as u64 + 1)).await;
    assert!(!campaigns[other].is_finished(), "two leaders at once");

    // The leader stops keeping its lease alive: the other is elected once it expires.
    nodes[first] = None;
    let stopped = Instant::now();
    let next = tokio::time::timeout(
        Duration::from_secs(TTL as u64) + SLACK,
        &mut campaigns[other],
    )
    .await
    .expect("the other candidate is elected within TTL plus slack")
    .unwrap()
    .unwrap();
    assert!(stopped.elapsed() >= Duration::from_millis(1000));
    let next_value = (other + 1).to_string();
    assert_eq!(next.value(), next_value);
    assert_eq!(election.leader().await.unwrap(), Some(next_value.clone()));
    tokio::time::timeout(
        SLACK,
        observed.wait_for(|v| v.as_deref() == Some(next_value.as_str())),
    )
    .await
    .expect("observe sees the new leader")
    .unwrap();

    election.resign(next).await.unwrap();
    assert_eq!(election.leader().await.unwrap(), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn map_assign_load_cache_and_fencing() {
    let cluster = EtcdCluster::start(3).await;
    let etcd = connect(&cluster.endpoints()).await;
    let store = PartitionMapStore::new(&etcd);

    assert_eq!(store.config().await.unwrap(), None);
    store.init_cluster(&config(1024)).await.unwrap();
    store.init_cluster(&config(1024)).await.unwrap();
    let refused = store.init_cluster(&config(512)).await.unwrap_err();
    assert!(
        matches!(refused, CoordError::ConfigMismatch { .. }),
        "{refused}"
    );
    assert_eq!(store.config().await.unwrap(), Some(config(1024)));

    let node = join_with_default_ttl(&etcd, 1).await;
    let master = Election::new(&etcd)
        .campaign(node.lease(), "1")
        .await
        .unwrap();

    // Every partition in one assign: more moves than one transaction may carry.
    let moves: Vec<(u32, u16)> = (0..1024).map(|p| (p, 1 + (p % 3) as u16)).collect();
    let epochs = store.assign(&moves, &master).await.unwrap();
    assert_eq!(epochs.len(), moves.len());
    let mut distinct: Vec<i64> = epochs.iter().map(|(_, e)| *e).collect();
    distinct.dedup();
    assert_eq!(
        distinct.len(),
        1024usize.div_ceil(MOVES_PER_TXN),
        "one transaction per {MOVES_PER_TXN} moves"
    );

    let map = store.load().await.unwrap();
    assert_eq!(map.partitions.len(), 1024);
    for (&(p, owner), &(ep, epoch)) in moves.iter().zip(&epochs) {
        assert_eq!(p, ep);
        let assignment = map.get(p).unwrap();
        assert_eq!(
            (assignment.owner, assignment.epoch),
            (owner, epoch),
            "partition {p}"
        );
    }
    assert_eq!(map.owned_by(2).len(), 341);

    let cache = store.cache().await.unwrap();
    assert_eq!(*cache.current(), map);
    assert!(store
        .check_epoch(5, map.get(5).unwrap().epoch)
        .await
        .unwrap());
    assert_eq!(
        store.check_epochs(&epochs).await.unwrap(),
        Vec::<u32>::new(),
        "every epoch is current"
    );

    // Reassign two partitions in different transactions' ranges: their old epochs fail
    // the fencing check, single and batched, and the cache follows.
    let moved = store.assign(&[(5, 3), (700, 1)], &master).await.unwrap();
    let new_epoch = moved[0].1;
    assert!(new_epoch > map.get(5).unwrap().epoch);
    assert!(!store
        .check_epoch(5, map.get(5).unwrap().epoch)
        .await
        .unwrap());
    assert!(store.check_epoch(5, new_epoch).await.unwrap());
    assert!(store
        .check_epoch(6, map.get(6).unwrap().epoch)
        .await
        .unwrap());
    assert_eq!(store.check_epochs(&epochs).await.unwrap(), [5, 700]);
    let cached = tokio::time::timeout(SLACK, cache.wait_for_revision(new_epoch))
        .await
        .expect("the cache follows within the slack")
        .unwrap();
    assert_eq!(
        cached.get(5).map(|a| (a.owner, a.epoch)),
        Some((3, new_epoch))
    );
    assert_eq!(
        cached.get(700).map(|a| (a.owner, a.epoch)),
        Some((1, new_epoch))
    );
    assert_eq!(*cached, store.load().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_whose_election_key_is_gone_cannot_write_the_map() {
    let cluster = EtcdCluster::start(3).await;
    let etcd = connect(&cluster.endpoints()).await;
    let store = PartitionMapStore::new(&etcd);
    let election = Election::new(&etcd);
    let old = join_with_default_ttl(&etcd, 1).await;
    let new = join_with_default_ttl(&etcd, 2).await;
    let old_master = election.campaign(old.lease(), "1").await.unwrap();
    let waiting = {
        let (election, lease) = (election.clone(), new.lease());
        tokio::spawn(async move { election.campaign(lease, "2").await })
    };
    store.assign(&[(1, 1)], &old_master).await.unwrap();

    old.leave().await.unwrap();
    let new_master = tokio::time::timeout(SLACK, waiting)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let before = store.load().await.unwrap();
    let refused = store
        .assign(&[(1, 2), (2, 2)], &old_master)
        .await
        .unwrap_err();
    assert!(matches!(refused, CoordError::NotMaster { .. }), "{refused}");
    assert!(!refused.is_retryable());
    assert_eq!(
        store.load().await.unwrap().partitions,
        before.partitions,
        "nothing written"
    );

    let epochs = store.assign(&[(1, 2)], &new_master).await.unwrap();
    assert_eq!(
        store
            .load()
            .await
            .unwrap()
            .get(1)
            .map(|a| (a.owner, a.epoch)),
        Some((2, epochs[0].1))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_fails_naming_the_endpoints_when_none_answers() {
    let endpoints: Vec<String> = ["127.0.0.1:1", "127.0.0.1:2"]
        .iter()
        .map(|e| format!("http://{e}"))
        .collect();
    let Err(error) = Etcd::connect(&endpoints, "/x", EtcdOptions::default()).await else {
        panic!("connected to nothing")
    };
    assert!(error.is_retryable());
    let message = error.to_string();
    assert!(
        message.contains("127.0.0.1:1") && message.contains("127.0.0.1:2"),
        "{message}"
    );
}

/// Runs every coordination operation once; panics on any failure.
async fn exercise_everything(etcd: &Etcd, id: u16, partition: u32) {
    let (_, mut events) = Membership::watch(etcd).await.unwrap();
    let node = join_with_default_ttl(etcd, id).await;
    assert!(member_ids(etcd).await.contains(&id));
    assert_eq!(
        next_event(&mut events).await,
        MemberEvent::Joined(node.member().clone())
    );
    let election = Election::new(etcd);
    let master = tokio::time::timeout(SLACK, election.campaign(node.lease(), &id.to_string()))
        .await
        .expect("elected within the slack")
        .unwrap();
    assert_eq!(election.leader().await.unwrap(), Some(id.to_string()));
    let store = PartitionMapStore::new(etcd);
    store.init_cluster(&config(64)).await.unwrap();
    let cache = store.cache().await.unwrap();
    let epochs = store.assign(&[(partition, id)], &master).await.unwrap();
    let epoch = epochs[0].1;
    assert!(store.check_epoch(partition, epoch).await.unwrap());
    assert_eq!(
        store.check_epochs(&epochs).await.unwrap(),
        Vec::<u32>::new()
    );
    assert_eq!(
        store.load().await.unwrap().get(partition).map(|a| a.owner),
        Some(id)
    );
    let cached = tokio::time::timeout(SLACK, cache.wait_for_revision(epoch))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        cached.get(partition).map(|a| (a.owner, a.epoch)),
        Some((id, epoch))
    );
    election.resign(master).await.unwrap();
    node.leave().await.unwrap();
    assert_eq!(next_event(&mut events).await, MemberEvent::Left(id));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_one_etcd_member_of_three_changes_nothing() {
    let mut cluster = EtcdCluster::start(3).await;
    let endpoints = cluster.endpoints();
    let etcd = connect(&endpoints).await;
    let survivor = join_with_default_ttl(&etcd, 9).await;
    // A map cache whose watch stream may sit on a member killed below: it must reopen
    // (or reload) and miss nothing.
    let store = PartitionMapStore::new(&etcd);
    let early_cache = store.cache().await.unwrap();

    cluster.kill(0);
    let killed = tokio::time::Instant::now();
    // A handle made before the kill moves to the healthy endpoints...
    exercise_everything(&etcd, 1, 10).await;
    // ...and one made after it skips the dead endpoint from the start.
    let fresh = connect(&endpoints).await;
    assert_eq!(fresh.connected_endpoints(), endpoints[1..]);
    exercise_everything(&fresh, 2, 11).await;

    // The member restarts and rejoins: with another member down, quorum needs it.
    cluster.restart(0).await;
    cluster.kill(1);
    exercise_everything(&etcd, 3, 12).await;
    cluster.restart(1).await;
    exercise_everything(&etcd, 4, 13).await;

    // The member joined before all this kept its key the whole time (over a lease
    // period at least).
    tokio::time::sleep_until(killed + DEFAULT_TTL + Duration::from_secs(1)).await;
    assert!(!*survivor.lost().borrow());
    assert!(member_ids(&etcd).await.contains(&9));

    let map = store.load().await.unwrap();
    assert_eq!(map.partitions.len(), 4);
    tokio::time::timeout(
        SLACK,
        early_cache.wait_until(|cached| cached.partitions == map.partitions),
    )
    .await
    .expect("the cache made before the kills caught up")
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_etcd_member_is_skipped() {
    let mut cluster = EtcdCluster::start(3).await;
    let endpoints = cluster.endpoints();
    let etcd = connect(&endpoints).await;
    let survivor = join_with_default_ttl(&etcd, 9).await;

    // A frozen member accepts connections and never answers: only the wrapper's
    // timeouts and health probes get requests past it.
    cluster.pause(0);
    let paused = tokio::time::Instant::now();
    exercise_everything(&etcd, 1, 10).await;
    assert!(!etcd.connected_endpoints().contains(&endpoints[0]));
    let fresh = connect(&endpoints).await;
    assert_eq!(fresh.connected_endpoints(), endpoints[1..]);
    // A whole lease period frozen: the survivor's keepalive got past it every time.
    tokio::time::sleep_until(paused + DEFAULT_TTL + Duration::from_secs(1)).await;
    assert!(!*survivor.lost().borrow());
    assert!(member_ids(&etcd).await.contains(&9));
    cluster.resume(0);
}
