//! Writing the user's project files off the event loop.
//!
//! Recording an answer in sandbox.json and approving a hand edit take the
//! project's lock, which another bridge on the same project may hold for
//! as long as its own write takes, and they touch the disk: they run on the
//! blocking pool, and their outcome comes back to the loop as an event, so
//! relaying never waits for them. An answer takes effect at once (the
//! grant is held in memory, and every arming includes it), so nothing the
//! user allowed waits on the disk, and writes to one path keep their order;
//! the record only makes it outlive this bridge, and the user is told when
//! it could not be made. Work that panics is reported like work that
//! failed, so nothing waits on it forever.
//! A project's template and ledger are prepared here too when a session
//! opens it (discovery prepares them again, off the loop as well, when a
//! generation is armed for it).

use std::path::PathBuf;

use tokio::sync::mpsc;

use crate::config::managed::ManagedRoot;
use crate::config::project::{self, List, WriteError};

/// Disk work finished off the loop.
#[derive(Debug)]
pub(super) enum DiskDone {
    /// An answer's record: `Err` says why it could not be made.
    Recorded {
        session: String,
        list: List,
        entry: String,
        result: Result<(), DiskError>,
    },
    Approved {
        root: PathBuf,
        result: Result<(), DiskError>,
    },
    /// A project's template and ledger, on its first session.
    Prepared { root: PathBuf },
    /// The post-turn audit of the baseline armed as `epoch`, for
    /// `session`: what it found (not yet reverted).
    Audited {
        epoch: u64,
        session: String,
        findings: Vec<crate::audit::Finding>,
    },
    /// An agent's state location, remembered for it in the user config.
    Remembered {
        session: String,
        location: PathBuf,
        result: Result<(), String>,
    },
    /// An "always allow" of a connection, in the project's network table.
    NetworkRecorded {
        session: String,
        what: String,
        /// It opened a host loopback port (mirrored from the next arming).
        mirrored: bool,
        result: Result<(), DiskError>,
    },
}

impl std::fmt::Display for DiskDone {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let outcome = |r: &Result<(), DiskError>| match r {
            Ok(()) => "done".to_owned(),
            Err(e) => format!("failed: {e}"),
        };
        match self {
            DiskDone::Recorded { entry, result, .. } => {
                write!(f, "record of {entry}: {}", outcome(result))
            }
            DiskDone::Approved { root, result } => {
                write!(f, "approval of {}: {}", root.display(), outcome(result))
            }
            DiskDone::Prepared { root } => write!(f, "{} prepared", root.display()),
            DiskDone::Audited { findings, .. } => {
                write!(f, "an audit with {} findings", findings.len())
            }
            DiskDone::NetworkRecorded { what, result, .. } => {
                write!(f, "record of {what}: {}", outcome(result))
            }
            DiskDone::Remembered {
                location, result, ..
            } => write!(
                f,
                "{} remembered: {}",
                location.display(),
                match result {
                    Ok(()) => "done".to_owned(),
                    Err(e) => format!("failed: {e}"),
                }
            ),
        }
    }
}

/// Why a write to a project's files did not happen.
#[derive(Debug, thiserror::Error)]
pub(super) enum DiskError {
    #[error(transparent)]
    Write(#[from] WriteError),
    /// The session's workspace cannot be found any more (moved or
    /// removed): there is no sandbox.json to write.
    #[error("the session's workspace is gone")]
    WorkspaceGone,
    /// What was allowed cannot be written as a network table entry.
    #[error("{0}")]
    NotATableEntry(String),
    /// The work panicked: reported like work that failed, so nothing
    /// waits on it forever.
    #[error("zcode-acp failed while writing it (a bug: please report it)")]
    Panicked,
}

/// Runs `work`, turning a panic into an error the loop hears about.
fn guarded<T>(work: impl FnOnce() -> Result<T, WriteError>) -> Result<T, DiskError> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(work)) {
        Ok(result) => Ok(result?),
        Err(_) => Err(DiskError::Panicked),
    }
}

/// The loop's handle on disk work: starts it, and receives what is done.
pub(super) struct Disk {
    tx: mpsc::UnboundedSender<DiskDone>,
    rx: mpsc::UnboundedReceiver<DiskDone>,
    /// Started and not yet received.
    pending: usize,
}

impl Disk {
    pub fn new() -> Disk {
        let (tx, rx) = mpsc::unbounded_channel();
        Disk { tx, rx, pending: 0 }
    }

