//! Holding an armed agent's processes still while the editor acts for it.
//!
//! The editor writes a file (`fs/write_text_file`) with the user's rights,
//! following symlinks as it goes. The bridge judges the path first, but a
//! process of the agent's that swaps a directory on the way for a symlink
//! between that judgment and the editor's write would have the editor
//! write wherever the link points. So while such a write is in flight,
//! every process of the agent's world is stopped: the judgment is made
//! after they are, and nothing of theirs moves until the editor answered.
//!
//! The world is every process descended from the generation's helper,
//! and every editor terminal's helper of this generation (found by its
//! command line, which names the generation's directory) with its
//! descendants: both helpers are child subreapers, so nothing of theirs
//! leaves their tree by double forking. Where the generation has a user
//! namespace of its own, the world is also every process whose user
//! namespace is the generation's, a terminal's, or lies below one (a
//! process may create a nested one; it cannot leave it). Where it has none
//! (the Landlock-only level), no namespace is taken for the world: other
//! programs' sandboxes nest their namespaces below this one too.
//!
//! Each process is opened as a pidfd before it is judged, and stopped with
//! SIGSTOP through it, so neither the stop nor the later SIGCONT can reach
//! a process that took its pid. The scan is repeated until it finds
//! nothing new: a process that forks while it is being stopped shows its
//! child in the next scan, and a stopped process forks nothing. Only when
//! every thread of every one is seen stopped (or gone) is the hold taken.
//! Anything that cannot be read, opened or signalled for a reason other
//! than the process being gone fails the hold, as does a process that will
//! not stop in time (in an uninterruptible sleep): the write is refused
//! rather than made with the world moving.

use std::collections::{HashMap, HashSet};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};

/// Whose processes to hold.
#[derive(Debug, Clone)]
pub struct World {
    /// The generation's helper (the bridge's child): its user namespace is
    /// the generation's. It runs only zcode-acp's code and is not stopped.
    pub holder: i32,
    /// The generation's directory: a terminal's helper names a spec in it.
    pub generation_dir: Option<PathBuf>,
}

/// Why the world could not be held.
#[derive(Debug, thiserror::Error)]
pub enum HoldError {
    #[error("the agent's sandbox is gone (its helper, pid {0}, has no user namespace to read)")]
    Gone(i32),
    #[error("{0} of the agent's processes did not stop within {1:?} (one may be in an uninterruptible sleep, on a slow or hung filesystem)")]
    WouldNotStop(usize, Duration),
    #[error("the agent's processes kept starting new ones while being stopped")]
    KeptForking,
    #[error("the agent runs more than {0} processes, more than zcode-acp holds at once: end some of them")]
    TooMany(usize),
    #[error("zcode-acp ran out of file descriptors holding the agent's {0} processes: raise the limit (`ulimit -n`) for the editor, or end some of them")]
    OutOfDescriptors(usize),
    #[error("{0}")]
    Unreadable(String),
    #[error("an editor terminal of the agent's kept starting (it holds the hold lock)")]
    TerminalStarting,
}

/// The held processes: each is continued when this is released or dropped.
#[derive(Debug, Default)]
pub struct Held {
    stopped: Vec<(i32, OwnedFd)>,
    /// Released after every process is continued (a field drops after
    /// `Drop::drop` ran).
    _lock: Option<Flock<std::fs::File>>,
}

impl Held {
    /// How many processes are held.
    pub fn len(&self) -> usize {
        self.stopped.len()
    }

    pub fn is_empty(&self) -> bool {
        self.stopped.is_empty()
    }

    /// Continues every held process.
    pub fn release(mut self) {
        self.continue_all();
    }

    /// Ends every held process (SIGKILL reaches a stopped one): when they
    /// must not go on, with a write at the editor that may still be made.
    pub fn kill(mut self) {
        for (_, pidfd) in self.stopped.drain(..) {
            let _ = send(&pidfd, libc::SIGKILL);
        }
    }

