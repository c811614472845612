//! Finding and reaping the processes a backend generation left behind.
//!
//! A backend may start processes that leave its process group (`setsid`,
//! double forks). On Linux the bridge is a child subreaper, so such orphans
//! are re-parented to the bridge instead of init: they stay the bridge's
//! descendants, and walking the `/proc` parent links from the bridge finds
//! every one of them. On macOS the parent links come from libproc; there
//! is no subreaper, so a process that daemonizes (its parent exits) is
//! re-parented to launchd and only its process group still reaches it.

use nix::sys::wait::{waitpid, WaitPidFlag};
use nix::unistd::Pid;

/// One process as `/proc/PID/stat` describes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcInfo {
    pub pid: i32,
    pub ppid: i32,
    /// The state letter: `R`, `S`, `Z` (zombie), ...
    pub state: char,
}

impl ProcInfo {
    pub fn is_zombie(&self) -> bool {
        matches!(self.state, 'Z' | 'X')
    }

    /// Whether nothing of the process runs any more. A process whose main
    /// thread ended while its other threads run on shows `Z` as well (its
    /// leader's state), and is not gone: it must still be killed.
    pub fn is_gone(&self) -> bool {
        self.is_zombie() && !threads_run_on(self.pid)
    }
}

/// Whether a process whose main thread is a zombie still has threads.
#[cfg(target_os = "linux")]
fn threads_run_on(pid: i32) -> bool {
    std::fs::read_dir(format!("/proc/{pid}/task")).is_ok_and(|tasks| tasks.count() > 1)
}

#[cfg(not(target_os = "linux"))]
fn threads_run_on(_pid: i32) -> bool {
    false
}

/// Parses the fields we need from a `/proc/PID/stat` line. The command name
/// sits in parentheses and may itself contain spaces and parentheses, so
/// the fields are read after the last `)`.
pub fn parse_stat(line: &str) -> Option<ProcInfo> {
    let pid = line.split_whitespace().next()?.parse().ok()?;
    let rest = &line[line.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let ppid = fields.next()?.parse().ok()?;
    Some(ProcInfo { pid, ppid, state })
}

/// All processes visible in `/proc`. Empty where there is no `/proc`.
#[cfg(not(target_os = "macos"))]
pub fn snapshot() -> Vec<ProcInfo> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| {
        let e = e.ok()?;
        let name = e.file_name();
        let name = name.to_str()?;
        if !name.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        // A process can exit between readdir and read: skip it quietly.
        let stat = std::fs::read_to_string(format!("/proc/{name}/stat")).ok()?;
        parse_stat(&stat)
    })
    .collect()
}

/// All processes this user may inspect, from libproc.
#[cfg(target_os = "macos")]
pub fn snapshot() -> Vec<ProcInfo> {
    use std::mem::size_of;
    // SAFETY: with a null buffer proc_listallpids only reports how many
    // pids there are.
    let count = unsafe { libc::proc_listallpids(std::ptr::null_mut(), 0) };
    if count <= 0 {
        return Vec::new();
    }
    // Room for processes started since the count.
    let mut pids: Vec<libc::pid_t> = vec![0; count as usize + 64];
    let bytes = (pids.len() * size_of::<libc::pid_t>()) as libc::c_int;
    // SAFETY: the buffer is valid for `bytes` bytes of pids.
    let got = unsafe { libc::proc_listallpids(pids.as_mut_ptr().cast(), bytes) };
    if got <= 0 {
        return Vec::new();
    }
    pids.truncate(got as usize);
    pids.into_iter()
        .filter(|pid| *pid > 0)
        .filter_map(|pid| {
            // SAFETY: proc_bsdinfo is plain old data; all zeroes is valid.
            let mut info: libc::proc_bsdinfo = unsafe { std::mem::zeroed() };
            let size = size_of::<libc::proc_bsdinfo>() as libc::c_int;
            // SAFETY: the buffer is a proc_bsdinfo of `size` bytes, which is
            // what PROC_PIDTBSDINFO writes.
            let n = unsafe {
                libc::proc_pidinfo(
                    pid,
                    libc::PROC_PIDTBSDINFO,
                    0,
                    (&mut info as *mut libc::proc_bsdinfo).cast(),
                    size,
                )
            };
            // A process that exited meanwhile (or one we may not inspect)
            // answers short: skip it.
            (n == size).then_some(ProcInfo {
                pid,
                ppid: info.pbi_ppid as i32,
                state: match info.pbi_status {
                    libc::SZOMB => 'Z',
                    libc::SSTOP => 'T',
                    _ => 'S',
                },
            })
        })
        .collect()
}

