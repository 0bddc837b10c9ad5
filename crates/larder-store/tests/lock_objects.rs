//! Lock objects (docs/design/remote.md, "Lock objects"), the lock of repositories on
//! storage without `flock`, over an in-memory object store: shared holders coexist,
//! an exclusive one excludes all, stale objects (holder gone, or not refreshed for
//! `LOCK_STALE_AFTER`) block no one and `remove_stale` removes them.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use larder_store::{
    error_chain, Backend, FileKind, LockHolder, LockMode, LockObject, ObjectBackend, RepoLock,
    StoreError, LOCK_STALE_AFTER,
};
use object_store::memory::InMemory;

fn backend() -> Arc<dyn Backend> {
    Arc::new(ObjectBackend::new(Arc::new(InMemory::new()), "repo", "memory://").unwrap())
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// A pid that is certainly not running: a child that has exited and been reaped.
fn dead_pid() -> u32 {
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let pid = child.id();
    child.wait().unwrap();
    pid
}

fn plant(backend: &dyn Backend, name: &str, object: &LockObject) {
    let bytes = serde_json::to_vec(object).unwrap();
    backend.write(FileKind::Lock, name, &bytes).unwrap();
}

fn refused(backend: &Arc<dyn Backend>, mode: LockMode) -> String {
    match RepoLock::acquire(backend, mode, Duration::ZERO) {
        Err(e @ StoreError::Locked { .. }) => error_chain(&e),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn readers_share_and_a_writer_excludes_everyone() {
    let backend = backend();
    let a = RepoLock::acquire(&backend, LockMode::Shared, Duration::ZERO).unwrap();
    let b = RepoLock::acquire(&backend, LockMode::Shared, Duration::ZERO).unwrap();
    assert_eq!(backend.list(FileKind::Lock).unwrap().len(), 2);
    let message = refused(&backend, LockMode::Exclusive);
    assert!(message.contains("locked by pid"), "{message}");
    drop((a, b));
    assert!(backend.list(FileKind::Lock).unwrap().is_empty(), "released");

    let writer = RepoLock::acquire(&backend, LockMode::Exclusive, Duration::ZERO).unwrap();
    refused(&backend, LockMode::Shared);
    refused(&backend, LockMode::Exclusive);
    drop(writer);
    RepoLock::acquire(&backend, LockMode::Shared, Duration::ZERO).unwrap();
}

#[test]
fn a_waiting_writer_gets_the_lock_when_it_is_released() {
    let backend = backend();
    let reader = RepoLock::acquire(&backend, LockMode::Shared, Duration::ZERO).unwrap();
    let waiter = {
        let backend = backend.clone();
        std::thread::spawn(move || {
            RepoLock::acquire(&backend, LockMode::Exclusive, Duration::from_secs(20)).map(drop)
        })
    };
    std::thread::sleep(Duration::from_millis(700));
    drop(reader);
    waiter.join().unwrap().unwrap();
}

#[test]
fn stale_objects_block_no_one_and_are_removed() {
    let backend = backend();
    let gone = LockObject {
        holder: LockHolder {
            pid: dead_pid(),
            ..LockHolder::current()
        },
        exclusive: true,
        refreshed: now(),
    };
    let expired = LockObject {
        holder: LockHolder {
            hostname: "another-host".into(),
            ..LockHolder::current()
        },
        exclusive: true,
        refreshed: now() - LOCK_STALE_AFTER.as_secs() - 60,
    };
    plant(&*backend, "00000000000000a1", &gone);
    plant(&*backend, "00000000000000a2", &expired);
    assert!(gone.is_stale(now()) && expired.is_stale(now()));
    drop(RepoLock::acquire(&backend, LockMode::Exclusive, Duration::ZERO).unwrap());

    let removed = RepoLock::remove_stale(&backend).unwrap();
    assert_eq!(removed.len(), 2);
    assert!(backend.list(FileKind::Lock).unwrap().is_empty());
}

#[test]
fn a_fresh_object_of_another_host_blocks_and_says_when_it_lapses() {
    let backend = backend();
    let elsewhere = LockObject {
        holder: LockHolder {
            hostname: "another-host".into(),
            ..LockHolder::current()
        },
        exclusive: false,
        refreshed: now(),
    };
    assert!(!elsewhere.is_stale(now()));
    plant(&*backend, "00000000000000b1", &elsewhere);
    RepoLock::acquire(&backend, LockMode::Shared, Duration::ZERO).unwrap();
    let message = refused(&backend, LockMode::Exclusive);
    assert!(
        message.contains("another-host") && message.contains("lapses in"),
        "{message}"
    );
    assert!(RepoLock::remove_stale(&backend).unwrap().is_empty());
    assert_eq!(backend.list(FileKind::Lock).unwrap(), ["00000000000000b1"]);
}

#[test]
fn a_damaged_object_blocks_until_unlock_removes_it() {
    let backend = backend();
    backend
        .write(FileKind::Lock, "00000000000000c1", b"not json")
        .unwrap();
    let message = refused(&backend, LockMode::Shared);
    assert!(message.contains("damaged"), "{message}");
    RepoLock::remove_stale(&backend).unwrap();
    RepoLock::acquire(&backend, LockMode::Exclusive, Duration::ZERO).unwrap();
}