    fn continue_all(&mut self) {
        for (_, pidfd) in self.stopped.drain(..) {
            let _ = send(&pidfd, libc::SIGCONT);
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.continue_all();
    }
}

/// `NS_GET_PARENT` (linux/nsfs.h: `_IO(0xb7, 0x2)`).
const NS_GET_PARENT: libc::c_ulong = 0xb702;
/// User namespaces nest at most 32 deep.
const MAX_NESTING: usize = 33;
/// Rounds of scanning, at most: each stops what the last one found.
const MAX_ROUNDS: usize = 64;
/// Processes held at once, at most (each takes a descriptor).
pub const MAX_HELD: usize = 8192;

/// The generation's hold lock, in its directory: a hold takes it
/// exclusively for as long as it lasts; an editor terminal's helper takes
/// it shared from its start until its command's first process exists. So
/// a terminal whose helper the hold could not see yet (still starting,
/// under another name) waits for the release instead of running unheld.
pub const HOLD_LOCK: &str = "hold.lock";

/// Opens (making it where missing) the lock at `path`.
fn open_lock(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .mode(0o600)
        .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
        .open(path)
}

/// A terminal's helper: waits until no hold is in effect, and keeps the
/// next one off until the returned lock is dropped.
pub fn wait_for_no_hold(path: &Path) -> std::io::Result<Flock<std::fs::File>> {
    Flock::lock(open_lock(path)?, FlockArg::LockShared).map_err(|(_, e)| e.into())
}

/// The hold's side: the lock taken exclusively (a terminal's helper
/// between its start and its command's first process holds it off),
/// waiting up to `deadline`.
fn take_lock(path: &Path, deadline: Instant) -> Result<Flock<std::fs::File>, HoldError> {
    let unreadable = |e: std::io::Error| {
        HoldError::Unreadable(format!(
            "cannot take the hold lock {} ({e})",
            path.display()
        ))
    };
    let mut file = open_lock(path).map_err(unreadable)?;
    loop {
        match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(locked) => return Ok(locked),
            Err((back, Errno::EWOULDBLOCK)) if Instant::now() < deadline => {
                file = back;
                std::thread::sleep(Duration::from_millis(1));
            }
            Err((_, Errno::EWOULDBLOCK)) => return Err(HoldError::TerminalStarting),
            Err((_, e)) => return Err(unreadable(e.into())),
        }
    }
}

/// Stops every process of `world`, waiting up to `within` for each to be
/// seen stopped.
pub fn hold(world: &World, within: Duration) -> Result<Held, HoldError> {
    let deadline = Instant::now() + within;
    let root = inode_of(&format!("/proc/{}/ns/user", world.holder))
        .map_err(|_| HoldError::Gone(world.holder))?;
    let own = inode_of("/proc/self/ns/user").map_err(|e| {
        HoldError::Unreadable(format!("cannot read this process's user namespace ({e})"))
    })?;
    let me = std::process::id() as i32;
    let mut scope = Scope {
        roots: HashSet::from([root]),
        own,
        // Sharing ours, the holder's namespace says nothing about whose a
        // process is: only the lineage does.
        by_namespace: root != own,
    };
    let mut held = Held {
        stopped: Vec::new(),
        _lock: match &world.generation_dir {
            Some(dir) => Some(take_lock(&dir.join(HOLD_LOCK), deadline)?),
            None => None,
        },
    };
    let mut stopped_pids: HashSet<i32> = HashSet::new();
    for _ in 0..MAX_ROUNDS {
        let procs = all_processes()?;
        let lineage = lineage(&procs, world.holder, world.generation_dir.as_deref());
        let mut new = 0;
        for &(pid, _, started, _) in &procs {
            if pid == me || pid == world.holder || stopped_pids.contains(&pid) {
                continue;
            }
            // Judged first, from what the scan saw: most processes are not
            // the world's, and need no descriptor.
            let member =
                lineage.contains(&pid) || scope.holds(pid, world.generation_dir.as_deref())?;
            if !member {
                continue;
            }
            // Then opened, and checked to be still the process the scan
            // saw: a pid is not reused while its process lives, so a
            // matching start time means the judgment above was of this very
            // process, the one the descriptor stops (one that took its pid
            // since waits for the next round's scan).
            let pidfd = match pidfd_open(pid) {
                Ok(fd) => fd,
                Err(Errno::ESRCH) => continue,
                Err(Errno::EMFILE | Errno::ENFILE) => {
                    return Err(HoldError::OutOfDescriptors(held.len()))
                }
                Err(e) => {
                    return Err(HoldError::Unreadable(format!(
                        "cannot open process {pid} to hold it ({e})"
                    )))
                }
            };
            if read_stat(pid).ok().as_deref().and_then(start_time) != Some(started) {
                continue;
            }
            match send(&pidfd, libc::SIGSTOP) {
                Ok(()) => {}
                Err(Errno::ESRCH) => continue,
                Err(e) => {
                    return Err(HoldError::Unreadable(format!(
                        "cannot stop process {pid} ({e})"
                    )))
                }
            }
            stopped_pids.insert(pid);
            held.stopped.push((pid, pidfd));
            new += 1;
            if held.len() > MAX_HELD {
                return Err(HoldError::TooMany(MAX_HELD));
            }
        }
        let left = wait_stopped(&held, deadline);
        if left > 0 {
            return Err(HoldError::WouldNotStop(left, within));
        }
        if new == 0 {
            return Ok(held);
        }
    }
    Err(HoldError::KeptForking)
}

