//! Joining a generation's namespaces instead of building new ones.
//!
//! A backend generation's helper builds the user, mount and IPC namespaces
//! (the mounts, the private /tmp, the caches' copy-on-write layers) once.
//! A command the editor later runs for that agent (`terminal/create`) does
//! not need a second copy of all that: it enters the same namespaces with
//! `setns` and then adds only what is its own (a mount namespace copied
//! from the generation's, for a /proc of its own; a PID namespace, so
//! nothing it starts outlives it; its Landlock layer and seccomp filter).
//! It then sees what the agent sees, including the agent's private /tmp
//! and its caches' copy-on-write slot, which it holds (see
//! [`super::layers::Joined`]) so that no later sandbox mounts that slot
//! while the terminal still works in it. Its processes are nowhere in the
//! agent's PID namespace, and nothing of the generation waits for them.
//!
//! Who holds the namespaces is named by the bridge (the generation's
//! helper, the bridge's own child), with its start time and the inode of
//! each namespace as the bridge saw them. The command's helper opens the
//! namespaces through `/proc/PID/ns/*`, checks the process is still that
//! one (same parent, same start time) and enters only descriptors whose
//! inode is the one named: a pid reused since enters nothing.

use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

use nix::sched::{setns, CloneFlags};
use serde::{Deserialize, Serialize};

/// A generation's namespaces, as the bridge saw them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Join {
    /// The process that holds them (the generation's helper).
    pub pid: i32,
    /// Its parent (the bridge) and its start time (clock ticks after
    /// boot): together they tell a reused pid from the holder.
    pub parent: i32,
    pub started: u64,
    pub user: u64,
    pub mnt: u64,
    pub ipc: u64,
    /// Its network namespace, when it has one of its own (see
    /// `super::net`): the terminal then uses the generation's loopback and
    /// proxy, and reaches the servers the agent started.
    #[serde(default)]
    pub net: Option<u64>,
    /// The lock file of the caches' slot the generation holds
    /// (`BASE/N.lock`), if it layers any.
    #[serde(default)]
    pub slot: Option<PathBuf>,
}

fn ns_inode(pid: &str, kind: &str) -> Option<u64> {
    std::fs::metadata(format!("/proc/{pid}/ns/{kind}"))
        .ok()
        .map(|m| m.ino())
}

impl Join {
    /// The namespaces `pid`, a child of this process, holds, once it has
    /// left this process's namespaces and started its init (which it
    /// forks once every mount is in place: the init is the child in a
    /// deeper PID namespace; root's id mapper, forked earlier, is not).
    /// A helper still arming, or a process that is not a sandbox, has
    /// nothing to join. The caller names the slot, if any.
    pub fn of_child(pid: i32) -> Option<Join> {
        let me = std::process::id() as i32;
        let (parent, started) = stat_of(pid)?;
        if parent != me {
            return None;
        }
        let p = pid.to_string();
        let join = Join {
            pid,
            parent: me,
            started,
            user: ns_inode(&p, "user")?,
            mnt: ns_inode(&p, "mnt")?,
            ipc: ns_inode(&p, "ipc")?,
            net: ns_inode(&p, "net").filter(|n| Some(*n) != ns_inode("self", "net")),
            slot: None,
        };
        let unshared = Some(join.user) != ns_inode("self", "user")
            && Some(join.mnt) != ns_inode("self", "mnt")
            && Some(join.ipc) != ns_inode("self", "ipc");
        let depth = pid_depth(pid)?;
        let init_started = children_of(pid)
            .iter()
            .any(|c| pid_depth(*c).is_some_and(|d| d > depth));
        (unshared && init_started).then_some(join)
    }

    /// The namespaces to enter, in order: the user namespace first, since
    /// entering the others needs its capabilities.
    fn kinds(&self) -> Vec<(&'static str, CloneFlags, u64)> {
        let mut kinds = vec![
            ("user", CloneFlags::CLONE_NEWUSER, self.user),
            ("mnt", CloneFlags::CLONE_NEWNS, self.mnt),
            ("ipc", CloneFlags::CLONE_NEWIPC, self.ipc),
        ];
        if let Some(net) = self.net {
            kinds.push(("net", CloneFlags::CLONE_NEWNET, net));
        }
        kinds
    }

    /// Opens the namespaces, checking each is the one named. Nothing is
    /// changed yet: a failure leaves the caller free to build its own.
    pub fn open(&self) -> Result<Opened, NotJoinable> {
        if stat_of(self.pid) != Some((self.parent, self.started)) {
            return Err(NotJoinable::HelperGone(self.pid));
        }
        let mut fds = Vec::new();
        for (kind, flag, named) in self.kinds() {
            let path = format!("/proc/{}/ns/{kind}", self.pid);
            let unreadable = |source| NotJoinable::Unreadable {
                path: path.clone(),
                source,
            };
            let file = std::fs::File::open(&path).map_err(unreadable)?;
            let ino = file.metadata().map_err(unreadable)?.ino();
            if ino != named {
                return Err(NotJoinable::OtherNamespace(path));
            }
            fds.push((kind, OwnedFd::from(file), flag));
        }
        // Still holding its caches' slot: between the end of a helper's
        // launch and its exit, another sandbox may have taken the slot
        // before the caller's hold on it (see `layers::Joined::hold`).
        if let Some(slot) = &self.slot {
            let base = slot.parent().unwrap_or(std::path::Path::new("/"));
            if super::layers::held_by(self.pid, base).as_ref() != Some(slot) {
                return Err(NotJoinable::SlotReleased(self.pid));
            }
        }
        Ok(Opened {
            fds,
            root: PathBuf::from(format!("/proc/{}/root", self.pid)),
        })
    }
}

