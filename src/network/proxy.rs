//! The sandbox's way out: an HTTP (CONNECT and absolute-form requests)
//! and SOCKS5 proxy, on one port of the sandbox's own loopback, that
//! judges every destination by the network table before it connects from
//! the host's network. Also the mirrors of allowed host loopback ports:
//! a connection to `127.0.0.1:PORT` inside is carried to the host's.
//!
//! On Linux it runs outside the sandbox's network namespace, on listening
//! sockets made inside it (a socket stays in the namespace it was made
//! in), so nothing inside can reach the host's network but through here.
//! On macOS it runs in the process that armed the sandbox, on a port of
//! the host's loopback that Seatbelt leaves the sandbox alone
//! (`network::outside`), and serves only clients that give its
//! credentials ([`Judge::token`]).

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

use super::credentials::{authorized, same_secret, CLIENT};
use crate::policy::network::{authority, NetworkPolicy, OwnAddress, Verdict, Zone};

/// The largest request head read (a CONNECT line and its headers).
const MAX_HEAD: usize = 64 * 1024;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// What the proxy judges with.
pub struct Judge {
    pub policy: NetworkPolicy,
    /// The name servers of `/etc/resolv.conf`, read at start.
    pub resolvers: Vec<IpAddr>,
    /// The names only this machine or its network answer for, read at
    /// start: the only ones resolved before they are judged.
    pub local: crate::policy::network::LocalNames,
    /// Where refused connections are put to the user; with nobody to
    /// ask a refusal is final.
    pub asks: Asker,
    /// Connections carried at once (see `connection_slots`).
    pub slots: usize,
    /// Connections open now (each counted until its counts are sent).
    pub open: Arc<std::sync::atomic::AtomicUsize>,
    /// The credentials a client must give (user [`CLIENT`]), where the
    /// port is one any local process can reach (macOS: the host's
    /// loopback); none where only the sandbox can (Linux: its own).
    pub token: Option<String>,
    /// The user's answers that hold for this proxy's lifetime, by
    /// destination as named and the zone it was in.
    answers: std::sync::Mutex<std::collections::HashMap<AnswerKey, bool>>,
    /// Where what the connections carried is counted (`ledger`).
    pub ledger: crate::network::ledger::Sink,
}

/// What an answer holds for: the name, the port, the zone and, outside
/// the public zone, the address.
type AnswerKey = (String, u16, Zone, Option<IpAddr>);

/// Why a connection did not happen.
enum Refusal {
    /// The table refuses it: what to tell the client, and how to allow.
    Denied(String),
    /// It was allowed and failed (no such host, refused, unreachable).
    Failed(String),
}

/// Who the proxy puts a refused connection to.
pub enum Asker {
    /// Nobody (`zcode-acp run`, a tool call): the refusal is final, and
    /// says how to allow the destination.
    Nobody,
    /// The bridge, on its socket of that name (`network::asks`): the proxy
    /// is another process (Linux).
    Socket(String),
    /// The bridge this proxy runs in, once it takes the questions
    /// (`network::outside`); until then nobody.
    InProcess(crate::network::asks::Questions),
}

impl Judge {
    /// The judge of a proxy process of its own (Linux), asking on the
    /// socket `asks` and counting on `ledger`.
    pub fn new(policy: NetworkPolicy, asks: Option<String>, ledger: Option<&str>) -> Judge {
        Judge::with(
            policy,
            asks.map_or(Asker::Nobody, Asker::Socket),
            crate::network::ledger::Sink::new(ledger),
            connection_slots(),
        )
    }

    pub fn with(
        policy: NetworkPolicy,
        asks: Asker,
        ledger: crate::network::ledger::Sink,
        slots: usize,
    ) -> Judge {
        let resolvers = std::fs::read_to_string("/etc/resolv.conf")
            .map(|t| crate::policy::network::resolvers_of(&t))
            .unwrap_or_default();
        Judge {
            policy,
            resolvers,
            local: crate::policy::network::LocalNames::read(),
            asks,
            slots,
            open: Default::default(),
            token: None,
            answers: Default::default(),
            ledger,
        }
    }