/// A process as one scan saw it: pid, parent, start time, and whether its
/// name is this program's (a terminal's helper runs it; anything else is
/// not one, and its command line need not be read).
type Seen = (i32, i32, u64, bool);

/// The name (`comm`) a process running this program has: the first 15
/// bytes of the file name it was started by, which for a terminal's helper
/// is this program's own path (`std::env::current_exe`).
fn own_comm() -> Option<&'static [u8]> {
    static OWN: std::sync::OnceLock<Option<Vec<u8>>> = std::sync::OnceLock::new();
    OWN.get_or_init(|| {
        use std::os::unix::ffi::OsStrExt;
        let exe = std::env::current_exe().ok()?;
        let name = exe.file_name()?.as_bytes();
        // Replaced since it started (an upgrade): the link reads
        // "NAME (deleted)", and the helpers started before have NAME.
        let name = name.strip_suffix(b" (deleted)").unwrap_or(name);
        Some(name[..name.len().min(15)].to_vec())
    })
    .as_deref()
}

/// The name between the parentheses of a `/proc/PID/stat` line.
fn comm_of(stat: &str) -> Option<&[u8]> {
    Some(&stat.as_bytes()[stat.find('(')? + 1..stat.rfind(')')?])
}

/// Its start time (field 22 of `/proc/PID/stat`), which tells it from a
/// process that took its pid since.
fn start_time(stat: &str) -> Option<u64> {
    stat[stat.rfind(')')? + 1..]
        .split_whitespace()
        .nth(19)?
        .parse()
        .ok()
}

/// `/proc/PID/stat`, in one read (it is generated whole on the first).
fn read_stat(pid: i32) -> std::io::Result<String> {
    use std::io::Read;
    let mut file = std::fs::File::open(format!("/proc/{pid}/stat"))?;
    let mut buf = [0u8; 4096];
    let n = file.read(&mut buf)?;
    Ok(String::from_utf8_lossy(&buf[..n]).into_owned())
}

/// Every process, with its parent, read strictly: a `/proc` that cannot be
/// listed fails the hold (an empty list would take it for no process).
fn all_processes() -> Result<Vec<Seen>, HoldError> {
    let dir = std::fs::read_dir("/proc")
        .map_err(|e| HoldError::Unreadable(format!("cannot list /proc ({e})")))?;
    let mut out = Vec::new();
    for entry in dir {
        let entry = entry.map_err(|e| HoldError::Unreadable(format!("cannot list /proc ({e})")))?;
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        match read_stat(pid) {
            Ok(stat) => {
                if let (Some(p), Some(t)) = (crate::procs::parse_stat(&stat), start_time(&stat)) {
                    // Unknown (no own name): every command line is read.
                    let named = own_comm().is_none_or(|own| comm_of(&stat) == Some(own));
                    out.push((pid, p.ppid, t, named));
                }
            }
            // Gone between the listing and the read.
            Err(e)
                if e.raw_os_error() == Some(libc::ENOENT)
                    || e.raw_os_error() == Some(libc::ESRCH) => {}
            Err(e) => {
                return Err(HoldError::Unreadable(format!(
                    "cannot read process {pid} ({e})"
                )))
            }
        }
    }
    Ok(out)
}

