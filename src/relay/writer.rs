//! Frames toward a peer, written by a thread of its own in batches.
//!
//! The editor's stdout is a blocking descriptor the bridge shares with the
//! editor, so it is not switched to non-blocking mode for the reactor.
//! Handing each write to tokio's blocking pool instead cost two thread
//! hand-offs per frame (issue 14's profile: the relay spent its time
//! waking pool threads). Here the event loop only appends to a queue and
//! wakes the writer when it sleeps; the writer takes everything queued at
//! once and writes it with vectored writes, so a busy stream costs one
//! wake-up and a few system calls per batch instead of per frame.
//!
//! Small frames are copied, with their newline, into buffers the two
//! threads pass back and forth, and the frames themselves are freed where
//! they were allocated: freeing thousands of small allocations on another
//! thread made both threads contend for the allocator's lock. Large frames
//! are queued as they are (a copy would cost more than it saves). The
//! permits of a batch are merged, so releasing them is one step.

use std::io::{IoSlice, Write};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use tokio::sync::oneshot;

use super::budget::Permit;

/// At most this many slices per `writev` (Linux's IOV_MAX is 1024).
const MAX_SLICES: usize = 1024;

/// Frames up to this size are copied into a batch buffer; larger ones are
/// queued as they are.
const COPY_BELOW: usize = 64 << 10;

/// Batch buffers larger than this are freed rather than kept for reuse.
const SPARE_AT_MOST: usize = 1 << 20;

/// A run of queued bytes, in order.
enum Segment {
    /// Small frames, each with its newline.
    Copied(Vec<u8>),
    /// One large frame, without its newline.
    Frame(Vec<u8>),
}

/// Keeps a written batch buffer, emptied, among `spare` for the next
/// frames (a few, none too large); anything else is dropped.
fn recycle(spare: &mut Vec<Vec<u8>>, segment: Segment) {
    if let Segment::Copied(mut buf) = segment {
        if spare.len() < 2 && buf.capacity() <= SPARE_AT_MOST {
            buf.clear();
            spare.push(buf);
        }
    }
}

impl Segment {
    /// Its bytes on the wire (a large frame's newline included).
    fn len(&self) -> usize {
        match self {
            Segment::Copied(buf) => buf.len(),
            Segment::Frame(frame) => frame.len() + 1,
        }
    }
}

#[derive(Default)]
struct Queue {
    segments: Vec<Segment>,
    /// The queued frames' shares of the bytes in flight, merged per budget.
    permits: Vec<Permit>,
    /// Emptied batch buffers, for the next frames.
    spare: Vec<Vec<u8>>,
    /// No more frames will come: write what is queued, then end.
    closing: bool,
    /// The writer is waiting for frames (a push must wake it).
    idle: bool,
    /// A write failed: frames are dropped from now on.
    failed: bool,
    /// The bytes staged (on the loop's side only).
    bytes: usize,
}

impl Queue {
    fn stage(&mut self, frame: Vec<u8>, permit: Option<Permit>) {
        self.bytes += frame.len() + 1;
        if frame.len() < COPY_BELOW {
            self.push(&frame);
        } else {
            self.segments.push(Segment::Frame(frame));
        }
        if let Some(permit) = permit {
            self.carry(permit);
        }
    }

    /// Drops the first `n` bytes of what is queued (written elsewhere).
    fn consume(&mut self, mut n: usize) {
        let mut done = 0;
        for segment in &mut self.segments {
            let len = segment.len();
            if n >= len {
                n -= len;
                done += 1;
                continue;
            }
            match segment {
                Segment::Copied(buf) => drop(buf.drain(..n)),
                // Short of its newline: n is at most the frame's length.
                Segment::Frame(frame) => drop(frame.drain(..n)),
            }
            break;
        }
        for segment in self.segments.drain(..done) {
            recycle(&mut self.spare, segment);
        }
    }

    fn push(&mut self, frame: &[u8]) {
        if let Some(Segment::Copied(buf)) = self.segments.last_mut() {
            buf.extend_from_slice(frame);
            buf.push(b'\n');
            return;
        }
        let mut buf = self.spare.pop().unwrap_or_default();
        buf.extend_from_slice(frame);
        buf.push(b'\n');
        self.segments.push(Segment::Copied(buf));
    }

