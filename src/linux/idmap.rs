//! The user namespace's id maps: a non-root user maps only its own ids;
//! root's full range is written by a helper forked before the unshare.

use nix::sys::signal::{kill, Signal};
use nix::sys::wait::waitpid;
use nix::unistd::{fork, ForkResult, Pid};

use super::error::{sys, LaunchError, Syscall};

/// The user namespace's maps: you stay who you are. A non-root user maps
/// only their own ids (never to 0).
pub(super) fn own_id_map(id: u32) -> String {
    format!("{id} {id} 1")
}

/// Root maps every id that exists where it runs onto itself, so files of
/// other owners keep their owners (git's ownership checks still work)
/// rather than showing as nobody. `current` is this namespace's own map
/// (`/proc/self/uid_map`): on the host one line for the whole range, in a
/// container (rootless podman, unprivileged LXC) the ranges it was given,
/// which is all a child namespace may map.
pub(super) fn identity_map(current: &str) -> Option<String> {
    let mut out = String::new();
    for line in current.lines().filter(|l| !l.trim().is_empty()) {
        let mut fields = line.split_whitespace().map(str::parse::<u64>);
        let (Some(Ok(inside)), Some(Ok(_outside)), Some(Ok(count))) =
            (fields.next(), fields.next(), fields.next())
        else {
            return None;
        };
        out.push_str(&format!("{inside} {inside} {count}\n"));
    }
    (!out.is_empty()).then_some(out)
}

/// A child forked before the helper enters its user namespace, which
/// writes the helper's full-range maps once told to (a process inside the
/// new namespace has no privilege over the parent to write them itself).
pub(super) struct Mapper {
    pid: Pid,
    go: std::os::fd::OwnedFd,
    done: std::os::fd::OwnedFd,
}

impl Mapper {
    pub(super) fn fork() -> Result<Mapper, LaunchError> {
        let maps = |file: &str| {
            std::fs::read_to_string(file)
                .ok()
                .and_then(|m| identity_map(&m))
                .ok_or_else(|| {
                    LaunchError::Refused(format!(
                        "cannot read {file}, which root's user namespace map is made from"
                    ))
                })
        };
        let (uid_map, gid_map) = (maps("/proc/self/uid_map")?, maps("/proc/self/gid_map")?);
        let (go_r, go_w) = sys(Syscall::Pipe, nix::unistd::pipe())?;
        let (done_r, done_w) = sys(Syscall::Pipe, nix::unistd::pipe())?;
        let parent = nix::unistd::getpid();
        // SAFETY: the helper is single-threaded (documented precondition of
        // `run`), so the child may allocate; it leaves with _exit.
        match sys(Syscall::ForkMapper, unsafe { fork() })? {
            ForkResult::Child => {
                drop((go_w, done_r));
                let mut byte = [0u8; 1];
                let ok = nix::unistd::read(&go_r, &mut byte) == Ok(1)
                    && std::fs::write(format!("/proc/{parent}/uid_map"), &uid_map).is_ok()
                    && std::fs::write(format!("/proc/{parent}/gid_map"), &gid_map).is_ok();
                let _ = nix::unistd::write(&done_w, if ok { b"1" } else { b"0" });
                // SAFETY: leaves the child at once, without running destructors.
                unsafe { libc::_exit(0) }
            }
            ForkResult::Parent { child } => Ok(Mapper {
                pid: child,
                go: go_w,
                done: done_r,
            }),
        }
    }

    /// Asks the mapper to write the maps of this (already unshared)
    /// process, and waits for it.
    pub(super) fn map_parent(self) -> Result<(), LaunchError> {
        let _ = nix::unistd::write(&self.go, b"1");
        let mut byte = [0u8; 1];
        let ok = nix::unistd::read(&self.done, &mut byte) == Ok(1) && byte[0] == b'1';
        if ok {
            Ok(())
        } else {
            Err(LaunchError::Refused(
                "cannot map root's user namespace (the id mapper failed)".into(),
            ))
        }
    }
}

impl Drop for Mapper {
    fn drop(&mut self) {
        // Unblocks a mapper never told to go (its pipe closes), then reaps it.
        let _ = kill(self.pid, Signal::SIGKILL);
        let _ = waitpid(self.pid, None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_maps_what_exists_where_it_runs() {
        // The host: the whole range.
        assert_eq!(
            identity_map("         0          0 4294967295\n").as_deref(),
            Some("0 0 4294967295\n")
        );
        // Rootless podman: root is the user, the rest a subordinate range.
        assert_eq!(
            identity_map("         0       1000          1\n         1     100000      65536\n")
                .as_deref(),
            Some("0 0 1\n1 1 65536\n")
        );
        assert_eq!(identity_map(""), None);
        assert_eq!(identity_map("0 x 1"), None);
        assert_eq!(own_id_map(1000), "1000 1000 1");
    }
}
