//! `larder mount`: the repository's snapshots as a read-only FUSE file system
//! (docs/design/mount.md), served in the foreground until SIGINT or SIGTERM, then
//! unmounted. Holds the repository's shared lock while mounted.

mod fs;
mod namespace;
mod tree;

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use fuser::{BackgroundSession, Config, MountOption, SessionACL};
use larder_store::{error_chain, LockMode};

use super::Globals;
use crate::output::Output;
use crate::size;

#[derive(Args)]
pub struct MountArgs {
    /// An existing directory to mount on
    mountpoint: PathBuf,
    /// Let users other than the one mounting in (FUSE's allow_other, which a user who
    /// is not root may use only if /etc/fuse.conf has user_allow_other); the kernel
    /// then checks every access against the recorded owners and modes
    #[arg(long)]
    allow_other: bool,
    /// Memory for decoded chunks, shared by every file read
    #[arg(long, default_value = "64MiB", value_parser = size::parse)]
    cache_size: usize,
}

pub fn run(args: MountArgs, g: &Globals, out: &Output) -> Result<ExitCode> {
    if let Some(code) = out.refuse_json("mount serves a file system; --json does not apply") {
        return Ok(code);
    }
    if !g.cluster.is_empty() {
        return Ok(out.usage("mount works on a local repository; --cluster does not apply"));
    }
    if !args.mountpoint.is_dir() {
        return Ok(out.usage(&format!(
            "the mount point {} is not a directory",
            args.mountpoint.display()
        )));
    }
    let repo = g.repo.open(LockMode::Shared, out)?;
    repo.require_full_key("mount snapshots")?;
    let (snapshots, unreadable) = repo.snapshots()?;
    for e in &unreadable {
        out.warn(&format!("a snapshot is left out: {}", error_chain(e)));
    }
    let count = snapshots.len();
    let fs = fs::SnapshotFs::new(repo, snapshots, args.cache_size);
    catch_stop_signals();
    let session = fuser::spawn_mount(fs, &args.mountpoint, &mount_config(args.allow_other))
        .with_context(|| {
            format!(
                "cannot mount on {} (FUSE needs /dev/fuse, and fusermount3 for a user who is not root: Debian's fuse3 package)",
                args.mountpoint.display()
            )
        })?;
    out.note(&format!(
        "{count} snapshots mounted at {}; Ctrl-C or SIGTERM unmounts",
        args.mountpoint.display()
    ));
    while STOP_SIGNAL.load(Ordering::Relaxed) == 0 && !session.guard.is_finished() {
        std::thread::sleep(Duration::from_millis(100));
    }
    unmount(session, &args.mountpoint, out)?;
    Ok(ExitCode::SUCCESS)
}

fn mount_config(allow_other: bool) -> Config {
    let mut config = Config::default();
    // Two threads serve requests: one copies a cached run out while the other waits
    // for a chunk being decoded (docs/performance.md, "larder mount": 414-427 MB/s
    // on the Django tarballs against 302-367 MB/s with one).
    config.n_threads = Some(2);
    config.mount_options = vec![
        MountOption::RO,
        MountOption::NoDev,
        MountOption::NoSuid,
        MountOption::FSName("larder".into()),
        MountOption::Subtype("larder".into()),
    ];
    if allow_other {
        // Other users see only what the recorded owners and modes let them see. The
        // mounting user, who holds the repository's key, is not held to them.
        config.acl = SessionACL::All;
        config.mount_options.push(MountOption::DefaultPermissions);
    }
    config
}

/// Unmounts (unless someone else already did) and waits for the file system's thread,
/// which drops the repository and its lock. A busy mount point (a process has a file
/// open or its working directory there) is detached lazily: it disappears when the
/// last user leaves.
fn unmount(session: BackgroundSession, mountpoint: &Path, out: &Output) -> Result<()> {
    if session.guard.is_finished() {
        out.note(&format!("{} was unmounted", mountpoint.display()));
        return session
            .join()
            .context("the file system stopped with an error");
    }
    if let Err(e) = session.umount_and_join() {
        out.warn(&format!(
            "{} is busy ({e}): detaching it now; it disappears when no process uses it",
            mountpoint.display()
        ));
        let status = Command::new("fusermount3")
            .args(["-u", "-z", "--"])
            .arg(mountpoint)
            .status()
            .context("cannot run fusermount3 to detach the mount")?;
        anyhow::ensure!(status.success(), "fusermount3 -u -z failed: {status}");
    }
    Ok(())
}

/// The signal that asked the mount to stop (SIGINT or SIGTERM), 0 before one came.
static STOP_SIGNAL: AtomicI32 = AtomicI32::new(0);

extern "C" fn note_stop_signal(signal: libc::c_int) {
    STOP_SIGNAL.store(signal, Ordering::Relaxed);
}

/// Makes SIGINT and SIGTERM set [`STOP_SIGNAL`] instead of ending the process, on
/// whichever thread they arrive: the main thread polls it and unmounts.
fn catch_stop_signals() {
    for signal in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe;
        // `sigaction` is given a zeroed, then filled, valid struct.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = note_stop_signal as extern "C" fn(libc::c_int) as usize;
            libc::sigemptyset(&mut action.sa_mask);
            action.sa_flags = libc::SA_RESTART;
            libc::sigaction(signal, &action, std::ptr::null_mut());
        }
    }
}
