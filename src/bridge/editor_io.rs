//! The editor's side of the wire, never through tokio's blocking pool
//! (one thread hand-off per read or write: issue 14's profile).
//!
//! fds 0 and 1 are blocking descriptors whose file descriptions the editor
//! (or whatever started the bridge) may share, so they are left as they
//! are: no O_NONBLOCK, nothing to restore on exit (but fd 1's pipe may be
//! widened for large frames, see `relay::pipes`). Stdin, when a pipe or a
//! socket, is read on the loop's thread through the reactor with reads
//! that cannot wait (`relay::polled`), else on a thread of its own. Stdout
//! is written by a thread of its own in batches; a small answer while that
//! thread is idle goes out at once from the loop's thread with a write
//! that cannot wait (`relay::writer`).

use std::os::fd::AsFd;

use tokio::sync::{mpsc, oneshot};
use tracing::warn;

use super::EditorEvent;
use crate::relay::budget::Budget;
use crate::relay::framing::{BlockingFrameReader, ReadItem};
use crate::relay::writer::{FrameWriter, WriteFailed};

/// How much of stdin one read takes.
const READ_BUFFER: usize = 1 << 20;

/// Starts the thread that writes frames to stdout.
pub(super) fn start_writer() -> std::io::Result<(FrameWriter, WriteFailed)> {
    let stdout = std::fs::File::from(std::io::stdout().as_fd().try_clone_to_owned()?);
    FrameWriter::spawn_direct("editor-writer", stdout)
}

/// Where the editor's frames come from: stdin read through the reactor
/// where it is a pipe or a stream socket (see `relay::polled`), else read on a
/// thread of its own that hands each frame over.
enum Source {
    #[cfg(target_os = "linux")]
    Polled(crate::relay::framing::FrameReader<tokio::io::BufReader<crate::relay::polled::Polled>>),
    Thread(mpsc::Receiver<std::io::Result<ReadItem>>),
}

impl Source {
    fn open(max_frame_bytes: usize) -> std::io::Result<Source> {
        let stdin = std::io::stdin().as_fd().try_clone_to_owned()?;
        #[cfg(target_os = "linux")]
        if let Some(polled) = crate::relay::polled::Polled::new(stdin.try_clone()?) {
            return Ok(Source::Polled(crate::relay::framing::FrameReader::new(
                tokio::io::BufReader::with_capacity(READ_BUFFER, polled),
                max_frame_bytes,
            )));
        }
        // One frame handed over at a time: the thread waits while the loop
        // waits for room, so nothing piles up between them.
        let (tx, rx) = mpsc::channel(1);
        std::thread::Builder::new()
            .name("editor-reader".into())
            .spawn(move || {
                let file = std::fs::File::from(stdin);
                let mut reader = BlockingFrameReader::new(file, READ_BUFFER, max_frame_bytes);
                loop {
                    let item = reader.read_frame();
                    let end = !matches!(item, Ok(ReadItem::Frame(_) | ReadItem::TooLarge { .. }));
                    if tx.blocking_send(item).is_err() || end {
                        return;
                    }
                }
            })?;
        Ok(Source::Thread(rx))
    }

    async fn next(&mut self) -> std::io::Result<ReadItem> {
        match self {
            #[cfg(target_os = "linux")]
            Source::Polled(reader) => reader.next().await,
            Source::Thread(rx) => rx.recv().await.unwrap_or(Ok(ReadItem::Eof)),
        }
    }
}

/// Starts the task that reads the editor's frames and sends them to the
/// loop, each with its share of the bytes in flight toward the backend. It
/// ends after stdin's end (or a read error), with `Closed`.
pub(super) fn start_reader(
    max_frame_bytes: usize,
    to_backend: Budget,
    events: mpsc::Sender<EditorEvent>,
) -> std::io::Result<()> {
    let mut source = Source::open(max_frame_bytes)?;
    let mut hangup = stdin_hangup_watch();
    tokio::spawn(async move {
        let mut hung_up = false;
        loop {
            let event = match source.next().await {
                Ok(ReadItem::Frame(bytes)) => {
                    // Waits while the backend is behind: the editor's writes
                    // then block on a full pipe. An editor that hangs up
                    // meanwhile is not kept waiting: what it sent is read to
                    // the end, and the bridge ends.
                    let permit = match to_backend.try_take(bytes.len()) {
                        Some(p) => Some(p),
                        None if hung_up => None,
                        None => tokio::select! {
                            p = to_backend.take(bytes.len()) => Some(p),
                            _ = hung_up_now(&mut hangup) => None,
                        },
                    };
                    hung_up |= permit.is_none();
                    EditorEvent::Frame(bytes, permit)
                }
                Ok(ReadItem::TooLarge { prefix, size }) => EditorEvent::TooLarge { prefix, size },
                Ok(ReadItem::Eof) => EditorEvent::Closed,
                Err(e) => {
                    warn!("reading from the editor failed: {e}");
                    EditorEvent::Closed
                }
            };
            let closed = matches!(event, EditorEvent::Closed);
            if events.send(event).await.is_err() || closed {
                return;
            }
        }
    });
    Ok(())
}

/// A watch on this process's stdin for the editor hanging up (its end of
/// the pipe closed), which shows even while unread frames are still in
/// the pipe: a thread of its own waits in poll(2) for POLLHUP alone (no
/// readiness for reading is asked, so unread data never wakes it). Where
/// stdin is a file it never fires, and EOF says the same.
fn stdin_hangup_watch() -> Option<oneshot::Receiver<()>> {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    let fd = std::io::stdin().as_fd().try_clone_to_owned().ok()?;
    let (tx, rx) = oneshot::channel();
    std::thread::Builder::new()
        .name("stdin-hangup".into())
        .spawn(move || loop {
            let mut fds = [PollFd::new(fd.as_fd(), PollFlags::empty())];
            match poll(&mut fds, PollTimeout::NONE) {
                Ok(_)
                    if fds[0].revents().is_some_and(|r| {
                        r.intersects(PollFlags::POLLHUP | PollFlags::POLLERR | PollFlags::POLLNVAL)
                    }) =>
                {
                    let _ = tx.send(());
                    return;
                }
                Ok(_) | Err(nix::errno::Errno::EINTR) => {}
                Err(_) => return,
            }
        })
        .ok()?;
    Some(rx)
}

/// Resolves when the editor hangs up; never without a watch (or once the
/// watch gave up).
async fn hung_up_now(watch: &mut Option<oneshot::Receiver<()>>) {
    if let Some(rx) = watch.as_mut() {
        if rx.await.is_ok() {
            return;
        }
        *watch = None;
    }
    std::future::pending().await
}
