//! What left: the proxy counts, per destination, the connections it
//! carried and the bytes sent and received, and tells whoever armed the
//! sandbox (the bridge, or `zcode-acp run`), which says it at the end of
//! each turn (at exit for `run`). Only counts: nothing of a payload is
//! recorded or sent.
//!
//! The proxy sends one datagram per batch it carries back (what has come
//! from the destination, up to 256 KiB), before it passes the batch on,
//! to an abstract Unix datagram socket drawn for the
//! arming (a network namespace's own: nothing inside the sandbox can
//! reach it; Linux), or to one end of a pair whose other end the
//! process it runs in holds (macOS, `network::outside`). So by the time a sandboxed program has had its answer, and
//! the agent could end its turn, the counts are queued for the bridge,
//! which reads what is queued when the turn ends: the ledger of a turn
//! holds everything its commands waited for. Where the queue is full (a
//! very busy proxy) the counts wait in the proxy, merged, and go with the
//! next datagram that fits, or the proxy's retry a tenth of a second
//! later. Datagrams from another user are dropped.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use serde::{Deserialize, Serialize};

/// Counts for one destination since the last datagram.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// As the client named it (a name, or an address).
    pub host: String,
    pub port: u16,
    /// Where it went.
    pub addr: IpAddr,
    /// Connections opened.
    #[serde(default)]
    pub opened: u64,
    #[serde(default)]
    pub sent: u64,
    #[serde(default)]
    pub received: u64,
}

/// A datagram's largest size (a host name is at most 253 bytes).
const MAX_DATAGRAM: usize = 1024;
/// Destinations one ledger keeps apart; past it they are summed as one.
pub const MAX_DESTINATIONS: usize = 256;
/// An upload above this, to one host other than the agent's own, is
/// marked as such.
pub const LARGE_UPLOAD: u64 = 1 << 20;

/// Totals for one destination (host as named, and port).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Totals {
    /// The addresses it went to (a few).
    pub addrs: BTreeSet<IpAddr>,
    pub connections: u64,
    pub sent: u64,
    pub received: u64,
}

/// What left, by destination.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ledger {
    pub by_destination: BTreeMap<(String, u16), Totals>,
    /// Destinations past [`MAX_DESTINATIONS`], summed.
    pub others: Totals,
}

impl Ledger {
    pub fn add(&mut self, r: &Record) {
        let key = (r.host.to_ascii_lowercase(), r.port);
        let full = self.by_destination.len() >= MAX_DESTINATIONS;
        let totals = match self.by_destination.get_mut(&key) {
            Some(t) => t,
            None if full => &mut self.others,
            None => self.by_destination.entry(key).or_default(),
        };
        if totals.addrs.len() < 4 {
            totals.addrs.insert(r.addr);
        }
        totals.connections = totals.connections.saturating_add(r.opened);
        totals.sent = totals.sent.saturating_add(r.sent);
        totals.received = totals.received.saturating_add(r.received);
    }

    pub fn is_empty(&self) -> bool {
        self.by_destination.is_empty() && self.others == Totals::default()
    }

    /// The notice for this ledger, leaving out the hosts `own` (the
    /// agent's API and sign-in): a title ("this turn sent 3.1 MB to
    /// github.com, 2 KB to pypi.org", `span` being "this turn") and one
    /// line per destination; none when nothing went anywhere else.
    pub fn summary(&self, own: &[String], span: &str) -> Option<(String, Vec<String>)> {
        let is_own = |host: &str| {
            own.iter()
                .any(|p| crate::policy::network::host_matches(p, host))
        };
        // Names are the client's to choose: written out, never markup or
        // lines of their own in the notice.
        let mut rows: Vec<(String, u16, &Totals)> = self
            .by_destination
            .iter()
            .filter(|((host, _), _)| !is_own(host))
            .map(|((host, port), t)| (written_out(host), *port, t))
            .collect();
        if self.others != Totals::default() {
            rows.push(("other hosts".to_owned(), 0, &self.others));
        }
        if rows.is_empty() {
            return None;
        }
        // The largest uploads first.
        rows.sort_by(|a, b| b.2.sent.cmp(&a.2.sent).then(a.0.cmp(&b.0)));
        let title_parts: Vec<String> = rows
            .iter()
            .take(3)
            .map(|(host, _, t)| format!("{} to {host}", bytes(t.sent)))
            .collect();
        let more = if rows.len() > 3 {
            format!(" and {} more", rows.len() - 3)
        } else {
            String::new()
        };
        let title = format!("{span} sent {}{more}", title_parts.join(", "));
        let lines = rows
            .iter()
            .map(|(host, port, t)| {
                let addrs: Vec<String> = t.addrs.iter().map(IpAddr::to_string).collect();
                let dest = if *port == 0 {
                    host.clone()
                } else {
                    format!(
                        "{} ({})",
                        crate::policy::network::authority(host, *port),
                        addrs.join(", ")
                    )
                };
                let large = if t.sent > LARGE_UPLOAD {
                    " (a large upload)"
                } else {
                    ""
                };
                // Exact where the words round.
                let sent = if t.sent >= 1000 {
                    format!("{} ({} bytes)", bytes(t.sent), t.sent)
                } else {
                    bytes(t.sent)
                };
                format!(
                    "{dest}: sent {sent}{large}, received {}, {} connection{}",
                    bytes(t.received),
                    t.connections,
                    if t.connections == 1 { "" } else { "s" }
                )
            })
            .collect();
        Some((title, lines))
    }
}

