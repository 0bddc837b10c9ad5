//! `larder mount`: the repository's snapshots as a read-only FUSE file system
//! (docs/design/mount.md), served in the foreground until SIGINT or SIGTERM, then
//! unmounted. Holds the repository's shared lock while mounted.
//!
//! The mount point is resolved once, when it is opened. As root, larder mounts on that
//! descriptor and unmounts through the mount's own (`fsopen`, `fsmount`,
//! `move_mount`), so another user who renames a directory on the mount point's path
//! while larder runs redirects neither the mount nor the unmount to another place
//! (mounting by path over /etc, unmounting whatever is mounted where a symlink now
//! leads). A user who is not root mounts through `fusermount3`, the setuid helper,
//! which does its own checks.

mod fs;
mod namespace;
mod tree;

use std::fs::OpenOptions;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use fuser::{BackgroundSession, Config, MountOption, Session, SessionACL};
use larder_store::{error_chain, LockMode};
use rustix::fs::{Mode, OFlags};
use rustix::mount::{FsMountFlags, FsOpenFlags, MountAttrFlags, MoveMountFlags, UnmountFlags};

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
    let dir = match open_mount_point(&args.mountpoint) {
        Ok(dir) => dir,
        Err(e) => {
            return Ok(out.usage(&format!(
                "the mount point {} is not a directory ({e})",
                args.mountpoint.display()
            )))
        }
    };
    let repo = g.repo.open(LockMode::Shared, out)?;
    repo.require_full_key("mount snapshots")?;
    let (snapshots, unreadable) = repo.snapshots()?;
    for e in &unreadable {
        out.warn(&format!("a snapshot is left out: {}", error_chain(e)));
    }
    let count = snapshots.len();
    let fs = fs::SnapshotFs::new(repo, snapshots, args.cache_size);
    catch_stop_signals();
    let config = mount_config(args.allow_other);
    let session = if rustix::process::geteuid().is_root() {
        mount_on(fs, &dir, &config, args.allow_other)
            .map(|(session, mount)| Mounted::Descriptor { session, mount })
    } else {
        fuser::spawn_mount(fs, &args.mountpoint, &config).map(Mounted::Helper)
    }
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
    while STOP_SIGNAL.load(Ordering::Relaxed) == 0 && !session.is_finished() {
        std::thread::sleep(Duration::from_millis(100));
    }
    session.unmount(&args.mountpoint, out)?;
    Ok(ExitCode::SUCCESS)
}

/// Opens the mount point (following the path the user gave, once): a directory.
fn open_mount_point(path: &Path) -> std::io::Result<OwnedFd> {
    let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC;
    Ok(rustix::fs::open(path, flags, Mode::empty())?)
}

/// A mounted file system and the thread serving it.
enum Mounted {
    /// Mounted as root on the mount point's descriptor; `mount` is the mount itself.
    Descriptor {
        session: BackgroundSession,
        mount: OwnedFd,
    },
    /// Mounted through fusermount3.
    Helper(BackgroundSession),
}

/// Mounts `fs` as root on the directory `dir` refers to, with the kernel's mount API:
/// the file system is configured and made (`fsopen`, `fsconfig`, `fsmount`) and then
/// attached to that very directory (`move_mount` onto the descriptor), never to a path
/// looked up again. Returns the serving thread and the mount's descriptor.
fn mount_on(
    fs: fs::SnapshotFs,
    dir: &OwnedFd,
    config: &Config,
    allow_other: bool,
) -> std::io::Result<(BackgroundSession, OwnedFd)> {
    let dev = OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")?;
    let root_mode = rustix::fs::fstat(dir)?.st_mode;
    let fs_fd = rustix::mount::fsopen("fuse", FsOpenFlags::FSOPEN_CLOEXEC)?;
    let set = |key: &str, value: String| rustix::mount::fsconfig_set_string(&fs_fd, key, value);
    set("source", "larder".into())?;
    set("subtype", "larder".into())?;
    set("fd", dev.as_raw_fd().to_string())?;
    set("rootmode", format!("{root_mode:o}"))?;
    set("user_id", rustix::process::getuid().as_raw().to_string())?;
    set("group_id", rustix::process::getgid().as_raw().to_string())?;
    if allow_other {
        rustix::mount::fsconfig_set_flag(&fs_fd, "allow_other")?;
        rustix::mount::fsconfig_set_flag(&fs_fd, "default_permissions")?;
    }
    rustix::mount::fsconfig_create(&fs_fd)?;
    let attrs = MountAttrFlags::MOUNT_ATTR_RDONLY
        | MountAttrFlags::MOUNT_ATTR_NODEV
        | MountAttrFlags::MOUNT_ATTR_NOSUID;
    let mount = rustix::mount::fsmount(&fs_fd, FsMountFlags::FSMOUNT_CLOEXEC, attrs)?;
    rustix::mount::move_mount(
        mount.as_fd(),
        "",
        dir.as_fd(),
        "",
        MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH | MoveMountFlags::MOVE_MOUNT_T_EMPTY_PATH,
    )?;
    let acl = if allow_other {
        SessionACL::All
    } else {
        SessionACL::Owner
    };
    // The kernel sent its INIT request when the file system was made; the session
    // answers it before it serves anything.
    match Session::from_fd(fs, dev.into(), acl, config.clone()).and_then(Session::spawn) {
        Ok(session) => Ok((session, mount)),
        Err(e) => {
            let _ = rustix::mount::unmount(proc_fd(&mount), UnmountFlags::DETACH);
            Err(e)
        }
    }
}

/// `/proc/self/fd/N`: what descriptor `fd` refers to, for calls that take a path.
fn proc_fd(fd: &OwnedFd) -> String {
    format!("/proc/self/fd/{}", fd.as_raw_fd())
}

impl Mounted {
    /// Whether the file system stopped (someone unmounted it).
    fn is_finished(&self) -> bool {
        match self {
            Self::Descriptor { session, .. } | Self::Helper(session) => session.guard.is_finished(),
        }
    }

    /// Unmounts (unless someone else already did) and waits for the file system's
    /// thread, which drops the repository and its lock. A busy mount (a process has a
    /// file open or its working directory there) is detached lazily: it disappears
    /// when the last user leaves.
    fn unmount(self, mountpoint: &Path, out: &Output) -> Result<()> {
        match self {
            Self::Helper(session) => unmount_helper(session, mountpoint, out),
            Self::Descriptor { session, mount } => {
                if session.guard.is_finished() {
                    out.note(&format!("{} was unmounted", mountpoint.display()));
                } else if let Err(e) =
                    rustix::mount::unmount(proc_fd(&mount), UnmountFlags::empty())
                {
                    out.warn(&format!(
                        "{} is busy ({e}): detaching it now; it disappears when no process uses it",
                        mountpoint.display()
                    ));
                    // The thread serves the detached mount's last users until this
                    // process ends; it is not waited for.
                    return rustix::mount::unmount(proc_fd(&mount), UnmountFlags::DETACH)
                        .context("cannot detach the mount");
                }
                session
                    .join()
                    .context("the file system stopped with an error")
            }
        }
    }
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

/// [`Mounted::unmount`] of a mount made through fusermount3.
fn unmount_helper(session: BackgroundSession, mountpoint: &Path, out: &Output) -> Result<()> {
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