/// Why a generation's namespaces cannot be joined (the caller then arms
/// a set of its own).
#[derive(Debug, thiserror::Error)]
pub enum NotJoinable {
    #[error("process {0} is no longer the generation's helper (the generation has ended)")]
    HelperGone(i32),
    #[error("{path}: {source}")]
    Unreadable {
        path: String,
        source: std::io::Error,
    },
    #[error("{0} is not the generation's namespace (the generation has ended)")]
    OtherNamespace(String),
    #[error("process {0} no longer holds its caches' slot (the generation has ended)")]
    SlotReleased(i32),
}

/// The generation's namespaces, open and checked.
pub struct Opened {
    fds: Vec<(&'static str, OwnedFd, CloneFlags)>,
    /// The generation's root, as seen from here.
    root: PathBuf,
}

/// Why entering stopped.
#[derive(Debug)]
pub struct NotEntered {
    pub kind: &'static str,
    pub errno: nix::errno::Errno,
    /// Whether a namespace was already entered (if not, nothing changed).
    pub changed: bool,
}

impl Opened {
    /// Whether every path exists in the generation's view (a command
    /// under the host's /tmp does not, since its /tmp is private).
    pub fn sees(&self, paths: &[PathBuf]) -> bool {
        paths.iter().all(|p| {
            let inside = p.strip_prefix("/").unwrap_or(p);
            self.root.join(inside).symlink_metadata().is_ok()
        })
    }

    /// Enters the namespaces, the user namespace first. Must run in a
    /// single-threaded process (the kernel refuses a user namespace to a
    /// process with threads). Afterwards the root and the working
    /// directory are the generation's root.
    pub fn enter(self) -> Result<(), NotEntered> {
        for (n, (kind, fd, flag)) in self.fds.iter().enumerate() {
            setns(fd.as_fd(), *flag).map_err(|errno| NotEntered {
                kind,
                errno,
                changed: n > 0,
            })?;
        }
        Ok(())
    }
}

/// The parent and the start time of `pid`, from `/proc/PID/stat` (the
/// fields after the command's name, which may itself hold spaces and
/// parentheses: the state is field 3, the parent 4, the start time 22).
fn stat_of(pid: i32) -> Option<(i32, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields: Vec<&str> = stat[stat.rfind(')')? + 1..].split_whitespace().collect();
    Some((fields.get(1)?.parse().ok()?, fields.get(19)?.parse().ok()?))
}

/// How deep `pid` is in nested PID namespaces (the number of pids it has,
/// `NSpid` in its status, which anyone may read).
fn pid_depth(pid: i32) -> Option<usize> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find_map(|l| l.strip_prefix("NSpid:"))?;
    Some(line.split_whitespace().count())
}

/// The children of `pid` (`/proc/PID/task/PID/children`; a kernel without
/// that file gives none, and so no join).
fn children_of(pid: i32) -> Vec<i32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .map(|c| {
            c.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A child of this test process, in this process's namespaces.
    fn sleeper() -> std::process::Child {
        std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap()
    }

    /// A [`Join`] naming the child as it is.
    fn as_it_is(child: &std::process::Child) -> Join {
        let pid = child.id() as i32;
        let p = pid.to_string();
        let (parent, started) = stat_of(pid).unwrap();
        Join {
            pid,
            parent,
            started,
            user: ns_inode(&p, "user").unwrap(),
            mnt: ns_inode(&p, "mnt").unwrap(),
            ipc: ns_inode(&p, "ipc").unwrap(),
            net: None,
            slot: None,
        }
    }

    #[test]
    fn a_process_that_shares_our_namespaces_has_nothing_to_join() {
        let mut child = sleeper();
        let pid = child.id() as i32;
        assert_eq!(stat_of(pid).unwrap().0, std::process::id() as i32);
        assert_eq!(Join::of_child(pid), None);
        child.kill().unwrap();
        child.wait().unwrap();
    }

    #[test]
    fn a_process_that_is_not_our_child_is_never_named() {
        // pid 1 is nobody's child of ours, whatever its namespaces.
        assert_eq!(Join::of_child(1), None);
    }

    #[test]
    fn only_the_named_process_and_namespaces_are_opened() {
        let mut child = sleeper();
        let named = as_it_is(&child);
        // As named: opened (entering is for the helper, not a test thread).
        assert!(named.open().is_ok());
        // Each check alone refuses: another parent, another start (a
        // reused pid), another namespace.
        let refused = [
            Join {
                parent: 1,
                ..named.clone()
            },
            Join {
                started: named.started + 1,
                ..named.clone()
            },
            Join {
                mnt: named.mnt + 1,
                ..named.clone()
            },
            Join {
                user: named.user + 1,
                ..named.clone()
            },
            Join {
                net: Some(named.ipc + 1),
                ..named.clone()
            },
            // A slot the process does not hold.
            Join {
                slot: Some(PathBuf::from("/nonexistent/0.lock")),
                ..named.clone()
            },
        ];
        for join in refused {
            let err = join.open().err().expect("a changed name is refused");
            assert!(err.to_string().contains("generation has ended"), "{err}");
        }
        child.kill().unwrap();
        child.wait().unwrap();
    }
}
