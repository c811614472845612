//! The kernel interface of the supervisor: installing the filter, the
//! user-notification ioctls, reading the caller's memory, passing the
//! listener between processes. Each function is one concern; errors are
//! errno.

use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use nix::errno::Errno;

/// `SECCOMP_USER_NOTIF_FD_SYNC_WAKE_UP` (Linux 6.6): the supervisor runs on
/// the caller's CPU when woken, which makes a round trip several times
/// cheaper.
const SYNC_WAKE_UP: u64 = 1;

/// Whether this kernel can hand calls to a supervisor that answers them
/// with descriptors of its own (SECCOMP_ADDFD_FLAG_SEND, Linux 5.14).
pub fn user_notification_supported() -> bool {
    let action: u32 = libc::SECCOMP_RET_USER_NOTIF;
    // SAFETY: GET_ACTION_AVAIL reads one u32 we own.
    let r = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_GET_ACTION_AVAIL,
            0,
            &action as *const u32,
        )
    };
    r == 0 && kernel_at_least(5, 14)
}

fn kernel_at_least(major: u32, minor: u32) -> bool {
    let Ok(uts) = nix::sys::utsname::uname() else {
        return false;
    };
    let release = uts.release().to_string_lossy().into_owned();
    let mut parts = release.split(|c: char| !c.is_ascii_digit());
    let maj: u32 = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    let min: u32 = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    (maj, min) >= (major, minor)
}

/// Asks for synchronous wake-ups; older kernels say no, which only costs
/// speed.
pub fn prefer_sync_wake_up(listener: BorrowedFd<'_>) {
    // SAFETY: SET_FLAGS takes the flags by value.
    unsafe {
        libc::ioctl(
            listener.as_raw_fd(),
            libc::SECCOMP_IOCTL_NOTIF_SET_FLAGS as _,
            SYNC_WAKE_UP,
        );
    }
}

/// Receives the next call. Blocks until one is pending.
pub fn receive(listener: BorrowedFd<'_>) -> Result<libc::seccomp_notif, Errno> {
    // SAFETY: an all-zero seccomp_notif is valid (plain integers), and the
    // kernel requires it zeroed.
    let mut n: libc::seccomp_notif = unsafe { std::mem::zeroed() };
    // SAFETY: RECV writes one seccomp_notif into `n`, which we own.
    let r = unsafe {
        libc::ioctl(
            listener.as_raw_fd(),
            libc::SECCOMP_IOCTL_NOTIF_RECV as _,
            &mut n as *mut libc::seccomp_notif,
        )
    };
    Errno::result(r).map(|_| n)
}

/// Whether call `id` is still waiting (its caller alive and blocked): a
/// check after reading the caller's memory, so a pid that was reused in
/// the meantime is never acted for.
pub fn still_waiting(listener: BorrowedFd<'_>, id: u64) -> bool {
    // SAFETY: ID_VALID reads one u64 we own.
    let r = unsafe {
        libc::ioctl(
            listener.as_raw_fd(),
            libc::SECCOMP_IOCTL_NOTIF_ID_VALID as _,
            &id as *const u64,
        )
    };
    r == 0
}

/// Lets call `id` continue to the kernel, which judges it as if the
/// supervisor were not there.
pub fn let_continue(listener: BorrowedFd<'_>, id: u64) {
    send(
        listener,
        id,
        0,
        0,
        libc::SECCOMP_USER_NOTIF_FLAG_CONTINUE as u32,
    );
}

/// Answers call `id` with `result`: a value, or an errno.
pub fn answer(listener: BorrowedFd<'_>, id: u64, result: Result<i64, Errno>) {
    match result {
        Ok(v) => send(listener, id, v, 0, 0),
        Err(e) => send(listener, id, 0, -(e as i32), 0),
    }
}

fn send(listener: BorrowedFd<'_>, id: u64, val: i64, error: i32, flags: u32) {
    let mut resp = libc::seccomp_notif_resp {
        id,
        val,
        error,
        flags,
    };
    // SAFETY: SEND reads one seccomp_notif_resp we own. ENOENT (the caller
    // is gone) needs nothing from us.
    unsafe {
        libc::ioctl(
            listener.as_raw_fd(),
            libc::SECCOMP_IOCTL_NOTIF_SEND as _,
            &mut resp as *mut libc::seccomp_notif_resp,
        );
    }
}

/// Puts `fd` into the caller of `id` and answers the call with its number,
/// in one step (SECCOMP_ADDFD_FLAG_SEND).
pub fn answer_with_fd(
    listener: BorrowedFd<'_>,
    id: u64,
    fd: BorrowedFd<'_>,
    cloexec: bool,
) -> Result<i32, Errno> {
    let add = libc::seccomp_notif_addfd {
        id,
        flags: libc::SECCOMP_ADDFD_FLAG_SEND as u32,
        srcfd: fd.as_raw_fd() as u32,
        newfd: 0,
        newfd_flags: if cloexec { libc::O_CLOEXEC as u32 } else { 0 },
    };
    // SAFETY: ADDFD reads one seccomp_notif_addfd we own; `fd` is open.
    let r = unsafe {
        libc::ioctl(
            listener.as_raw_fd(),
            libc::SECCOMP_IOCTL_NOTIF_ADDFD as _,
            &add as *const libc::seccomp_notif_addfd,
        )
    };
    Errno::result(r)
}

