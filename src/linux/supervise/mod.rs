//! The supervisor: name-prefix grants on Linux.
//!
//! Some agents keep state as entries of the home directory itself: Claude
//! saves `~/.claude.json` by writing `~/.claude.json.tmp.PID.N` beside it
//! under a lock directory `~/.claude.json.lock` and renaming the temporary
//! file over it; a zcode backend may create `~/.zcode-…`. Landlock and
//! read-only mounts grant whole directories, and opening the home directory
//! to new files would be an escape (a new `~/.bash_profile` runs at the next
//! login). So the home directory stays read-only, and the sandbox helper,
//! which is outside the sandbox, creates, renames and removes exactly those
//! names for the agent:
//!
//! 1. before the sandbox is armed, the helper opens each supervised
//!    directory (on the host's mount, which stays writable for it) and the
//!    host's `/proc`;
//! 2. the sandbox's first process, once confined, installs a seccomp filter
//!    (`filter`) that hands the calls that could touch such a name to the
//!    helper (user notification), and passes the helper the listener;
//! 3. for each call the helper copies the path out of the caller's memory
//!    once, decides on that copy (`decide`: a single name directly in the
//!    directory, starting with a granted prefix, allowed by the policy),
//!    and either lets the call continue to the kernel (which judges it as
//!    if the helper were not there) or carries it out itself on its own
//!    copy, beneath the directory's descriptor, with `openat2(
//!    RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS |
//!    RESOLVE_NO_XDEV)` (an opened file is handed to the caller with
//!    SECCOMP_ADDFD_FLAG_SEND). A call is never let through to the kernel on
//!    the strength of a path the caller could still change.
//!
//! A supervised name supports every way a program makes, replaces or
//! removes a name: an open with O_CREAT (with or without O_EXCL) or
//! O_TRUNC, `creat`, renaming one granted name over another, `link`
//! between granted names, a `symlink` holding a plain sibling name (a
//! lock's note), `mkdir`, `rmdir`, `unlink`, `utimensat`: a grant must not
//! hold only for one version's choice of calls. An existing entry is
//! handed over only when it is a regular file with no other name, and is
//! truncated after that check. chmod and writes through a descriptor are
//! never handed over. Every call the filter hands over costs a round
//! trip, whatever file it names, which is why only sandboxes whose policy
//! has a name-prefix grant outside the writable directories get the filter
//! at all (see BENCHMARKS.md for what it costs), and `zcode-acp run`, whose
//! supervisor also notes the writes the kernel will refuse, to name them
//! when the command ends (`refusals`).
//!
//! Calls the kernel must see for the decision to be right stay with it:
//! foreign ABIs are refused outright (`filter`), and so are set-user-ID and
//! set-group-ID bits (the helper never sets them). A kernel without user
//! notification (before 5.14), or a process tree that already has a
//! listener, gets the old behaviour: only entries that exist when the
//! sandbox is armed are writable, as the plan says.

mod act;
pub mod decide;
mod kernel;
pub mod refusals;

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::sync::OnceLock;

use nix::errno::Errno;
use nix::fcntl::{open, OFlag};
use nix::sys::stat::{fstatat, Mode};

use super::{seccomp, sys};
use crate::policy::Policy;
use decide::Supervised;

/// Whether supervised name-prefix grants can work here: a kernel with user
/// notification and descriptor passing (5.14), an architecture whose
/// filter is written, and no seccomp listener already above us (a sandbox
/// inside a sandbox: the kernel allows one per process tree). Decided once.
pub fn available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        cfg!(any(target_arch = "x86_64", target_arch = "aarch64"))
            && kernel::user_notification_supported()
            && (!has_seccomp_filters() || listener_can_be_installed())
    })
}

/// Whether this process already runs under seccomp filters (a container,
/// or a sandbox of ours around us).
fn has_seccomp_filters() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Seccomp_filters:"))
                .and_then(|v| v.trim().parse::<u32>().ok())
        })
        .is_some_and(|n| n > 0)
}

/// Tries, in a short-lived child, whether a listener can be added to the
/// filters already installed.
fn listener_can_be_installed() -> bool {
    use nix::sys::wait::{waitpid, WaitStatus};
    use nix::unistd::{fork, ForkResult};
    // Built before the fork: the bridge has threads, so the child must not
    // allocate.
    let filters = sys::sock_filters(&seccomp::program(&seccomp::NATIVE, true));
    // SAFETY: the child only makes system calls and leaves with _exit.
    match unsafe { fork() } {
        Ok(ForkResult::Child) => {
            let ok = nix::sys::prctl::set_no_new_privs().is_ok()
                && sys::install_seccomp(&filters, true).is_ok();
            // SAFETY: leaves the child at once, without running destructors.
            unsafe { libc::_exit(if ok { 0 } else { 1 }) }
        }
        Ok(ForkResult::Parent { child }) => {
            matches!(waitpid(child, None), Ok(WaitStatus::Exited(_, 0)))
        }
        Err(_) => false,
    }
}

