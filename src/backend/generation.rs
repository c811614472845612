//! One backend generation: a spawned process, the task that writes its
//! stdin, and the task that reads its stdout and notices its death.

use std::process::ExitStatus;
use std::time::{Duration, Instant};

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::sync::{mpsc, watch};
use tracing::{debug, warn};

use super::spawn::{spawn, Ahead, PreparedCommand, SpawnError};
use crate::procs;
use crate::relay::budget::{Budget, Permit};
use crate::relay::framing::{FrameReader, ReadItem};

/// How long after the process exits we still wait for its stdout to close.
/// Frames it wrote just before exiting are in the pipe; they must be routed
/// before the generation is declared lost, or an answered request would be
/// reported as crashed.
const DRAIN_AFTER_EXIT: Duration = Duration::from_millis(300);

/// How many of the backend's last stderr lines are kept for messages.
const TAIL_LINES: usize = 12;
/// Each kept line is cut at this many bytes.
const TAIL_LINE_BYTES: usize = 300;
// The sandbox's announcements of refused writes fit a kept line whole.
const _: () = assert!(TAIL_LINE_BYTES >= crate::policy::refused::MAX_ANNOUNCEMENT_BYTES);

/// The backend's last lines on stderr, for the messages that say why it
/// stopped.
#[derive(Debug, Default)]
struct Tail {
    lines: std::collections::VecDeque<String>,
    /// The line being read (bounded).
    partial: Vec<u8>,
}

impl Tail {
    /// Takes what was read; returns the lines it completed that may report
    /// a write the sandbox refused (see [`may_report_refusal`]).
    fn feed(&mut self, chunk: &[u8]) -> Vec<String> {
        let mut refusals = Vec::new();
        for piece in chunk.split_inclusive(|b| *b == b'\n') {
            let room = TAIL_LINE_BYTES.saturating_sub(self.partial.len());
            let content = piece.strip_suffix(b"\n").unwrap_or(piece);
            self.partial
                .extend_from_slice(&content[..content.len().min(room)]);
            if piece.ends_with(b"\n") {
                if let Some(line) = self.end_line() {
                    if may_report_refusal(&line) {
                        refusals.push(line);
                    }
                }
            }
        }
        refusals
    }

    fn end_line(&mut self) -> Option<String> {
        let line = String::from_utf8_lossy(&std::mem::take(&mut self.partial))
            .trim_end()
            .to_owned();
        if line.is_empty() {
            return None;
        }
        if self.lines.len() == TAIL_LINES {
            self.lines.pop_front();
        }
        self.lines.push_back(line.clone());
        Some(line)
    }

    fn take(&mut self) -> Vec<String> {
        self.end_line();
        self.lines.drain(..).collect()
    }
}

/// Whether a line of the agent's stderr may report a write the kernel
/// refused (the bridge reads which path, see `bridge::refusals`).
fn may_report_refusal(line: &str) -> bool {
    [
        "Read-only file system",
        "EROFS",
        "ermission denied",
        "peration not permitted",
    ]
    .iter()
    .any(|m| line.contains(m))
}

/// At most this many such lines are handed to the bridge per generation:
/// an agent that prints refusals in a loop costs nothing past them.
const MAX_REFUSAL_LINES: usize = 64;