    /// What the user says about a refused destination: asked once where
    /// the answer is to be remembered, never where nobody can be asked.
    async fn user_allows(
        &self,
        host: &str,
        port: u16,
        addr: IpAddr,
        zone: Zone,
        why: &str,
    ) -> bool {
        // The zone too, and for this machine or the LAN the address: a
        // name allowed for one place that resolves elsewhere later is
        // another question.
        let key = (
            host.to_ascii_lowercase(),
            port,
            zone,
            (zone != Zone::Public).then_some(addr),
        );
        if matches!(self.asks, Asker::Nobody) {
            return false;
        }
        if let Some(answer) = self.answers.lock().ok().and_then(|a| a.get(&key).copied()) {
            return answer;
        }
        let question = crate::network::asks::Ask {
            host: host.to_owned(),
            port,
            addr,
            zone,
            why: why.to_owned(),
        };
        let reply = match &self.asks {
            Asker::Nobody => return false,
            Asker::Socket(socket) => crate::network::asks::ask(socket, &question).await,
            Asker::InProcess(questions) => questions.ask(question).await,
        };
        if reply.remember {
            if let Ok(mut a) = self.answers.lock() {
                a.insert(key, reply.allow);
            }
        }
        reply.allow
    }

    /// Resolves `host` here (outside), judges each address and connects to
    /// the first allowed one that answers: the address judged is the
    /// address connected to, so a name cannot be re-resolved elsewhere.
    async fn connect(&self, host: &str, port: u16) -> Result<TcpStream, Refusal> {
        let host = host.trim_start_matches('[').trim_end_matches(']');
        if self.policy.asks_before_resolving(host, port, &self.local) {
            // Not resolved before a yes: asking the host's resolver about
            // a name outside the egress list would carry it (and what the
            // agent wrote into it) to whoever serves that domain.
            return self.unlisted(host, port).await;
        }
        let addrs: Vec<SocketAddr> = match host.parse::<IpAddr>() {
            Ok(ip) => vec![SocketAddr::new(ip, port)],
            Err(_) => tokio::net::lookup_host((host, port))
                .await
                .map_err(|e| Refusal::Failed(format!("cannot resolve {host}: {e}")))?
                .collect(),
        };
        let Some(own) = own_addresses() else {
            return Err(Refusal::Failed(
                "cannot read this machine's addresses to judge the destination (out of descriptors?)".into(),
            ));
        };
        let mut denied = Vec::new();
        let mut failed = None;
        for addr in addrs {
            match self
                .policy
                .decide(host, port, addr.ip(), &own, &self.resolvers)
            {
                Verdict::Allow => match open(addr).await {
                    Ok(stream) => return Ok(stream),
                    Err(e) => failed = Some(format!("{} ({addr}): {e}", authority(host, port))),
                },
                Verdict::Deny { zone, why } => denied.push((addr, zone, why)),
            }
        }
        if let Some(f) = failed {
            return Err(Refusal::Failed(f));
        }
        let Some((first, zone, why)) = denied.first().cloned() else {
            return Err(Refusal::Failed(format!("{host} has no address")));
        };
        if !self.user_allows(host, port, first.ip(), zone, &why).await {
            tracing::warn!("the sandbox refused a connection: {why}");
            return Err(Refusal::Denied(why));
        }
        tracing::info!("the user allowed a connection to {}", authority(host, port));
        // Only where the user was shown: the zone asked about, and for this
        // machine or the LAN the very address.
        let mut failed = String::new();
        let shown = |a: &SocketAddr, z: Zone| {
            z == zone
                && match zone {
                    Zone::Public => true,
                    // `localhost` is ::1 and 127.0.0.1: either answers.
                    Zone::HostLoopback if first.ip().is_loopback() => a.ip().is_loopback(),
                    _ => a.ip() == first.ip(),
                }
        };
        for (addr, ..) in denied.into_iter().filter(|(a, z, _)| shown(a, *z)) {
            match open(addr).await {
                Ok(stream) => return Ok(stream),
                Err(e) => failed = format!("{} ({addr}): {e}", authority(host, port)),
            }
        }
        Err(Refusal::Failed(failed))
    }
}

