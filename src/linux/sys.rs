//! Thin wrappers over the system calls nix does not cover (the new mount
//! API, capsets, close_range). Each is one syscall; errors are errno.

use std::ffi::CString;
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::sys::stat::Mode;

pub const MOUNT_ATTR_RDONLY: u64 = 0x0000_0001;
pub const MOUNT_ATTR_NOSUID: u64 = 0x0000_0002;
pub const MOUNT_ATTR_NODEV: u64 = 0x0000_0004;
const AT_RECURSIVE: libc::c_uint = 0x8000;
const OPEN_TREE_CLONE: libc::c_uint = 1;
const OPEN_TREE_CLOEXEC: libc::c_uint = libc::O_CLOEXEC as libc::c_uint;
const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x0000_0004;

/// `struct mount_attr` of the kernel ABI.
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

fn cpath(p: &Path) -> Result<CString, Errno> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| Errno::EINVAL)
}

/// Sets and clears mount attributes on the mount at `path` (and, with
/// `recursive`, every mount beneath it).
pub fn mount_setattr(path: &Path, recursive: bool, set: u64, clear: u64) -> Result<(), Errno> {
    let c = cpath(path)?;
    let attr = MountAttr {
        attr_set: set,
        attr_clr: clear,
        propagation: 0,
        userns_fd: 0,
    };
    let flags = if recursive { AT_RECURSIVE } else { 0 };
    // SAFETY: `c` is a valid NUL-terminated path and `attr` a properly
    // sized, initialized struct that outlives the call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            libc::AT_FDCWD,
            c.as_ptr(),
            flags,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    Errno::result(r).map(drop)
}

/// A detached copy of the mount tree at `path` (recursively).
pub fn open_tree_clone(path: &Path) -> Result<OwnedFd, Errno> {
    open_tree(path, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_RECURSIVE)
}

/// A detached bind of the symlink at `path` itself, not of what it leads
/// to.
pub fn open_tree_link(path: &Path) -> Result<OwnedFd, Errno> {
    open_tree(
        path,
        OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | libc::AT_SYMLINK_NOFOLLOW as libc::c_uint,
    )
}

fn open_tree(path: &Path, flags: libc::c_uint) -> Result<OwnedFd, Errno> {
    let c = cpath(path)?;
    // SAFETY: valid path; the returned fd is owned by us from here on.
    let fd = unsafe { libc::syscall(libc::SYS_open_tree, libc::AT_FDCWD, c.as_ptr(), flags) };
    let fd = Errno::result(fd)?;
    // SAFETY: the kernel just returned this fd and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Attaches a detached tree (from [`open_tree_clone`]) at `target`; a
/// symlink at `target` is not followed (no `MOVE_MOUNT_T_SYMLINKS`).
pub fn move_mount_to(tree: &OwnedFd, target: &Path) -> Result<(), Errno> {
    use std::os::fd::AsRawFd;
    let c = cpath(target)?;
    let empty = CString::default();
    // SAFETY: valid fd and paths for the duration of the call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            empty.as_ptr(),
            libc::AT_FDCWD,
            c.as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH,
        )
    };
    Errno::result(r).map(drop)
}

/// Drops every capability: bounding set, ambient set, and the effective,
/// permitted and inheritable sets. As uid 0 the securebits are locked too,
/// so exec cannot hand root's capabilities back. What is already dropped
/// (inside another zcode-acp sandbox, where dropping again needs the very
/// capability that is gone) is left as it is.
pub fn drop_all_capabilities(is_root: bool) -> Result<(), Errno> {
    // SAFETY: prctl with integer arguments only.
    unsafe {
        let mut cap = 0;
        // Drop until the kernel says the capability number is past the last.
        loop {
            let held = libc::prctl(libc::PR_CAPBSET_READ, cap, 0, 0, 0);
            if held < 0 {
                if Errno::last() == Errno::EINVAL {
                    break;
                }
                return Err(Errno::last());
            }
            if held == 1 && libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 {
                return Err(Errno::last());
            }
            cap += 1;
        }
        Errno::result(libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL,
            0,
            0,
            0,
        ))?;
        if is_root {
            // NOROOT, NO_SETUID_FIXUP and KEEP_CAPS off, each locked.
            let bits = 0x01 | 0x02 | 0x04 | 0x08 | 0x20;
            let now = libc::prctl(libc::PR_GET_SECUREBITS, 0, 0, 0, 0);
            if now < 0 || now & bits != bits {
                Errno::result(libc::prctl(libc::PR_SET_SECUREBITS, bits, 0, 0, 0))?;
            }
        }
    }
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    let header = Header {
        version: 0x2008_0522, // _LINUX_CAPABILITY_VERSION_3
        pid: 0,
    };
    let data = [
        Data {
            effective: 0,
            permitted: 0,
            inheritable: 0,
        },
        Data {
            effective: 0,
            permitted: 0,
            inheritable: 0,
        },
    ];
    // SAFETY: header and two data words, as capset(2) v3 expects.
    let r = unsafe { libc::syscall(libc::SYS_capset, &header as *const Header, data.as_ptr()) };
    Errno::result(r).map(drop)
}

