//! Running git on repositories the agent may have made, without ever
//! waiting on it for long: a `config` (or a file it includes) can be a FIFO
//! or a device, and git would block reading it, freezing arming or the
//! bridge's event loop with it.

use std::io::Read;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The git zcode-acp runs on repositories, found once on PATH, but never
/// in a directory an agent (or a `run_code` run) may have been able to put
/// a `git` in: git runs outside the sandbox, so a planted one would run
/// unconfined. Taken only from an absolute PATH entry outside the home
/// directory and the temp directories, owned by root and writable by no
/// one else, and, for root (whose workspaces are root's too), under the
/// system's prefixes. None: no such git (the checks that ask git are
/// skipped, as where git is not installed).
pub fn program() -> Option<&'static std::path::Path> {
    static GIT: std::sync::OnceLock<Option<std::path::PathBuf>> = std::sync::OnceLock::new();
    GIT.get_or_init(|| {
        let path = std::env::var_os("PATH")?;
        let home = dirs::home_dir().and_then(|h| std::fs::canonicalize(h).ok());
        let is_root = nix::unistd::geteuid().is_root();
        let found = std::env::split_paths(&path).find_map(|dir| {
            let dir = std::fs::canonicalize(&dir).ok().filter(|_| dir.is_absolute())?;
            let git = std::fs::canonicalize(dir.join("git")).ok()?;
            trusted_location(&git, home.as_deref(), is_root).then_some(git)
        });
        if found.is_none() {
            tracing::warn!("no git on PATH in a directory the agent cannot write; the checks that ask git are skipped");
        }
        found
    })
    .as_deref()
}

/// Whether `git` (a real path) and every directory above it are beyond
/// what a sandboxed process may have written.
fn trusted_location(git: &std::path::Path, home: Option<&std::path::Path>, is_root: bool) -> bool {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    const TEMP: &[&str] = &["/tmp", "/var/tmp", "/dev/shm", "/run/user"];
    const SYSTEM: &[&str] = &[
        "/usr",
        "/bin",
        "/sbin",
        "/opt",
        "/nix",
        "/snap",
        "/Library",
        "/Applications",
    ];
    if home.is_some_and(|h| git.starts_with(h)) || TEMP.iter().any(|t| git.starts_with(t)) {
        return false;
    }
    if is_root && !SYSTEM.iter().any(|p| git.starts_with(p)) {
        return false;
    }
    std::fs::metadata(git).is_ok_and(|m| m.is_file())
        && git.ancestors().all(|p| {
            std::fs::metadata(p).is_ok_and(|m| m.uid() == 0 && m.permissions().mode() & 0o022 == 0)
        })
}

/// A command running [`program`] (a path that cannot start when there is
/// none, which callers read as "git is unavailable").
pub fn command() -> Command {
    Command::new(program().unwrap_or(std::path::Path::new("/nonexistent/zcode-acp/git")))
}

/// The longest one git call may take before it is killed.
pub const LIMIT: Duration = Duration::from_secs(3);

/// Runs `cmd` (a git command) with no stdin and stderr discarded; its
/// output, or why there is none: it could not start, or took longer than
/// `limit` (it is then killed and reaped). No thread is started: the launcher that
/// calls this must stay single-threaded, or it could not unshare a user
/// namespace afterwards.
/// Why git gave no answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoAnswer {
    /// It could not be started (not installed, not on PATH).
    Unavailable,
    /// It took longer than the limit (a FIFO or device in the repository),
    /// or said more than [`MAX_OUTPUT`] (a config made to be huge).
    TimedOut,
}

/// The most of git's output read: past it, git is stopped and gave no
/// answer (a config of millions of keys must not fill memory).
pub const MAX_OUTPUT: usize = 16 << 20;

pub fn output(cmd: Command, limit: Duration) -> Result<Output, NoAnswer> {
    output_with_input(cmd, None, limit)
}