    /// Remembers `location` as `agent`'s state in the user config (the
    /// answer "for this agent, always" given on `session`).
    pub fn remember_agent_state(
        &mut self,
        managed: &ManagedRoot,
        agent: String,
        location: PathBuf,
        home: PathBuf,
        session: String,
    ) {
        let (tx, managed) = (self.tx.clone(), managed.clone());
        self.pending += 1;
        tokio::task::spawn_blocking(move || {
            let config = crate::config::user_config_path();
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                crate::config::remember::remember_agent_state(
                    config.as_deref(),
                    &agent,
                    &location,
                    &home,
                    &managed,
                )
                .map_err(|e| e.to_string())
            }))
            .unwrap_or_else(|_| Err(DiskError::Panicked.to_string()));
            if let Err(e) = &result {
                tracing::warn!(location = %location.display(), "could not remember the agent's state location in the user config ({e}); it holds until zcode-acp exits");
            }
            let _ = tx.send(DiskDone::Remembered {
                session,
                location,
                result,
            });
        });
    }

    /// Records `entry` in `root`'s `list` for the answer given on
    /// `session`.
    pub fn record(
        &mut self,
        managed: &ManagedRoot,
        root: PathBuf,
        list: List,
        entry: String,
        session: String,
    ) {
        let (tx, managed) = (self.tx.clone(), managed.clone());
        self.pending += 1;
        tokio::task::spawn_blocking(move || {
            let result = guarded(|| project::append(&root, list, &entry, &managed));
            if let Err(e) = &result {
                tracing::warn!(root = %root.display(), "could not record `{entry}` in sandbox.json ({e}); it holds for this session only");
            }
            let _ = tx.send(DiskDone::Recorded {
                session,
                list,
                entry,
                result,
            });
        });
    }

    /// Widens `root`'s network table by `table` (approved) for the answer
    /// given on `session` about `what`.
    pub fn record_network(
        &mut self,
        managed: &ManagedRoot,
        root: PathBuf,
        table: crate::policy::network::NetworkTable,
        session: String,
        what: String,
    ) {
        let (tx, managed) = (self.tx.clone(), managed.clone());
        self.pending += 1;
        let mirrored = !table.ports().is_empty();
        tokio::task::spawn_blocking(move || {
            let result = guarded(|| project::widen_network(&root, &table, &managed));
            if let Err(e) = &result {
                tracing::warn!(root = %root.display(), "could not record the connection to {what} in sandbox.json ({e}); it holds for this session only");
            }
            let _ = tx.send(DiskDone::NetworkRecorded {
                session,
                what,
                mirrored,
                result,
            });
        });
    }

    /// Looks for what the agent left that would run (walking the roots,
    /// reading settings, asking git about new repositories), off the loop:
    /// relaying goes on meanwhile. Reverting is the loop's, on the answer.
    pub fn audit(
        &mut self,
        baseline: crate::audit::Baseline,
        dirty: Vec<PathBuf>,
        epoch: u64,
        session: String,
    ) {
        let tx = self.tx.clone();
        self.pending += 1;
        tokio::task::spawn_blocking(move || {
            let findings =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| baseline.audit_with(&dirty)))
                    .unwrap_or_else(|_| {
                        tracing::error!("the audit failed (a bug: please report it)");
                        // Said to the user, never taken for "nothing found".
                        let root = baseline.roots().first().cloned().unwrap_or_default();
                        vec![crate::audit::Finding {
                            path: root,
                            what: "zcode-acp's audit of what the agent left failed (a bug: please report it), so nothing it left was checked".into(),
                            shown: String::new(),
                            revert: None,
                            keep: None,
                            blind: false,
                        }]
                    });
            let _ = tx.send(DiskDone::Audited {
                epoch,
                session,
                findings,
            });
        });
    }

    /// Approves `root`'s sandbox.json as it is now.
    pub fn approve(&mut self, managed: &ManagedRoot, root: PathBuf) {
        let (tx, managed) = (self.tx.clone(), managed.clone());
        self.pending += 1;
        tokio::task::spawn_blocking(move || {
            let result = guarded(|| project::approve_current(&root, &managed));
            let _ = tx.send(DiskDone::Approved { root, result });
        });
    }

    /// Prepares a project a session opens: creates its sandbox.json
    /// template on first touch and records in the ledger what needs no
    /// approval. The decision whether it arms is read without writing
    /// ([`project::inspect`]) and does not wait for this.
    pub fn prepare(&mut self, managed: &ManagedRoot, root: PathBuf) {
        let (tx, managed) = (self.tx.clone(), managed.clone());
        self.pending += 1;
        tokio::task::spawn_blocking(move || {
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                project::prepare(&root, &managed)
            }));
            let _ = tx.send(DiskDone::Prepared { root });
        });
    }

    /// The next piece of work done (never, while none is pending).
    pub async fn next(&mut self) -> DiskDone {
        if self.pending == 0 {
            return std::future::pending().await;
        }
        let done = self.rx.recv().await;
        self.pending -= 1;
        // The loop holds a sender, so the channel never closes.
        done.expect("the bridge holds a sender")
    }

    /// Waits up to `limit` for the work still pending, so no record is cut
    /// off when the bridge exits; what it finds is only logged (nothing of
    /// the agent is left to answer).
    pub async fn settle(&mut self, limit: std::time::Duration) {
        let deadline = tokio::time::Instant::now() + limit;
        while self.pending > 0 {
            match tokio::time::timeout_at(deadline, self.next()).await {
                Ok(done) => tracing::debug!(done = %done, "disk work finished while shutting down"),
                Err(_) => {
                    tracing::warn!(
                        pending = self.pending,
                        "gave up waiting for sandbox.json records while shutting down (another zcode-acp holds the project's lock?)"
                    );
                    return;
                }
            }
        }
    }
}
