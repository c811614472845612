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
//! The world is every process whose user namespace is the generation's or
//! lies below it (a process may create a nested one; it cannot leave it),
//! and likewise for each editor terminal that armed a sandbox of its own
//! (found by its helper's command line, which names the generation's
//! directory). Each is stopped with SIGSTOP through a pidfd, so the later
//! SIGCONT reaches exactly the process stopped, never one that took its
//! pid. The scan is repeated until it finds nothing running: a process
//! that forks while it is being stopped shows its child in the next scan,
//! and a stopped process forks nothing. Only when every one is seen
//! stopped (or gone) is the hold taken; a process that will not stop in
//! time (one in an uninterruptible sleep) fails the hold, and the write is
//! refused rather than made with the world moving.

use std::collections::{HashMap, HashSet};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use nix::errno::Errno;

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
}

/// The held processes: each is continued when this is released or dropped.
#[derive(Debug, Default)]
pub struct Held {
    stopped: Vec<(i32, OwnedFd)>,
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

/// Stops every process of `world`, waiting up to `within` for each to be
/// seen stopped.
pub fn hold(world: &World, within: Duration) -> Result<Held, HoldError> {
    let deadline = Instant::now() + within;
    let root = inode_of(&format!("/proc/{}/ns/user", world.holder))
        .map_err(|_| HoldError::Gone(world.holder))?;
    let own = inode_of("/proc/self/ns/user").unwrap_or(0);
    let me = std::process::id() as i32;
    let mut scope = Scope {
        roots: HashSet::from([root]),
        known: HashMap::new(),
        own,
    };
    let mut held = Held::default();
    let mut stopped_pids: HashSet<i32> = HashSet::new();
    for _ in 0..MAX_ROUNDS {
        let mut new = 0;
        for pid in pids() {
            if pid == me || pid == world.holder || stopped_pids.contains(&pid) {
                continue;
            }
            if !scope.holds(pid, world.generation_dir.as_deref()) {
                continue;
            }
            // A process gone meanwhile needs no stopping.
            let Ok(pidfd) = pidfd_open(pid) else { continue };
            if send(&pidfd, libc::SIGSTOP).is_ok() {
                stopped_pids.insert(pid);
                held.stopped.push((pid, pidfd));
                new += 1;
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

/// Which user namespaces are the world's.
struct Scope {
    roots: HashSet<u64>,
    /// Inodes already placed: in the world, or not.
    known: HashMap<u64, bool>,
    /// The bridge's own user namespace: never the world's.
    own: u64,
}

impl Scope {
    /// Whether `pid` belongs to the world (a terminal's helper found on
    /// the way adds its namespace).
    fn holds(&mut self, pid: i32, generation_dir: Option<&std::path::Path>) -> bool {
        let link = format!("/proc/{pid}/ns/user");
        let Ok(ino) = inode_of(&link) else {
            return false;
        };
        if ino == self.own {
            return false;
        }
        if self.roots.contains(&ino) {
            return true;
        }
        if let Some(&known) = self.known.get(&ino) {
            return known;
        }
        let below = self.below_a_root(&link);
        if below {
            self.known.insert(ino, true);
            return true;
        }
        if generation_dir.is_some_and(|dir| is_terminal_helper(pid, dir)) {
            self.roots.insert(ino);
            return true;
        }
        self.known.insert(ino, false);
        false
    }

    /// Whether the user namespace at `link` is nested below a root.
    fn below_a_root(&self, link: &str) -> bool {
        let Ok(file) = std::fs::File::open(link) else {
            return false;
        };
        let mut fd: OwnedFd = file.into();
        for _ in 0..MAX_NESTING {
            // SAFETY: NS_GET_PARENT takes no argument and returns a new
            // descriptor (or -1); `fd` is an open namespace descriptor.
            let parent = unsafe { libc::ioctl(fd.as_raw_fd(), NS_GET_PARENT) };
            if parent < 0 {
                return false; // the top, or a namespace outside our scope
            }
            // SAFETY: the ioctl returned a new descriptor that nothing else owns.
            fd = unsafe { OwnedFd::from_raw_fd(parent) };
            let Ok(ino) = fstat_ino(&fd) else {
                return false;
            };
            if self.roots.contains(&ino) {
                return true;
            }
            if ino == self.own {
                return false;
            }
        }
        false
    }
}

/// Whether `pid` is zcode-acp's sandbox helper for a spec in `dir` (an
/// editor terminal of this generation that armed a sandbox of its own).
fn is_terminal_helper(pid: i32, dir: &std::path::Path) -> bool {
    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
    if !args.iter().any(|a| *a == b"__sandbox") {
        return false;
    }
    let dir = dir.as_os_str().as_encoded_bytes();
    args.windows(2)
        .any(|w| w[0] == b"--spec" && w[1].starts_with(dir))
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

fn is_stopped_or_gone(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            crate::procs::parse_stat(&stat).is_none_or(|p| matches!(p.state, 'T' | 't' | 'Z' | 'X'))
        }
        Err(_) => true,
    }
}

fn pids() -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect()
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

    /// A process tree of our own (a child that forks a grandchild that
    /// forks more) is held whole, and released whole.
    #[test]
    fn a_forking_tree_is_held_until_released() {
        // The "holder" is a process in our own user namespace: the world is
        // then everything in that namespace, which includes this test. So
        // the tree runs in a user namespace of its own (where allowed).
        let mut child = match std::process::Command::new("unshare")
            .args(["--user", "--map-current-user", "sh", "-c"])
            .arg("(while :; do sleep 0.01 & done) & while :; do :; done")
            .spawn()
        {
            Ok(c) => c,
            Err(_) => return,
        };
        std::thread::sleep(Duration::from_millis(300));
        let holder = child.id() as i32;
        if inode_of(&format!("/proc/{holder}/ns/user")) == inode_of("/proc/self/ns/user") {
            // unshare could not make a namespace here: nothing to test.
            let _ = child.kill();
            let _ = child.wait();
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
        // Every process of the tree this test started, by pid.
        for p in crate::procs::descendants_in(&crate::procs::snapshot(), holder) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(p.pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}