impl Judge {
    /// A name outside the egress list that is not resolved before it is
    /// judged: put to the user unresolved, and after a yes connected only
    /// to a public address (what the user was asked about) or one the
    /// table lets through anyway (an open LAN).
    async fn unlisted(&self, host: &str, port: u16) -> Result<TcpStream, Refusal> {
        let why = format!(
            "{host} is not in the egress list; to let the agent reach it, add \"{host}\" to \"network\": {{\"egress\": [...]}} in the user config"
        );
        let unresolved = IpAddr::from([0u8, 0, 0, 0]);
        if !self
            .user_allows(host, port, unresolved, Zone::Public, &why)
            .await
        {
            tracing::warn!("the sandbox refused a connection: {why}");
            return Err(Refusal::Denied(why));
        }
        let own = own_addresses().ok_or_else(|| {
            Refusal::Failed("cannot read this machine's addresses to judge the destination".into())
        })?;
        let addrs = tokio::net::lookup_host((host, port))
            .await
            .map_err(|e| Refusal::Failed(format!("cannot resolve {host}: {e}")))?;
        let mut failed = format!("{host} has no public address");
        let reachable = |a: &SocketAddr| {
            crate::policy::network::zone(a.ip(), &own) == Zone::Public
                || self
                    .policy
                    .decide(host, port, a.ip(), &own, &self.resolvers)
                    == Verdict::Allow
        };
        for addr in addrs.filter(reachable) {
            match open(addr).await {
                Ok(stream) => return Ok(stream),
                Err(e) => failed = format!("{} ({addr}): {e}", authority(host, port)),
            }
        }
        Err(Refusal::Failed(failed))
    }
}

/// A connection from the host's network, within the time limit.
async fn open(addr: SocketAddr) -> std::io::Result<TcpStream> {
    match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr)).await {
        Ok(Ok(stream)) => {
            let _ = stream.set_nodelay(true);
            Ok(stream)
        }
        Ok(Err(e)) => Err(e),
        Err(_) => Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "timed out",
        )),
    }
}

/// This machine's interface addresses and their subnets, read at each
/// connection (they change with the network); `None` when they cannot be
/// read (out of descriptors), which refuses the connection: without them
/// an address of this machine, or of a host beside it, would pass for a
/// public one. Only read: the interfaces are never changed here.
fn own_addresses() -> Option<Vec<OwnAddress>> {
    #[cfg(any(target_os = "linux", target_os = "macos"))]
    {
        let ip = |s: &nix::sys::socket::SockaddrStorage| {
            s.as_sockaddr_in()
                .map(|v4| IpAddr::V4(v4.ip()))
                .or_else(|| s.as_sockaddr_in6().map(|v6| IpAddr::V6(v6.ip())))
        };
        nix::ifaddrs::getifaddrs().ok().map(|addrs| {
            addrs
                .filter_map(|a| {
                    let addr = ip(a.address.as_ref()?)?;
                    // No mask read: the address alone, no subnet.
                    let prefix = match a.netmask.as_ref().and_then(ip) {
                        Some(IpAddr::V4(m)) if addr.is_ipv4() => u32::from(m).count_ones(),
                        Some(IpAddr::V6(m)) if addr.is_ipv6() => u128::from(m).count_ones(),
                        _ if addr.is_ipv4() => 32,
                        _ => 128,
                    };
                    Some(OwnAddress {
                        addr,
                        prefix: prefix as u8,
                    })
                })
                .collect()
        })
    }
    #[cfg(not(any(target_os = "linux", target_os = "macos")))]
    None
}

/// Serves the proxy port (on each of `proxies`: one per address family)
/// and the mirrors until the proxy is stopped (its process ends, or its
/// runtime is dropped).
pub async fn serve(judge: Judge, proxies: Vec<TcpListener>, mirrors: Vec<(u16, TcpListener)>) {
    let judge = Arc::new(judge);
    if judge.ledger.may_count() {
        // Counts a full queue held back go a little later.
        let judge = judge.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(100)).await;
                if judge.ledger.pending() {
                    judge.ledger.flush(false).await;
                }
            }
        });
    }
    // Connections at once, at most: each holds two descriptors, and the
    // proxy must keep some to judge with (see `own_addresses`). Beyond
    // it, new ones wait in the listeners' queues.
    let slots = Arc::new(Semaphore::new(judge.slots));
    for (port, listener) in mirrors {
        tokio::spawn(take_connections(
            listener,
            Some(port),
            judge.clone(),
            slots.clone(),
        ));
    }
    let mut proxies = proxies.into_iter();
    let Some(first) = proxies.next() else {
        return;
    };
    for listener in proxies {
        tokio::spawn(take_connections(
            listener,
            None,
            judge.clone(),
            slots.clone(),
        ));
    }
    take_connections(first, None, judge, slots).await
}