/// The holder's descendants, and every terminal helper of the generation
/// with its descendants (a helper still starting, in the bridge's own
/// namespace, included).
fn lineage(procs: &[Seen], holder: i32, generation_dir: Option<&Path>) -> HashSet<i32> {
    let mut children: HashMap<i32, Vec<i32>> = HashMap::new();
    for &(pid, ppid, _, _) in procs {
        children.entry(ppid).or_default().push(pid);
    }
    let mut out = HashSet::new();
    let mut stack = vec![holder];
    if let Some(dir) = generation_dir {
        for &(pid, _, _, named) in procs {
            if named && is_terminal_helper(pid, dir) {
                out.insert(pid);
                stack.push(pid);
            }
        }
    }
    while let Some(p) = stack.pop() {
        for &c in children.get(&p).map(Vec::as_slice).unwrap_or_default() {
            if out.insert(c) {
                stack.push(c);
            }
        }
    }
    out
}

/// Which user namespaces are the world's.
struct Scope {
    roots: HashSet<u64>,
    /// The bridge's own user namespace: never the world's.
    own: u64,
    /// Whether namespaces tell the world (the generation has its own).
    by_namespace: bool,
}

impl Scope {
    /// Whether `pid` belongs to the world by its user namespace (a
    /// terminal's helper found on the way adds its namespace). Nothing is
    /// remembered as outside the world: a terminal's helper seen later in
    /// a scan may make a namespace the world's.
    fn holds(&mut self, pid: i32, generation_dir: Option<&Path>) -> Result<bool, HoldError> {
        if !self.by_namespace {
            return Ok(false);
        }
        let link = format!("/proc/{pid}/ns/user");
        let ino = match inode_of(&link) {
            Ok(ino) => ino,
            // Gone; or another user's, which none of the agent's is.
            Err(Errno::ENOENT | Errno::ESRCH | Errno::EACCES | Errno::EPERM) => return Ok(false),
            Err(e) => {
                return Err(HoldError::Unreadable(format!(
                    "cannot read the user namespace of process {pid} ({e})"
                )))
            }
        };
        if ino == self.own {
            return Ok(false);
        }
        if self.roots.contains(&ino) {
            return Ok(true);
        }
        if self.below_a_root(&link)? {
            return Ok(true);
        }
        if generation_dir.is_some_and(|dir| is_terminal_helper(pid, dir)) {
            self.roots.insert(ino);
            return Ok(true);
        }
        Ok(false)
    }

    /// Whether the user namespace at `link` is nested below a root.
    fn below_a_root(&self, link: &str) -> Result<bool, HoldError> {
        let file = match std::fs::File::open(link) {
            Ok(f) => f,
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ESRCH)) => {
                return Ok(false)
            }
            Err(e) => return Err(HoldError::Unreadable(format!("cannot open {link} ({e})"))),
        };
        let mut fd: OwnedFd = file.into();
        for _ in 0..MAX_NESTING {
            // SAFETY: NS_GET_PARENT takes no argument and returns a new
            // descriptor (or -1); `fd` is an open namespace descriptor.
            let parent = unsafe { libc::ioctl(fd.as_raw_fd(), NS_GET_PARENT) };
            if parent < 0 {
                return Ok(false); // the top, or a namespace outside our scope
            }
            // SAFETY: the ioctl returned a new descriptor that nothing else owns.
            fd = unsafe { OwnedFd::from_raw_fd(parent) };
            let ino = fstat_ino(&fd).map_err(|e| {
                HoldError::Unreadable(format!("cannot read a user namespace ({e})"))
            })?;
            if self.roots.contains(&ino) {
                return Ok(true);
            }
            if ino == self.own {
                return Ok(false);
            }
        }
        Ok(false)
    }
}

/// Whether `pid` is zcode-acp's sandbox helper for a spec in `dir` (an
/// editor terminal of this generation): its command line says so, and it
/// is this user's process running this very program (anyone may write a
/// command line).
fn is_terminal_helper(pid: i32, dir: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
    if !args.iter().any(|a| *a == b"__sandbox") {
        return false;
    }
    let names_spec = args.windows(2).any(|w| {
        w[0] == b"--spec" && Path::new(std::ffi::OsStr::from_bytes(w[1])).starts_with(dir)
    });
    names_spec && is_ours(pid)
}