/// A host name as the notice shows it: control characters escaped,
/// markdown's marks taken literally.
fn written_out(host: &str) -> String {
    host.chars()
        .flat_map(|c| {
            if c.is_control() {
                c.escape_default().collect::<Vec<_>>()
            } else if "`*_[]<>\\".contains(c) {
                vec!['\\', c]
            } else {
                vec![c]
            }
        })
        .collect()
}

/// `n` bytes in words: `512 B`, `2 KB`, `3.1 MB` (powers of 1000).
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["KB", "MB", "GB", "TB"];
    if n < 1000 {
        return format!("{n} B");
    }
    let mut value = n as f64 / 1000.0;
    let mut unit = 0;
    while value >= 1000.0 && unit < UNITS.len() - 1 {
        value /= 1000.0;
        unit += 1;
    }
    if value < 10.0 {
        format!("{value:.1} {}", UNITS[unit])
    } else {
        format!("{value:.0} {}", UNITS[unit])
    }
}

#[cfg(target_os = "linux")]
fn address(name: &str) -> std::io::Result<std::os::unix::net::SocketAddr> {
    use std::os::linux::net::SocketAddrExt;
    std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())
}

/// How long a count waits for room in the bridge's queue before the
/// connection goes on without it (it is sent later, with the next).
const ROOM_WITHIN: std::time::Duration = std::time::Duration::from_millis(250);

/// The proxy's side: counts merged until a datagram carries them.
pub struct Sink {
    socket: SinkSocket,
    pending: std::sync::Mutex<BTreeMap<(String, u16, IpAddr), Record>>,
}

/// Where the counts go: connected, so a full queue at the other end
/// reads as "wait".
enum SinkSocket {
    /// Nowhere: nothing is counted.
    None,
    Connected(tokio::net::UnixDatagram),
    /// One end of a pair, once whoever armed the sandbox takes the other
    /// ([`Sink::later`]); until then nothing is counted. Made the proxy
    /// runtime's own at its first use.
    Later {
        slot: std::sync::Arc<std::sync::OnceLock<std::os::unix::net::UnixDatagram>>,
        ours: std::sync::OnceLock<tokio::net::UnixDatagram>,
    },
}

impl Sink {
    /// Sends to the socket `name`; none: counts nothing. Must run inside
    /// the proxy's runtime.
    pub fn new(name: Option<&str>) -> Sink {
        #[cfg(target_os = "linux")]
        let socket = name.and_then(|name| {
            let addr = address(name).ok()?;
            let socket = std::os::unix::net::UnixDatagram::unbound().ok()?;
            socket.connect_addr(&addr).ok()?;
            socket.set_nonblocking(true).ok()?;
            tokio::net::UnixDatagram::from_std(socket).ok()
        });
        #[cfg(not(target_os = "linux"))]
        let socket = {
            let _ = name;
            None
        };
        Sink {
            socket: socket.map_or(SinkSocket::None, SinkSocket::Connected),
            pending: Default::default(),
        }
    }

    /// Counts into the socket put into `slot` once there is one (see
    /// [`Source::pair`]).
    pub fn later(
        slot: std::sync::Arc<std::sync::OnceLock<std::os::unix::net::UnixDatagram>>,
    ) -> Sink {
        Sink {
            socket: SinkSocket::Later {
                slot,
                ours: std::sync::OnceLock::new(),
            },
            pending: Default::default(),
        }
    }

