//! Reading a blocking pipe or socket through the reactor, without making
//! it non-blocking.
//!
//! The editor's stdin is a file description the bridge shares with
//! whatever started it, so switching it to O_NONBLOCK would change it for
//! them too (and would have to be undone on every way out). It stays
//! blocking; epoll reports readiness on blocking descriptors as well, and
//! a read never waits because it asks only for what FIONREAD says is
//! there (the bridge is the only reader). Anything but a pipe or a stream socket
//! (a terminal, a regular file) is read on a thread instead.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, Interest, ReadBuf};

pub struct Polled {
    fd: AsyncFd<OwnedFd>,
}

impl Polled {
    /// `fd` read through the reactor, or none where it cannot be (it is
    /// then left as it was).
    pub fn new(fd: OwnedFd) -> Option<Polled> {
        use nix::sys::stat::{fstat, SFlag};
        let kind = SFlag::from_bits_truncate(fstat(&fd).ok()?.st_mode) & SFlag::S_IFMT;
        let stream_socket = || {
            use nix::sys::socket::{getsockopt, sockopt::SockType, SockType as Kind};
            getsockopt(&fd, SockType).is_ok_and(|k| k == Kind::Stream)
        };
        // A datagram socket's empty record reads as 0 bytes, which is not
        // its end: only byte streams are read here.
        if kind != SFlag::S_IFIFO && !(kind == SFlag::S_IFSOCK && stream_socket()) {
            return None;
        }
        // SAFETY: an OwnedFd is open, stays open until the AsyncFd (its
        // owner) drops it, and always returns the same descriptor.
        let fd = unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) }.ok()?;
        Some(Polled { fd })
    }
}

impl AsyncRead for Polled {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        loop {
            let mut guard = ready!(self.fd.poll_read_ready(cx))?;
            let fd = self.fd.get_ref();
            let queued = bytes_queued(fd)?;
            if queued > 0 {
                let room = buf.initialize_unfilled();
                let want = room.len().min(queued);
                let n = loop {
                    match nix::unistd::read(fd, &mut room[..want]) {
                        Err(nix::errno::Errno::EINTR) => continue,
                        other => break other?,
                    }
                };
                buf.advance(n);
                return Poll::Ready(Ok(()));
            }
            // Nothing queued: the other end is gone (end of file, which a
            // read returns at once), or the readiness is spent. Clearing it
            // is safe from a race: a new edge since the guard was taken
            // keeps it set; and a hang-up (a pipe's last writer gone, a
            // socket's peer shut down) stays set once seen.
            if guard.ready().is_read_closed() {
                return Poll::Ready(Ok(()));
            }
            guard.clear_ready();
        }
    }
}

/// How many bytes wait to be read (FIONREAD).
fn bytes_queued(fd: &OwnedFd) -> io::Result<usize> {
    let mut n: libc::c_int = 0;
    // SAFETY: FIONREAD writes one int to the pointer, which points at `n`
    // for the duration of the call; the descriptor is owned.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), libc::FIONREAD, &mut n) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n.max(0) as usize)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use tokio::io::AsyncReadExt;

    #[tokio::test]
    async fn a_socket_whose_peer_shuts_down_writing_reads_to_its_end() {
        let (ours, mut theirs) = std::os::unix::net::UnixStream::pair().unwrap();
        let mut polled = Polled::new(OwnedFd::from(ours)).expect("a socket is polled");
        theirs.write_all(b"last words\n").unwrap();
        theirs.shutdown(std::net::Shutdown::Write).unwrap();
        let mut got = String::new();
        polled.read_to_string(&mut got).await.unwrap();
        assert_eq!(got, "last words\n");
        drop(theirs);
    }

    #[tokio::test]
    async fn a_pipe_is_read_through_the_reactor_and_stays_blocking() {
        let (rx, mut tx) = std::io::pipe().unwrap();
        let rx = OwnedFd::from(rx);
        let flags = nix::fcntl::fcntl(&rx, nix::fcntl::FcntlArg::F_GETFL).unwrap();
        let mut polled = Polled::new(rx.try_clone().unwrap()).expect("a pipe is polled");
        let writer = std::thread::spawn(move || {
            for i in 0..1000 {
                writeln!(tx, "line {i}").unwrap();
            }
        });
        let mut got = String::new();
        polled.read_to_string(&mut got).await.unwrap();
        writer.join().unwrap();
        assert_eq!(got.lines().count(), 1000);
        assert_eq!(
            nix::fcntl::fcntl(&rx, nix::fcntl::FcntlArg::F_GETFL).unwrap(),
            flags,
            "the shared file description's flags changed"
        );
    }

    #[test]
    fn a_regular_file_is_left_to_a_thread() {
        let file = tempfile::tempfile().unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let _enter = rt.enter();
        assert!(Polled::new(file.into()).is_none());
    }
}