/// Whether `pid` runs as this user and runs this program.
fn is_ours(pid: i32) -> bool {
    use std::os::unix::fs::MetadataExt;
    static OWN_EXE: std::sync::OnceLock<Option<(u64, u64)>> = std::sync::OnceLock::new();
    let own = OWN_EXE.get_or_init(|| {
        std::fs::metadata("/proc/self/exe")
            .ok()
            .map(|m| (m.dev(), m.ino()))
    });
    let exe = std::fs::metadata(format!("/proc/{pid}/exe"))
        .ok()
        .map(|m| (m.dev(), m.ino()));
    let uid = std::fs::metadata(format!("/proc/{pid}"))
        .ok()
        .map(|m| m.uid());
    own.is_some() && exe == *own && uid == Some(nix::unistd::geteuid().as_raw())
}

/// Waits until every held process is stopped or gone; how many are not
/// by the deadline.
fn wait_stopped(held: &Held, deadline: Instant) -> usize {
    let mut pause = Duration::from_micros(50);
    loop {
        let running = held
            .stopped
            .iter()
            .filter(|(pid, _)| !is_stopped_or_gone(*pid))
            .count();
        if running == 0 || Instant::now() >= deadline {
            return running;
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(5));
    }
}

/// Whether every thread of `pid` is stopped or gone. A thread that cannot
/// be read for another reason is taken as running. A thread waiting for
/// its vfork child (`wait_for_vfork_done`) runs only when that child, a
/// process of the world's and so held too, execs or exits.
fn is_stopped_or_gone(pid: i32) -> bool {
    let gone = |e: &std::io::Error| matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ESRCH));
    let tasks = match std::fs::read_dir(format!("/proc/{pid}/task")) {
        Ok(t) => t,
        Err(e) => return gone(&e),
    };
    for task in tasks {
        let Ok(task) = task else { return false };
        let dir = task.path();
        let stat = match std::fs::read_to_string(dir.join("stat")) {
            Ok(s) => s,
            Err(e) if gone(&e) => continue,
            Err(_) => return false,
        };
        match crate::procs::parse_stat(&stat).map(|p| p.state) {
            Some('T' | 't' | 'Z' | 'X') => {}
            Some('D')
                if std::fs::read_to_string(dir.join("wchan"))
                    .is_ok_and(|w| w.trim() == "wait_for_vfork_done") => {}
            _ => return false,
        }
    }
    true
}

fn inode_of(path: &str) -> Result<u64, Errno> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path)
        .map(|m| m.ino())
        .map_err(|e| Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)))
}

fn fstat_ino(fd: &OwnedFd) -> Result<u64, Errno> {
    nix::sys::stat::fstat(fd).map(|s| s.st_ino)
}

fn pidfd_open(pid: i32) -> Result<OwnedFd, Errno> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(Errno::last());
    }
    // SAFETY: the syscall returned a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