/// What a generation reports to the bridge.
#[derive(Debug)]
pub enum BackendEvent {
    /// Frames, in order: what one read of the agent's stdout brought, with
    /// their share of the bytes in flight toward the editor.
    Frames(Vec<Vec<u8>>, Permit),
    TooLarge {
        prefix: Vec<u8>,
        size: usize,
    },
    /// A line of the agent's stderr that may report a write the sandbox
    /// refused it (its own state, which no tool call shows).
    RefusedOnStderr(String),
    /// The generation is gone: its stdout closed, or it exited. Sent once,
    /// after every frame it wrote.
    Lost {
        status: Option<ExitStatus>,
        /// Its last lines on stderr (passed on as they came, too).
        stderr_tail: Vec<String>,
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
    stdin: Option<mpsc::UnboundedSender<(Vec<u8>, Option<Permit>)>>,
    exited: watch::Receiver<bool>,
}

impl Generation {
    /// Starts `cmd`, in the launcher started `ahead` for it when that can
    /// run it (see [`Ahead`]).
    pub fn start(
        id: u64,
        cmd: &PreparedCommand,
        ahead: Option<Ahead>,
        max_frame_bytes: usize,
        events: EventSender,
        to_editor: Budget,
    ) -> Result<Generation, SpawnError> {
        let (spawned, handed) = match ahead.and_then(|a| a.run(&cmd.argv)) {
            Some((spawned, line)) => (spawned, Some(line)),
            None => (spawn(cmd)?, None),
        };
        let pid = spawned.pid;

        let (stdin_tx, mut stdin_rx) = mpsc::unbounded_channel::<(Vec<u8>, Option<Permit>)>();
        // Its command line goes before any frame, on the same pipe.
        if let Some(line) = handed {
            let _ = stdin_tx.send((line.into_bytes(), None));
        }
        let mut stdin = spawned.stdin;
        tokio::spawn(async move {
            while let Some((mut frame, permit)) = stdin_rx.recv().await {
                frame.push(b'\n');
                if let Err(e) = stdin.write_all(&frame).await {
                    debug!(generation = id, "backend stdin closed: {e}");
                    return;
                }
                // Written: its bytes are no longer in flight.
                drop(permit);
            }
            // Sender dropped: dropping `stdin` closes the pipe, which is the
            // polite way to ask an ACP agent to exit.
        });

        // Its stderr reaches ours as it comes (the editor's log), and its
        // last lines are kept for the message that says why it stopped.
        let tail = std::sync::Arc::new(std::sync::Mutex::new(Tail::default()));
        let (closed_tx, closed_rx) = tokio::sync::oneshot::channel::<()>();
        let mut stderr = spawned.stderr;
        let kept = tail.clone();
        let told = events.clone();
        tokio::spawn(async move {
            use tokio::io::AsyncReadExt;
            let mut ours = tokio::io::stderr();
            let mut buf = vec![0u8; 8192];
            let mut handed = 0;
            let mut announced = 0;
            loop {
                match stderr.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        let refusals = kept.lock().map(|mut t| t.feed(&buf[..n]));
                        for line in refusals.unwrap_or_default() {
                            // The sandbox's own word has a budget of its
                            // own: the agent's refusal lines do not use it
                            // up (a forged announcement does, which only
                            // hides the agent's own refusals).
                            let budget = match crate::policy::refused::announced(&line) {
                                Some(_) => &mut announced,
                                None => &mut handed,
                            };
                            if *budget < MAX_REFUSAL_LINES {
                                *budget += 1;
                                let _ = told.send((id, BackendEvent::RefusedOnStderr(line)));
                            }
                        }
                        let _ = ours.write_all(&buf[..n]).await;
                    }
                }
            }
            let _ = closed_tx.send(());
        });

        let (exited_tx, exited_rx) = watch::channel(false);
        // Widened for the first large frame (see `relay::pipes`).
        let widen = crate::relay::pipes::Widen::of(&spawned.stdout);
        let reader = FrameReader::new(
            BufReader::with_capacity(1 << 20, spawned.stdout),
            max_frame_bytes,
        );
        tokio::spawn(read_frames(Reading {
            id,
            reader,
            widen,
            child: spawned.child,
            events,
            to_editor,
            exited: exited_tx,
            stderr_closed: closed_rx,
            tail,
        }));

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
        self.send_carrying(frame, None)
    }

    /// As [`Generation::send`], the frame carrying its share of the bytes
    /// in flight toward the backend until it is written.
    pub fn send_carrying(&self, frame: Vec<u8>, permit: Option<Permit>) -> bool {
        self.stdin
            .as_ref()
            .is_some_and(|tx| tx.send((frame, permit)).is_ok())
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

/// What the task reading a generation's stdout owns.
struct Reading {
    id: u64,
    reader: FrameReader<BufReader<tokio::process::ChildStdout>>,
    /// The agent's stdout, widened for its first large frame.
    widen: crate::relay::pipes::Widen,
    child: tokio::process::Child,
    events: EventSender,
    to_editor: Budget,
    exited: watch::Sender<bool>,
    stderr_closed: tokio::sync::oneshot::Receiver<()>,
    tail: std::sync::Arc<std::sync::Mutex<Tail>>,
}

/// Reads the agent's frames and hands each read's worth on in one batch,
/// every frame with its share of the bytes in flight toward the editor;
/// notices the agent's exit; reports `Lost` once, after every frame it
/// wrote.
async fn read_frames(r: Reading) {
    let Reading {
        id,
        mut reader,
        mut widen,
        mut child,
        events,
        to_editor,
        exited,
        stderr_closed,
        tail,
    } = r;
    // Made once, not per frame: the exit, and the drain's deadline once it
    // exited.
    let mut exit = std::pin::pin!(child.wait());
    let mut drain = std::pin::pin!(tokio::time::sleep(Duration::ZERO));
    let mut status: Option<Option<ExitStatus>> = None;
    let exited_now = |s: std::io::Result<ExitStatus>,
                      drain: std::pin::Pin<&mut tokio::time::Sleep>| {
        let _ = exited.send(true);
        drain.reset(tokio::time::Instant::now() + DRAIN_AFTER_EXIT);
        Some(s.ok())
    };
    'reading: loop {
        let (frames, bytes, after) = tokio::select! {
            // What the agent wrote is read before its exit or the drain's
            // deadline is looked at: frames it wrote before exiting are
            // never dropped for a timer that ran out while the reader
            // waited for the editor.
            biased;
            item = reader.next() => gather(id, &mut reader, item),
            s = &mut exit, if status.is_none() => {
                status = exited_now(s, drain.as_mut());
                continue;
            }
            _ = &mut drain, if status.is_some() => {
                // Exited, but something it started still holds stdout open.
                break;
            }
        };
        if let Some(largest) = frames.iter().map(Vec::len).max() {
            widen.crossed(largest);
        }
        if !frames.is_empty() {
            // One share of the bytes in flight for the whole batch. While
            // the editor is behind, the agent waits with its stdout full;
            // its exit is still noticed meanwhile, so stopping it never
            // waits on the editor.
            let permit = match to_editor.try_take(bytes) {
                Some(p) => p,
                None => loop {
                    tokio::select! {
                        p = to_editor.take(bytes) => break p,
                        s = &mut exit, if status.is_none() => {
                            status = exited_now(s, drain.as_mut());
                        }
                    }
                },
            };
            let _ = events.send((id, BackendEvent::Frames(frames, permit)));
        }
        match after {
            After::More => {}
            After::TooLarge { prefix, size } => {
                let _ = events.send((id, BackendEvent::TooLarge { prefix, size }));
            }
            After::End => break 'reading,
        }
    }
    let status = match status {
        Some(s) => s,
        None => {
            // Stdout closed first; the exit follows (or the bridge's stop
            // kills it).
            let s = exit.await.ok();
            let _ = exited.send(true);
            s
        }
    };
    // Its last words: stderr closes when it (and whatever it left holding
    // stderr) is gone; not waited on for long.
    let _ = tokio::time::timeout(DRAIN_AFTER_EXIT, stderr_closed).await;
    let stderr_tail = tail.lock().map(|mut t| t.take()).unwrap_or_default();
    let _ = events.send((
        id,
        BackendEvent::Lost {
            status,
            stderr_tail,
        },
    ));
}