    fn carry(&mut self, permit: Permit) {
        match self
            .permits
            .iter_mut()
            .find(|p| Arc::ptr_eq(p.semaphore(), permit.semaphore()))
        {
            Some(held) => held.merge(permit),
            None => self.permits.push(permit),
        }
    }
}

struct Shared {
    queue: Mutex<Queue>,
    wake: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        // A panic while holding the lock leaves the queue consistent (every
        // change is one assignment), so a poisoned lock is taken as is.
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The event loop's handle on a writer thread. Frames are staged here,
/// on the loop's side, and handed to the writer by [`FrameWriter::flush`]:
/// one lock and at most one wake-up for everything a burst produced.
pub struct FrameWriter {
    shared: Arc<Shared>,
    ended: Option<oneshot::Receiver<()>>,
    staged: std::cell::RefCell<Queue>,
    /// Where the loop may write itself, never waiting (see `nowait`).
    direct: Option<nowait::Direct>,
    /// The output, widened for the first large frame (see `pipes`).
    widen: std::cell::RefCell<super::pipes::Widen>,
}

/// A flush of at most this many bytes, while the writer has nothing in
/// hand, is written from the loop's thread if the kernel takes it without
/// waiting: an answer then reaches the editor without a thread hand-off.
/// Larger batches (a stream) go to the writer, which works while the loop
/// goes on.
const DIRECT_AT_MOST: usize = 64 << 10;

/// Staged frames are handed over without waiting for a flush past this
/// many bytes, so the writer works while the loop still produces.
const STAGE_AT_MOST: usize = 256 << 10;

/// Resolves with the error when a write fails (the peer left: EPIPE), and
/// never otherwise.
pub struct WriteFailed(Option<oneshot::Receiver<std::io::Error>>);

impl WriteFailed {
    pub async fn wait(&mut self) -> std::io::Error {
        if let Some(rx) = self.0.as_mut() {
            if let Ok(e) = rx.await {
                self.0 = None;
                return e;
            }
            self.0 = None;
        }
        std::future::pending().await
    }
}

impl FrameWriter {
    /// Starts a thread that writes the frames sent to it to `out`, each
    /// followed by a newline, in the order they were sent.
    pub fn spawn<W: Write + Send + 'static>(
        name: &str,
        out: W,
    ) -> std::io::Result<(FrameWriter, WriteFailed)> {
        Self::spawn_with(name, out, None, Default::default())
    }

    /// As [`FrameWriter::spawn`], with small flushes written straight to
    /// `out` when the writer is idle and the kernel can take them at once
    /// (see [`DIRECT_AT_MOST`]). Where `out` is a pipe, the first large
    /// frame widens it (see `pipes`).
    pub fn spawn_direct(
        name: &str,
        out: std::fs::File,
    ) -> std::io::Result<(FrameWriter, WriteFailed)> {
        let direct = nowait::Direct::new(&out)?;
        let widen = super::pipes::Widen::of(&out);
        Self::spawn_with(name, out, direct, widen)
    }

