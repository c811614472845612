//! A run's process tree: finding it, measuring its resident memory, ending
//! it. The tree is everything below the process `run_code` started: the
//! sandbox helper holds the run's PID namespace (whose end ends everyone
//! in it) or, without one, is a child subreaper, so a `setsid`'d daemon
//! or an orphaned grandchild stays below it.

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::procs;

/// `root` and all its descendants now.
pub fn members(root: i32) -> Vec<i32> {
    let mut pids = vec![root];
    pids.extend(
        procs::descendants_in(&procs::snapshot(), root)
            .into_iter()
            .map(|p| p.pid),
    );
    pids
}

/// The memory `root`'s tree holds, in bytes: each process's
/// proportional share of its resident memory (pages shared after a fork
/// count once), and on Linux also what it keeps in memory outside any
/// process's pages: memfds it holds open, and files in the private temp
/// directories of its own mount namespace (tmpfs lives in memory).
pub fn memory_bytes(root: i32) -> u64 {
    let members = members(root);
    let (mut private, mut shared) = (0u64, 0u64);
    for pid in &members {
        let (p, s) = resident_of(*pid);
        private += p;
        shared += s;
    }
    // Shared memory the tree maps is also a file in its tmpfs or a memfd it
    // holds: counted once, by whichever sees more of it.
    private + shared.max(held_outside_pages(&members))
}

#[cfg(not(target_os = "linux"))]
fn held_outside_pages(_members: &[i32]) -> u64 {
    0
}

#[cfg(target_os = "linux")]
fn held_outside_pages(members: &[i32]) -> u64 {
    use std::collections::BTreeSet;
    use std::os::unix::fs::MetadataExt;
    let ours = std::fs::metadata("/proc/self/ns/mnt").map(|m| m.ino()).ok();
    let mut namespaces = BTreeSet::new();
    let mut files = BTreeSet::new();
    let mut total = 0u64;
    for pid in members {
        // Private temp directories: once per mount namespace of the run's
        // own (inside an inherited sandbox, /tmp is the agent's too, and is
        // not the run's to count).
        if let Ok(ns) = std::fs::metadata(format!("/proc/{pid}/ns/mnt")).map(|m| m.ino()) {
            if Some(ns) != ours && namespaces.insert(ns) {
                for dir in ["tmp", "var/tmp", "dev/shm"] {
                    total += tmpfs_used(&format!("/proc/{pid}/root/{dir}"));
                }
            }
        }
        // memfds: their pages belong to no mapping until mapped.
        let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            let is_memfd = std::fs::read_link(fd.path())
                .is_ok_and(|target| target.to_string_lossy().starts_with("/memfd:"));
            if !is_memfd {
                continue;
            }
            if let Ok(meta) = std::fs::metadata(fd.path()) {
                if files.insert((meta.dev(), meta.ino())) {
                    total += meta.blocks() * 512;
                }
            }
        }
    }
    total
}

/// The bytes in use on the tmpfs at `dir` (nothing for any other kind of
/// file system).
#[cfg(target_os = "linux")]
// statfs's field types differ between architectures.
#[allow(clippy::unnecessary_cast)]
fn tmpfs_used(dir: &str) -> u64 {
    match nix::sys::statfs::statfs(dir) {
        Ok(fs) if fs.filesystem_type() == nix::sys::statfs::TMPFS_MAGIC => {
            (fs.blocks() as u64).saturating_sub(fs.blocks_free() as u64) * fs.block_size() as u64
        }
        _ => 0,
    }
}

/// A process's proportional set size (its share of each page it maps),
/// apart from and then of shared memory (tmpfs, memfd, SysV); else its
/// resident set.
#[cfg(target_os = "linux")]
fn resident_of(pid: i32) -> (u64, u64) {
    if let Ok(rollup) = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")) {
        let field = |name: &str| {
            rollup
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|kb| kb.parse::<u64>().ok())
                .map(|kb| kb * 1024)
        };
        if let Some(pss) = field("Pss:") {
            let shmem = field("Pss_Shmem:").unwrap_or(0).min(pss);
            return (pss - shmem, shmem);
        }
    }
    (statm_resident(pid), 0)
}

#[cfg(target_os = "linux")]
fn statm_resident(pid: i32) -> u64 {
    // statm: size resident shared ... (in pages).
    let Ok(statm) = std::fs::read_to_string(format!("/proc/{pid}/statm")) else {
        return 0;
    };
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    pages * page_size()
}

#[cfg(target_os = "linux")]
fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if size > 0 {
        size as u64
    } else {
        4096
    }
}

#[cfg(target_os = "macos")]
fn resident_of(pid: i32) -> (u64, u64) {
    // SAFETY: proc_taskinfo is plain old data; all zeroes is valid.
    let mut info: libc::proc_taskinfo = unsafe { std::mem::zeroed() };
    let size = std::mem::size_of::<libc::proc_taskinfo>() as libc::c_int;
    // SAFETY: the buffer is a proc_taskinfo of `size` bytes, which is what
    // PROC_PIDTASKINFO writes.
    let n = unsafe {
        libc::proc_pidinfo(
            pid,
            libc::PROC_PIDTASKINFO,
            0,
            (&mut info as *mut libc::proc_taskinfo).cast(),
            size,
        )
    };
    if n == size {
        (info.pti_resident_size, 0)
    } else {
        (0, 0)
    }
}

#[cfg(not(any(target_os = "linux", target_os = "macos")))]
fn resident_of(_pid: i32) -> (u64, u64) {
    (0, 0)
}

/// SIGKILLs `root`'s tree. The root is stopped first: it is the sandbox
/// helper, which would otherwise see its network proxy or the run's init
/// die under it and say so (an error of its own, in the run's stderr,
/// about a sandbox that is only being ended); stopped, it says nothing
/// and does nothing more, but stays the parent and subreaper of the
/// tree. Then the descendants, again until none is left alive: while the
/// root lives, what loses its parent stays below it, so a process forked
/// between a look and a kill is found by the next look. Then the root,
/// which is left to its owner to reap.
pub fn end(root: i32) {
    let _ = kill(Pid::from_raw(root), Signal::SIGSTOP);
    for _ in 0..200 {
        let alive: Vec<i32> = procs::descendants_in(&procs::snapshot(), root)
            .into_iter()
            .filter(|p| !p.is_gone())
            .map(|p| p.pid)
            .collect();
        if alive.is_empty() {
            break;
        }
        for pid in alive {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    let _ = kill(Pid::from_raw(root), Signal::SIGKILL);
}