/// Takes `listener`'s connections, each while it holds a slot: the
/// proxy's own (`mirrored` none), or a mirror of that host port.
async fn take_connections(
    listener: TcpListener,
    mirrored: Option<u16>,
    judge: Arc<Judge>,
    slots: Arc<Semaphore>,
) {
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let Some(client) = accepted(&listener).await else {
            continue;
        };
        let judge = judge.clone();
        judge.open.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        tokio::spawn(async move {
            match mirrored {
                Some(port) => mirror(&judge, client, port).await,
                None => handle(&judge, client).await,
            }
            judge.open.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
            drop(slot);
        });
    }
}

/// How many connections may be open at once: what the descriptor limit
/// leaves after a reserve, two descriptors each (the proxy raises its
/// limit to the hard one first, on Linux).
pub fn connection_slots() -> usize {
    let limit = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        .map(|(soft, _)| soft)
        .unwrap_or(1024);
    (limit.min(1 << 20) as usize).saturating_sub(64).max(32) / 2
}

/// The next connection; `None` after a failure (and a pause).
async fn accepted(listener: &TcpListener) -> Option<TcpStream> {
    match listener.accept().await {
        Ok((client, _)) => Some(client),
        Err(e) => {
            super::pause_after_failed_accept("the proxy could not accept a connection", e).await;
            None
        }
    }
}

/// Carries a connection to a mirror to the host's loopback: the same
/// family first (a service may listen on ::1 alone, as Node's `localhost`
/// does, or on 127.0.0.1 alone), then the other.
async fn mirror(judge: &Judge, mut client: TcpStream, port: u16) {
    let v6 = client.local_addr().is_ok_and(|a| a.is_ipv6());
    let order = if v6 {
        ["::1", "127.0.0.1"]
    } else {
        ["127.0.0.1", "::1"]
    };
    for host in order {
        match judge.connect(host, port).await {
            Ok(mut upstream) => {
                let _ = tokio::io::copy_bidirectional_with_sizes(
                    &mut client,
                    &mut upstream,
                    super::ledger::CHUNK,
                    super::ledger::CHUNK,
                )
                .await;
                return;
            }
            Err(Refusal::Denied(why) | Refusal::Failed(why)) => {
                tracing::debug!("mirrored port {port}: {why}");
            }
        }
    }
}

async fn handle(judge: &Judge, client: TcpStream) {
    let _ = client.set_nodelay(true);
    let mut first = [0u8; 1];
    if client.peek(&mut first).await.unwrap_or(0) == 0 {
        return;
    }
    if first[0] == 5 {
        socks5(judge, client).await;
    } else {
        http(judge, client).await;
    }
}