/// The helper's side: everything opened before the sandbox is armed, and
/// the listener once the sandbox's first process sends it.
pub struct Supervisor {
    dirs: Vec<Supervised>,
    /// Each supervised directory on the host's mount (writable for us even
    /// after the sandbox's mounts are read-only), with its device and inode.
    dir_fds: Vec<(OwnedFd, u64, u64)>,
    /// The host's `/proc` (the sandbox mounts its own over `/proc` later).
    proc_fd: OwnedFd,
    policy: Policy,
    listener: Option<OwnedFd>,
    /// `zcode-acp run`: the refused writes seen go by, for its last line.
    refusals: Option<Noted>,
    /// Where each refused write is said as it is first seen (an agent whose
    /// shell shows the editor nothing): stderr, written without waiting
    /// (see [`Announcer`]).
    announcer: Option<Announcer>,
}

/// The refused writes a supervisor noted, shared with `run`, which names
/// them when the command ends.
pub type Noted = std::sync::Arc<std::sync::Mutex<crate::policy::refused::Refusals>>;

/// Why the supervisor could not be prepared.
#[derive(Debug, thiserror::Error)]
#[error("cannot {what} {path}: {errno}")]
pub struct PrepareError {
    pub what: &'static str,
    pub path: std::path::PathBuf,
    pub errno: nix::errno::Errno,
}

impl Supervisor {
    /// Opens what the supervisor needs. Must run before the mount
    /// namespace is unshared: descriptors opened now keep the host's
    /// (writable) mounts. With `note_refusals`, it also notes the writes
    /// the sandbox refuses (see [`refusals`]), and with `announce` says
    /// each on stderr as it is first seen.
    pub fn prepare(
        dirs: &[Supervised],
        policy: Policy,
        note_refusals: bool,
        announce: bool,
    ) -> Result<Supervisor, PrepareError> {
        let flags = OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW;
        let failed = |what: &'static str, path: &std::path::Path| {
            let path = path.to_path_buf();
            move |errno| PrepareError { what, path, errno }
        };
        let mut dir_fds = Vec::new();
        for d in dirs {
            let fd = open(&d.dir, flags, Mode::empty()).map_err(failed("open", &d.dir))?;
            let st = nix::sys::stat::fstat(&fd).map_err(failed("stat", &d.dir))?;
            dir_fds.push((fd, st.st_dev, st.st_ino));
        }
        let proc = std::path::Path::new("/proc");
        let proc_fd = open(
            proc,
            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(failed("open", proc))?;
        Ok(Supervisor {
            dirs: dirs.to_vec(),
            dir_fds,
            proc_fd,
            policy,
            listener: None,
            refusals: note_refusals.then(Noted::default),
            announcer: announce.then(Announcer::of_stderr).flatten(),
        })
    }

    /// The writes it notes the sandbox refused (`run`'s last line), if it
    /// notes them.
    pub fn refusals(&self) -> Option<Noted> {
        self.refusals.clone()
    }

    /// Notes the names `call` writes that the policy refuses, made
    /// absolute from the caller's directories as the host's `/proc` shows
    /// them (before the call continues to the kernel, which decides it).
    fn note_refusals(&self, pid: u32, call: &decide::Call) {
        let Some(cell) = &self.refusals else {
            return;
        };
        for (at, path, when) in refusals::written_names(call) {
            let base = if path.first() == Some(&b'/') {
                std::path::PathBuf::from("/")
            } else {
                let link = if at == libc::AT_FDCWD {
                    format!("{pid}/cwd")
                } else if at >= 0 {
                    format!("{pid}/fd/{at}")
                } else {
                    continue;
                };
                match nix::fcntl::readlinkat(&self.proc_fd, link.as_str()) {
                    Ok(dir) => std::path::PathBuf::from(dir),
                    Err(_) => continue,
                }
            };
            let path = refusals::absolute(&base, path);
            let exists = || std::fs::symlink_metadata(&path).is_ok();
            let counts = match when {
                refusals::When::Always => true,
                refusals::When::Absent => !exists(),
                refusals::When::Present => exists(),
            };
            if counts {
                let mut refusals = cell.lock().unwrap_or_else(|e| e.into_inner());
                let noted = refusals.note(&self.policy, path);
                if let Some(announcer) = &self.announcer {
                    if let Some(line) = noted.and_then(crate::policy::refused::announcement) {
                        announcer.say(&line);
                    }
                }
            }
        }
    }

