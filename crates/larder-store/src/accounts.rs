//! User and group names from the system's databases: the owners a tree entry records,
//! the user a snapshot and a lock note name.

/// The name of user `uid` in the password database (`getpwuid_r`); empty when it has
/// none.
pub fn user_name(uid: u32) -> Vec<u8> {
    lookup_name(uid, Kind::User)
}

/// The name of group `gid` in the group database (`getgrgid_r`); empty when it has
/// none.
pub fn group_name(gid: u32) -> Vec<u8> {
    lookup_name(gid, Kind::Group)
}

#[derive(Clone, Copy)]
enum Kind {
    User,
    Group,
}

/// The name of a user or group id from the system's databases; empty if none.
fn lookup_name(id: u32, kind: Kind) -> Vec<u8> {
    let mut buf = vec![0u8; 1024];
    loop {
        let mut name_ptr: *const libc::c_char = std::ptr::null();
        let rc = match kind {
            Kind::User => {
                // SAFETY: an all-zero passwd is a valid value for every field (null
                // pointers, zero ids); getpwuid_r only writes into it and `buf`.
                let mut pwd: libc::passwd = unsafe { std::mem::zeroed() };
                let mut result: *mut libc::passwd = std::ptr::null_mut();
                // SAFETY: `pwd`, `buf` (of the length passed) and `result` are valid
                // for writes for the duration of the call.
                let rc = unsafe {
                    libc::getpwuid_r(
                        id,
                        &mut pwd,
                        buf.as_mut_ptr().cast(),
                        buf.len(),
                        &mut result,
                    )
                };
                if rc == 0 && !result.is_null() {
                    name_ptr = pwd.pw_name;
                }
                rc
            }
            Kind::Group => {
                // SAFETY: as for passwd above.
                let mut grp: libc::group = unsafe { std::mem::zeroed() };
                let mut result: *mut libc::group = std::ptr::null_mut();
                // SAFETY: as for getpwuid_r above.
                let rc = unsafe {
                    libc::getgrgid_r(
                        id,
                        &mut grp,
                        buf.as_mut_ptr().cast(),
                        buf.len(),
                        &mut result,
                    )
                };
                if rc == 0 && !result.is_null() {
                    name_ptr = grp.gr_name;
                }
                rc
            }
        };
        if rc == libc::ERANGE && buf.len() < 1 << 20 {
            buf.resize(buf.len() * 4, 0);
            continue;
        }
        if name_ptr.is_null() {
            return Vec::new();
        }
        // SAFETY: on success the name points into `buf`, NUL-terminated by the call.
        return unsafe { std::ffi::CStr::from_ptr(name_ptr) }
            .to_bytes()
            .to_vec();
    }
}