/// SOCKS5, no authentication, CONNECT only (RFC 1928).
async fn socks5(judge: &Judge, mut client: TcpStream) {
    let reply = |code: u8| [5, code, 0, 1, 0, 0, 0, 0, 0, 0];
    let mut head = [0u8; 2];
    if client.read_exact(&mut head).await.is_err() {
        return;
    }
    let mut methods = vec![0u8; head[1] as usize];
    if client.read_exact(&mut methods).await.is_err() {
        return;
    }
    // With credentials to check, only user name and password (RFC 1929).
    let method = if judge.token.is_some() { 2 } else { 0 };
    if !methods.contains(&method) {
        let _ = client.write_all(&[5, 0xff]).await;
        return;
    }
    if client.write_all(&[5, method]).await.is_err() {
        return;
    }
    if let Some(token) = &judge.token {
        let mut ver_len = [0u8; 2];
        if client.read_exact(&mut ver_len).await.is_err() {
            return;
        }
        let mut user = vec![0u8; ver_len[1] as usize];
        let mut pass_len = [0u8; 1];
        if client.read_exact(&mut user).await.is_err()
            || client.read_exact(&mut pass_len).await.is_err()
        {
            return;
        }
        let mut pass = vec![0u8; pass_len[0] as usize];
        if client.read_exact(&mut pass).await.is_err() {
            return;
        }
        let good =
            ver_len[0] == 1 && user == CLIENT.as_bytes() && same_secret(&pass, token.as_bytes());
        let _ = client.write_all(&[1, if good { 0 } else { 1 }]).await;
        if !good {
            tracing::warn!("a SOCKS client without this sandbox's credentials was refused");
            return;
        }
    }
    let mut req = [0u8; 4];
    if client.read_exact(&mut req).await.is_err() {
        return;
    }
    if req[1] != 1 {
        // Only CONNECT: no BIND, no UDP.
        let _ = client.write_all(&reply(7)).await;
        return;
    }
    let host = match req[3] {
        1 => {
            let mut a = [0u8; 4];
            if client.read_exact(&mut a).await.is_err() {
                return;
            }
            IpAddr::from(a).to_string()
        }
        4 => {
            let mut a = [0u8; 16];
            if client.read_exact(&mut a).await.is_err() {
                return;
            }
            IpAddr::from(a).to_string()
        }
        3 => {
            let mut len = [0u8; 1];
            if client.read_exact(&mut len).await.is_err() {
                return;
            }
            let mut name = vec![0u8; len[0] as usize];
            if client.read_exact(&mut name).await.is_err() {
                return;
            }
            String::from_utf8_lossy(&name).into_owned()
        }
        _ => {
            let _ = client.write_all(&reply(8)).await;
            return;
        }
    };
    let mut port = [0u8; 2];
    if client.read_exact(&mut port).await.is_err() {
        return;
    }
    let port = u16::from_be_bytes(port);
    match judge.connect(&host, port).await {
        Ok(mut upstream) => {
            if client.write_all(&reply(0)).await.is_ok() {
                if let Some(strict) = super::tunnel::checked(judge.policy.tunnel_check(&host, port))
                {
                    let Some(first) =
                        super::tunnel::own_name_only(&mut client, &host, Vec::new(), strict).await
                    else {
                        return;
                    };
                    if let Ok(addr) = upstream.peer_addr() {
                        judge
                            .ledger
                            .add(&host, port, addr.ip(), 0, first.len() as u64, 0);
                    }
                    if upstream.write_all(&first).await.is_err() {
                        return;
                    }
                }
                crate::network::ledger::relay(
                    &mut client,
                    &mut upstream,
                    &judge.ledger,
                    &host,
                    port,
                )
                .await;
            }
        }
        // 2: not allowed by the ruleset; 4: host unreachable.
        Err(Refusal::Denied(_)) => {
            let _ = client.write_all(&reply(2)).await;
        }
        Err(Refusal::Failed(_)) => {
            let _ = client.write_all(&reply(4)).await;
        }
    }
}

/// Reads a request head (up to the blank line), returning it and whatever
/// came after it in the same reads.
async fn read_head(client: &mut (impl AsyncRead + Unpin)) -> Option<(Vec<u8>, Vec<u8>)> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 4096];
    loop {
        let n = client.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(end) = memchr::memmem::find(&buf, b"\r\n\r\n") {
            let rest = buf.split_off(end + 4);
            return Some((buf, rest));
        }
        if buf.len() > MAX_HEAD {
            return None;
        }
    }
}

async fn respond(client: &mut TcpStream, status: &str, body: &str) {
    let text = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}\n",
        body.len() + 1
    );
    let _ = client.write_all(text.as_bytes()).await;
}

