//! Connections the table refuses, put to the user: the proxy asks the
//! bridge over a Unix socket, the bridge asks the editor
//! (`session/request_permission`), and the answer comes back the same
//! way. One connection per question, one JSON line each way; anything
//! that goes wrong reads as "no".
//!
//! The socket is in the abstract namespace, under a name drawn for each
//! arming: no path to outgrow the 108 bytes a socket address holds (a long
//! home directory would), no file to cover, and abstract names belong to a
//! network namespace, so nothing inside the sandbox's can reach it. Only
//! a process outside the sandbox's network may ask: the bridge takes
//! questions from its own user in its own network namespace (the proxy),
//! never from anyone else, who could otherwise fill the editor with
//! prompts of their choosing. On macOS the proxy runs in the bridge's own
//! process and hands its questions over in it ([`Questions`]); only
//! clients that give the proxy's credentials get that far.

use std::net::IpAddr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{mpsc, oneshot};

use crate::policy::network::Zone;

pub use crate::confine::network_asks_name as new_name;

#[cfg(target_os = "linux")]
fn address(name: &str) -> std::io::Result<std::os::unix::net::SocketAddr> {
    use std::os::linux::net::SocketAddrExt;
    std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())
}

/// Listens on the abstract socket `name` (Linux: the only platform whose
/// sandbox has a proxy that asks).
pub fn listen(name: &str) -> std::io::Result<UnixListener> {
    #[cfg(target_os = "linux")]
    {
        let listener = std::os::unix::net::UnixListener::bind_addr(&address(name)?)?;
        listener.set_nonblocking(true)?;
        UnixListener::from_std(listener)
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = name;
        Err(std::io::Error::from(std::io::ErrorKind::Unsupported))
    }
}

async fn connect(name: &str) -> std::io::Result<UnixStream> {
    #[cfg(target_os = "linux")]
    {
        let addr = address(name)?;
        // A local connect does not wait on anyone: no need for the pool.
        let stream = std::os::unix::net::UnixStream::connect_addr(&addr)?;
        stream.set_nonblocking(true)?;
        UnixStream::from_std(stream)
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = name;
        Err(std::io::Error::from(std::io::ErrorKind::Unsupported))
    }
}

/// How long the proxy waits for the user; the connection waits with it.
const ANSWER_WITHIN: Duration = Duration::from_secs(120);
const MAX_LINE: u64 = 8 * 1024;

/// A refused connection, as the proxy saw it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ask {
    /// As the client named it (a name or an address).
    pub host: String,
    pub port: u16,
    /// Where it would have gone.
    pub addr: IpAddr,
    pub zone: Zone,
    /// The refusal, with how to allow it in the config.
    pub why: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reply {
    pub allow: bool,
    /// The same answer holds for this destination from now on (the proxy
    /// stops asking): allowed for the bridge's lifetime, or never.
    pub remember: bool,
}

impl Reply {
    /// The answer to anything that goes wrong, and to a prompt dismissed.
    pub const NO: Reply = Reply {
        allow: false,
        remember: false,
    };
}

/// The proxy's side: asks on the socket `name` and waits; "no" on any
/// failure.
pub async fn ask(name: &str, question: &Ask) -> Reply {
    let exchange = async {
        let mut stream = connect(name)
            .await
            .map_err(|e| tracing::warn!("cannot put a refused connection to the user: {e}"))
            .ok()?;
        // Abstract names are anyone's to take once freed (a generation
        // that ended): only the bridge of this user answers.
        let ours = stream
            .peer_cred()
            .is_ok_and(|c| c.uid() == nix::unistd::getuid().as_raw());
        if !ours {
            tracing::warn!(
                "the socket for questions about the network is not the bridge's: refused"
            );
            return None;
        }
        let mut line = serde_json::to_vec(question).ok()?;
        line.push(b'\n');
        stream.write_all(&line).await.ok()?;
        let mut answer = String::new();
        BufReader::new(stream.take(MAX_LINE))
            .read_line(&mut answer)
            .await
            .ok()?;
        serde_json::from_str::<Reply>(&answer).ok()
    };
    tokio::time::timeout(ANSWER_WITHIN, exchange)
        .await
        .ok()
        .flatten()
        .unwrap_or(Reply::NO)
}

/// What the bridge's loop is handed.
#[derive(Debug)]
pub enum Question {
    /// A question, with where its answer goes.
    Asked(Ask, oneshot::Sender<Reply>),
    /// An asker stopped waiting (it left, or waited as long as it waits):
    /// its answer's way is closed, and prompts nobody waits on any more
    /// can be withdrawn.
    GaveUp,
}

/// Where the questions of a proxy running in the bridge's own process
/// (`network::outside`) go, once the bridge takes them: handed over in
/// the process, with no socket.
#[derive(Clone, Default)]
pub struct Questions(std::sync::Arc<std::sync::OnceLock<mpsc::UnboundedSender<Question>>>);

