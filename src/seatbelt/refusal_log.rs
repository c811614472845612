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
    child: Child,
    lines: Receiver<String>,
    tag: String,
    /// The fences' names in the private directory: `{fence}-{n}`.
    fence: String,
    dir: PathBuf,
    fences: u32,
}

impl Drop for RefusalLog {
    fn drop(&mut self) {
        // Ours, by its handle (it cannot have been reaped by anyone else).
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
        let mut child = std::process::Command::new(&argv[0])
            .args(&argv[1..])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            // Its own group: a ^C at the terminal is the command's, and
            // must not end the reading before the closing fence.
            .process_group(0)
            .spawn()
            .map_err(|e| LogError::Start(argv[0].clone(), e))?;
        let (tx, lines) = mpsc::channel();
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
            fence: format!(".refused-fence-{:016x}", rand::random::<u64>()),
            dir: dir.to_path_buf(),
            fences: 0,
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
        let last = self.fences;
        self.make(make_fence);
        let mut refused = Vec::new();
        let whole = self.read_until(Instant::now() + FENCE_WAIT, |n| n == last, &mut refused);
        Read { refused, whole }
    }

    fn make(&mut self, make_fence: &dyn Fn(&Path)) {
        make_fence(&self.dir.join(format!("{}-{}", self.fence, self.fences)));
        self.fences += 1;
    }

    /// Reads refusals into `refused` until a fence whose number `done`
    /// accepts is reported (true) or `until` passes (false). Fences are
    /// known by their name, which no command can guess.
    fn read_until(
        &mut self,
        until: Instant,
        done: impl Fn(u32) -> bool,
        refused: &mut Vec<Violation>,
    ) -> bool {
        let prefix = format!("{}-", self.fence);
        loop {
            let left = until.saturating_duration_since(Instant::now());
            let line = match self.lines.recv_timeout(left) {
                Ok(line) => line,
                Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => return false,
            };
            let Some(v) = violations::parse_line(&line, &self.tag) else {
                continue;
            };
            let fence = v
                .path
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.strip_prefix(&prefix))
                .and_then(|n| n.parse::<u32>().ok());
            match fence {
                Some(n) if done(n) => return true,
                Some(_) => {}
                None => refused.push(v),
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
        format!("{}\n", serde_json::json!({ "eventMessage": message }))
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
        // What the command was refused.
        append(&file, &report(Path::new("/Users/me/.bashrc")));
        append(&file, &report(Path::new("/etc/x")));
        let read = log.finish(&fence);
        assert!(read.whole);
        let paths: Vec<&Path> = read.refused.iter().map(|v| v.path.as_path()).collect();
        assert_eq!(paths, [Path::new("/Users/me/.bashrc"), Path::new("/etc/x")]);
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