/// Every descendant of `root` in `procs` (children, their children, ...).
pub fn descendants_in(procs: &[ProcInfo], root: i32) -> Vec<ProcInfo> {
    let mut found = Vec::new();
    let mut frontier = vec![root];
    while let Some(parent) = frontier.pop() {
        for p in procs.iter().filter(|p| p.ppid == parent && p.pid != root) {
            if !found.iter().any(|f: &ProcInfo| f.pid == p.pid) {
                found.push(*p);
                frontier.push(p.pid);
            }
        }
    }
    found
}

/// Descendants of this process, right now.
pub fn my_descendants() -> Vec<ProcInfo> {
    descendants(std::process::id() as i32)
}

/// Every descendant of `root`, right now. On Linux each process's own
/// list of children is read (`/proc/PID/task/TID/children`), so only the
/// tree is read, not every process of the machine: a scan of `/proc`
/// costs about 10 µs a process (1.3 ms for this machine's 129, more on a
/// desktop's), and the bridge looks at each `SIGCHLD` and each stop of a
/// generation. Like a scan, the lists are made as the kernel walks them:
/// a process that forks or exits meanwhile can be missed (a list longer
/// than one read is resumed by position, where a scan resumes by pid), so
/// callers that must see every process look again until two looks in a
/// row find none. Where the lists
/// do not exist (a kernel without `CONFIG_PROC_CHILDREN`), every process
/// is read.
pub fn descendants(root: i32) -> Vec<ProcInfo> {
    #[cfg(target_os = "linux")]
    if let Some(first) = children_of(root) {
        let mut found: Vec<ProcInfo> = Vec::new();
        let mut frontier = first;
        while let Some(p) = frontier.pop() {
            if p.pid == root || found.iter().any(|f| f.pid == p.pid) {
                continue;
            }
            found.push(p);
            frontier.extend(children_of(p.pid).unwrap_or_default());
        }
        return found;
    }
    descendants_in(&snapshot(), root)
}

/// The children of `pid` (zombies included), from the lists of its
/// threads; `None` where the kernel keeps no such list, or `pid` is gone.
#[cfg(target_os = "linux")]
fn children_of(pid: i32) -> Option<Vec<ProcInfo>> {
    // The main thread's list first: its absence means no lists at all.
    let main = read_list(format!("/proc/{pid}/task/{pid}/children")).ok()?;
    let mut pids: Vec<String> = main.split_ascii_whitespace().map(str::to_owned).collect();
    // A child belongs to the thread that made it (a thread's that ended
    // passes to another of the process's threads).
    if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for task in tasks.flatten() {
            if task.file_name().to_str() == Some(pid.to_string().as_str()) {
                continue;
            }
            if let Ok(list) = read_list(task.path().join("children")) {
                pids.extend(list.split_ascii_whitespace().map(str::to_owned));
            }
        }
    }
    Some(
        pids.iter()
            .filter_map(|child| {
                // A child can exit and be reaped between the list and here.
                let stat = std::fs::read_to_string(format!("/proc/{child}/stat")).ok()?;
                parse_stat(&stat).filter(|p| p.ppid == pid)
            })
            .collect(),
    )
}

/// A list of children in as few reads as it takes (one, for up to some
/// 600 pids): between two reads the kernel resumes the list by position,
/// so a child reaped meanwhile would hide the one after it.
#[cfg(target_os = "linux")]
fn read_list(path: impl AsRef<std::path::Path>) -> std::io::Result<String> {
    use std::io::Read;
    let mut file = std::fs::File::open(path)?;
    let mut list = Vec::new();
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        match file.read(&mut buf)? {
            0 => break,
            n => list.extend_from_slice(&buf[..n]),
        }
    }
    Ok(String::from_utf8_lossy(&list).into_owned())
}