impl Questions {
    /// From now on, questions go to `tx`; false when someone took them
    /// already.
    pub fn take_from(&self, tx: mpsc::UnboundedSender<Question>) -> bool {
        self.0.set(tx).is_ok()
    }

    /// Puts `ask` to whoever took the questions and waits for the answer:
    /// "no" when nobody took them, nobody answers in time, or the taker
    /// is gone.
    pub async fn ask(&self, ask: Ask) -> Reply {
        let Some(tx) = self.0.get() else {
            return Reply::NO;
        };
        put(tx, ask, std::future::pending())
            .await
            .unwrap_or(Reply::NO)
    }
}

/// Hands `ask` to the bridge's loop on `tx` and waits for the answer: at
/// most [`ANSWER_WITHIN`], and only until `left` (the asker leaving). A
/// wait that ends without one (timed out, left, or dropped with the
/// proxy) tells the loop [`Question::GaveUp`], so the prompt nobody waits
/// on any more is withdrawn; None then, or when nobody takes questions.
async fn put(
    tx: &mpsc::UnboundedSender<Question>,
    ask: Ask,
    left: impl std::future::Future<Output = ()>,
) -> Option<Reply> {
    let (answer_tx, answer_rx) = oneshot::channel();
    tx.send(Question::Asked(ask, answer_tx)).ok()?;
    let mut gave_up = GiveUpOnDrop(Some(tx.clone()));
    // The answer's way is closed (`answer_rx` dropped with the select)
    // before the loop is told, so it finds it closed.
    let reply = tokio::select! {
        answer = answer_rx => Some(answer.unwrap_or(Reply::NO)),
        _ = left => None,
        _ = tokio::time::sleep(ANSWER_WITHIN) => None,
    };
    if reply.is_some() {
        gave_up.0 = None;
    }
    reply
}

/// Says [`Question::GaveUp`] when dropped.
struct GiveUpOnDrop(Option<mpsc::UnboundedSender<Question>>);

impl Drop for GiveUpOnDrop {
    fn drop(&mut self) {
        if let Some(tx) = self.0.take() {
            let _ = tx.send(Question::GaveUp);
        }
    }
}

/// The bridge's side: takes questions on `listener` from processes of
/// this user in this network namespace, and hands each to `tx`.
pub async fn serve(listener: UnixListener, tx: mpsc::UnboundedSender<Question>) {
    let own = Peer::of("self");
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                super::pause_after_failed_accept("cannot take a question about the network", e)
                    .await;
                continue;
            }
        };
        if !outside_the_sandbox(&stream, &own) {
            tracing::warn!("a question about the network came from inside a sandbox: ignored");
            continue;
        }
        let tx = tx.clone();
        tokio::spawn(async move {
            let (read, mut write) = stream.into_split();
            let mut line = String::new();
            let mut reader = BufReader::new(read.take(MAX_LINE));
            if reader.read_line(&mut line).await.is_err() {
                return;
            }
            let Ok(question) = serde_json::from_str::<Ask>(&line) else {
                return;
            };
            // Held until the answer, the asker's leaving (anything more it
            // sends, or its end), or the time it waits at most: never
            // longer than anyone listens.
            let mut rest = reader.into_inner();
            let left = async move {
                let _ = rest.read(&mut [0u8; 1]).await;
            };
            let Some(reply) = put(&tx, question, left).await else {
                return;
            };
            if let Ok(mut bytes) = serde_json::to_vec(&reply) {
                bytes.push(b'\n');
                let _ = write.write_all(&bytes).await;
            }
        });
    }
}

/// Whether the peer is a process of this user outside every sandbox: in
/// this process's network namespace (a sandbox with a network of its own
/// is in another) and under no more seccomp filters than this process
/// (every process of a zcode-acp sandbox has one more, and cannot shed
/// it): a sandbox that shares the host's network (another bridge's, with
/// the whole host loopback allowed) and read this socket's name from a
/// launch spec is refused all the same. A process of this user outside
/// any sandbox could do anything the user can anyway.
fn outside_the_sandbox(stream: &UnixStream, own: &Peer) -> bool {
    let Ok(cred) = stream.peer_cred() else {
        return false;
    };
    let Some(pid) = cred.pid() else {
        return false;
    };
    // The process that connected, held (Linux 6.5): its pid's /proc is
    // read below, then checked to be still its own.
    let pinned = match peer_pidfd(stream) {
        Ok(pinned) => pinned,
        Err(e) => {
            tracing::debug!("the process that asked about the network is gone: {e}");
            return false;
        }
    };
    let peer = Peer::of(&pid.to_string());
    is_outside(cred.uid(), &peer, pinned.as_ref(), own)
}

/// The judgement of [`outside_the_sandbox`] on what was read of the peer.
/// `pinned`: the process that connected, checked after `peer` was read of
/// its pid to be still there (a process not yet reaped keeps its pid, so
/// `peer` was its, not that of a process that took the pid since); without
/// it (before Linux 6.5) that race stays open.
fn is_outside(uid: u32, peer: &Peer, pinned: Option<&OwnedFd>, own: &Peer) -> bool {
    if uid != nix::unistd::getuid().as_raw() || !pinned.is_none_or(still_there) {
        return false;
    }
    match (peer, own) {
        (
            Peer {
                net: Some(net),
                filters: Some(filters),
            },
            Peer {
                net: Some(own_net),
                filters: Some(own_filters),
            },
        ) => net == own_net && filters <= own_filters,
        _ => false,
    }
}