/// [`output`], with `input` written to git's standard input as it takes
/// it, in the same loop that reads its output (never a thread: `zcode-acp
/// run` asks git before it forks, which needs it single-threaded).
pub fn output_with_input(
    mut cmd: Command,
    input: Option<Vec<u8>>,
    limit: Duration,
) -> Result<Output, NoAnswer> {
    use std::os::fd::AsFd;
    cmd.stdin(if input.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stdout(Stdio::piped())
    .stderr(Stdio::null());
    // A busy machine can refuse a fork for a moment (EAGAIN): once more.
    // Registered as waited for here, so the bridge's reaper of leftover
    // zombies never takes its exit status (this may run off the loop).
    let (mut child, _owned) = match crate::children::spawn_owned(&mut cmd) {
        Ok(c) => c,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(NoAnswer::Unavailable),
        Err(_) => {
            std::thread::sleep(Duration::from_millis(50));
            crate::children::spawn_owned(&mut cmd).map_err(|_| NoAnswer::Unavailable)?
        }
    };
    let deadline = Instant::now() + limit;
    // What is left to write, on a pipe that never blocks.
    let mut stdin = child.stdin.take();
    let input = input.unwrap_or_default();
    let mut written = 0;
    if let Some(pipe) = &stdin {
        let flags = nix::fcntl::fcntl(pipe, nix::fcntl::FcntlArg::F_GETFL)
            .map(nix::fcntl::OFlag::from_bits_truncate)
            .unwrap_or(nix::fcntl::OFlag::empty());
        let _ = nix::fcntl::fcntl(
            pipe,
            nix::fcntl::FcntlArg::F_SETFL(flags | nix::fcntl::OFlag::O_NONBLOCK),
        );
    }
    let mut stdout = child.stdout.take().ok_or(NoAnswer::Unavailable)?;
    let mut out = Vec::new();
    let mut chunk = [0u8; 8192];
    let finished = loop {
        if written >= input.len() {
            stdin = None; // all given: git sees its end
        }
        let left = deadline.saturating_duration_since(Instant::now());
        let out_fd = nix::poll::PollFd::new(stdout.as_fd(), nix::poll::PollFlags::POLLIN);
        let mut fds = vec![out_fd];
        if let Some(pipe) = &stdin {
            fds.push(nix::poll::PollFd::new(
                pipe.as_fd(),
                nix::poll::PollFlags::POLLOUT,
            ));
        }
        let ms = u16::try_from(left.as_millis()).unwrap_or(u16::MAX);
        match nix::poll::poll(&mut fds, nix::poll::PollTimeout::from(ms)) {
            Ok(0) if left.is_zero() => break false,
            Ok(0) => continue,
            Ok(_) => {
                let writable = fds
                    .get(1)
                    .and_then(|f| f.revents())
                    .is_some_and(|r| !r.is_empty());
                let readable = fds[0].revents().is_some_and(|r| !r.is_empty());
                if writable {
                    use std::io::Write;
                    match stdin.as_mut().map(|p| p.write(&input[written..])) {
                        Some(Ok(n)) => written += n,
                        Some(Err(e)) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                        Some(Err(e)) if e.kind() == std::io::ErrorKind::Interrupted => {}
                        // Git stopped reading (it exited, or needs no more).
                        _ => written = input.len(),
                    }
                }
                if readable {
                    match stdout.read(&mut chunk) {
                        Ok(0) => break true,
                        Ok(n) if out.len() + n > MAX_OUTPUT => break false,
                        Ok(n) => out.extend_from_slice(&chunk[..n]),
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                        Err(_) => break true,
                    }
                }
            }
            Err(nix::errno::Errno::EINTR) => {}
            Err(_) => break false,
        }
    };
    // Its output is complete; it exits at once (a little grace for that).
    let status = if finished {
        loop {
            match child.try_wait() {
                Ok(Some(status)) => break Some(status),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(1))
                }
                _ => break None,
            }
        }
    } else {
        None
    };
    match status {
        Some(status) => Ok(Output {
            status,
            stdout: out,
            stderr: Vec::new(),
        }),
        None => {
            tracing::warn!(command = ?cmd, "git did not answer within {} s or said more than {} MiB (a FIFO, device or huge config in the repository?); stopped it", limit.as_secs(), MAX_OUTPUT >> 20);
            // Our own child, by its handle.
            let _ = child.kill();
            let _ = child.wait();
            Err(NoAnswer::TimedOut)
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
        assert_eq!(
            output(cmd, Duration::from_millis(300)).unwrap_err(),
            NoAnswer::TimedOut
        );
        assert_eq!(
            output(Command::new("/nonexistent/git"), LIMIT).unwrap_err(),
            NoAnswer::Unavailable
        );
        assert!(started.elapsed() < Duration::from_secs(5));
        let mut cmd = command();
        cmd.arg("--version");
        let out = output(cmd, LIMIT).unwrap();
        assert!(out.status.success() && out.stdout.starts_with(b"git version"));
    }

    #[test]
    fn git_is_never_taken_from_where_an_agent_can_write() {
        let home = std::path::Path::new("/home/u");
        let root_git = program().expect("a system git on this machine");
        assert!(root_git.is_absolute());
        let d = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        let planted = d.path().join("git");
        std::fs::write(&planted, "#!/bin/sh\n").unwrap();
        let planted = std::fs::canonicalize(planted).unwrap();
        // Outside the system's prefixes (root), or not root's: refused.
        assert!(!trusted_location(&planted, Some(home), true));
        assert!(!trusted_location(&planted, Some(home), false) || nix::unistd::geteuid().is_root());
        assert!(!trusted_location(
            std::path::Path::new("/tmp/x/git"),
            None,
            false
        ));
        assert!(!trusted_location(
            std::path::Path::new("/home/u/.venv/bin/git"),
            Some(home),
            false
        ));
        assert!(trusted_location(root_git, Some(home), true));
    }
}
