//! The proxy run by the process that armed the sandbox, for a platform
//! that cannot give the sandbox a network of its own (macOS): Seatbelt
//! can confine a process's outbound traffic to one port of the host's
//! loopback, and this proxy listens there, outside the sandbox, on a
//! thread of its own. It is the same proxy as Linux's (`proxy`): the same
//! table, the same questions and the same counts, handed over in this
//! process instead of over sockets.
//!
//! Its parts:
//! - a listener on `127.0.0.1`, on a port the system picks (the host's
//!   loopback is shared: no port is known free beforehand);
//! - questions about refused connections, put to whoever takes them
//!   ([`OutsideProxy::questions`], the bridge); nobody takes them under
//!   `zcode-acp run` or a tool call, and a refusal is then final;
//! - counts of what each connection carried, to whoever takes the
//!   [`ledger::Source`] ([`OutsideProxy::ledger`]).
//!
//! It serves until dropped (with the arming that started it); its
//! connections end with it.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use super::asks::Question;
pub use super::asks::Questions;
use super::ledger;
use crate::policy::network::NetworkPolicy;

/// Why the proxy cannot start (the sandbox is then not armed).
#[derive(Debug, thiserror::Error)]
#[error("cannot start the sandbox's network proxy: {0}; the sandbox was not armed (check that 127.0.0.1 can be listened on, or set \"network\": {{\"hostLoopback\": \"allow\"}} to leave the network open and confine writes only)")]
pub struct StartError(std::io::Error);

/// A running proxy outside the sandbox.
pub struct OutsideProxy {
    port: u16,
    /// Its credentials: any local process can reach its port, and only
    /// the sandbox's commands are given them (in their proxy variables).
    token: String,
    questions: Questions,
    ledger: Arc<OnceLock<std::os::unix::net::UnixDatagram>>,
    /// Its connections open now.
    open: Arc<std::sync::atomic::AtomicUsize>,
    /// Dropped with this value: the proxy's thread then ends, and its
    /// runtime with every connection.
    _stop: oneshot::Sender<()>,
}

/// Listeners on one port of both loopbacks: `localhost:PORT`, which the
/// profile opens, is `::1` as well as `127.0.0.1`, and no other program
/// may hold either. Where the machine has no IPv6 loopback, 127.0.0.1 alone.
fn both_loopbacks() -> std::io::Result<Vec<std::net::TcpListener>> {
    let mut last = None;
    for _ in 0..16 {
        let v4 = std::net::TcpListener::bind(("127.0.0.1", 0))?;
        let port = v4.local_addr()?.port();
        match std::net::TcpListener::bind(("::1", port)) {
            Ok(v6) => return Ok(vec![v4, v6]),
            // Someone has that port on ::1: another one.
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => last = Some(e),
            Err(_) => return Ok(vec![v4]),
        }
    }
    Err(last.unwrap_or_else(|| std::io::ErrorKind::AddrInUse.into()))
}

