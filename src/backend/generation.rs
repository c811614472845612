//! One backend generation: a spawned process, the task that writes its
//! stdin, and the task that reads its stdout and notices its death.

use std::process::ExitStatus;
use std::time::{Duration, Instant};

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::sync::{mpsc, watch};
use tracing::{debug, warn};

use super::procs;
use super::spawn::{spawn, PreparedCommand, SpawnError};
use crate::relay::framing::{FrameReader, ReadItem};

/// How long after the process exits we still wait for its stdout to close.
/// Frames it wrote just before exiting are in the pipe; they must be routed
/// before the generation is declared lost, or an answered request would be
/// reported as crashed.
const DRAIN_AFTER_EXIT: Duration = Duration::from_millis(300);

/// What a generation reports to the bridge.
#[derive(Debug)]
pub enum BackendEvent {
    Frame(Vec<u8>),
    TooLarge {
        prefix: Vec<u8>,
        size: usize,
    },
    /// The generation is gone: its stdout closed, or it exited. Sent once,
    /// after every frame it wrote.
    Lost {
        status: Option<ExitStatus>,
    },
}

/// Events are tagged with the generation that produced them, so events of
/// a stopped generation can be told apart and ignored.
pub type EventSender = mpsc::UnboundedSender<(u64, BackendEvent)>;

pub struct Generation {
    pub id: u64,
    pub pid: i32,
    pub confinement: String,
    /// Which backend profile chose the agent's writable state, and why.
    pub backend_profile: Option<String>,
    stdin: Option<mpsc::UnboundedSender<Vec<u8>>>,
    exited: watch::Receiver<bool>,
}

impl Generation {
    pub fn start(
        id: u64,
        cmd: &PreparedCommand,
        max_frame_bytes: usize,
        events: EventSender,
    ) -> Result<Generation, SpawnError> {
        let spawned = spawn(cmd)?;
        let pid = spawned.pid;

        let (stdin_tx, mut stdin_rx) = mpsc::unbounded_channel::<Vec<u8>>();
        let mut stdin = spawned.stdin;
        tokio::spawn(async move {
            while let Some(mut frame) = stdin_rx.recv().await {
                frame.push(b'\n');
                if let Err(e) = stdin.write_all(&frame).await {
                    debug!(generation = id, "backend stdin closed: {e}");
                    return;
                }
            }
            // Sender dropped: dropping `stdin` closes the pipe, which is the
            // polite way to ask an ACP agent to exit.
        });

        let (exited_tx, exited_rx) = watch::channel(false);
        let mut child = spawned.child;
        let mut reader = FrameReader::new(
            BufReader::with_capacity(1 << 20, spawned.stdout),
            max_frame_bytes,
        );
        tokio::spawn(async move {
            let mut status = None;
            let mut deadline: Option<tokio::time::Instant> = None;
            loop {
                tokio::select! {
                    item = reader.next() => match item {
                        Ok(ReadItem::Frame(bytes)) => { let _ = events.send((id, BackendEvent::Frame(bytes))); }
                        Ok(ReadItem::TooLarge { prefix, size }) => {
                            let _ = events.send((id, BackendEvent::TooLarge { prefix, size }));
                        }
                        Ok(ReadItem::Eof) => break,
                        Err(e) => { warn!(generation = id, "reading the backend's stdout failed: {e}"); break; }
                    },
                    s = child.wait(), if status.is_none() => {
                        status = Some(s.ok());
                        let _ = exited_tx.send(true);
                        deadline = Some(tokio::time::Instant::now() + DRAIN_AFTER_EXIT);
                    }
                    _ = tokio::time::sleep_until(deadline.unwrap_or_else(tokio::time::Instant::now)), if deadline.is_some() => {
                        // Exited, but something it started still holds stdout open.
                        break;
                    }
                }
            }
            let status = match status {
                Some(s) => s,
                None => {
                    // Stdout closed first; the exit follows (or the bridge's
                    // stop kills it).
                    let s = child.wait().await.ok();
                    let _ = exited_tx.send(true);
                    s
                }
            };
            let _ = events.send((id, BackendEvent::Lost { status }));
        });

        Ok(Generation {
            id,
            pid,
            confinement: cmd.confinement.clone(),
            backend_profile: cmd.backend_profile.clone(),
            stdin: Some(stdin_tx),
            exited: exited_rx,
        })
    }

    /// Queues one frame (without terminator) for the backend's stdin.
    pub fn send(&self, frame: Vec<u8>) -> bool {
        self.stdin.as_ref().is_some_and(|tx| tx.send(frame).is_ok())
    }

    /// Closes the backend's stdin: the polite way to ask an ACP agent to
    /// finish and exit.
    pub fn close_stdin(&mut self) {
        self.stdin.take();
    }

    /// Stops the generation and everything it started: close stdin, SIGTERM
    /// the process group, SIGKILL after `grace`, then kill any descendant
    /// that left the group, until none is left. Returns the pids that could
    /// not be killed (none, unless something is badly wrong).
    ///
    /// `spare`: children of the bridge's own that are not the generation's
    /// (the violation log reader); they and their descendants are left be.
    pub async fn stop(mut self, grace: Duration, spare: &[i32]) -> Vec<i32> {
        self.stdin.take();
        let group = Pid::from_raw(self.pid);
        if !*self.exited.borrow() {
            let _ = killpg(group, Signal::SIGTERM);
            let mut exited = self.exited.clone();
            let _ = tokio::time::timeout(grace, exited.wait_for(|e| *e)).await;
        }
        let _ = killpg(group, Signal::SIGKILL);
        {
            let mut exited = self.exited.clone();
            let _ = tokio::time::timeout(Duration::from_secs(5), exited.wait_for(|e| *e)).await;
        }
        kill_all_descendants(self.pid, spare).await
    }
}

/// Kills every descendant of the bridge but `spare` and theirs: at the
/// point this runs, the only other descendants are the stopped
/// generation's (the next one is not spawned yet). Returns what survived.
async fn kill_all_descendants(main_pid: i32, spare: &[i32]) -> Vec<i32> {
    let give_up = Instant::now() + Duration::from_secs(3);
    let mut not_ours = vec![main_pid];
    not_ours.extend_from_slice(spare);
    loop {
        procs::reap_zombie_children(&not_ours);
        let procs = procs::snapshot();
        let kept: Vec<i32> = spare
            .iter()
            .flat_map(|s| procs::descendants_in(&procs, *s))
            .map(|p| p.pid)
            .chain(spare.iter().copied())
            .collect();
        let alive: Vec<i32> = procs::descendants_in(&procs, std::process::id() as i32)
            .iter()
            .filter(|p| !p.is_zombie() && !kept.contains(&p.pid))
            .map(|p| p.pid)
            .collect();
        if alive.is_empty() {
            return alive;
        }
        if Instant::now() > give_up {
            return alive;
        }
        for pid in &alive {
            debug!(pid, "killing a leftover process of the stopped backend");
            let _ = nix::sys::signal::kill(Pid::from_raw(*pid), Signal::SIGKILL);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
