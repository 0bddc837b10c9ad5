//! Who is running larder: the host and user names recorded in snapshots and key slots.

/// This machine's host name (empty if it cannot be read).
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::fs::read_to_string("/etc/hostname"))
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// The name of the effective user in the password database, as restic records it;
/// `USER` where the database has no entry for it (a container's uid), else empty.
pub fn username() -> String {
    // SAFETY: geteuid cannot fail and touches no memory.
    let uid = unsafe { libc::geteuid() };
    match larder_engine::user_name(uid) {
        name if !name.is_empty() => String::from_utf8_lossy(&name).into_owned(),
        _ => std::env::var("USER").unwrap_or_default(),
    }
}