fn send(pidfd: &OwnedFd, signal: libc::c_int) -> Result<(), Errno> {
    // SAFETY: pidfd_send_signal with a valid pidfd, no siginfo, no flags.
    let r = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            signal,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    if r < 0 {
        return Err(Errno::last());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_terminal_helper_is_known_by_its_spec_in_the_generations_directory() {
        let dir = std::path::Path::new("/h/.zcode-acp/sandbox/g7");
        let me = std::process::id() as i32;
        // This process is no helper.
        assert!(!is_terminal_helper(me, dir));
    }

    /// Children a test started, ended with what they started (by pid)
    /// even when the test panics: a failed test leaves no spinner behind.
    struct Reap(Vec<std::process::Child>);

    impl Drop for Reap {
        fn drop(&mut self) {
            let procs = crate::procs::snapshot();
            for c in &mut self.0 {
                for p in crate::procs::descendants_in(&procs, c.id() as i32) {
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(p.pid),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                }
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }

    /// Waits (up to 20 s, for a loaded machine) until `ready` holds.
    fn wait_until(what: &str, ready: impl Fn() -> bool) {
        let end = std::time::Instant::now() + Duration::from_secs(20);
        while !ready() {
            assert!(std::time::Instant::now() < end, "{what}: not after 20 s");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// A holder sharing our user namespace (the Landlock-only level): its
    /// descendants are held, and a process of another program's sandbox,
    /// in a user namespace nested below ours, is left running.
    #[test]
    fn in_our_own_namespace_only_the_holders_descendants_are_held() {
        let holder = std::process::Command::new("sh")
            .args(["-c", "sh -c 'while :; do :; done' & wait"])
            .stdin(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let holder_pid = holder.id() as i32;
        let mut reap = Reap(vec![holder]);
        // The holder is spared and forks once: it must have forked (and be
        // waiting) before the hold, or its spinner would start after it.
        wait_until("the holder's spinner", || {
            let procs = crate::procs::snapshot();
            let waiting = procs.iter().any(|p| p.pid == holder_pid && p.state == 'S');
            waiting && !crate::procs::descendants_in(&procs, holder_pid).is_empty()
        });
        match std::process::Command::new("unshare")
            .args([
                "--user",
                "--map-current-user",
                "sh",
                "-c",
                "while :; do :; done",
            ])
            .spawn()
        {
            Ok(c) => reap.0.push(c),
            Err(e) => {
                println!("skipped in part: unshare cannot run here ({e})");
                return;
            }
        }
        let by = reap.0[1].id() as i32;
        // unshare has made its namespace and exec'd the shell (or failed).
        wait_until("the bystander's namespace", || {
            std::fs::read_link(format!("/proc/{by}/exe")).is_ok_and(|exe| !exe.ends_with("unshare"))
        });
        let nested = inode_of(&format!("/proc/{by}/ns/user")) != inode_of("/proc/self/ns/user");
        let world = World {
            holder: holder_pid,
            generation_dir: None,
        };
        let held = hold(&world, Duration::from_secs(5)).expect("held");
        let procs = crate::procs::snapshot();
        let tree = crate::procs::descendants_in(&procs, holder_pid);
        assert!(!tree.is_empty());
        for p in &tree {
            assert!(matches!(p.state, 'T' | 't'), "{p:?} runs while held");
        }
        let state = procs.iter().find(|p| p.pid == by).map(|p| p.state);
        if nested {
            assert!(
                !matches!(state, Some('T' | 't')),
                "another sandbox's process was stopped ({state:?})"
            );
        } else {
            println!("skipped in part: no nested user namespace here");
        }
        held.release();
    }

    /// A process tree of our own (a child that forks a grandchild that
    /// forks more) is held whole, and released whole.
    #[test]
    fn a_forking_tree_is_held_until_released() {
        // The "holder" is a process in our own user namespace: the world is
        // then everything in that namespace, which includes this test. So
        // the tree runs in a user namespace of its own (where allowed).
        let child = match std::process::Command::new("unshare")
            .args(["--user", "--map-current-user", "sh", "-c"])
            .arg("(while :; do sleep 0.01 & done) & while :; do :; done")
            .spawn()
        {
            Ok(c) => c,
            Err(_) => return,
        };
        let holder = child.id() as i32;
        let _reap = Reap(vec![child]);
        // unshare has made its namespace and exec'd the shell (or failed).
        wait_until("the tree's namespace", || {
            std::fs::read_link(format!("/proc/{holder}/exe"))
                .map_or(true, |exe| !exe.ends_with("unshare"))
        });
        if inode_of(&format!("/proc/{holder}/ns/user")) == inode_of("/proc/self/ns/user") {
            println!("skipped: unshare could not make a user namespace here");
            return;
        }
        // The holder itself is spared; its descendants are held.
        let world = World {
            holder,
            generation_dir: None,
        };
        let held = hold(&world, Duration::from_secs(5)).expect("held");
        assert!(!held.is_empty());
        let tree = crate::procs::descendants_in(&crate::procs::snapshot(), holder);
        for p in &tree {
            assert!(
                matches!(p.state, 'T' | 't' | 'Z' | 'X'),
                "{p:?} runs while held"
            );
        }
        held.release();
        std::thread::sleep(Duration::from_millis(100));
        let running = crate::procs::descendants_in(&crate::procs::snapshot(), holder)
            .iter()
            .filter(|p| !matches!(p.state, 'T' | 't'))
            .count();
        assert!(running > 0, "nothing runs after the release");
    }
}