    /// The socket counts go to now, if any. Must run inside the proxy's
    /// runtime.
    fn socket(&self) -> Option<&tokio::net::UnixDatagram> {
        match &self.socket {
            SinkSocket::None => None,
            SinkSocket::Connected(socket) => Some(socket),
            SinkSocket::Later { slot, ours } => {
                if ours.get().is_none() {
                    let socket = slot
                        .get()?
                        .try_clone()
                        .and_then(|s| s.set_nonblocking(true).map(|_| s))
                        .and_then(tokio::net::UnixDatagram::from_std);
                    match socket {
                        Ok(socket) => {
                            let _ = ours.set(socket);
                        }
                        Err(e) => {
                            // Tried again at the next connection.
                            tracing::warn!(
                                "a connection through the sandbox's proxy is not counted: {e}"
                            );
                            return None;
                        }
                    }
                }
                ours.get()
            }
        }
    }

    /// Whether anything is counted now.
    pub fn counts(&self) -> bool {
        self.socket().is_some()
    }

    /// Whether anything may be counted during the proxy's life.
    pub fn may_count(&self) -> bool {
        !matches!(self.socket, SinkSocket::None)
    }

    /// Counts `sent` and `received` bytes (and `opened` connections) for a
    /// destination, to go with the next [`Sink::flush`].
    pub fn add(&self, host: &str, port: u16, addr: IpAddr, opened: u64, sent: u64, received: u64) {
        if !self.counts() {
            return;
        }
        if let Ok(mut pending) = self.pending.lock() {
            let r = pending
                .entry((host.to_owned(), port, addr))
                .or_insert_with(|| Record {
                    host: host.to_owned(),
                    port,
                    addr,
                    opened: 0,
                    sent: 0,
                    received: 0,
                });
            r.opened = r.opened.saturating_add(opened);
            r.sent = r.sent.saturating_add(sent);
            r.received = r.received.saturating_add(received);
        }
    }

    /// Sends what is pending; `patient`, each waiting a little for room in
    /// the bridge's queue, else only what fits now. What finds no room
    /// stays for the next flush; whether everything went.
    pub async fn flush(&self, patient: bool) -> bool {
        let Some(socket) = self.socket() else {
            return true;
        };
        loop {
            let Some((key, record)) = self.pending.lock().ok().and_then(|mut p| p.pop_first())
            else {
                return true;
            };
            let Ok(bytes) = serde_json::to_vec(&record) else {
                continue;
            };
            let sent = if patient {
                tokio::time::timeout(ROOM_WITHIN, socket.send(&bytes))
                    .await
                    .unwrap_or_else(|_| Err(std::io::ErrorKind::WouldBlock.into()))
            } else {
                socket.try_send(&bytes)
            };
            match sent {
                Ok(_) => {}
                // No room yet: kept, merged with what comes meanwhile.
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if let Ok(mut pending) = self.pending.lock() {
                        let r = pending.entry(key).or_insert_with(|| Record {
                            opened: 0,
                            sent: 0,
                            received: 0,
                            ..record.clone()
                        });
                        r.opened = r.opened.saturating_add(record.opened);
                        r.sent = r.sent.saturating_add(record.sent);
                        r.received = r.received.saturating_add(record.received);
                    }
                    return false;
                }
                // Nobody listens (the bridge is gone): nothing to keep.
                Err(_) => {}
            }
        }
    }

    /// Whether counts wait to be sent.
    pub fn pending(&self) -> bool {
        self.pending.lock().is_ok_and(|p| !p.is_empty())
    }
}

/// The side that armed the sandbox: a socket whose queue is read when a
/// turn ends (and whenever it has something, so it never fills).
pub struct Source {
    socket: std::os::unix::net::UnixDatagram,
}

