//! Running git on repositories the agent may have made, without ever
//! waiting on it for long: a `config` (or a file it includes) can be a FIFO
//! or a device, and git would block reading it, freezing arming or the
//! bridge's event loop with it.

use std::io::Read;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

/// The longest one git call may take before it is killed.
pub const LIMIT: Duration = Duration::from_secs(3);

/// Runs `cmd` (a git command) with no stdin and stderr discarded; its
/// output, or `None` when it could not start or took longer than `limit`
/// (it is then killed and reaped).
pub fn output(mut cmd: Command, limit: Duration) -> Option<Output> {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    // A busy machine can refuse a fork for a moment (EAGAIN): once more.
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(_) => {
            std::thread::sleep(Duration::from_millis(50));
            cmd.spawn().ok()?
        }
    };
    let mut stdout = child.stdout.take()?;
    let pid = child.id();
    // Waited for on a thread of its own, so the answer is taken the moment
    // git exits (no polling), and read meanwhile so a large output never
    // fills the pipe.
    let (tx, rx) = std::sync::mpsc::channel();
    let waiter = std::thread::spawn(move || {
        let mut out = Vec::new();
        let _ = stdout.read_to_end(&mut out);
        let _ = tx.send((child.wait(), out));
    });
    match rx.recv_timeout(limit) {
        Ok((Ok(status), stdout)) => Some(Output {
            status,
            stdout,
            stderr: Vec::new(),
        }),
        Ok((Err(_), _)) => None,
        Err(_) => {
            tracing::warn!(command = ?cmd, "git did not answer within {} s (a FIFO or device in the repository?); stopped it", limit.as_secs());
            // SAFETY: kill(2) of our own child, not reaped yet (the waiter
            // reaps it once it dies), so the pid is still its.
            unsafe {
                libc::kill(pid as i32, libc::SIGKILL);
            }
            let _ = waiter.join();
            None
        }
    }
}

/// Whether `path` is a regular file (symlinks followed, as git does), or
/// absent: anything else is not read at all.
pub fn readable_config(path: &std::path::Path) -> bool {
    match std::fs::metadata(path) {
        Ok(m) => m.is_file(),
        Err(e) => e.kind() == std::io::ErrorKind::NotFound,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::time::Instant;

    #[test]
    fn a_fifo_config_never_blocks() {
        let d = tempfile::tempdir().unwrap();
        let fifo = d.path().join("config");
        nix::unistd::mkfifo(
            &fifo,
            nix::sys::stat::Mode::S_IRUSR | nix::sys::stat::Mode::S_IWUSR,
        )
        .unwrap();
        assert!(!readable_config(&fifo));
        assert!(readable_config(&d.path().join("absent")));
        let mut cmd = Command::new("git");
        cmd.args(["config", "--file"]).arg(&fifo).arg("--list");
        let started = Instant::now();
        assert!(output(cmd, Duration::from_millis(300)).is_none());
        assert!(started.elapsed() < Duration::from_secs(5));
        let mut cmd = Command::new("git");
        cmd.arg("--version");
        let out = output(cmd, LIMIT).unwrap();
        assert!(out.status.success() && out.stdout.starts_with(b"git version"));
    }
}
