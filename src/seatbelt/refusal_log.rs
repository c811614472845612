//! `zcode-acp run`'s reading of the writes Seatbelt refused (macOS), for
//! the line the run ends with (`policy::refused`).
//!
//! Seatbelt says what it refused in the system log only, and `log stream`
//! reports it late and only once it is listening. So the watch is fenced
//! by two refusals of our own, made under the run's own profile (a write
//! into its private directory, which the profile denies with the same tag):
//! the command starts only once the first has come back, so the stream is
//! live; and the line is written once the second has come back, so every
//! refusal the command caused before it ended has been read (the kernel
//! reports them in order). When a fence does not come back in time, the
//! run says so rather than implying that nothing was refused.

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use super::violations::{self, Violation};

/// How long the log may take to report a fence.
const FENCE_WAIT: Duration = Duration::from_secs(3);

/// Until the stream is live, a first fence may go unseen: one is made
/// this often.
const FENCE_AGAIN: Duration = Duration::from_millis(250);

/// Why the refusals cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    #[error("cannot start {0}: {1}")]
    Start(String, std::io::Error),
    #[error("the system log did not report a refusal of the sandbox's within {} s (is `log stream` allowed for this user?)", FENCE_WAIT.as_secs())]
    Silent,
}

/// A `log stream` child, read on a thread of its own, fenced as above.
pub struct RefusalLog {
    /// The watchdog shell whose child `log` is (see [`watched`]).
    child: Child,
    lines: Receiver<String>,
    tag: String,
    dir: PathBuf,
    /// Every fence made so far, by name, each drawn at random when it is
    /// made: the closing one exists only once the command has ended, so
    /// nothing it left behind can make it first.
    fences: Vec<String>,
}

/// Lines waiting to be read at most: past it the reader waits (and so does
/// `log`), so a flood costs no memory.
const QUEUED: usize = 4096;

/// Refusals kept at most (`policy::refused` names a few and counts the
/// rest).
const KEPT: usize = 8192;

