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
//! prompts of their choosing.

use std::net::IpAddr;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{mpsc, oneshot};

use crate::policy::network::Zone;

/// A fresh name for an arming's socket, in the abstract namespace.
pub fn new_name() -> String {
    format!(
        "zcode-acp-network-asks-{:016x}{:016x}",
        rand::random::<u64>(),
        rand::random::<u64>()
    )
}

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

/// The bridge's side: takes questions on `listener` from processes of
/// this user in this network namespace, and hands each to `tx`.
pub async fn serve(listener: UnixListener, tx: mpsc::UnboundedSender<Question>) {
    let own = Peer::of("self");
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of descriptors: a pause, not a spin.
                tracing::debug!("cannot take a question about the network: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
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
            let (answer_tx, mut answer_rx) = oneshot::channel();
            if tx.send(Question::Asked(question, answer_tx)).is_err() {
                return;
            }
            // Held until the answer, the asker's leaving, or the time it
            // waits at most: never longer than anyone listens.
            let mut rest = reader.into_inner();
            let mut byte = [0u8; 1];
            let reply = tokio::select! {
                answer = &mut answer_rx => Some(answer.unwrap_or(Reply::NO)),
                _ = rest.read(&mut byte) => None,
                _ = tokio::time::sleep(ANSWER_WITHIN) => None,
            };
            let Some(reply) = reply else {
                // Closed first, so the bridge finds it closed.
                drop(answer_rx);
                let _ = tx.send(Question::GaveUp);
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
    if cred.uid() != nix::unistd::getuid().as_raw() {
        return false;
    }
    let Some(pid) = cred.pid() else {
        return false;
    };
    match (Peer::of(&pid.to_string()), own) {
        (
            Peer {
                net: Some(net),
                filters: Some(filters),
            },
            Peer {
                net: Some(own_net),
                filters: Some(own_filters),
            },
        ) => net == *own_net && filters <= *own_filters,
        _ => false,
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
