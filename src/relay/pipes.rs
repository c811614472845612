//! Pipes wide enough for a large frame.
//!
//! A pipe holds 64 KiB unless asked for more, so a 1 MiB frame crosses it
//! in sixteen turns: the writer fills it and sleeps, the reader drains it
//! and sleeps, and neither side ever has a whole frame to move in one go.
//! The relay's two streams (the agent's stdout, and the bridge's stdout to
//! the editor) are widened to [`WIDE`] where they are pipes: a 1 MiB frame
//! then moves in one write and one read (issue 31's stream row: 0.53x of
//! `cat` before, 0.87x to 1.12x after). The memory is the kernel's, charged
//! to the user (256 pages of each user's allowance, `pipe-user-pages-soft`,
//! 16,384 pages by default), and only filled while the reader lags. The
//! editor's direction is left as it is: its frames are answered, not
//! streamed.
//!
//! Only ever widened: a pipe someone already made wider stays as it is.
//! A machine whose limit is lower (`/proc/sys/fs/pipe-max-size`), or a user
//! over their share of pipe memory, gets the widest allowed, or the pipe
//! as it was: only throughput depends on it.

use std::os::fd::AsFd;

/// How wide the relay's pipes are made: a 1 MiB frame fits whole.
pub const WIDE: usize = 1 << 20;

/// Widens the pipe `fd` to [`WIDE`], or to the most this machine allows
/// an unprivileged process; returns its size after, or None when `fd` is
/// not a pipe.
#[cfg(target_os = "linux")]
pub fn widen(fd: impl AsFd) -> Option<usize> {
    use nix::fcntl::{fcntl, FcntlArg};
    let now = usize::try_from(fcntl(fd.as_fd(), FcntlArg::F_GETPIPE_SZ).ok()?).ok()?;
    if now >= WIDE {
        return Some(now);
    }
    let allowed = std::fs::read_to_string("/proc/sys/fs/pipe-max-size")
        .ok()
        .and_then(|s| s.trim().parse::<usize>().ok())
        .unwrap_or(WIDE);
    let want = WIDE.min(allowed).max(now);
    match fcntl(fd.as_fd(), FcntlArg::F_SETPIPE_SZ(want as i32)) {
        Ok(size) => usize::try_from(size).ok(),
        Err(e) => {
            tracing::debug!("cannot widen a pipe to {want} bytes ({e}): it stays at {now}");
            Some(now)
        }
    }
}

/// Elsewhere pipes keep their size.
#[cfg(not(target_os = "linux"))]
pub fn widen(_fd: impl AsFd) -> Option<usize> {
    None
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    #[test]
    fn a_pipe_is_widened_and_never_narrowed() {
        let (r, w) = nix::unistd::pipe().unwrap();
        let allowed = std::fs::read_to_string("/proc/sys/fs/pipe-max-size")
            .unwrap()
            .trim()
            .parse::<usize>()
            .unwrap();
        let size = widen(&w).unwrap();
        assert!(size >= WIDE.min(allowed), "{size}");
        // The read end is the same pipe.
        let read_end = nix::fcntl::fcntl(&r, nix::fcntl::FcntlArg::F_GETPIPE_SZ).unwrap();
        assert_eq!(read_end as usize, size);

        // A pipe wider still (past pipe-max-size, which takes
        // CAP_SYS_RESOURCE) keeps its size.
        let (_r, wider) = nix::unistd::pipe().unwrap();
        match nix::fcntl::fcntl(&wider, nix::fcntl::FcntlArg::F_SETPIPE_SZ(2 * WIDE as i32)) {
            Ok(_) => assert_eq!(widen(&wider), Some(2 * WIDE)),
            Err(e) => eprintln!("skipped: a pipe wider than {WIDE} bytes ({e}: not allowed here)"),
        }
    }

    #[test]
    fn what_is_not_a_pipe_is_left_alone() {
        let file = tempfile::tempfile().unwrap();
        assert_eq!(widen(&file), None);
    }
}
