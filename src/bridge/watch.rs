//! Watching the system log for writes the sandbox refused (macOS).
//!
//! Agents that write for themselves report a refused write however they
//! like, or not at all; Seatbelt logs every refusal. A `log stream` child,
//! filtered on the tag that the sandbox's profiles carry, feeds the refusals
//! to the bridge's loop, which offers grants through the same flow as the
//! refusals it reads in tool calls.

use std::process::Stdio;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::mpsc;
use tracing::{debug, warn};

use crate::seatbelt::violations::{self, Violation};

pub(super) struct ViolationWatch {
    pub tag: String,
    /// The `log` child's pid: its exit status is tokio's to collect.
    pub pid: Option<i32>,
    pub rx: mpsc::UnboundedReceiver<Violation>,
    /// Killed (by its pid, while tokio still owns it) when dropped.
    child: tokio::process::Child,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for ViolationWatch {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
        self.task.abort();
    }
}

impl ViolationWatch {
    /// Starts `log stream` for `tag`; None (said in the log) when it cannot.
    pub fn start(tag: &str) -> Option<ViolationWatch> {
        let argv = violations::stream_argv(tag);
        let mut child = match tokio::process::Command::new(&argv[0])
            .args(&argv[1..])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
        {
            Ok(c) => c,
            Err(e) => {
                warn!("cannot read the sandbox's violation log ({} stream: {e}); writes the agent makes itself and the sandbox refuses will not be offered to you", violations::LOG);
                return None;
            }
        };
        let pid = child.id().map(|p| p as i32);
        let stdout = child.stdout.take()?;
        let (tx, rx) = mpsc::unbounded_channel();
        let owned_tag = tag.to_owned();
        let task = tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                if let Some(v) = violations::parse_line(&line, &owned_tag) {
                    debug!(process = v.process, pid = v.pid, operation = v.operation, path = %v.path.display(), "the sandbox refused a write");
                    if tx.send(v).is_err() {
                        return;
                    }
                }
            }
            warn!("the sandbox's violation log ended; refused writes will no longer be offered to you");
        });
        Some(ViolationWatch {
            tag: tag.to_owned(),
            pid,
            rx,
            child,
            task,
        })
    }
}

impl super::Bridge {
    /// Reads the system log for the sandbox's tag (a sandbox turned on, a new tag);
    /// stops reading when it has none.
    pub(super) fn watch_violations(&mut self) {
        let tag = self.sandbox.violation_tag().map(str::to_owned);
        if self.asks.violations.as_ref().map(|w| &w.tag) == tag.as_ref() {
            return;
        }
        self.asks.violations = tag.and_then(|t| ViolationWatch::start(&t));
    }
}

/// The next refusal, or never when nothing is watched.
pub(super) async fn next(watch: &mut Option<ViolationWatch>) -> Option<Violation> {
    match watch {
        Some(w) => w.rx.recv().await,
        None => std::future::pending().await,
    }
}