/// Copies `buf.len()` bytes (or fewer, where the caller's mapping ends)
/// from address `addr` of process `pid`.
fn read_memory(pid: u32, addr: u64, buf: &mut [u8]) -> usize {
    let local = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let remote = libc::iovec {
        iov_base: addr as *mut libc::c_void,
        iov_len: buf.len(),
    };
    // SAFETY: `local` describes `buf`, which we own; the remote side is
    // read by the kernel under its ptrace access check.
    let n = unsafe { libc::process_vm_readv(pid as libc::pid_t, &local, 1, &remote, 1, 0) };
    if n < 0 {
        0
    } else {
        n as usize
    }
}

/// The NUL-terminated string at `addr` in process `pid` (at most
/// PATH_MAX bytes), read page by page so a string that ends near the end
/// of a mapping is still read whole.
pub fn read_c_string(pid: u32, addr: u64) -> Option<Vec<u8>> {
    const PAGE: u64 = 4096;
    const MAX: usize = libc::PATH_MAX as usize;
    if addr == 0 {
        return None;
    }
    let mut out = Vec::new();
    let mut at = addr;
    // Most paths are short: a small first read, then whole pages.
    let mut want = 256usize;
    while out.len() < MAX {
        let room = (PAGE - at % PAGE) as usize;
        let mut chunk = vec![0u8; room.min(want).min(MAX - out.len())];
        want = PAGE as usize;
        let n = read_memory(pid, at, &mut chunk);
        if n == 0 {
            return None;
        }
        if let Some(end) = chunk[..n].iter().position(|&b| b == 0) {
            out.extend_from_slice(&chunk[..end]);
            return Some(out);
        }
        out.extend_from_slice(&chunk[..n]);
        at += n as u64;
    }
    None
}

/// Two timespecs at `addr` in process `pid` (utimensat's argument).
pub fn read_times(pid: u32, addr: u64) -> Option<[libc::timespec; 2]> {
    let mut raw = [0u8; 2 * std::mem::size_of::<libc::timespec>()];
    if read_memory(pid, addr, &mut raw) != raw.len() {
        return None;
    }
    // SAFETY: `raw` holds exactly two timespecs' bytes; timespec is plain
    // integers, valid for any bit pattern; read_unaligned copes with the
    // byte buffer's alignment.
    Some(unsafe { std::ptr::read_unaligned(raw.as_ptr().cast::<[libc::timespec; 2]>()) })
}

/// `openat2(dirfd, name, how)`.
pub fn openat2(
    dirfd: BorrowedFd<'_>,
    name: &std::ffi::CStr,
    flags: u64,
    mode: u64,
    resolve: u64,
) -> Result<OwnedFd, Errno> {
    #[repr(C)]
    struct OpenHow {
        flags: u64,
        mode: u64,
        resolve: u64,
    }
    let how = OpenHow {
        flags,
        mode,
        resolve,
    };
    // SAFETY: `name` is NUL-terminated and `how` is a properly sized
    // struct open_how; both outlive the call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dirfd.as_raw_fd(),
            name.as_ptr(),
            &how as *const OpenHow,
            std::mem::size_of::<OpenHow>(),
        )
    };
    let fd = Errno::result(r)?;
    // SAFETY: the kernel just returned this fd; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// Sends `fd` (or nothing, to say there is none) over a Unix socket.
pub fn send_fd(sock: BorrowedFd<'_>, fd: Option<BorrowedFd<'_>>) -> Result<(), Errno> {
    use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
    let raw: Vec<RawFd> = fd.iter().map(|f| f.as_raw_fd()).collect();
    let cmsg = [ControlMessage::ScmRights(&raw)];
    let cmsgs: &[ControlMessage<'_>] = if raw.is_empty() { &[] } else { &cmsg };
    let byte = [if raw.is_empty() { b'0' } else { b'1' }];
    let iov = [std::io::IoSlice::new(&byte)];
    sendmsg::<()>(sock.as_raw_fd(), &iov, cmsgs, MsgFlags::empty(), None).map(drop)
}

/// Receives what [`send_fd`] sent.
pub fn recv_fd(sock: BorrowedFd<'_>) -> Result<Option<OwnedFd>, Errno> {
    use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
    let mut byte = [0u8; 1];
    let mut iov = [std::io::IoSliceMut::new(&mut byte)];
    let mut space = nix::cmsg_space!(RawFd);
    let msg = recvmsg::<()>(
        sock.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        MsgFlags::MSG_CMSG_CLOEXEC,
    )?;
    let mut first = None;
    for c in msg.cmsgs()? {
        if let ControlMessageOwned::ScmRights(fds) = c {
            for fd in fds {
                // SAFETY: SCM_RIGHTS just gave us these fds; nothing else
                // owns them. Any beyond the first close when dropped.
                let owned = unsafe { OwnedFd::from_raw_fd(fd) };
                if first.is_none() {
                    first = Some(owned);
                }
            }
        }
    }
    Ok(first)
}
