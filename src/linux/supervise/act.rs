//! Carrying out a call the supervisor took on, on its own copy of the
//! name, beneath the supervised directory's descriptor, and answering it.
//!
//! Every step refuses symlinks (`RESOLVE_NO_SYMLINKS`, or an `O_PATH`
//! descriptor opened that way and acted on through `/proc/self/fd`), so a
//! name that is a symlink is never followed: such a call continues to the
//! kernel instead, which follows it and judges the target with the
//! sandbox's own rules. Modes get the caller's umask and lose set-user-ID,
//! set-group-ID and sticky bits. (mkdir, rmdir and rename never follow a
//! final symlink, and the name is one component beneath the descriptor.)

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::sys::stat::Mode;

use super::decide::Act;
use super::{c_name, kernel, Supervisor};

const RESOLVE_BENEATH: u64 = 0x08;
const RESOLVE_NO_XDEV: u64 = 0x01;
const RESOLVE_NO_MAGICLINKS: u64 = 0x02;
const RESOLVE_NO_SYMLINKS: u64 = 0x04;
const RESOLVE: u64 =
    RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV;

/// What became of a call.
enum Outcome {
    /// Answered with this value or errno.
    Answer(Result<i64, Errno>),
    /// Already answered (a descriptor was handed over).
    Done,
    /// Not ours after all (a symlink, a mount): the kernel decides.
    Continue,
}

pub(super) fn perform(sup: &Supervisor, act: &Act, id: u64, pid: u32) {
    let Some(listener) = sup.listener() else {
        return;
    };
    let outcome = run(sup, listener, act, id, pid);
    match outcome {
        Outcome::Answer(r) => kernel::answer(listener, id, r),
        Outcome::Done => {}
        Outcome::Continue => kernel::let_continue(listener, id),
    }
    tracing::debug!(act = %act, "carried out for the sandbox (name-prefix grant)");
}

fn run(sup: &Supervisor, listener: BorrowedFd<'_>, act: &Act, id: u64, pid: u32) -> Outcome {
    let dir = |i: usize| sup.dir_fds[i].0.as_fd();
    match act {
        Act::Open {
            dir: d,
            name,
            flags,
            mode,
        } => {
            let Ok(c) = c_name(name) else {
                return Outcome::Continue;
            };
            let mode = (mode & 0o777 & !sup.caller_umask(pid)) as u64;
            let exclusive = flags & libc::O_EXCL != 0 && flags & libc::O_CREAT != 0;
            // Our own copy is close-on-exec; the caller's gets what it asked.
            // openat2 refuses flags open(2) ignores: only the known ones.
            // An open that may meet an existing entry does not truncate
            // and does not wait (a FIFO) before the entry is judged.
            let mut ours =
                (*flags & KNOWN_OPEN_FLAGS & !libc::O_CLOEXEC) | libc::O_CLOEXEC | libc::O_NOCTTY;
            if !exclusive {
                ours = (ours & !libc::O_TRUNC) | libc::O_NONBLOCK;
            }
            match kernel::openat2(dir(*d), &c, ours as u32 as u64, mode, RESOLVE) {
                Ok(fd) if !exclusive => match ready_existing(fd.as_fd(), *flags) {
                    Ok(true) => match kernel::answer_with_fd(
                        listener,
                        id,
                        fd.as_fd(),
                        flags & libc::O_CLOEXEC != 0,
                    ) {
                        Ok(_) => Outcome::Done,
                        Err(Errno::ENOENT) => Outcome::Done,
                        Err(e) => Outcome::Answer(Err(e)),
                    },
                    // Not a plain file of its own (a FIFO, a device, a
                    // second name of another file): the kernel decides.
                    Ok(false) => Outcome::Continue,
                    Err(e) => Outcome::Answer(Err(e)),
                },
                Ok(fd) => {
                    match kernel::answer_with_fd(
                        listener,
                        id,
                        fd.as_fd(),
                        flags & libc::O_CLOEXEC != 0,
                    ) {
                        Ok(_) => Outcome::Done,
                        // The caller could not take it (no free descriptor)
                        // or is gone: the file it never got is removed, so a
                        // retry is not met by EEXIST, and the caller is told.
                        Err(e) => {
                            remove_if_same(dir(*d), &c, fd.as_fd());
                            if e == Errno::ENOENT {
                                Outcome::Done
                            } else {
                                Outcome::Answer(Err(e))
                            }
                        }
                    }
                }
                Err(Errno::ELOOP | Errno::EXDEV) => Outcome::Continue,
                Err(e) => Outcome::Answer(Err(e)),
            }
        }
        Act::Mkdir { dir: d, name, mode } => {
            let mode = mode & 0o777 & !sup.caller_umask(pid);
            Outcome::Answer(
                nix::sys::stat::mkdirat(dir(*d), name.as_os_str(), Mode::from_bits_truncate(mode))
                    .map(|_| 0),
            )
        }
        Act::Rmdir { dir: d, name } => Outcome::Answer(
            nix::unistd::unlinkat(
                dir(*d),
                name.as_os_str(),
                nix::unistd::UnlinkatFlags::RemoveDir,
            )
            .map(|_| 0),
        ),
        // unlinkat and linkat (without AT_SYMLINK_FOLLOW) act on the entry
        // itself, never on where a symlink leads.
        Act::Unlink { dir: d, name } => Outcome::Answer(
            nix::unistd::unlinkat(
                dir(*d),
                name.as_os_str(),
                nix::unistd::UnlinkatFlags::NoRemoveDir,
            )
            .map(|_| 0),
        ),
        Act::Link { dir: d, from, to } => Outcome::Answer(
            nix::unistd::linkat(
                dir(*d),
                from.as_os_str(),
                dir(*d),
                to.as_os_str(),
                nix::fcntl::AtFlags::empty(),
            )
            .map(|_| 0),
        ),
        Act::Symlink {
            dir: d,
            target,
            name,
        } => Outcome::Answer(
            nix::unistd::symlinkat(target.as_os_str(), dir(*d), name.as_os_str()).map(|_| 0),
        ),
        Act::Rename {
            dir: d,
            from,
            to,
            flags,
        } => {
            // A symlink is never moved onto a granted name (nor swapped
            // with one): a save made outside the sandbox would follow it.
            // Only this supervisor changes these names, so what it sees
            // here is what it renames.
            for name in [from, to] {
                let link = nix::sys::stat::fstatat(
                    dir(*d),
                    name.as_os_str(),
                    nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
                )
                .is_ok_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFLNK);
                let moved = std::ptr::eq(name, from) || flags & libc::RENAME_EXCHANGE != 0;
                if link && moved {
                    return Outcome::Answer(Err(Errno::EPERM));
                }
            }
            let flags = nix::fcntl::RenameFlags::from_bits_truncate(*flags);
            Outcome::Answer(
                nix::fcntl::renameat2(dir(*d), from.as_os_str(), dir(*d), to.as_os_str(), flags)
                    .map(|_| 0),
            )
        }
        Act::Utimens {
            dir: d,
            name,
            times,
        } => {
            let times = if *times == 0 {
                None
            } else {
                match kernel::read_times(pid, *times) {
                    Some(t) => Some(t),
                    None => return Outcome::Answer(Err(Errno::EFAULT)),
                }
            };
            through_path_fd(dir(*d), name, |link| {
                let ptr = times.as_ref().map_or(std::ptr::null(), |t| t.as_ptr());
                // SAFETY: `link` is NUL-terminated; `ptr` is null or points
                // at two timespecs we own, alive for the call.
                let r = unsafe { libc::utimensat(sup.proc_fd.as_raw_fd(), link.as_ptr(), ptr, 0) };
                Errno::result(r).map(|_| 0)
            })
        }
    }
}