    fn spawn_with<W: Write + Send + 'static>(
        name: &str,
        out: W,
        direct: Option<nowait::Direct>,
        widen: super::pipes::Widen,
    ) -> std::io::Result<(FrameWriter, WriteFailed)> {
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue::default()),
            wake: Condvar::new(),
        });
        let (ended_tx, ended_rx) = oneshot::channel();
        let (failed_tx, failed_rx) = oneshot::channel();
        let theirs = shared.clone();
        std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                if let Err(e) = write_until_closed(&theirs, out) {
                    let _ = failed_tx.send(e);
                }
                let _ = ended_tx.send(());
            })?;
        Ok((
            FrameWriter {
                shared,
                ended: Some(ended_rx),
                staged: Default::default(),
                direct,
                widen: std::cell::RefCell::new(widen),
            },
            WriteFailed(Some(failed_rx)),
        ))
    }

    /// Stages one frame (without its newline), carrying its share of the
    /// bytes in flight until it is written; it goes to the writer with the
    /// next [`FrameWriter::flush`] (or at once, past a size). False once a
    /// write failed or the writer was closed: the frame is dropped, its
    /// permit released.
    pub fn send(&self, frame: Vec<u8>, permit: Option<Permit>) -> bool {
        let mut staged = self.staged.borrow_mut();
        if staged.failed {
            return false;
        }
        self.widen.borrow_mut().crossed(frame.len());
        staged.stage(frame, permit);
        if staged.bytes >= STAGE_AT_MOST {
            drop(staged);
            return self.flush();
        }
        true
    }

    /// Holds `permit` until everything staged before it is written: the
    /// share of a frame that sent nothing on, whose batch went ahead.
    pub fn carry(&self, permit: Permit) {
        self.staged.borrow_mut().carry(permit);
    }

    /// Hands everything staged to the writer, waking it if it sleeps.
    /// False once a write failed (what was staged is dropped).
    pub fn flush(&self) -> bool {
        let mut staged = self.staged.borrow_mut();
        if staged.segments.is_empty() && staged.permits.is_empty() {
            return !staged.failed;
        }
        let mut q = self.shared.lock();
        if q.failed || q.closing {
            staged.failed = true;
            staged.segments.clear();
            staged.permits.clear();
            return false;
        }
        if staged.segments.is_empty() && q.idle && q.segments.is_empty() {
            // Shares only, and nothing unwritten ahead of them.
            staged.permits.clear();
            return true;
        }
        if let (true, true, Some(direct)) = (q.idle, q.segments.is_empty(), &self.direct) {
            // The writer has nothing in hand (and cannot start while the
            // lock is held), so nothing can come out of order.
            if staged.bytes <= DIRECT_AT_MOST {
                let written = direct.try_write(&staged.segments);
                staged.consume(written);
                if staged.segments.is_empty() {
                    // Written: their bytes are no longer in flight.
                    staged.permits.clear();
                    staged.bytes = 0;
                    return true;
                }
            }
        }
        let wake = q.idle;
        q.idle = false;
        // Whole buffers change hands; the writer's spare ones come back.
        q.segments.append(&mut staged.segments);
        for permit in staged.permits.drain(..) {
            q.carry(permit);
        }
        staged.bytes = 0;
        if staged.spare.is_empty() {
            staged.spare.append(&mut q.spare);
        }
        drop(q);
        if wake {
            self.shared.wake.notify_one();
        }
        true
    }

    /// No more frames: what is queued is still written. Waits until the
    /// writer is done.
    pub async fn close(mut self) {
        self.flush();
        self.shared.lock().closing = true;
        self.shared.wake.notify_one();
        if let Some(ended) = self.ended.take() {
            let _ = ended.await;
        }
    }
}

impl Drop for FrameWriter {
    fn drop(&mut self) {
        self.flush();
        self.shared.lock().closing = true;
        self.shared.wake.notify_one();
    }
}

fn write_until_closed<W: Write>(shared: &Shared, mut out: W) -> std::io::Result<()> {
    let mut batch: Vec<Segment> = Vec::new();
    let mut permits: Vec<Permit> = Vec::new();
    loop {
        {
            let mut q = shared.lock();
            // The buffers of the last batch go back, emptied, for reuse.
            for segment in batch.drain(..) {
                recycle(&mut q.spare, segment);
            }
            while q.segments.is_empty() && !q.closing {
                // Shares handed over after the last batch was taken: what
                // came before them is written now.
                q.permits.clear();
                q.idle = true;
                q = shared.wake.wait(q).unwrap_or_else(|p| p.into_inner());
            }
            q.idle = false;
            if q.segments.is_empty() {
                return Ok(());
            }
            std::mem::swap(&mut batch, &mut q.segments);
            std::mem::swap(&mut permits, &mut q.permits);
        }
        if let Err(e) = write_batch(&mut out, &batch) {
            let mut q = shared.lock();
            q.failed = true;
            // Nothing queued will be written: its bytes are no longer in
            // flight, so the readers behind it are not left waiting.
            q.segments.clear();
            q.permits.clear();
            return Err(e);
        }
        // Written: their bytes are no longer in flight.
        permits.clear();
    }
}