/// `SO_PEERPIDFD` (Linux 6.5), which the libc crate does not name here.
#[cfg(target_os = "linux")]
const SO_PEERPIDFD: libc::c_int = if cfg!(any(target_arch = "sparc", target_arch = "sparc64")) {
    0x56
} else {
    77
};

/// The process at the other end of `socket` (the one that connected), as
/// a pidfd: `Ok(None)` where the kernel has none to give (before 6.5),
/// `Err` where it has and cannot (the process is gone).
fn peer_pidfd(socket: &impl AsRawFd) -> std::io::Result<Option<OwnedFd>> {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::FromRawFd;
        let mut fd: libc::c_int = -1;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: getsockopt writes at most `len` bytes into `fd`.
        let r = unsafe {
            libc::getsockopt(
                socket.as_raw_fd(),
                libc::SOL_SOCKET,
                SO_PEERPIDFD,
                (&mut fd as *mut libc::c_int).cast(),
                &mut len,
            )
        };
        if r != 0 {
            let e = std::io::Error::last_os_error();
            return match e.raw_os_error() {
                Some(libc::ENOPROTOOPT) => Ok(None),
                _ => Err(e),
            };
        }
        // SAFETY: a new descriptor the kernel made for this call, owned here.
        Ok(Some(unsafe { OwnedFd::from_raw_fd(fd) }))
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = socket;
        Ok(None)
    }
}

/// Whether the process of `pidfd` has not been reaped (running, or a
/// zombie), and so still has its pid.
fn still_there(pidfd: &OwnedFd) -> bool {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: signal 0 is not sent: the call only checks the process
        // exists (and that it may be signalled, which a denial also shows).
        let r = unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                pidfd.as_raw_fd(),
                0,
                std::ptr::null::<libc::siginfo_t>(),
                0,
            )
        };
        r == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = pidfd;
        true
    }
}

/// What tells a process inside a sandbox from one outside.
pub struct Peer {
    net: Option<u64>,
    /// Its seccomp filters (`Seccomp_filters`, Linux 5.9; before that,
    /// whether it has any: `Seccomp`).
    filters: Option<u64>,
}

impl Peer {
    pub fn of(pid: &str) -> Peer {
        use std::os::unix::fs::MetadataExt;
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.trim().parse::<u64>().ok())
        };
        Peer {
            net: std::fs::metadata(format!("/proc/{pid}/ns/net"))
                .ok()
                .map(|m| m.ino()),
            filters: field("Seccomp_filters:").or_else(|| field("Seccomp:").map(|m| m.min(1))),
        }
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;
    use std::process::{Command, Stdio};

    /// A connection from a process that has ended and been reaped, and
    /// what its pid's /proc would say had another process of this user,
    /// in this network, taken the pid since (simulated: a live process's
    /// /proc read in its place).
    #[test]
    fn a_peer_whose_pid_was_taken_since_is_not_heard() {
        let name = new_name();
        let listener =
            std::os::unix::net::UnixListener::bind_addr(&address(&name).unwrap()).unwrap();
        // Connects, then ends.
        let mut asker = Command::new("python3")
            .args([
                "-c",
                "import socket, sys; s = socket.socket(socket.AF_UNIX); s.connect('\\0' + sys.argv[1])",
                &name,
            ])
            .spawn()
            .unwrap();
        let (stream, _) = listener.accept().unwrap();
        assert!(asker.wait().unwrap().success());
        let mut other = Command::new("sleep")
            .arg("60")
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        let taken = Peer::of(&other.id().to_string());
        let _ = other.kill();
        let _ = other.wait();
        let own = Peer::of("self");
        let uid = nix::unistd::getuid().as_raw();
        // Without a pidfd, the other process's /proc passes for the asker.
        assert!(is_outside(uid, &taken, None, &own), "the test cannot fail");
        match peer_pidfd(&stream) {
            Ok(Some(pinned)) => assert!(!is_outside(uid, &taken, Some(&pinned), &own)),
            // Some kernels give no pidfd for a process reaped.
            Err(_) => {}
            Ok(None) if std::env::var_os("ZCODE_ACP_REQUIRE_ALL_TESTS").is_none() => {
                return eprintln!("SKIPPED: this kernel has no SO_PEERPIDFD (Linux 6.5)");
            }
            Ok(None) => panic!("this kernel has no SO_PEERPIDFD (Linux 6.5)"),
        }
        // A live peer (this process) is heard with its pidfd.
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        let pinned = peer_pidfd(&a).unwrap().expect("SO_PEERPIDFD");
        assert!(is_outside(uid, &own, Some(&pinned), &own));
    }
}