/// What ended a batch.
enum After {
    /// Nothing more whole in the buffer.
    More,
    /// An oversized frame, reported after the frames before it.
    TooLarge { prefix: Vec<u8>, size: usize },
    /// Stdout closed (or failed).
    End,
}

/// The frame just read and every frame already whole in the buffer behind
/// it, their total size, and what ended the batch.
fn gather(
    id: u64,
    reader: &mut FrameReader<BufReader<tokio::process::ChildStdout>>,
    first: std::io::Result<ReadItem>,
) -> (Vec<Vec<u8>>, usize, After) {
    let (mut frames, mut bytes) = (Vec::new(), 0usize);
    let mut next = Some(first);
    while let Some(item) = next.take() {
        match item {
            Ok(ReadItem::Frame(frame)) => {
                bytes += frame.len();
                frames.push(frame);
            }
            Ok(ReadItem::TooLarge { prefix, size }) => {
                return (frames, bytes, After::TooLarge { prefix, size })
            }
            Ok(ReadItem::Eof) => return (frames, bytes, After::End),
            Err(e) => {
                warn!(generation = id, "reading the backend's stdout failed: {e}");
                return (frames, bytes, After::End);
            }
        }
        next = reader.next_buffered().map(Ok);
    }
    (frames, bytes, After::More)
}

/// Kills every descendant of the bridge but `spare` and theirs: at the
/// point this runs, the only other descendants are the stopped
/// generation's (the next one is not spawned yet). Returns what survived.
async fn kill_all_descendants(main_pid: i32, spare: &[i32]) -> Vec<i32> {
    let give_up = Instant::now() + Duration::from_secs(3);
    let mut not_ours = vec![main_pid];
    not_ours.extend_from_slice(spare);
    // Two looks in a row must find nothing: one can miss a process that a
    // list moved past as another ended (`procs::descendants`).
    let mut none_before = false;
    loop {
        procs::reap_zombie_children(&not_ours);
        let tree = procs::my_descendants();
        let kept: Vec<i32> = spare
            .iter()
            .flat_map(|s| procs::descendants_in(&tree, *s))
            .map(|p| p.pid)
            .chain(spare.iter().copied())
            .collect();
        let alive: Vec<i32> = tree
            .iter()
            .filter(|p| !p.is_gone() && !kept.contains(&p.pid))
            .map(|p| p.pid)
            .collect();
        if alive.is_empty() {
            if none_before {
                return alive;
            }
            none_before = true;
            continue;
        }
        none_before = false;
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