/// Open flags openat2 accepts; others (which open(2) ignores) are dropped.
const KNOWN_OPEN_FLAGS: i32 = libc::O_ACCMODE
    | libc::O_CREAT
    | libc::O_EXCL
    | libc::O_NOCTTY
    | libc::O_TRUNC
    | libc::O_APPEND
    | libc::O_NONBLOCK
    | libc::O_DSYNC
    | libc::O_SYNC
    | libc::O_DIRECT
    | libc::O_LARGEFILE
    | libc::O_NOFOLLOW
    | libc::O_NOATIME
    | libc::O_CLOEXEC;

/// Readies an entry opened without O_EXCL (so perhaps one that existed)
/// for the caller: only a regular file with no other name may be handed
/// over; then it is truncated if the caller asked, and waits again if the
/// caller did not ask otherwise. `false`: not ours to hand over.
fn ready_existing(fd: BorrowedFd<'_>, flags: i32) -> Result<bool, Errno> {
    let st = nix::sys::stat::fstat(fd)?;
    let regular = st.st_mode & libc::S_IFMT == libc::S_IFREG;
    // A file of yours that also carries a granted name (a hard link made
    // outside the sandbox) must not be written through it.
    let one_name = st.st_nlink == 1;
    if !regular {
        return Ok(false);
    }
    if !one_name {
        return Ok(false);
    }
    if flags & libc::O_TRUNC != 0 && flags & libc::O_ACCMODE != libc::O_RDONLY {
        nix::unistd::ftruncate(fd, 0)?;
    }
    if flags & libc::O_NONBLOCK == 0 {
        let status = nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_GETFL)?;
        let status = OFlag::from_bits_truncate(status) - OFlag::O_NONBLOCK;
        nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_SETFL(status))?;
    }
    Ok(true)
}

/// Removes `name` beneath `dir` if it is still the file `fd` opened (a
/// file the supervisor created exclusively and could not hand over).
fn remove_if_same(dir: BorrowedFd<'_>, name: &std::ffi::CStr, fd: BorrowedFd<'_>) {
    let (Ok(ours), Ok(there)) = (
        nix::sys::stat::fstat(fd),
        nix::sys::stat::fstatat(dir, name, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW),
    ) else {
        return;
    };
    if (ours.st_dev, ours.st_ino) == (there.st_dev, there.st_ino) {
        let _ = nix::unistd::unlinkat(dir, name, nix::unistd::UnlinkatFlags::NoRemoveDir);
    }
}

/// Pins the entry with an `O_PATH` descriptor opened without following a
/// symlink, then acts on exactly that inode through `self/fd/N` of the
/// host's /proc.
fn through_path_fd(
    dir: BorrowedFd<'_>,
    name: &std::ffi::OsStr,
    f: impl FnOnce(&std::ffi::CStr) -> Result<i64, Errno>,
) -> Outcome {
    let Ok(c) = c_name(name) else {
        return Outcome::Continue;
    };
    let flags = (OFlag::O_PATH | OFlag::O_CLOEXEC).bits() as u64;
    let pinned: OwnedFd = match kernel::openat2(dir, &c, flags, 0, RESOLVE) {
        Ok(fd) => fd,
        Err(Errno::ELOOP | Errno::EXDEV) => return Outcome::Continue,
        Err(e) => return Outcome::Answer(Err(e)),
    };
    let link = format!("self/fd/{}", pinned.as_raw_fd());
    let Ok(link) = std::ffi::CString::new(link) else {
        return Outcome::Continue;
    };
    Outcome::Answer(f(&link))
}
