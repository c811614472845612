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
    descendants_in(&snapshot(), std::process::id() as i32)
}

/// Reaps zombie children of this process, except `spare` (a child whose
/// exit status another owner, such as tokio's child handle, will collect).
/// Returns how many were reaped.
pub fn reap_zombie_children(spare: &[i32]) -> usize {
    let me = std::process::id() as i32;
    // Children a thread of ours waits for itself (`crate::children`) are
    // theirs too.
    crate::children::with_owned(|owned| {
        let mut reaped = 0;
        for p in snapshot() {
            let theirs = spare.contains(&p.pid) || owned.contains(&(p.pid as u32));
            if p.ppid == me && p.is_zombie() && !theirs {
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
}