impl Source {
    /// Listens on the abstract name `name` (Linux: the only platform whose
    /// proxy is a process of its own; macOS uses [`Source::pair`]).
    pub fn bind(name: &str) -> std::io::Result<Source> {
        #[cfg(target_os = "linux")]
        {
            use std::os::fd::AsFd;
            let socket = std::os::unix::net::UnixDatagram::bind_addr(&address(name)?)?;
            socket.set_nonblocking(true)?;
            nix::sys::socket::setsockopt(
                &socket.as_fd(),
                nix::sys::socket::sockopt::PassCred,
                &true,
            )
            .map_err(std::io::Error::from)?;
            Ok(Source { socket })
        }
        #[cfg(not(target_os = "linux"))]
        {
            let _ = name;
            Err(std::io::Error::from(std::io::ErrorKind::Unsupported))
        }
    }

    /// A pair: the proxy's end (for [`Sink::later`]) and this side's.
    /// Nothing but the proxy holding the other end can send here.
    pub fn pair() -> std::io::Result<(std::os::unix::net::UnixDatagram, Source)> {
        let (proxy, socket) = std::os::unix::net::UnixDatagram::pair()?;
        socket.set_nonblocking(true)?;
        // The same reading as a named socket's: with the sender's
        // credentials (always this process's here).
        #[cfg(target_os = "linux")]
        {
            use std::os::fd::AsFd;
            nix::sys::socket::setsockopt(
                &socket.as_fd(),
                nix::sys::socket::sockopt::PassCred,
                &true,
            )
            .map_err(std::io::Error::from)?;
        }
        Ok((proxy, Source { socket }))
    }