/// Writes every segment of `batch` (a newline after each large frame),
/// with as few vectored writes as the kernel allows.
fn write_batch<W: Write>(out: &mut W, batch: &[Segment]) -> std::io::Result<()> {
    // The pieces to write, in order.
    let mut pieces: Vec<&[u8]> = Vec::with_capacity(batch.len() * 2);
    for segment in batch {
        match segment {
            Segment::Copied(bytes) => pieces.push(bytes),
            Segment::Frame(bytes) => {
                pieces.push(bytes);
                pieces.push(b"\n");
            }
        }
    }
    // Where the next write starts: a piece, and an offset into it.
    let (mut piece, mut offset) = (0usize, 0usize);
    let mut slices: Vec<IoSlice<'_>> = Vec::with_capacity(MAX_SLICES.min(pieces.len()));
    while piece < pieces.len() {
        slices.clear();
        slices.push(IoSlice::new(&pieces[piece][offset..]));
        slices.extend(
            pieces[piece + 1..]
                .iter()
                .take(MAX_SLICES - 1)
                .map(|p| IoSlice::new(p)),
        );
        let mut written = match out.write_vectored(&slices) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        while written > 0 {
            let left = pieces[piece].len() - offset;
            if written >= left {
                written -= left;
                piece += 1;
                offset = 0;
            } else {
                offset += written;
                written = 0;
            }
        }
        // Pieces emptied exactly are passed over.
        while piece < pieces.len() && pieces[piece].len() == offset {
            piece += 1;
            offset = 0;
        }
    }
    out.flush()
}

/// Writes that never wait: `pwritev2(RWF_NOWAIT)`, which pipes honour on
/// recent Linux kernels; where a file does not, the first try says so and
/// the fast path is off for good.
mod nowait {
    use super::Segment;

    #[cfg(target_os = "linux")]
    pub struct Direct {
        fd: std::os::fd::OwnedFd,
        usable: std::cell::Cell<bool>,
    }

    #[cfg(target_os = "linux")]
    impl Direct {
        pub fn new(out: &std::fs::File) -> std::io::Result<Option<Direct>> {
            Ok(Some(Direct {
                fd: out.try_clone()?.into(),
                usable: std::cell::Cell::new(true),
            }))
        }

        /// Writes as much of `segments` as the kernel takes without
        /// waiting; how many bytes that was.
        pub fn try_write(&self, segments: &[Segment]) -> usize {
            use std::os::fd::AsRawFd;
            if !self.usable.get() {
                return 0;
            }
            let slice = |bytes: &[u8]| libc::iovec {
                iov_base: bytes.as_ptr() as *mut libc::c_void,
                iov_len: bytes.len(),
            };
            let mut iov = Vec::with_capacity(segments.len() * 2);
            for segment in segments.iter().take(super::MAX_SLICES / 2) {
                match segment {
                    Segment::Copied(buf) => iov.push(slice(buf)),
                    Segment::Frame(frame) => {
                        iov.push(slice(frame));
                        iov.push(slice(b"\n"));
                    }
                }
            }
            // SAFETY: every iovec points into a buffer borrowed from
            // `segments` (or a static newline) that outlives the call and
            // is only read; the count is the vector's length (at most
            // IOV_MAX); offset -1 writes at the file's position, as
            // write(2) does.
            let n = unsafe {
                libc::pwritev2(
                    self.fd.as_raw_fd(),
                    iov.as_ptr(),
                    iov.len() as libc::c_int,
                    -1,
                    libc::RWF_NOWAIT,
                )
            };
            if n >= 0 {
                return n as usize;
            }
            match std::io::Error::last_os_error().raw_os_error() {
                // Full, or interrupted: the writer thread waits for room.
                Some(libc::EAGAIN | libc::EINTR) => {}
                // Anything else (the editor left: EPIPE) is the writer's
                // to meet and report; an older kernel's pipe or a terminal
                // cannot be written without waiting: never tried again.
                _ => self.usable.set(false),
            }
            0
        }
    }

    #[cfg(not(target_os = "linux"))]
    pub struct Direct;

    #[cfg(not(target_os = "linux"))]
    impl Direct {
        pub fn new(_: &std::fs::File) -> std::io::Result<Option<Direct>> {
            Ok(None)
        }