    /// Takes the listener the sandbox's first process sent; with none, it
    /// could not install the filter, and the grants stay as armed.
    pub fn receive_listener(&mut self, sock: BorrowedFd<'_>) {
        match kernel::recv_fd(sock) {
            Ok(Some(fd)) => {
                kernel::prefer_sync_wake_up(fd.as_fd());
                // Modes are the caller's (its umask applied by us), never ours.
                nix::sys::stat::umask(Mode::empty());
                self.listener = Some(fd);
            }
            Ok(None) | Err(_) => tracing::warn!(
                "the sandbox could not hand name-prefix grants to its supervisor; entries of the granted prefixes (such as ~/.claude.json) cannot be written in this generation"
            ),
        }
    }

    pub fn listener(&self) -> Option<BorrowedFd<'_>> {
        self.listener.as_ref().map(|l| l.as_fd())
    }

    /// Stops supervising (every filtered process is gone).
    pub fn close(&mut self) {
        self.listener = None;
    }

    /// Waits for one call and handles it; false when no call can come
    /// any more (no listener, or one the kernel no longer serves).
    pub fn serve_one(&self) -> bool {
        let Some(listener) = self.listener() else {
            return false;
        };
        let n = match kernel::receive(listener) {
            Ok(n) => n,
            // The caller went away before we looked, or a signal came.
            Err(Errno::ENOENT | Errno::EINTR) => return true,
            Err(_) => return false,
        };
        let pid = n.pid;
        let call = decide::decode(n.data.nr as u32, n.data.args, &mut |addr| {
            kernel::read_c_string(pid, addr)
        });
        let act = call.as_ref().and_then(|c| {
            decide::decide(c, &self.dirs, &self.policy, &mut |at, i| {
                self.caller_dir_is(pid, at, i)
            })
        });
        let Some(act) = act else {
            // Noted while the caller still waits: its descriptors and
            // working directory are still the ones the call names, and
            // what exists is what the call will find.
            if let Some(call) = &call {
                self.note_refusals(pid, call);
            }
            kernel::let_continue(listener, n.id);
            return true;
        };
        // The pid might have been reused since the call was made; act only
        // for a caller still waiting on this very call.
        if !kernel::still_waiting(listener, n.id) {
            return true;
        }
        act::perform(self, &act, n.id, pid);
        true
    }

    /// Whether the caller's directory argument (or its working directory)
    /// is supervised directory `i`, by device and inode.
    fn caller_dir_is(&self, pid: u32, at: decide::Dirfd, i: usize) -> bool {
        let link = if at == libc::AT_FDCWD {
            format!("{pid}/cwd")
        } else if at >= 0 {
            format!("{pid}/fd/{at}")
        } else {
            return false;
        };
        match fstatat(&self.proc_fd, link.as_str(), nix::fcntl::AtFlags::empty()) {
            Ok(st) => {
                let (_, dev, ino) = &self.dir_fds[i];
                st.st_dev == *dev && st.st_ino == *ino
            }
            Err(_) => false,
        }
    }

    /// The caller's umask (from the host's /proc), 022 when unreadable.
    fn caller_umask(&self, pid: u32) -> u32 {
        let read = || -> Option<u32> {
            let fd = nix::fcntl::openat(
                &self.proc_fd,
                format!("{pid}/status").as_str(),
                OFlag::O_RDONLY | OFlag::O_CLOEXEC,
                Mode::empty(),
            )
            .ok()?;
            let text = std::io::read_to_string(std::fs::File::from(fd)).ok()?;
            text.lines()
                .find_map(|l| l.strip_prefix("Umask:"))
                .and_then(|v| u32::from_str_radix(v.trim(), 8).ok())
        };
        read().unwrap_or(0o022)
    }
}

/// In the sandbox's first process, after Landlock: installs the sandbox's
/// seccomp filter, with the supervisor's listener when `supervisor` is the
/// socket to the helper (which gets the listener, or word that there is
/// none). The filter itself is part of the sandbox: if it cannot be
/// installed, this process dies rather than run the command without it. A
/// listener that cannot be had (a sandbox inside another process tree
/// with one) costs only the prefix grants, and is said.
pub fn install_filter(supervisor: Option<BorrowedFd<'_>>) -> Result<(), Errno> {
    let Some(sock) = supervisor else {
        let filters = sys::sock_filters(&seccomp::program(&seccomp::NATIVE, false));
        return sys::install_seccomp(&filters, false).map(drop);
    };
    let filters = sys::sock_filters(&seccomp::program(&seccomp::NATIVE, true));
    match sys::install_seccomp(&filters, true) {
        Ok(listener) => {
            if let Err(e) = kernel::send_fd(sock, listener.as_ref().map(|l| l.as_fd())) {
                eprintln!("zcode-acp sandbox: cannot hand the supervisor its listener: {e}");
            }
            Ok(())
        }
        Err(e) => {
            eprintln!(
                "zcode-acp sandbox: cannot install the supervisor's filter ({e}); entries of the granted prefixes (such as ~/.claude.json) cannot be written"
            );
            let _ = kernel::send_fd(sock, None);
            let filters = sys::sock_filters(&seccomp::program(&seccomp::NATIVE, false));
            sys::install_seccomp(&filters, false).map(drop)
        }
    }
}

