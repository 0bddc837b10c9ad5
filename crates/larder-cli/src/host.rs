//! Who is running larder: the host and user names recorded in snapshots and key slots.

/// This machine's host name (empty if it cannot be read).
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::fs::read_to_string("/etc/hostname"))
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// The user's name from `USER` (empty if unset).
pub fn username() -> String {
    std::env::var("USER").unwrap_or_default()
}