/// The children of this process, zombies included.
fn my_children() -> Vec<ProcInfo> {
    let me = std::process::id() as i32;
    #[cfg(target_os = "linux")]
    if let Some(children) = children_of(me) {
        return children;
    }
    snapshot().into_iter().filter(|p| p.ppid == me).collect()
}

/// Reaps zombie children of this process, except `spare` (a child whose
/// exit status another owner, such as tokio's child handle, will collect).
/// Returns how many were reaped.
pub fn reap_zombie_children(spare: &[i32]) -> usize {
    // Children a thread of ours waits for itself (`crate::children`) are
    // theirs too.
    crate::children::with_owned(|owned| {
        let mut reaped = 0;
        for p in my_children() {
            let theirs = spare.contains(&p.pid) || owned.contains(&(p.pid as u32));
            if p.is_zombie() && !theirs {
                if let Ok(status) = waitpid(Pid::from_raw(p.pid), Some(WaitPidFlag::WNOHANG)) {
                    if status.pid().is_some() {
                        reaped += 1;
                    }
                }
            }
        }
        reaped
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_stat_with_awkward_names() {
        let p = parse_stat("123 (a) b (c)) S 45 123 123 0 -1").unwrap();
        assert_eq!(
            p,
            ProcInfo {
                pid: 123,
                ppid: 45,
                state: 'S'
            }
        );
        let z = parse_stat("9 (x) Z 1 9 9").unwrap();
        assert!(z.is_zombie());
    }

    #[test]
    fn descendants_follow_parent_links() {
        let procs = [
            ProcInfo {
                pid: 10,
                ppid: 1,
                state: 'S',
            },
            ProcInfo {
                pid: 11,
                ppid: 10,
                state: 'S',
            },
            ProcInfo {
                pid: 12,
                ppid: 11,
                state: 'S',
            },
            ProcInfo {
                pid: 13,
                ppid: 1,
                state: 'S',
            },
            ProcInfo {
                pid: 14,
                ppid: 10,
                state: 'Z',
            },
        ];
        let mut pids: Vec<i32> = descendants_in(&procs, 10).iter().map(|p| p.pid).collect();
        pids.sort();
        assert_eq!(pids, vec![11, 12, 14]);
    }

    #[test]
    fn sees_a_real_child() {
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        let found = my_descendants().iter().any(|p| p.pid == child.id() as i32);
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(found);
    }

    /// A process whose main thread ended while another runs reads as a
    /// zombie, and is not gone until it is killed.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_process_whose_main_thread_ended_is_not_gone() {
        let mut child = std::process::Command::new("python3")
            .args([
                "-c",
                "import ctypes, threading, time\n\
                 threading.Thread(target=time.sleep, args=(30,)).start()\n\
                 time.sleep(0.1)\n\
                 ctypes.CDLL(None).syscall(60, 0)",
            ])
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        let info = || {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|s| parse_stat(&s))
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !info().is_some_and(|p| p.is_zombie()) {
            assert!(
                std::time::Instant::now() < deadline,
                "the main thread never ended"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let p = info().unwrap();
        assert!(
            !p.is_gone(),
            "a process with a running thread was taken for gone"
        );
        child.kill().unwrap();
        child.wait().unwrap();
    }

    /// The tree read from each process's list of children is the tree the
    /// parent links of every process give: a grandchild too.
    #[test]
    fn descendants_are_the_tree_a_scan_finds() {
        use std::io::BufRead;
        let mut child = std::process::Command::new("sh")
            .args(["-c", "sleep 5 & echo $!; wait"])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let grandchild: i32 = line.trim().parse().unwrap();
        let sh = child.id() as i32;
        let mut read: Vec<i32> = descendants(sh).iter().map(|p| p.pid).collect();
        let mut scanned: Vec<i32> = descendants_in(&snapshot(), sh)
            .iter()
            .map(|p| p.pid)
            .collect();
        let mine = my_descendants();
        let _ = nix::sys::signal::kill(Pid::from_raw(grandchild), nix::sys::signal::SIGKILL);
        child.kill().unwrap();
        child.wait().unwrap();
        read.sort();
        scanned.sort();
        assert_eq!(read, vec![grandchild]);
        assert_eq!(read, scanned);
        assert!(mine.iter().any(|p| p.pid == sh) && mine.iter().any(|p| p.pid == grandchild));
    }
}