async fn http(judge: &Judge, mut client: TcpStream) {
    let Some((head, rest)) = read_head(&mut client).await else {
        return;
    };
    let text = String::from_utf8_lossy(&head);
    let mut lines = text.split("\r\n");
    let request_line = lines.next().unwrap_or_default();
    let mut parts = request_line.split(' ');
    let (method, target, version) = (
        parts.next().unwrap_or_default(),
        parts.next().unwrap_or_default(),
        parts.next().unwrap_or("HTTP/1.1"),
    );
    if let Some(token) = &judge.token {
        if !authorized(text.split("\r\n").skip(1), token) {
            // Never judged, asked or counted: it is not the sandbox's.
            tracing::warn!("a client without this sandbox's proxy credentials was refused");
            let body = "zcode-acp: this proxy serves its own sandbox only; the proxy URL in HTTP_PROXY carries its credentials\n";
            let _ = client
                .write_all(
                    format!(
                        "HTTP/1.1 407 Proxy Authentication Required\r\nProxy-Authenticate: Basic realm=\"zcode-acp\"\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    )
                    .as_bytes(),
                )
                .await;
            return;
        }
    }
    let (host, port, path) = if method.eq_ignore_ascii_case("CONNECT") {
        match split_host_port(target, 443) {
            Some((h, p)) => (h, p, None),
            None => {
                return respond(
                    &mut client,
                    "400 Bad Request",
                    "zcode-acp: CONNECT needs host:port",
                )
                .await
            }
        }
    } else if let Some(rest) = target.strip_prefix("http://") {
        let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
        match split_host_port(authority, 80) {
            Some((h, p)) => (h, p, Some(if path.is_empty() { "/" } else { path })),
            None => {
                return respond(
                    &mut client,
                    "400 Bad Request",
                    "zcode-acp: no host in the request",
                )
                .await
            }
        }
    } else {
        return respond(
            &mut client,
            "400 Bad Request",
            "zcode-acp: this is the sandbox's proxy; send it CONNECT or http:// requests",
        )
        .await;
    };
    let mut upstream = match judge.connect(&host, port).await {
        Ok(s) => s,
        Err(Refusal::Denied(why)) => {
            let body =
                format!("zcode-acp: the sandbox's network policy refuses this connection: {why}");
            return respond(&mut client, "403 Forbidden", &body).await;
        }
        Err(Refusal::Failed(why)) => {
            return respond(&mut client, "502 Bad Gateway", &format!("zcode-acp: {why}")).await
        }
    };
    // What went to the origin before the relay: the request's head.
    let mut head_sent = 0;
    let mut rest = rest;
    match path {
        None => {
            if client
                .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
                .await
                .is_err()
            {
                return;
            }
            if let Some(strict) = super::tunnel::checked(judge.policy.tunnel_check(&host, port)) {
                match super::tunnel::own_name_only(&mut client, &host, rest, strict).await {
                    Some(first) => rest = first,
                    None => return,
                }
            }
        }
        Some(path) => {
            // One request per connection: the next one may be for another
            // host, so the origin is told to close after this one.
            // The Host the origin sees is the one judged (a shared front
            // must not be asked for another name than the one allowed).
            let authority = match (port, host.contains(':')) {
                (80, false) => host.clone(),
                (80, true) => format!("[{host}]"),
                (_, true) => format!("[{host}]:{port}"),
                (_, false) => format!("{host}:{port}"),
            };
            let mut out = format!("{method} {path} {version}\r\nHost: {authority}\r\n");
            for line in lines.filter(|l| !l.is_empty()) {
                let name = line.split(':').next().unwrap_or_default().trim();
                if [
                    "host",
                    "connection",
                    "proxy-connection",
                    "keep-alive",
                    "proxy-authorization",
                ]
                .iter()
                .any(|h| name.eq_ignore_ascii_case(h))
                {
                    continue;
                }
                out.push_str(line);
                out.push_str("\r\n");
            }
            out.push_str("Connection: close\r\n\r\n");
            head_sent = out.len();
            if upstream.write_all(out.as_bytes()).await.is_err() {
                return;
            }
        }
    }
    // Counted before it goes (see `ledger`).
    let already_sent = (head_sent + rest.len()) as u64;
    if let Ok(addr) = upstream.peer_addr() {
        judge.ledger.add(&host, port, addr.ip(), 0, already_sent, 0);
    }
    if !rest.is_empty() && upstream.write_all(&rest).await.is_err() {
        return;
    }
    crate::network::ledger::relay(&mut client, &mut upstream, &judge.ledger, &host, port).await;
}

/// `host:port`, `[v6]:port` or a bare host (with the default port).
fn split_host_port(authority: &str, default: u16) -> Option<(String, u16)> {
    let authority = authority.rsplit('@').next()?;
    if let Some(v6) = authority.strip_prefix('[') {
        let (host, rest) = v6.split_once(']')?;
        let port = match rest.strip_prefix(':') {
            Some(p) => p.parse().ok()?,
            None => default,
        };
        return Some((host.to_owned(), port));
    }
    let (host, port) = match authority.rsplit_once(':') {
        Some((h, p)) => (h, p.parse().ok()?),
        None => (authority, default),
    };
    (!host.is_empty()).then(|| (host.to_owned(), port))
}

#[cfg(test)]
mod tests {

    use super::*;

    #[test]
    fn authorities_are_split() {
        assert_eq!(
            split_host_port("example.com:8443", 443),
            Some(("example.com".into(), 8443))
        );
        assert_eq!(
            split_host_port("example.com", 80),
            Some(("example.com".into(), 80))
        );
        assert_eq!(split_host_port("[::1]:99", 80), Some(("::1".into(), 99)));
        assert_eq!(split_host_port("user:pw@h:1", 80), Some(("h".into(), 1)));
        assert_eq!(split_host_port(":80", 80), None);
        assert_eq!(split_host_port("h:notaport", 80), None);
    }
}