/// Says refused writes on stderr without ever waiting for the reader: the
/// supervisor answers the sandbox's calls from the helper's own loop, at
/// every level (a helper that made a PID namespace for its children can
/// start no thread), so a line written into a full pipe would hold every
/// call behind it until the reader came back. A pipe gets a description of
/// its own opened non-blocking (the one the agent shares keeps its flags);
/// a line it has no room for is dropped, and not said again while the
/// agent runs: the refusal stands all the same.
struct Announcer {
    out: std::fs::File,
}

impl Announcer {
    /// Must run while `/proc` is still the host's (see `prepare`).
    fn of_stderr() -> Option<Announcer> {
        let announcer = Announcer::of(std::io::stderr().as_fd());
        if announcer.is_none() {
            tracing::warn!("the sandbox cannot say the writes it refuses on stderr: they are refused without a question in the editor");
        }
        announcer
    }

    fn of(fd: BorrowedFd<'_>) -> Option<Announcer> {
        use std::os::fd::AsRawFd;
        use std::os::unix::fs::OpenOptionsExt;
        let file = std::fs::File::from(fd.try_clone_to_owned().ok()?);
        if file.metadata().ok()?.is_file() {
            // A file takes a line without waiting for a reader.
            return Some(Announcer { out: file });
        }
        // A pipe (or a terminal) reopened: a description of our own, whose
        // flags the agent does not share. A socket cannot be reopened so,
        // and gets no announcer (the bridge hands its agents pipes).
        std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open(format!("/proc/self/fd/{}", file.as_raw_fd()))
            .ok()
            .map(|out| Announcer { out })
    }

    /// One write of one line (shorter than a pipe's atomic size), so it
    /// never interleaves with the agent's own, and never waits: a line the
    /// pipe has no room for is dropped whole (and not logged, which would
    /// wait on the same pipe).
    fn say(&self, line: &str) {
        use std::io::Write;
        let _ = (&self.out).write(line.as_bytes());
    }
}

/// A name as a C string (names never hold NUL: they came from one).
fn c_name(name: &std::ffi::OsStr) -> Result<std::ffi::CString, Errno> {
    std::ffi::CString::new(name.as_bytes()).map_err(|_| Errno::EINVAL)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    /// A pipe nobody reads holds no call: the announcer's lines go through
    /// a description of its own that never waits, and the one the agent
    /// shares keeps waiting as it did.
    #[test]
    fn a_full_pipe_never_holds_the_announcer() {
        let (read, write) = nix::unistd::pipe2(OFlag::O_CLOEXEC).unwrap();
        let announcer = Announcer::of(write.as_fd()).expect("an announcer for a pipe");
        let (done, finished) = std::sync::mpsc::channel();
        let filler = std::thread::spawn(move || {
            use std::io::Write;
            // Fills the pipe through the announcer's own description, which
            // must say "full" (EAGAIN) rather than wait for a reader.
            let chunk = [b'x'; 4096];
            let mut written = 0usize;
            let full = loop {
                match (&announcer.out).write(&chunk) {
                    Ok(n) => written += n,
                    Err(e) => break e.raw_os_error() == Some(libc::EAGAIN),
                }
                assert!(written < 64 << 20, "the pipe never filled");
            };
            announcer.say("one line more\n");
            done.send((full, written)).unwrap();
        });
        let (full, written) = finished
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("a full pipe held the announcer");
        filler.join().unwrap();
        assert!(full, "the pipe filled with an error other than EAGAIN");
        // Everything went into this very pipe, and the last line not at all.
        let mut queued: libc::c_int = 0;
        // SAFETY: FIONREAD writes one int we own.
        let r = unsafe { libc::ioctl(read.as_raw_fd(), libc::FIONREAD, &mut queued) };
        assert_eq!(r, 0);
        assert_eq!(queued as usize, written, "the lines went somewhere else");
        let shared = nix::fcntl::fcntl(&write, nix::fcntl::FcntlArg::F_GETFL).unwrap();
        assert_eq!(
            shared & libc::O_NONBLOCK,
            0,
            "the description the agent shares was made non-blocking"
        );
    }
}