        pub fn try_write(&self, _: &[Segment]) -> usize {
            0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Takes at most `step` bytes per write, as a full pipe does.
    struct Trickle {
        got: Arc<Mutex<Vec<u8>>>,
        step: usize,
        fail_after: Option<usize>,
    }

    impl Write for Trickle {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.write_vectored(&[IoSlice::new(buf)])
        }
        fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> std::io::Result<usize> {
            let mut got = self.got.lock().unwrap();
            if self.fail_after.is_some_and(|n| got.len() >= n) {
                return Err(std::io::ErrorKind::BrokenPipe.into());
            }
            let mut room = self.step;
            let mut n = 0;
            for b in bufs {
                let k = b.len().min(room);
                got.extend_from_slice(&b[..k]);
                room -= k;
                n += k;
                if room == 0 {
                    break;
                }
            }
            Ok(n)
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// Small frames, and every 500th one larger than `COPY_BELOW` (queued
    /// as it is rather than copied).
    fn frames(n: usize) -> Vec<Vec<u8>> {
        (0..n)
            .map(|i| {
                let pad = if i % 500 == 499 {
                    COPY_BELOW + i
                } else {
                    i % 37
                };
                format!("{{\"n\":{i},\"pad\":\"{}\"}}", "x".repeat(pad)).into_bytes()
            })
            .collect()
    }

    #[tokio::test]
    async fn partial_writes_keep_every_byte_in_order() {
        for step in [1, 7, 64, 4096, 1 << 20] {
            let got = Arc::new(Mutex::new(Vec::new()));
            let out = Trickle {
                got: got.clone(),
                step,
                fail_after: None,
            };
            let (w, _failed) = FrameWriter::spawn("test-writer", out).unwrap();
            let sent = frames(2000);
            for f in &sent {
                assert!(w.send(f.clone(), None));
            }
            w.close().await;
            let mut want = Vec::new();
            for f in &sent {
                want.extend_from_slice(f);
                want.push(b'\n');
            }
            assert_eq!(*got.lock().unwrap(), want, "step {step}");
        }
    }

    /// A real pipe: small flushes go out from the caller's thread, a full
    /// pipe hands them to the writer, and the reader sees every byte in
    /// order either way.
    #[tokio::test]
    async fn direct_writes_and_the_writer_keep_one_order() {
        use std::io::Read;
        let (rx, tx) = std::io::pipe().unwrap();
        let (w, _failed) =
            FrameWriter::spawn_direct("test-writer", std::os::fd::OwnedFd::from(tx).into())
                .unwrap();
        let sent = frames(3000);
        let reader = std::thread::spawn(move || {
            let mut rx = rx;
            let mut got = Vec::new();
            rx.read_to_end(&mut got).unwrap();
            got
        });
        for (i, f) in sent.iter().enumerate() {
            assert!(w.send(f.clone(), None));
            // Some flushes alone (small, direct), some in bursts.
            if i % 7 != 0 {
                assert!(w.flush());
            }
        }
        w.close().await;
        let mut want = Vec::new();
        for f in &sent {
            want.extend_from_slice(f);
            want.push(b'\n');
        }
        assert!(reader.join().unwrap() == want, "bytes lost or reordered");
    }

    #[tokio::test]
    async fn a_failed_write_is_reported_and_releases_what_was_queued() {
        let budget = crate::relay::budget::Budget::new(1 << 20);
        let got = Arc::new(Mutex::new(Vec::new()));
        let out = Trickle {
            got,
            step: 16,
            fail_after: Some(100),
        };
        let (w, mut failed) = FrameWriter::spawn("test-writer", out).unwrap();
        for f in frames(500) {
            let permit = budget.take(f.len()).await;
            w.send(f, Some(permit));
        }
        assert!(w.flush());
        let e = failed.wait().await;
        assert_eq!(e.kind(), std::io::ErrorKind::BrokenPipe);
        w.send(b"late".to_vec(), None);
        assert!(!w.flush(), "a frame after the failure was taken");
        assert!(!w.send(b"later".to_vec(), None));
        w.close().await;
        assert_eq!(budget.available(), 1 << 20, "permits were kept");
    }
}
