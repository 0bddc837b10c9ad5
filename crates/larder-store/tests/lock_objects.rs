//! Lock objects (docs/design/remote.md, "Lock objects"), the lock of repositories on
//! storage without `flock`, over an in-memory object store: shared holders coexist,
//! an exclusive one excludes all, stale objects (holder gone, or not refreshed for
//! `LOCK_STALE_AFTER`) block no one and `remove_stale` removes them. In an encrypted
//! repository they are sealed: the storage reads no holder from them, and an object
//! it forged, edited, moved or swelled is held, never free or stale.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use larder_crypto::{AeadKind, FingerprintKind, RepoKeys};
use larder_store::{
    error_chain, Backend, FileKind, LockHolder, LockMode, LockObject, ObjectBackend, RemovedLock,
    RepoLock, StoreError, LOCK_STALE_AFTER,
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

fn keys() -> Arc<RepoKeys> {
    Arc::new(RepoKeys::generate(
        [7; 16],
        AeadKind::Aes256Gcm,
        FingerprintKind::KeyedBlake3,
    ))
}

fn plant(backend: &dyn Backend, name: &str, object: &LockObject) {
    let bytes = serde_json::to_vec(object).unwrap();
    backend.write(FileKind::Lock, name, &bytes).unwrap();
}

fn acquire(backend: &Arc<dyn Backend>, mode: LockMode) -> RepoLock {
    RepoLock::acquire(backend, mode, Duration::ZERO, None).unwrap()
}

fn refused(backend: &Arc<dyn Backend>, mode: LockMode) -> String {
    refused_with(backend, mode, None)
}

fn refused_with(
    backend: &Arc<dyn Backend>,
    mode: LockMode,
    keys: Option<&Arc<RepoKeys>>,
) -> String {
    match RepoLock::acquire(backend, mode, Duration::ZERO, keys) {
        Err(e @ StoreError::Locked { .. }) => error_chain(&e),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn readers_share_and_a_writer_excludes_everyone() {
    let backend = backend();
    let a = acquire(&backend, LockMode::Shared);
    let b = acquire(&backend, LockMode::Shared);
    assert_eq!(backend.list(FileKind::Lock).unwrap().len(), 2);
    let message = refused(&backend, LockMode::Exclusive);
    assert!(message.contains("locked by pid"), "{message}");
    drop((a, b));
    assert!(backend.list(FileKind::Lock).unwrap().is_empty(), "released");

    let writer = acquire(&backend, LockMode::Exclusive);
    refused(&backend, LockMode::Shared);
    refused(&backend, LockMode::Exclusive);
    drop(writer);
    acquire(&backend, LockMode::Shared);
}

#[test]
fn a_waiting_writer_gets_the_lock_when_it_is_released() {
    let backend = backend();
    let reader = acquire(&backend, LockMode::Shared);
    let waiter = {
        let backend = backend.clone();
        std::thread::spawn(move || {
            RepoLock::acquire(&backend, LockMode::Exclusive, Duration::from_secs(20), None)
                .map(drop)
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
    drop(acquire(&backend, LockMode::Exclusive));

    let removed = RepoLock::remove_stale(&backend, None, false)
        .unwrap()
        .removed;
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
    acquire(&backend, LockMode::Shared);
    let message = refused(&backend, LockMode::Exclusive);
    assert!(
        message.contains("another-host") && message.contains("lapses in"),
        "{message}"
    );
    // `unlock` leaves it and says who holds it; `unlock --remove-all` removes it.
    let removal = RepoLock::remove_stale(&backend, None, false).unwrap();
    assert!(removal.removed.is_empty());
    assert_eq!(removal.kept, std::slice::from_ref(&elsewhere.holder));
    assert_eq!(backend.list(FileKind::Lock).unwrap(), ["00000000000000b1"]);
    let removal = RepoLock::remove_stale(&backend, None, true).unwrap();
    assert_eq!(removal.removed, [RemovedLock::Live(elsewhere.holder)]);
    assert!(backend.list(FileKind::Lock).unwrap().is_empty());
    acquire(&backend, LockMode::Exclusive);
}

/// A lock object whose refresh time lies ten years ahead (a forged object, or a clock
/// far ahead) blocks no one: no claimed time more than `LOCK_STALE_AFTER` ahead of
/// this client's clock is trusted, and `unlock` removes it as stale. A clock ahead by
/// less is respected, until the refresh it claims is `LOCK_STALE_AFTER` old.
#[test]
fn a_lock_from_the_future_holds_for_no_longer_than_the_bound() {
    let backend = backend();
    let bound = LOCK_STALE_AFTER.as_secs();
    let at = |refreshed| LockObject {
        holder: LockHolder {
            hostname: "clock-ahead".into(),
            ..LockHolder::current()
        },
        exclusive: true,
        refreshed,
    };
    let t = now();
    // The clock is injected: what each object says at each moment of this client's.
    let far = at(t + 315_000_000);
    assert!(far.is_stale(t), "ten years ahead is not trusted");
    let ahead = at(t + 20 * 60);
    assert!(!ahead.is_stale(t), "a clock 20 minutes ahead is respected");
    assert!(!ahead.is_stale(t + 20 * 60 + bound));
    assert!(
        ahead.is_stale(t + 20 * 60 + bound + 1),
        "and lapses like any other"
    );
    assert!(at(t + bound).is_stale(t - 1), "just past the bound");

    plant(&*backend, "00000000000000d1", &far);
    drop(acquire(&backend, LockMode::Exclusive));
    let removal = RepoLock::remove_stale(&backend, None, false).unwrap();
    assert_eq!(removal.removed, [RemovedLock::Stale(far.holder)]);
    assert!(removal.kept.is_empty());

    plant(&*backend, "00000000000000d2", &ahead);
    let message = refused(&backend, LockMode::Shared);
    assert!(message.contains("clock-ahead"), "{message}");
}

/// A holder that larder can see (this host, this boot and pid namespace) is live
/// exactly while its process runs, whatever the times in its object say: a writer
/// whose clock runs an hour ahead does not take a running backup's lock as stale.
/// A pid that a later process reused is no holder.
#[test]
fn a_live_holder_on_this_host_is_never_stale_whatever_the_clocks() {
    let backend = backend();
    let t = now();
    let live = |refreshed| LockObject {
        holder: LockHolder::current(),
        exclusive: true,
        refreshed,
    };
    for refreshed in [t - 3600, t - 10 * 365 * 86400, t + 315_000_000] {
        assert!(!live(refreshed).is_stale(t), "refreshed {refreshed} at {t}");
    }
    plant(&*backend, "00000000000000e1", &live(t - 3600));
    let message = refused(&backend, LockMode::Shared);
    assert!(message.contains("locked by pid"), "{message}");
    let removal = RepoLock::remove_stale(&backend, None, false).unwrap();
    assert!(removal.removed.is_empty(), "{removal:?}");

    let mut reused = live(t);
    assert_ne!(
        reused.holder.pid_start, 0,
        "this process's start time is known"
    );
    reused.holder.pid_start += 1;
    assert!(reused.is_stale(t), "the pid belongs to another process now");

    // Another boot, or another pid namespace, of a host with the same name: its pid
    // says nothing here, so its times decide.
    let mut elsewhere = live(t);
    elsewhere.holder.boot = "another boot".into();
    elsewhere.holder.pid = dead_pid();
    assert!(!elsewhere.is_stale(t));
    assert!(elsewhere.is_stale(t + LOCK_STALE_AFTER.as_secs() + 1));
}

#[test]
fn a_damaged_object_blocks_until_unlock_removes_it() {
    let backend = backend();
    backend
        .write(FileKind::Lock, "00000000000000c1", b"not json")
        .unwrap();
    let message = refused(&backend, LockMode::Shared);
    assert!(message.contains("cannot be read"), "{message}");
    RepoLock::remove_stale(&backend, None, false).unwrap();
    acquire(&backend, LockMode::Exclusive);
}

/// The bytes of the one lock object in `backend`, with its name.
fn only_object(backend: &Arc<dyn Backend>) -> (String, Vec<u8>) {
    let names = backend.list(FileKind::Lock).unwrap();
    assert_eq!(names.len(), 1, "{names:?}");
    let bytes = backend.read(FileKind::Lock, &names[0]).unwrap();
    (names[0].clone(), bytes)
}

#[test]
fn a_plaintext_repositorys_lock_object_records_who_and_no_command_line() {
    let backend = backend();
    let lock = acquire(&backend, LockMode::Exclusive);
    let (_, bytes) = only_object(&backend);
    let object: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    let mut fields: Vec<&str> = object
        .as_object()
        .unwrap()
        .keys()
        .map(|k| k.as_str())
        .collect();
    fields.sort_unstable();
    assert_eq!(
        fields,
        [
            "boot",
            "exclusive",
            "hostname",
            "nonce",
            "pid",
            "pid_start",
            "refreshed",
            "started",
            "username"
        ]
    );
    assert_eq!(object["pid"], std::process::id());
    drop(lock);
}

#[test]
fn an_encrypted_repositorys_lock_objects_are_sealed_and_still_exclude() {
    let backend = backend();
    let keys = keys();
    let writer =
        RepoLock::acquire(&backend, LockMode::Exclusive, Duration::ZERO, Some(&keys)).unwrap();
    let (name, bytes) = only_object(&backend);
    assert!(bytes.starts_with(b"LARDERE1"), "not an envelope");
    assert_eq!(bytes[8], 10, "not kind 10");
    let host = LockHolder::current().hostname;
    let text = String::from_utf8_lossy(&bytes);
    assert!(
        !text.contains(&host) && !text.contains(&std::process::id().to_string()),
        "the sealed object shows its holder"
    );
    let opened = LockObject::decode(&name, &bytes, Some(&keys)).unwrap();
    assert!(opened.exclusive);
    assert_eq!(opened.holder.pid, std::process::id());
    // Another holder of the key reads who holds it.
    let message = refused_with(&backend, LockMode::Shared, Some(&keys));
    assert!(message.contains("locked by pid"), "{message}");
    drop(writer);
    assert!(backend.list(FileKind::Lock).unwrap().is_empty(), "released");
}

/// What the storage can do to an encrypted repository's lock objects: forge a stale
/// one in plaintext, flip a byte of a live one, copy a live one under another name,
/// or serve a huge one. Each is held (blocks every mode) and `unlock` names it.
#[test]
fn lock_objects_the_storage_forged_or_edited_are_held_and_named_by_unlock() {
    let keys = keys();
    let k = Some(&keys);
    let stale = LockObject {
        holder: LockHolder {
            pid: dead_pid(),
            ..LockHolder::current()
        },
        exclusive: true,
        refreshed: now(),
    };
    let live = LockObject {
        holder: LockHolder {
            hostname: "another-host".into(),
            ..LockHolder::current()
        },
        exclusive: false,
        refreshed: now(),
    };
    let mut flipped = live.encode("00000000000000d2", k.map(|k| &**k));
    let last = flipped.len() - 1;
    flipped[last] ^= 1;
    let cases: [(&str, Vec<u8>); 4] = [
        ("00000000000000d1", serde_json::to_vec(&stale).unwrap()),
        ("00000000000000d2", flipped),
        (
            "00000000000000d3",
            live.encode("00000000000000d9", k.map(|k| &**k)),
        ),
        ("00000000000000d4", vec![b' '; 1 << 20]),
    ];
    for (name, bytes) in cases {
        let backend = backend();
        backend.write(FileKind::Lock, name, &bytes).unwrap();
        for mode in [LockMode::Shared, LockMode::Exclusive] {
            let message = refused_with(&backend, mode, k);
            assert!(
                message.contains(name) && message.contains("cannot be read"),
                "{name}: {message}"
            );
        }
        let removed = RepoLock::remove_stale(&backend, k.map(|k| &**k), false)
            .unwrap()
            .removed;
        assert!(
            matches!(&removed[..], [RemovedLock::Unreadable { name: n, .. }] if n == name),
            "{name}: {removed:?}"
        );
        RepoLock::acquire(&backend, LockMode::Exclusive, Duration::ZERO, k).unwrap();
    }
}

/// A plaintext repository's lock object is the storage's to write: a name in it
/// cannot put control characters on the terminal through a message.
#[test]
fn names_in_a_lock_object_are_printed_escaped() {
    let backend = backend();
    let forged = LockObject {
        holder: LockHolder {
            hostname: "evil\u{1b}[2J\nforged line".into(),
            ..LockHolder::current()
        },
        exclusive: true,
        refreshed: now(),
    };
    plant(&*backend, "00000000000000e1", &forged);
    let message = refused(&backend, LockMode::Shared);
    assert!(
        !message.contains('\u{1b}') && !message.contains('\n'),
        "{message:?}"
    );
    assert!(
        message.contains("evil\\x1b[2J\\x0aforged line"),
        "{message:?}"
    );
}