/// Closes every fd from `first` up, allocating nothing (it runs in forked
/// children): `close_range`, or before Linux 5.9 (a mounts-only sandbox's
/// kernel may be that old) each number below the descriptor limit.
pub fn close_from(first: u32) -> Result<(), Errno> {
    // SAFETY: close_range with integer arguments; only fds >= first close.
    let r = unsafe { libc::syscall(libc::SYS_close_range, first, u32::MAX, 0) };
    match Errno::result(r) {
        Err(Errno::ENOSYS) => close_each_from(first),
        r => r.map(drop),
    }
}

/// [`close_from`] one number at a time, up to the soft descriptor limit
/// (no descriptor is numbered at or above it: zcode-acp only ever raises
/// its limit).
fn close_each_from(first: u32) -> Result<(), Errno> {
    let (soft, _) = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)?;
    for fd in u64::from(first)..soft.min(i32::MAX as u64) {
        // SAFETY: closes a descriptor this process owns and no longer
        // uses; a number not open fails, and is skipped.
        unsafe { libc::close(fd as i32) };
    }
    Ok(())
}

/// The inode of a namespace link (`/proc/self/ns/mnt`), to tell namespaces
/// apart.
/// Joins a new, anonymous session keyring: the keyring a login session
/// shares (`@s`, where Kerberos and others keep credentials) is no longer
/// reachable. A kernel without keyrings has none to share.
pub fn join_new_session_keyring() -> Result<(), Errno> {
    const KEYCTL_JOIN_SESSION_KEYRING: libc::c_long = 1;
    // SAFETY: keyctl(KEYCTL_JOIN_SESSION_KEYRING, NULL) takes no memory of
    // ours (a NULL name asks for an anonymous keyring).
    let r = unsafe {
        libc::syscall(
            libc::SYS_keyctl,
            KEYCTL_JOIN_SESSION_KEYRING,
            std::ptr::null::<libc::c_char>(),
        )
    };
    match Errno::result(r) {
        Ok(_) | Err(Errno::ENOSYS) => Ok(()),
        Err(e) => Err(e),
    }
}

/// Opens the directory `dir` (an absolute path) as an `O_PATH` descriptor
/// with no symlink allowed anywhere on its path (`openat2`,
/// `RESOLVE_NO_SYMLINKS`): what is done beneath it afterwards cannot be
/// redirected by a directory swapped for a symlink.
pub fn open_dir_without_symlinks(dir: &Path) -> Result<OwnedFd, Errno> {
    const RESOLVE_NO_SYMLINKS: u64 = 0x04;
    const RESOLVE_NO_MAGICLINKS: u64 = 0x02;
    #[repr(C)]
    struct OpenHow {
        flags: u64,
        mode: u64,
        resolve: u64,
    }
    if !dir.is_absolute() {
        return Err(Errno::EINVAL);
    }
    let name = CString::new(dir.as_os_str().as_bytes()).map_err(|_| Errno::EINVAL)?;
    let how = OpenHow {
        flags: (libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC) as u64,
        mode: 0,
        resolve: RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS,
    };
    // SAFETY: `name` is NUL-terminated and `how` is a properly sized struct
    // open_how; both outlive the call. The fd returned is ours alone.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            libc::AT_FDCWD,
            name.as_ptr(),
            &how as *const OpenHow,
            std::mem::size_of::<OpenHow>(),
        )
    };
    match Errno::result(fd) {
        // SAFETY: a new descriptor that nothing else owns.
        Ok(fd) => Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) }),
        // No openat2 (before Linux 5.6, or inside the sandbox, whose filter
        // refuses it): the same, one component at a time.
        Err(Errno::ENOSYS) => open_dir_one_step_at_a_time(dir),
        Err(e) => Err(e),
    }
}