    /// Every record queued now (a pair's only, off Linux: nothing else
    /// can send to it).
    #[cfg(not(target_os = "linux"))]
    pub fn drain(&self) -> Vec<Record> {
        let mut out = Vec::new();
        let mut buf = [0u8; MAX_DATAGRAM];
        // A bound on one read: a flood waits for the next.
        for _ in 0..4096 {
            match self.socket.recv(&mut buf) {
                Ok(len) => {
                    if let Ok(r) = serde_json::from_slice::<Record>(&buf[..len]) {
                        out.push(r);
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => break,
            }
        }
        out
    }

    /// Every record queued now, from processes of this user.
    #[cfg(target_os = "linux")]
    pub fn drain(&self) -> Vec<Record> {
        let mut out = Vec::new();
        {
            use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags, UnixCredentials};
            use std::os::fd::AsRawFd;
            let me = nix::unistd::getuid().as_raw();
            let mut buf = [0u8; MAX_DATAGRAM];
            // A bound on one read: a flood waits for the next.
            for _ in 0..4096 {
                let mut iov = [std::io::IoSliceMut::new(&mut buf)];
                let mut space = nix::cmsg_space!(UnixCredentials);
                let (len, uid) = match recvmsg::<()>(
                    self.socket.as_raw_fd(),
                    &mut iov,
                    Some(&mut space),
                    MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_CMSG_CLOEXEC,
                ) {
                    Ok(msg) => {
                        let uid = msg.cmsgs().ok().and_then(|mut c| {
                            c.find_map(|m| match m {
                                ControlMessageOwned::ScmCredentials(c) => Some(c.uid()),
                                _ => None,
                            })
                        });
                        (msg.bytes, uid)
                    }
                    Err(nix::errno::Errno::EINTR) => continue,
                    Err(_) => break,
                };
                if uid != Some(me) {
                    continue;
                }
                if let Ok(r) = serde_json::from_slice::<Record>(&buf[..len]) {
                    out.push(r);
                }
            }
        }
        out
    }
}

/// Reads a [`Source`] on a thread of its own as long as the proxy may
/// send (so its queue never fills and the proxy never waits), for a
/// caller with no loop of its own (`zcode-acp run`).
pub struct Collector {
    source: std::sync::Arc<Source>,
    ledger: std::sync::Arc<std::sync::Mutex<Ledger>>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Collector {
    pub fn start(source: Source) -> Collector {
        use std::sync::atomic::Ordering;
        let collector = Collector {
            source: std::sync::Arc::new(source),
            ledger: Default::default(),
            stop: Default::default(),
        };
        let (source, ledger, stop) = (
            collector.source.clone(),
            collector.ledger.clone(),
            collector.stop.clone(),
        );
        // Left to end on its own (within its poll's tenth of a second):
        // `finish` reads what is queued itself, and waits for nothing.
        let _ = std::thread::Builder::new()
            .name("zcode-acp-ledger".into())
            .spawn(move || {
                use std::os::fd::AsFd;
                while !stop.load(Ordering::Relaxed) {
                    let mut fds = [nix::poll::PollFd::new(
                        source.socket.as_fd(),
                        nix::poll::PollFlags::POLLIN,
                    )];
                    let _ = nix::poll::poll(&mut fds, nix::poll::PollTimeout::from(100u16));
                    let records = source.drain();
                    if let Ok(mut l) = ledger.lock() {
                        for r in &records {
                            l.add(r);
                        }
                    }
                }
            });
        collector
    }

    /// Everything counted, with what is queued now.
    pub fn finish(self) -> Ledger {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let records = self.source.drain();
        let Ok(mut ledger) = self.ledger.lock() else {
            return Ledger::default();
        };
        for r in &records {
            ledger.add(r);
        }
        std::mem::take(&mut *ledger)
    }
}

/// For waiting until the socket has something.
impl std::os::fd::AsRawFd for Source {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.socket.as_raw_fd()
    }
}

/// The most a relay moves per read, each way (the mirror's too). tokio's
/// own copy moves 8 KiB at a time: with 64 KiB, a download through the
/// mirror went from 0.64x-0.68x of bare to 0.83x-0.86x (BENCHMARKS.md,
/// tenth stop). A connection holds two such buffers, 128 KiB, idle or not,
/// for as long as it is open (the proxy's connection slots bound how many;
/// a counted one's download buffer can grow to [`BATCH`]).
pub const CHUNK: usize = 64 * 1024;

/// The most the counted relay passes on to a client per count: what has
/// arrived from the destination by then, read without waiting. Each count
/// is a datagram the bridge wakes for: one per 64 KiB chunk held a
/// download through the proxy to 0.61x of bare, batches brought it to
/// 0.75x-0.83x, the mirror's own (BENCHMARKS.md, eleventh stop; 1 MiB did
/// no better). The buffer grows toward this only when a read fills it
/// (data arriving faster than the client takes it), and is kept for the
/// connection's life: a counted connection holds at most CHUNK (what the
/// client sends) + BATCH, 320 KiB.
const BATCH: usize = 256 * 1024;

/// A destination's connection, carried both ways and counted. Before a
/// batch from the destination is passed to the client, every count so far
/// is sent (see the module's comment): a client has its answer only once
/// what it sent and received is queued for the bridge. What a client only
/// sends goes with the next flush (its connection's end, or the proxy's
/// tick a tenth of a second later).
pub async fn relay(
    client: &mut tokio::net::TcpStream,
    upstream: &mut tokio::net::TcpStream,
    sink: &Sink,
    host: &str,
    port: u16,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    if !sink.counts() {
        let _ = tokio::io::copy_bidirectional_with_sizes(client, upstream, CHUNK, CHUNK).await;
        return;
    }
    let Ok(addr) = upstream.peer_addr().map(|a| a.ip()) else {
        return;
    };
    sink.add(host, port, addr, 1, 0, 0);
    // Once the queue had no room for a while (its reader is busy), this
    // connection no longer waits for it: its counts go when they fit.
    let patient = std::sync::atomic::AtomicBool::new(true);
    let flush = || async {
        let wait = patient.load(std::sync::atomic::Ordering::Relaxed);
        if !sink.flush(wait).await && wait {
            patient.store(false, std::sync::atomic::Ordering::Relaxed);
        }
    };
    let (mut client_read, mut client_write) = client.split();
    let (mut up_read, mut up_write) = upstream.split();
    let out = async {
        let mut buf = vec![0u8; CHUNK];
        loop {
            match client_read.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    sink.add(host, port, addr, 0, n as u64, 0);
                    if up_write.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            }
        }
        let _ = up_write.shutdown().await;
    };
    let back = async {
        let mut buf = vec![0u8; CHUNK];
        loop {
            // One chunk awaited, then what else has already arrived, up to
            // a batch: one count (one datagram) for all of it.
            let mut len = match up_read.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            let mut ended = false;
            while len < BATCH {
                // Room for more only once a read filled what there is:
                // a trickle never grows the buffer.
                if len == buf.len() {
                    buf.resize((len + CHUNK).min(BATCH), 0);
                }
                match up_read.try_read(&mut buf[len..]) {
                    Ok(0) => {
                        ended = true;
                        break;
                    }
                    Ok(n) => len += n,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(_) => {
                        ended = true;
                        break;
                    }
                }
            }
            sink.add(host, port, addr, 0, 0, len as u64);
            flush().await;
            if client_write.write_all(&buf[..len]).await.is_err() || ended {
                break;
            }
        }
        let _ = client_write.shutdown().await;
    };
    tokio::join!(out, back);
    flush().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(host: &str, sent: u64, received: u64) -> Record {
        Record {
            host: host.into(),
            port: 443,
            addr: "192.0.2.1".parse().unwrap(),
            opened: 1,
            sent,
            received,
        }
    }

