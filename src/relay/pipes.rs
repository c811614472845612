//! Pipes widened for the large frames that cross them.
//!
//! A pipe holds 16 pages (64 KiB on most machines) unless asked for more,
//! so a 1 MiB frame crosses it in sixteen turns: the writer fills it and
//! sleeps, the reader drains it and sleeps. The two pipes the agent's
//! frames cross (the agent's stdout, and the bridge's stdout when the
//! editor hands it a pipe) are widened to [`WIDE`] the first time a frame
//! of [`LARGE`] or more crosses them: such a frame then moves in one write
//! and one read (issue 31's stream row of 1 MiB frames, 0.53x of `cat`
//! before).
//!
//! Only when a large frame comes, because the memory is counted against
//! the user's allowance for pipes (`pipe-user-pages-soft`, 16,384 pages by
//! default) as soon as the pipe is widened, not as it fills: a user over
//! that allowance gets 2-page pipes for whatever they start next. The
//! kernel refuses a widening that would take an unprivileged user past it,
//! and the pipe then stays as it was; only throughput depends on it.
//! Never narrowed: a pipe someone already made wider stays as it is.

use std::os::fd::AsFd;
#[cfg(target_os = "linux")]
use std::os::fd::OwnedFd;

/// How wide the pipes are made: a 1 MiB frame fits whole.
pub const WIDE: usize = 1 << 20;

/// A frame this large widens the pipe it crosses: larger than a pipe's
/// default size, so it would take more than one turn.
pub const LARGE: usize = 64 << 10;

/// The size to ask for, given the pipe's size now and the most this
/// machine allows an unprivileged process (`/proc/sys/fs/pipe-max-size`):
/// None when that would not widen it.
pub fn target(now: usize, allowed: usize) -> Option<usize> {
    let want = WIDE.min(allowed);
    (want > now).then_some(want)
}

/// A pipe to widen the first time a large frame crosses it.
#[derive(Default)]
pub struct Widen {
    #[cfg(target_os = "linux")]
    pipe: Option<OwnedFd>,
}

impl Widen {
    /// For `fd` when it is a pipe not yet [`WIDE`] (a duplicate is kept
    /// until then); otherwise nothing is ever done.
    #[cfg(target_os = "linux")]
    pub fn of(fd: impl AsFd) -> Widen {
        let pipe = pipe_size(fd.as_fd())
            .filter(|size| *size < WIDE)
            .and_then(|_| fd.as_fd().try_clone_to_owned().ok());
        Widen { pipe }
    }

    #[cfg(not(target_os = "linux"))]
    pub fn of(_fd: impl AsFd) -> Widen {
        Widen::default()
    }

    /// A frame of `len` bytes crosses the pipe: the first large one widens
    /// it, once.
    pub fn crossed(&mut self, len: usize) {
        #[cfg(target_os = "linux")]
        if len >= LARGE {
            if let Some(pipe) = self.pipe.take() {
                widen(&pipe);
            }
        }
        #[cfg(not(target_os = "linux"))]
        let _ = len;
    }
}

#[cfg(target_os = "linux")]
fn pipe_size(fd: std::os::fd::BorrowedFd) -> Option<usize> {
    use nix::fcntl::{fcntl, FcntlArg};
    usize::try_from(fcntl(fd, FcntlArg::F_GETPIPE_SZ).ok()?).ok()
}

/// Widens the pipe `fd` to [`WIDE`], or to the most this machine allows
/// an unprivileged process; its size after, or None when `fd` is not a
/// pipe.
#[cfg(target_os = "linux")]
pub fn widen(fd: impl AsFd) -> Option<usize> {
    use nix::fcntl::{fcntl, FcntlArg};
    let now = pipe_size(fd.as_fd())?;
    let allowed = std::fs::read_to_string("/proc/sys/fs/pipe-max-size")
        .ok()
        .and_then(|s| s.trim().parse::<usize>().ok())
        .unwrap_or(WIDE);
    let Some(want) = target(now, allowed) else {
        return Some(now);
    };
    match fcntl(fd.as_fd(), FcntlArg::F_SETPIPE_SZ(want as i32)) {
        Ok(size) => usize::try_from(size).ok(),
        Err(e) => {
            tracing::debug!("cannot widen a pipe to {want} bytes ({e}): it stays at {now}");
            Some(now)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pipe_is_only_ever_widened_and_never_past_the_machines_limit() {
        assert_eq!(target(64 << 10, 1 << 20), Some(WIDE));
        assert_eq!(target(64 << 10, 256 << 10), Some(256 << 10));
        assert_eq!(target(WIDE, 4 << 20), None);
        assert_eq!(target(2 * WIDE, 4 << 20), None);
        assert_eq!(target(64 << 10, 64 << 10), None);
    }

    /// Whether this user may widen a pipe as far as `widen` does (a user
    /// over their pipe allowance may not): the tests below say so and skip
    /// otherwise.
    #[cfg(target_os = "linux")]
    fn widening_allowed() -> bool {
        let (_r, w) = nix::unistd::pipe().unwrap();
        let allowed: usize = std::fs::read_to_string("/proc/sys/fs/pipe-max-size")
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        let want = WIDE.min(allowed) as i32;
        let allowed = nix::fcntl::fcntl(&w, nix::fcntl::FcntlArg::F_SETPIPE_SZ(want)).is_ok();
        if !allowed {
            eprintln!("skipped: this user may not widen a pipe here (over their pipe allowance?)");
        }
        allowed
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn the_first_large_frame_widens_the_pipe_and_small_ones_do_not() {
        if !widening_allowed() {
            return;
        }
        let size = |fd: &OwnedFd| pipe_size(fd.as_fd()).unwrap();
        let (r, w) = nix::unistd::pipe().unwrap();
        let before = size(&r);
        let mut widen = Widen::of(&w);
        widen.crossed(LARGE - 1);
        assert_eq!(size(&r), before, "a small frame widened the pipe");
        widen.crossed(LARGE);
        let allowed: usize = std::fs::read_to_string("/proc/sys/fs/pipe-max-size")
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert!(size(&r) >= WIDE.min(allowed), "{}", size(&r));
        // Its duplicate is gone: nothing more is held.
        assert!(widen.pipe.is_none());
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn what_is_not_a_pipe_is_left_alone() {
        let file = tempfile::tempfile().unwrap();
        assert_eq!(widen(&file), None);
        assert!(Widen::of(&file).pipe.is_none());
    }
}