impl OutsideProxy {
    /// Starts the proxy for `table` on a port of the host's loopback.
    pub fn start(table: &NetworkPolicy) -> Result<OutsideProxy, StartError> {
        let listeners = both_loopbacks().map_err(StartError)?;
        let port = listeners[0].local_addr().map_err(StartError)?.port();
        for l in &listeners {
            l.set_nonblocking(true).map_err(StartError)?;
        }
        let questions = Questions::default();
        let ledger: Arc<OnceLock<std::os::unix::net::UnixDatagram>> = Default::default();
        let (stop, stopped) = oneshot::channel::<()>();
        // It shares this process's descriptors: half of what a proxy of
        // its own would take, so the rest of the process keeps its own.
        let mut judge = super::proxy::Judge::with(
            table.clone(),
            super::proxy::Asker::InProcess(questions.clone()),
            ledger::Sink::later(ledger.clone()),
            (super::proxy::connection_slots() / 2).max(16),
        );
        let token = format!("{:032x}", rand::random::<u128>());
        judge.token = Some(token.clone());
        let open = judge.open.clone();
        let (started, running) = std::sync::mpsc::channel::<std::io::Result<()>>();
        std::thread::Builder::new()
            .name("zcode-acp-proxy".into())
            .spawn(move || {
                // Built (and dropped) on this thread: a runtime may not be
                // dropped inside another's.
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(runtime) => runtime,
                    Err(e) => {
                        let _ = started.send(Err(e));
                        return;
                    }
                };
                runtime.block_on(async move {
                    let mut proxies = Vec::new();
                    for l in listeners {
                        match tokio::net::TcpListener::from_std(l) {
                            Ok(l) => proxies.push(l),
                            Err(e) => {
                                let _ = started.send(Err(e));
                                return;
                            }
                        }
                    }
                    let _ = started.send(Ok(()));
                    tokio::select! {
                        _ = super::proxy::serve(judge, proxies, Vec::new()) => {}
                        _ = stopped => {}
                    }
                });
            })
            .map_err(StartError)?;
        // Serving before the sandbox may connect: a proxy that cannot is
        // a sandbox not armed.
        running
            .recv()
            .unwrap_or_else(|_| Err(std::io::Error::other("its thread ended")))
            .map_err(StartError)?;
        Ok(OutsideProxy {
            port,
            token,
            questions,
            ledger,
            open,
            _stop: stop,
        })
    }

    /// The port of the host's loopback it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Waits, at most `within`, for the connections still open to end
    /// (each one's counts are sent as it ends): once the sandboxed command
    /// is gone, what it had under way is carried to its end and counted.
    pub fn settle(&self, within: Duration) {
        let until = std::time::Instant::now() + within;
        while self.open.load(std::sync::atomic::Ordering::SeqCst) > 0
            && std::time::Instant::now() < until
        {
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// The questions about refused connections, from now on: only the
    /// first caller gets them.
    pub fn questions(&self) -> Option<mpsc::UnboundedReceiver<Question>> {
        let (tx, rx) = mpsc::unbounded_channel();
        self.questions.take_from(tx).then_some(rx)
    }

    /// The counts of what the connections carry, from now on: only the
    /// first caller gets them.
    pub fn ledger(&self) -> std::io::Result<ledger::Source> {
        let (proxy, source) = ledger::Source::pair()?;
        self.ledger
            .set(proxy)
            .map_err(|_| std::io::Error::other("the proxy's counts were taken already"))?;
        Ok(source)
    }
}

impl crate::confine::Outside for OutsideProxy {
    fn port(&self) -> u16 {
        self.port
    }

    fn env(&self) -> Vec<(String, String)> {
        super::proxy_env(self.port, Some(&self.token))
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::network::asks::Reply;
    use std::io::{BufRead, BufReader, Read, Write};
    use std::net::{TcpListener, TcpStream};

    /// A CONNECT through `proxy` to `127.0.0.1:port`, with its credentials
    /// (as the sandbox's commands have them) or without: the status line,
    /// the stream to write to, and what follows the head.
    fn connect_as(
        proxy: &OutsideProxy,
        credentials: bool,
        port: u16,
    ) -> (String, TcpStream, BufReader<TcpStream>) {
        use base64::Engine;
        let mut s = TcpStream::connect(("127.0.0.1", proxy.port())).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let auth = if credentials {
            let basic = base64::engine::general_purpose::STANDARD.encode(format!(
                "{}:{}",
                crate::network::credentials::CLIENT,
                proxy.token
            ));
            format!("Proxy-Authorization: Basic {basic}\r\n")
        } else {
            String::new()
        };
        write!(
            s,
            "CONNECT 127.0.0.1:{port} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{auth}\r\n"
        )
        .unwrap();
        let mut reader = BufReader::new(s.try_clone().unwrap());
        let mut status = String::new();
        reader.read_line(&mut status).unwrap();
        // The rest of the head.
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line).unwrap() == 0 || line == "\r\n" {
                break;
            }
        }
        (status, s, reader)
    }

    fn connect(proxy: &OutsideProxy, port: u16) -> (String, TcpStream, BufReader<TcpStream>) {
        connect_as(proxy, true, port)
    }

    fn server() -> (TcpListener, u16) {
        let l = TcpListener::bind(("127.0.0.1", 0)).unwrap();
        l.set_nonblocking(true).unwrap();
        let port = l.local_addr().unwrap().port();
        (l, port)
    }

    /// What `l` was sent on the connection it takes, waiting for it.
    fn received(l: &TcpListener, n: usize) -> Vec<u8> {
        l.set_nonblocking(false).unwrap();
        let (mut c, _) = l.accept().unwrap();
        c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut buf = vec![0; n];
        c.read_exact(&mut buf).unwrap();
        buf
    }

    fn taken(l: &TcpListener) -> bool {
        l.set_nonblocking(true).unwrap();
        l.accept().is_ok()
    }

    #[test]
    fn the_proxy_outside_judges_asks_counts_and_ends_with_its_arming() {
        let (listed, listed_port) = server();
        let (unlisted, unlisted_port) = server();
        let table =
            NetworkPolicy::parse(&serde_json::json!({"hostLoopback": [listed_port]})).unwrap();
        let proxy = OutsideProxy::start(&table).unwrap();
        let ledger = proxy.ledger().unwrap();
        assert!(proxy.ledger().is_err(), "the counts go to one taker");

        // A listed port: carried, and counted before it arrives.
        let (status, mut s, _) = connect(&proxy, listed_port);
        assert!(status.starts_with("HTTP/1.1 200"), "{status}");
        s.write_all(b"ping").unwrap();
        assert_eq!(received(&listed, 4), b"ping");
        // What a client only sends is counted within the proxy's tick.
        let mut counted = 0;
        for _ in 0..100 {
            counted += ledger
                .drain()
                .iter()
                .filter(|r| r.port == listed_port)
                .map(|r| r.sent)
                .sum::<u64>();
            if counted >= 4 {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        assert_eq!(counted, 4);

        // Unlisted, with nobody taking questions: refused, with the way
        // to allow it, and nothing reached.
        let (status, _, mut rest) = connect(&proxy, unlisted_port);
        assert!(status.starts_with("HTTP/1.1 403"), "{status}");
        let mut body = String::new();
        let _ = rest.read_to_string(&mut body);
        assert!(body.contains("hostLoopback"), "{body}");
        assert!(!taken(&unlisted));

        // A client without the sandbox's credentials (another local
        // program: the port is on the host's loopback) is neither served
        // nor asked about, even to a listed port.
        let mut questions = proxy.questions().unwrap();
        assert!(proxy.questions().is_none(), "the questions go to one taker");
        let (status, _, _) = connect_as(&proxy, false, listed_port);
        assert!(status.starts_with("HTTP/1.1 407"), "{status}");
        assert!(!taken(&listed));
        assert!(
            questions.try_recv().is_err(),
            "a stranger's connection was asked about"
        );

        // Once questions are taken, the user's yes lets it through.
        let answerer = std::thread::spawn(move || {
            let Some(Question::Asked(ask, answer)) = questions.blocking_recv() else {
                panic!("no question");
            };
            let _ = answer.send(Reply {
                allow: true,
                remember: false,
            });
            ask
        });
        let (status, mut s, _) = connect(&proxy, unlisted_port);
        assert!(status.starts_with("HTTP/1.1 200"), "{status}");
        assert_eq!(answerer.join().unwrap().port, unlisted_port);
        s.write_all(b"once").unwrap();
        assert_eq!(received(&unlisted, 4), b"once");

        // Dropped with its arming: nothing listens on its port any more.
        let port = proxy.port();
        drop(proxy);
        let closed = (0..200).any(|_| {
            std::thread::sleep(Duration::from_millis(10));
            TcpStream::connect(("127.0.0.1", port)).is_err()
        });
        assert!(closed, "the proxy still listens after its arming ended");
    }

    /// SOCKS5 clients give the same credentials (user name and password,
    /// RFC 1929); one that offers no authentication is turned away.
    #[test]
    fn socks_clients_need_the_sandboxs_credentials_too() {
        let (listed, listed_port) = server();
        let table =
            NetworkPolicy::parse(&serde_json::json!({"hostLoopback": [listed_port]})).unwrap();
        let proxy = OutsideProxy::start(&table).unwrap();
        let socks = |user: &[u8], pass: &[u8], methods: &[u8]| -> Vec<u8> {
            let mut s = TcpStream::connect(("127.0.0.1", proxy.port())).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
            let mut hello = vec![5, methods.len() as u8];
            hello.extend(methods);
            s.write_all(&hello).unwrap();
            let mut choice = [0u8; 2];
            s.read_exact(&mut choice).unwrap();
            if choice[1] != 2 {
                return choice.to_vec();
            }
            let mut auth = vec![1, user.len() as u8];
            auth.extend(user);
            auth.push(pass.len() as u8);
            auth.extend(pass);
            s.write_all(&auth).unwrap();
            let mut status = [0u8; 2];
            s.read_exact(&mut status).unwrap();
            if status[1] != 0 {
                return status.to_vec();
            }
            let mut connect = vec![5, 1, 0, 1, 127, 0, 0, 1];
            connect.extend(listed_port.to_be_bytes());
            s.write_all(&connect).unwrap();
            let mut reply = [0u8; 10];
            s.read_exact(&mut reply).unwrap();
            reply[..2].to_vec()
        };
        let client = crate::network::credentials::CLIENT.as_bytes();
        assert_eq!(socks(b"", b"", &[0]), vec![5, 0xff]);
        assert_eq!(socks(client, b"wrong", &[0, 2]), vec![1, 1]);
        assert!(!taken(&listed));
        assert_eq!(socks(client, proxy.token.as_bytes(), &[0, 2]), vec![5, 0]);
        assert!(
            taken(&listed) || {
                std::thread::sleep(Duration::from_millis(200));
                taken(&listed)
            }
        );
    }
}