    #[test]
    fn bytes_read_as_people_write_them() {
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(2_048), "2.0 KB");
        assert_eq!(bytes(3_100_000), "3.1 MB");
        assert_eq!(bytes(45_000_000), "45 MB");
    }

    #[test]
    fn the_summary_leaves_out_the_agents_api_and_marks_large_uploads() {
        let mut l = Ledger::default();
        l.add(&rec("api.anthropic.com", 9_000_000, 100));
        l.add(&rec("GitHub.com", 3_100_000, 5_000));
        l.add(&rec("pypi.org", 2_000, 80_000));
        l.add(&rec("pypi.org", 0, 1_000));
        let (title, lines) = l
            .summary(&["api.anthropic.com".into()], "this turn")
            .unwrap();
        assert_eq!(
            title,
            "this turn sent 3.1 MB to github.com, 2.0 KB to pypi.org"
        );
        assert!(
            lines[0].contains("github.com:443") && lines[0].contains("a large upload"),
            "{lines:?}"
        );
        assert!(
            lines[1].contains("received 81 KB, 2 connections"),
            "{lines:?}"
        );
        assert!(!lines.iter().any(|l| l.contains("anthropic")));
        // A name is the client's: no lines or markup of its own.
        let mut odd = Ledger::default();
        odd.add(&rec("a\n**b**`c", 1, 0));
        let (title, lines) = odd.summary(&[], "this turn").unwrap();
        assert!(!title.contains('\n') && !lines[0].contains('\n'), "{title}");
        assert!(title.contains("a\\n\\*\\*b\\*\\*\\`c"), "{title}");
        // Only the agent's own API: nothing to say.
        let mut own = Ledger::default();
        own.add(&rec("api.anthropic.com", 1, 1));
        assert!(own
            .summary(&["api.anthropic.com".into()], "this turn")
            .is_none());
    }

    #[test]
    fn a_flood_of_destinations_is_summed_past_the_cap() {
        let mut l = Ledger::default();
        for i in 0..MAX_DESTINATIONS + 10 {
            l.add(&rec(&format!("h{i}.example"), 1, 0));
        }
        assert_eq!(l.by_destination.len(), MAX_DESTINATIONS);
        assert_eq!(l.others.sent, 10);
        let (title, _) = l.summary(&[], "this turn").unwrap();
        assert!(title.contains("more"), "{title}");
    }

    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn what_the_sink_sends_the_source_reads() {
        let name = format!("zcode-acp-test-ledger-{}", std::process::id());
        let source = Source::bind(&name).unwrap();
        let sink = Sink::new(Some(&name));
        let addr: IpAddr = "192.0.2.7".parse().unwrap();
        sink.add("example.com", 443, addr, 1, 100, 0);
        sink.add("example.com", 443, addr, 0, 0, 2_000);
        assert!(sink.flush(true).await);
        assert!(!sink.pending());
        let mut l = Ledger::default();
        for r in source.drain() {
            l.add(&r);
        }
        let t = &l.by_destination[&("example.com".to_owned(), 443)];
        assert_eq!((t.connections, t.sent, t.received), (1, 100, 2_000));
        assert!(source.drain().is_empty());
        // A full queue (the bridge busy): kept, and sent once there is room.
        for i in 0..64u64 {
            sink.add(&format!("h{i}.example"), 443, addr, 1, i, 0);
        }
        assert!(!sink.flush(true).await);
        assert!(sink.pending(), "the queue took 64 datagrams at once");
        // Impatient: no wait at all.
        let t = std::time::Instant::now();
        assert!(!sink.flush(false).await);
        assert!(t.elapsed() < ROOM_WITHIN);
        let mut total = 0;
        for _ in 0..100 {
            for r in source.drain() {
                total += r.sent;
            }
            sink.flush(true).await;
            if !sink.pending() {
                break;
            }
        }
        for r in source.drain() {
            total += r.sent;
        }
        assert_eq!(total, (0..64).sum::<u64>());
    }
}