impl Drop for RefusalLog {
    fn drop(&mut self) {
        // SIGTERM to the watchdog (ours, by its pid), which ends `log`
        // and exits; SIGKILL if it has not within a second.
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let until = Instant::now() + Duration::from_secs(1);
        while Instant::now() < until {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What was read: the command's refusals, and whether the closing fence
/// came back (else some may be missing).
pub struct Read {
    pub refused: Vec<Violation>,
    pub whole: bool,
}

/// `argv` under a watchdog shell that ends it when this process is gone
/// (a `zcode-acp run` killed with SIGKILL would otherwise leave `log
/// stream` waiting forever for a tag nobody logs again), or when told to
/// with SIGTERM.
fn watched(argv: &[String]) -> Vec<String> {
    const WATCHDOG: &str = r#""$@" & child=$!
trap 'kill "$child" 2>/dev/null; exit 0' TERM
while kill -0 "$PPID" 2>/dev/null && kill -0 "$child" 2>/dev/null; do
  sleep 1 & wait $!
done
kill "$child" 2>/dev/null"#;
    ["/bin/sh", "-c", WATCHDOG, "sh"]
        .into_iter()
        .map(str::to_owned)
        .chain(argv.iter().cloned())
        .collect()
}

impl RefusalLog {
    /// Starts `log stream` for `tag` and waits until it reports a fence
    /// written into `dir` (the run's private directory) by `make_fence`,
    /// which must attempt that write under the run's profile.
    pub fn start(
        tag: &str,
        dir: &Path,
        make_fence: &dyn Fn(&Path),
    ) -> Result<RefusalLog, LogError> {
        Self::start_with(&violations::stream_argv(tag), tag, dir, make_fence)
    }

    /// The same, with the log read from `argv` (tests use a file).
    pub fn start_with(
        argv: &[String],
        tag: &str,
        dir: &Path,
        make_fence: &dyn Fn(&Path),
    ) -> Result<RefusalLog, LogError> {
        use std::os::unix::process::CommandExt;
        let argv = watched(argv);
        let mut cmd = std::process::Command::new(&argv[0]);
        cmd.args(&argv[1..])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            // Its own group: a ^C at the terminal is the command's, and
            // must not end the reading before the closing fence.
            .process_group(0);
        // SAFETY: only the signal mask is set in the child, with a call
        // that is async-signal-safe: `run` holds its signals blocked, and
        // the watchdog must get its SIGTERM.
        unsafe {
            cmd.pre_exec(|| {
                nix::sys::signal::SigSet::empty()
                    .thread_set_mask()
                    .map_err(std::io::Error::from)
            });
        }
        let mut child = cmd
            .spawn()
            .map_err(|e| LogError::Start(argv[4].clone(), e))?;
        let (tx, lines) = mpsc::sync_channel(QUEUED);
        if let Some(stdout) = child.stdout.take() {
            std::thread::spawn(move || {
                for line in std::io::BufReader::new(stdout).lines() {
                    let Ok(line) = line else { return };
                    if tx.send(line).is_err() {
                        return;
                    }
                }
            });
        }
        let mut log = RefusalLog {
            child,
            lines,
            tag: tag.to_owned(),
            dir: dir.to_path_buf(),
            fences: Vec::new(),
        };
        let deadline = Instant::now() + FENCE_WAIT;
        while Instant::now() < deadline {
            log.make(make_fence);
            let until = (Instant::now() + FENCE_AGAIN).min(deadline);
            // Any fence back, however late, says the stream is live.
            if log.read_until(until, |_| true, &mut Vec::new()) {
                return Ok(log);
            }
        }
        Err(LogError::Silent)
    }

    /// Makes the closing fence and reads until it is reported (or
    /// [`FENCE_WAIT`] passed).
    pub fn finish(mut self, make_fence: &dyn Fn(&Path)) -> Read {
        let closing = self.make(make_fence);
        let mut refused = Vec::new();
        let whole = self.read_until(
            Instant::now() + FENCE_WAIT,
            |name| name == closing,
            &mut refused,
        );
        Read { refused, whole }
    }

    /// Makes a fence of a new name; returns the name.
    fn make(&mut self, make_fence: &dyn Fn(&Path)) -> String {
        let name = format!(".refused-fence-{:016x}", rand::random::<u64>());
        make_fence(&self.dir.join(&name));
        self.fences.push(name.clone());
        name
    }

    /// Reads refusals into `refused` (at most [`KEPT`]) until a fence
    /// `done` accepts is reported (true) or `until` passes (false), however
    /// many lines are waiting.
    fn read_until(
        &mut self,
        until: Instant,
        done: impl Fn(&str) -> bool,
        refused: &mut Vec<Violation>,
    ) -> bool {
        loop {
            let now = Instant::now();
            if now >= until {
                return false;
            }
            let line = match self.lines.recv_timeout(until - now) {
                Ok(line) => line,
                Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => return false,
            };
            let Some(v) = violations::parse_line(&line, &self.tag) else {
                continue;
            };
            let name = v.path.file_name().and_then(|n| n.to_str());
            match name.filter(|n| self.fences.iter().any(|f| f == n)) {
                Some(fence) if done(fence) => return true,
                Some(_) => {}
                None if refused.len() < KEPT => refused.push(v),
                None => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    const TAG: &str = "zcode-acp-00000000000000cd";

    /// A refusal as `log stream --style ndjson` reports it.
    fn report(path: &Path) -> String {
        let message = format!(
            "Sandbox: touch(7) deny(1) file-write-create {} {TAG}",
            path.display()
        );
        format!(
            "{}\n",
            serde_json::json!({ "processID": 0, "eventMessage": message })
        )
    }

    fn append(file: &Path, text: &str) {
        let mut f = std::fs::OpenOptions::new().append(true).open(file).unwrap();
        f.write_all(text.as_bytes()).unwrap();
    }

    /// A "system log" that is a file followed by `tail`, and fences that
    /// are reported by appending to it, as Seatbelt would.
    #[test]
    fn the_command_s_refusals_are_read_between_the_fences_and_the_fences_left_out() {
        let t = tempfile::tempdir().unwrap();
        let file = t.path().join("log");
        // Noise from before the run, and another sandbox's refusal.
        std::fs::write(&file, "{\"eventMessage\": \"boot\"}\n").unwrap();
        append(&file, &report(Path::new("/old")).replace(TAG, "other"));
        let argv: Vec<String> = ["tail", "-n", "+1", "-f"]
            .iter()
            .map(|s| s.to_string())
            .chain([file.display().to_string()])
            .collect();
        let fence = |p: &Path| append(&file, &report(p));
        let log = RefusalLog::start_with(&argv, TAG, t.path(), &fence).unwrap();
        // What the command was refused, and a fence it forged from the
        // first one's name (the closing one is drawn when the command has
        // ended): a refusal like any other, never the end of the reading.
        append(&file, &report(Path::new("/Users/me/.bashrc")));
        let forged = t.path().join(format!("{}x", log.fences[0]));
        append(&file, &report(&forged));
        append(&file, &report(Path::new("/etc/x")));
        let read = log.finish(&fence);
        assert!(read.whole);
        let paths: Vec<&Path> = read.refused.iter().map(|v| v.path.as_path()).collect();
        assert_eq!(
            paths,
            [Path::new("/Users/me/.bashrc"), &forged, Path::new("/etc/x")]
        );
        // The reader (`tail`, under its watchdog) went with the log.
        assert!(
            !cfg!(target_os = "linux") || !running_with(&file),
            "a process still follows {}",
            file.display()
        );
    }

    /// Whether a process of this machine has `path` in its command line.
    fn running_with(path: &Path) -> bool {
        let want = path.display().to_string();
        let deadline = Instant::now() + Duration::from_secs(3);
        loop {
            let found = std::fs::read_dir("/proc")
                .into_iter()
                .flatten()
                .flatten()
                .any(|e| {
                    std::fs::read(e.path().join("cmdline"))
                        .is_ok_and(|c| String::from_utf8_lossy(&c).contains(&want))
                });
            if !found || Instant::now() >= deadline {
                return found;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    #[test]
    fn a_log_that_never_reports_a_fence_is_said_not_trusted() {
        let t = tempfile::tempdir().unwrap();
        let argv = vec!["sleep".to_owned(), "30".to_owned()];
        let started = Instant::now();
        let err = RefusalLog::start_with(&argv, TAG, t.path(), &|_| {})
            .err()
            .unwrap();
        assert!(matches!(err, LogError::Silent), "{err}");
        assert!(started.elapsed() >= FENCE_WAIT);
        // And a closing fence that never comes back says the read is not whole.
        let file = t.path().join("log");
        std::fs::write(&file, "").unwrap();
        let argv: Vec<String> = vec!["tail".into(), "-f".into(), file.display().to_string()];
        let appending = std::cell::Cell::new(true);
        let fence = |p: &Path| {
            if appending.get() {
                append(&file, &report(p));
            }
        };
        let log = RefusalLog::start_with(&argv, TAG, t.path(), &fence).unwrap();
        append(&file, &report(Path::new("/etc/y")));
        appending.set(false);
        let read = log.finish(&fence);
        assert!(!read.whole);
        assert_eq!(read.refused.len(), 1);
    }
}
