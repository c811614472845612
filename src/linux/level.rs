//! How much of the sandbox this machine lets a launch arm: the levels,
//! and the probe of what namespaces can be created.

use nix::sched::{unshare, CloneFlags};
use nix::sys::wait::{waitpid, WaitStatus};
use nix::unistd::{fork, ForkResult};
use serde::{Deserialize, Serialize};

/// How much of the sandbox this machine lets us arm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Level {
    /// Namespaces and Landlock: everything in the plan.
    Full,
    /// No Landlock: read-only mounts only, so device nodes stay writable.
    MountsOnly,
    /// No namespaces (a non-root user without user namespaces, or root
    /// without CAP_SYS_ADMIN): Landlock only, so protected paths and islands
    /// inside the workspace are not enforced by the kernel (the approval
    /// ledger is what protects sandbox.json), and there is no PID namespace.
    LandlockOnly,
}

impl Level {
    /// What confines a command armed at this level, as `run_code` names it.
    pub fn confined_by(self) -> &'static str {
        match self {
            Level::Full => "linux namespaces+landlock",
            Level::MountsOnly => "linux namespaces (no landlock)",
            Level::LandlockOnly => "linux landlock",
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Level::Full => "full (namespaces+Landlock)",
            Level::MountsOnly => "mounts-only (no Landlock: device nodes stay writable; install a kernel with Landlock, 5.13 or later, for the full sandbox)",
            Level::LandlockOnly => {
                "landlock-only (no namespaces: the Unix sockets of your session (D-Bus, ssh-agent, docker, tmux, X11) are NOT closed, so the agent can ask a service to run what it likes; /tmp and your caches are shared with it; protected paths and islands inside the workspace are not enforced by the kernel; Landlock does not cover a file's mode, group, times or extended attributes, so the agent can change those of your files anywhere (chmod, chgrp, touch, setfattr; not their contents, nor, with Landlock ABI 3 (Linux 6.2), their length); there is no PID namespace. Allow unprivileged user namespaces (on Ubuntu: sysctl kernel.apparmor_restrict_unprivileged_userns=0; in a container: a seccomp profile that permits them) for the full sandbox)"
            }
        }
    }
}

/// This machine gives neither namespaces nor Landlock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "neither namespaces nor Landlock are available here, so the sandbox cannot be armed; \
     run the agent unconfined on purpose with --no-sandbox (or without zcode-acp)"
)]
pub struct NothingToArm;

/// The level for what the machine allows, or why nothing can be armed.
pub fn choose_level(namespaces: bool, landlock: bool) -> Result<Level, NothingToArm> {
    match (namespaces, landlock) {
        (true, true) => Ok(Level::Full),
        (true, false) => Ok(Level::MountsOnly),
        (false, true) => Ok(Level::LandlockOnly),
        (false, false) => Err(NothingToArm),
    }
}

/// Which namespaces this process could create: those the plan needs,
/// and with them a network namespace of the sandbox's own (probed in one
/// short-lived child, so nothing here changes; a machine that refuses only
/// the network keeps the rest of the sandbox, and says the network is not
/// confined).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Available {
    pub namespaces: bool,
    pub network: bool,
}

pub fn namespaces_available() -> Available {
    // SAFETY: the child only calls unshare and _exit.
    match unsafe { fork() } {
        Ok(ForkResult::Child) => {
            let code = if unshare(NAMESPACES | CloneFlags::CLONE_NEWNET).is_ok() {
                0
            } else if unshare(NAMESPACES).is_ok() {
                2
            } else {
                1
            };
            // SAFETY: leaves the child at once, without running destructors.
            unsafe { libc::_exit(code) }
        }
        Ok(ForkResult::Parent { child }) => match waitpid(child, None) {
            Ok(WaitStatus::Exited(_, 0)) => Available {
                namespaces: true,
                network: true,
            },
            Ok(WaitStatus::Exited(_, 2)) => Available {
                namespaces: true,
                network: false,
            },
            _ => Available {
                namespaces: false,
                network: false,
            },
        },
        Err(_) => Available {
            namespaces: false,
            network: false,
        },
    }
}

/// The namespaces every sandbox gets: mounts, PIDs, System V IPC and POSIX
/// message queues (an outside process's shared memory would otherwise be
/// writable, and its queues removable), and a user namespace, root
/// included (its keyrings are then its own, and no capability it keeps
/// reaches the host's namespaces).
pub(super) const NAMESPACES: CloneFlags = CloneFlags::CLONE_NEWNS
    .union(CloneFlags::CLONE_NEWPID)
    .union(CloneFlags::CLONE_NEWIPC)
    .union(CloneFlags::CLONE_NEWUSER);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_follow_what_the_machine_allows() {
        assert_eq!(choose_level(true, true), Ok(Level::Full));
        assert_eq!(choose_level(true, false), Ok(Level::MountsOnly));
        assert_eq!(choose_level(false, true), Ok(Level::LandlockOnly));
        let refusal = choose_level(false, false).unwrap_err().to_string();
        assert!(refusal.contains("--no-sandbox"), "{refusal}");
    }
}
