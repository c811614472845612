//! Why a launch failed: the system call and path, or a refusal in words.
//! Shared by the launcher's stages (`exec`, `net`).

use std::path::{Path, PathBuf};

use nix::errno::Errno;

/// The system call of the launch that failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Syscall {
    Pipe,
    ForkMapper,
    ReadNamespace,
    Unshare,
    MakePrivate,
    Bind,
    SetAttr,
    OpenTree,
    MoveMount,
    Tmpfs,
    Cover,
    SocketPair,
    Subreaper,
    ForkInit,
    BlockSignals,
    DropCapabilities,
    Signalfd,
    Poll,
    WaitForInit,
    Setns,
}

impl std::fmt::Display for Syscall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Syscall::Pipe => "pipe",
            Syscall::ForkMapper => "fork the id mapper",
            Syscall::ReadNamespace => "read /proc/self/ns/mnt",
            Syscall::Unshare => "unshare",
            Syscall::MakePrivate => "make / private",
            Syscall::Bind => "bind",
            Syscall::SetAttr => "mount_setattr",
            Syscall::OpenTree => "open_tree",
            Syscall::MoveMount => "move_mount",
            Syscall::Tmpfs => "tmpfs on",
            Syscall::Cover => "cover",
            Syscall::SocketPair => "socketpair for the supervisor",
            Syscall::Subreaper => "become the reaper of what the command leaves",
            Syscall::ForkInit => "fork the namespace's init",
            Syscall::BlockSignals => "block signals",
            Syscall::DropCapabilities => "drop the helper's capabilities",
            Syscall::Signalfd => "signalfd",
            Syscall::Poll => "poll",
            Syscall::WaitForInit => "wait for init",
            Syscall::Setns => "setns into the generation's namespaces",
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    #[error("{step}{}: {errno}", on(.path))]
    Sys {
        step: Syscall,
        path: Option<PathBuf>,
        errno: Errno,
    },
    #[error("{0}")]
    Refused(String),
}

fn on(path: &Option<PathBuf>) -> String {
    path.as_ref()
        .map(|p| format!(" {}", p.display()))
        .unwrap_or_default()
}

pub(super) fn sys<T>(step: Syscall, r: Result<T, Errno>) -> Result<T, LaunchError> {
    r.map_err(|errno| LaunchError::Sys {
        step,
        path: None,
        errno,
    })
}

/// As [`sys`], for a call on `path`.
pub(super) fn sys_at<T>(step: Syscall, path: &Path, r: Result<T, Errno>) -> Result<T, LaunchError> {
    r.map_err(|errno| LaunchError::Sys {
        step,
        path: Some(path.to_path_buf()),
        errno,
    })
}