/// [`open_dir_without_symlinks`] without `openat2`: each component is
/// opened beneath the last with `O_NOFOLLOW | O_DIRECTORY`, which fails on
/// a symlink (`ENOTDIR`); `.` and `..` are refused.
fn open_dir_one_step_at_a_time(dir: &Path) -> Result<OwnedFd, Errno> {
    use std::path::Component;
    let flags = OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let mut at = nix::fcntl::open("/", flags, Mode::empty())?;
    for c in dir.components() {
        match c {
            Component::RootDir => {}
            Component::Normal(name) => {
                at = nix::fcntl::openat(&at, name, flags, Mode::empty())?;
            }
            _ => return Err(Errno::EINVAL),
        }
    }
    Ok(at)
}

pub fn ns_inode(link: &str) -> Result<u64, Errno> {
    let st = nix::sys::stat::stat(link)?;
    Ok(st.st_ino)
}

/// The Landlock ABI version of the running kernel (0 when unavailable).
pub fn landlock_abi() -> i32 {
    const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;
    // SAFETY: the documented version query: null attr, size 0.
    let v = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<u8>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    if v < 0 {
        0
    } else {
        v as i32
    }
}

/// The seccomp program in the kernel's layout. Built before any fork where
/// the installing child must not allocate.
pub fn sock_filters(prog: &[super::seccomp::Insn]) -> Vec<libc::sock_filter> {
    prog.iter()
        .map(|i| libc::sock_filter {
            code: i.code,
            jt: i.jt,
            jf: i.jf,
            k: i.k,
        })
        .collect()
}

/// Installs `filters` on this thread (and so on everything it starts);
/// `no_new_privs` must already be set. With `listener`, returns the
/// supervisor's listener, and where the kernel knows it, a caller waiting
/// on the supervisor can then only be interrupted by a fatal signal (so an
/// operation the supervisor carried out is never reported as
/// interrupted). Allocates nothing.
pub fn install_seccomp(
    filters: &[libc::sock_filter],
    listener: bool,
) -> Result<Option<OwnedFd>, Errno> {
    let fprog = libc::sock_fprog {
        len: filters.len() as libc::c_ushort,
        filter: filters.as_ptr() as *mut libc::sock_filter,
    };
    let try_flags = |flags: libc::c_ulong| {
        // SAFETY: `fprog` points at `filters`, alive for the call; the
        // kernel copies the program.
        let r = unsafe {
            libc::syscall(
                libc::SYS_seccomp,
                libc::SECCOMP_SET_MODE_FILTER,
                flags,
                &fprog as *const libc::sock_fprog,
            )
        };
        Errno::result(r)
    };
    if !listener {
        return try_flags(0).map(|_| None);
    }
    let fd = match try_flags(
        libc::SECCOMP_FILTER_FLAG_NEW_LISTENER | libc::SECCOMP_FILTER_FLAG_WAIT_KILLABLE_RECV,
    ) {
        Err(Errno::EINVAL) => try_flags(libc::SECCOMP_FILTER_FLAG_NEW_LISTENER)?,
        other => other?,
    };
    // SAFETY: the kernel just returned this fd; nothing else owns it.
    Ok(Some(unsafe { OwnedFd::from_raw_fd(fd as i32) }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    use std::os::unix::process::CommandExt;
    use std::process::{Command, Stdio};

    /// The descriptors a command is left when its child ran `close` first
    /// (none: nothing), as it lists them.
    fn left_open(close: Option<fn(u32) -> Result<(), Errno>>) -> Vec<i32> {
        let mut cmd = Command::new("ls");
        cmd.arg("/proc/self/fd").stderr(Stdio::null());
        if let Some(close) = close {
            // SAFETY: runs in the forked child before exec; `close` makes
            // system calls only.
            unsafe {
                cmd.pre_exec(move || close(4).map_err(std::io::Error::from));
            }
        }
        let out = cmd.output().unwrap();
        assert!(out.status.success());
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    }

    #[test]
    fn a_forked_child_keeps_none_of_its_parents_descriptors_with_close_range_or_without() {
        let null = std::fs::File::open("/dev/null").unwrap();
        // A copy that is not close-on-exec, numbered where nothing the
        // listing opens would be.
        // SAFETY: F_DUPFD makes a new descriptor, owned at once.
        let leaked = unsafe { libc::fcntl(null.as_raw_fd(), libc::F_DUPFD, 900) };
        assert!(leaked >= 900, "{}", std::io::Error::last_os_error());
        // SAFETY: `leaked` is new and owned by nothing else.
        let _leaked = unsafe { OwnedFd::from_raw_fd(leaked) };
        assert!(left_open(None).contains(&leaked), "the test cannot fail");
        assert!(!left_open(Some(close_from)).contains(&leaked));
        // Before Linux 5.9: each number.
        assert!(!left_open(Some(close_each_from)).contains(&leaked));
    }
}
