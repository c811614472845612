//! The per-call tools server: JSON-RPC 2.0, one object per line, on a
//! Unix socket in the run's own directory, living exactly as long as the
//! run. Methods: `call {tool, args}`, `result {value}`, `log {level,
//! message}`. Every bound it keeps is a JSON-RPC error whose `data.code`
//! the stubs raise as `ToolError.code`, and a line in the run's `logs`.
//!
//! The socket is a file another run of the same agent can reach (they
//! share the agent's `/tmp`, and Landlock does not govern connecting to a
//! socket by its path), so every request must carry the run's token
//! (`token`, from `$ZCODE_TOOLS_TOKEN`, which only this run's processes
//! are given): one without it is refused, said in the logs, and its
//! connection closed.
//!
//! Connection by connection: a connection proves
//! it is the run's with its first request's token before it takes a slot
//! (`accept_all`, `connection`, `first_request`), then its requests are
//! read a line at a time and each answered by a task of its own (`serve`,
//! `Conn`). What the requests do is `calls`' (`handle`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;

use super::calls::{
    handle, Shared, FIRST_REQUEST_HEAD, FIRST_REQUEST_WAIT, MAX_CONNECTIONS, MAX_QUEUED_ANSWERS,
    MAX_TASKS_PER_CONNECTION, MAX_UNPROVEN, RECONNECT_GRACE,
};
use super::ToolFailure;

use super::budget::Budget;
use super::calls::{answer, State, DRAIN};
pub use super::calls::{Caller, LogEntry, Outcome, MAX_SOCKET_PATH};
use super::secret;
use super::ToolLimits;
use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Mutex;
use std::time::Instant;

/// The server of one run.
pub struct RpcServer {
    shared: Arc<Shared>,
    /// Taken by `finish`; aborted on drop (a run that never started).
    accept: Option<tokio::task::JoinHandle<()>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Drop for RpcServer {
    fn drop(&mut self) {
        if let Some(accept) = &self.accept {
            accept.abort();
        }
    }
}

impl RpcServer {
    /// Binds `path` (owner-only) and serves it until [`RpcServer::finish`].
    pub fn start(
        path: &Path,
        allowed: BTreeSet<String>,
        caller: Arc<dyn Caller>,
        limits: ToolLimits,
    ) -> std::io::Result<RpcServer> {
        if path.as_os_str().len() > MAX_SOCKET_PATH {
            return Err(std::io::Error::other(format!(
                "the tools socket's path {} is {} bytes, more than a Unix socket takes ({MAX_SOCKET_PATH}); set TMPDIR to a shorter directory",
                path.display(),
                path.as_os_str().len()
            )));
        }
        let listener = UnixListener::bind(path)?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
        let shared = Arc::new(Shared {
            token: secret::new(),
            budget: Budget::for_limits(&limits),
            allowed,
            caller,
            limits,
            started: Instant::now(),
            state: Mutex::new(State {
                ended: false,
                calls: 0,
                in_flight: 0,
                result: None,
                logs: Vec::new(),
                logs_dropped: 0,
                breaches: Default::default(),
            }),
        });
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let accept = tokio::spawn(accept_all(listener, shared.clone(), stopped));
        Ok(RpcServer {
            shared,
            accept: Some(accept),
            stop: Some(stop),
        })
    }

    /// The token every request must carry: for the run's environment
    /// ([`super::TOKEN_ENV`]), and nowhere else.
    pub fn token(&self) -> &str {
        &self.shared.token
    }

    /// Adds an entry of zcode-acp's own to the run's `logs`.
    pub fn note(&self, message: String) {
        let mut st = self.shared.lock();
        self.shared.log(&mut st, "info", message);
    }

    /// Ends the server (calls still in flight are dropped: the run is
    /// over) and returns what the run left.
    pub async fn finish(mut self) -> Outcome {
        self.shared.lock().ended = true;
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(mut accept) = self.accept.take() {
            // The run has ended, so its ends of the connections are
            // closed: what it wrote is read to the end, then they end.
            if tokio::time::timeout(DRAIN, &mut accept).await.is_err() {
                accept.abort();
                let _ = accept.await;
            }
        }
        let mut st = self.shared.state.lock().unwrap_or_else(|p| p.into_inner());
        let mut logs = std::mem::take(&mut st.logs);
        let t = self.shared.started.elapsed().as_millis() as u64;
        for (code, n) in &st.breaches {
            if *n > 1 {
                logs.push(LogEntry {
                    level: "warn".into(),
                    message: format!("zcode-acp: {n} calls in all were refused with {code}"),
                    t,
                });
            }
        }
        if st.logs_dropped > 0 {
            logs.push(LogEntry {
                level: "warn".into(),
                message: format!(
                    "zcode-acp: {} more log entries were dropped (at most {} are kept)",
                    st.logs_dropped, self.shared.limits.max_logs
                ),
                t,
            });
        }
        Outcome {
            result: st.result.take(),
            logs,
            calls: st.calls,
        }
    }
}

/// Accepts the run's connections until `stopped`. Each must first prove
/// it is the run's (its first request carries the token, within
/// [`FIRST_REQUEST_WAIT`]); only then does it take one of the run's
/// [`MAX_CONNECTIONS`] slots and get served by a task of its own. One past
/// the slots is refused, clearly, by [`refuse`].
pub(super) async fn accept_all(
    listener: UnixListener,
    shared: Arc<Shared>,
    mut stopped: tokio::sync::oneshot::Receiver<()>,
) {
    // The connections die with this task: aborting it at the end of the
    // run drops the set, which aborts every call in flight.
    let mut connections = JoinSet::new();
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    // Connections not yet past their first request, oldest first: each
    // can be told to give up its place.
    let mut unproven: std::collections::VecDeque<tokio::sync::oneshot::Sender<()>> =
        Default::default();
    loop {
        tokio::select! {
            _ = &mut stopped => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    // A proven (or closed) connection dropped its end.
                    unproven.retain(|s| !s.is_closed());
                    if unproven.len() >= MAX_UNPROVEN {
                        if let Some(oldest) = unproven.pop_front() {
                            let _ = oldest.send(());
                        }
                    }
                    let (evict, evicted) = tokio::sync::oneshot::channel();
                    unproven.push_back(evict);
                    connections.spawn(connection(stream, shared.clone(), slots.clone(), evicted));
                }
                Err(e) => {
                    // Out of descriptors, say: later connections may still
                    // be taken.
                    tracing::debug!("the tools socket could not accept: {e}");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
    drop(listener);
    while connections.join_next().await.is_some() {}
}

/// One connection, from its first byte: it holds no slot until its first
/// request has shown the run's token (a silent one is closed after
/// [`FIRST_REQUEST_WAIT`], or sooner when newer ones push it out); then it
/// takes a slot, or is refused for want of one.
async fn connection(
    mut stream: UnixStream,
    shared: Arc<Shared>,
    slots: Arc<Semaphore>,
    evicted: tokio::sync::oneshot::Receiver<()>,
) {
    let head = tokio::select! {
        head = first_request(&mut stream, &shared) => head,
        _ = tokio::time::sleep(FIRST_REQUEST_WAIT) => None,
        _ = evicted => None,
    };
    // (`evicted` is dropped with the select: this connection no longer
    // counts among the unproven.)
    let Some(head) = head else { return };
    match slot(&slots).await {
        Some(slot) => serve(stream, shared, slot, head).await,
        None => refuse(stream, shared, &head).await,
    }
}

/// Reads the start of a connection's first request and checks its token:
/// what was read (to be served from), or None when it does not carry the
/// token (the refusal is written, and the connection is to be closed) or
/// the connection ended first.
async fn first_request(stream: &mut UnixStream, shared: &Shared) -> Option<Vec<u8>> {
    let mut head: Vec<u8> = Vec::new();
    let mut chunk = [0u8; 4096];
    // Blank lines before the first request are dropped as they come (as
    // `line` skips them), and count against the head's bound: a stranger
    // sending only whitespace is refused as soon as any other would be.
    let mut skipped = 0usize;
    loop {
        let blank = head
            .iter()
            .position(|b| !b.is_ascii_whitespace())
            .unwrap_or(head.len());
        skipped += blank;
        head.drain(..blank);
        let line_end = memchr::memchr(b'\n', &head);
        let proven = match line_end {
            Some(end) => Some(
                serde_json::from_slice::<Value>(&head[..end])
                    .ok()
                    .is_some_and(|v| shared.is_token(v.get("token").and_then(Value::as_str))),
            ),
            None if skipped + head.len() >= FIRST_REQUEST_HEAD => {
                Some(shared.is_token(leading_str(&head, "token").as_deref()))
            }
            None => None,
        };
        match proven {
            Some(true) => return Some(head),
            Some(false) => {
                let mut line = closing_answer(&leading_id(&head), shared.stranger());
                line.push(b'\n');
                let _ = stream.write_all(&line).await;
                // The rest of the request is read and dropped (within the
                // connection's first wait), so a client still writing it
                // reads the refusal instead of a broken pipe.
                if line_end.is_none() {
                    loop {
                        match stream.read(&mut chunk).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) if chunk[..n].contains(&b'\n') => break,
                            Ok(_) => {}
                        }
                    }
                }
                return None;
            }
            None => {}
        }
        let want = FIRST_REQUEST_HEAD
            .saturating_sub(skipped + head.len())
            .clamp(1, chunk.len());
        match stream.read(&mut chunk[..want]).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => head.extend_from_slice(&chunk[..n]),
        }
    }
}

/// A slot for a new connection. At the limit, one the script has just
/// closed frees its slot as soon as its end is read, which may come just
/// after the new connection: that long is waited for.
async fn slot(slots: &Arc<Semaphore>) -> Option<OwnedSemaphorePermit> {
    if let Ok(slot) = slots.clone().try_acquire_owned() {
        return Some(slot);
    }
    tokio::time::timeout(RECONNECT_GRACE, slots.clone().acquire_owned())
        .await
        .ok()?
        .ok()
}

/// A connection of the run's past the limit: its first request (already
/// read, `head`) is answered, by its id, with the refusal (a script reads
/// why, not a reset), then it is closed.
async fn refuse(mut stream: UnixStream, shared: Arc<Shared>, head: &[u8]) {
    let f = shared.breach(
        "too_many_at_once",
        format!("this run holds {MAX_CONNECTIONS} connections to its tools server already, the most it may; close one first (the stubs keep one per thread)"),
    );
    let mut line = closing_answer(&leading_id(head.trim_ascii_start()), f);
    line.push(b'\n');
    let _ = stream.write_all(&line).await;
    // A request still being written is read to its end (within a bound),
    // so its client reads the refusal instead of a broken pipe.
    if !head.contains(&b'\n') {
        let mut chunk = [0u8; 4096];
        let _ = tokio::time::timeout(FIRST_REQUEST_WAIT, async {
            loop {
                match stream.read(&mut chunk).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) if chunk[..n].contains(&b'\n') => break,
                    Ok(_) => {}
                }
            }
        })
        .await;
    }
}

/// An answer on its way to the script, with the budget it holds until it
/// is written (none for the short refusals the reading itself answers).
struct Queued {
    line: Vec<u8>,
    _held: Option<OwnedSemaphorePermit>,
}

/// What the reading of a connection does next.
enum Next {
    Go,
    Close,
}

/// One connection being read.
struct Conn {
    reader: tokio::net::unix::OwnedReadHalf,
    shared: Arc<Shared>,
    tx: mpsc::Sender<Queued>,
    calls: JoinSet<()>,
    /// A request on this connection carried the token.
    trusted: bool,
    /// An answer could not be written (the script is gone): calls it still
    /// asked for are not made, since nobody would read what they return.
    deaf: Arc<AtomicBool>,
}

/// Serves one connection: requests are read one line at a time, checked
/// for the run's token, and each is answered by a task of its own (a
/// script may have several calls in flight); answers go back through one
/// writer. The first request without the token ends the connection.
async fn serve(stream: UnixStream, shared: Arc<Shared>, slot: OwnedSemaphorePermit, head: Vec<u8>) {
    let (reader, writer) = stream.into_split();
    let (tx, rx) = mpsc::channel::<Queued>(MAX_QUEUED_ANSWERS);
    let deaf = Arc::new(AtomicBool::new(false));
    let write = tokio::spawn(write_answers(writer, rx, deaf.clone()));
    // A line is at most the argument ceiling plus room for the envelope.
    let max_line = shared.limits.max_bytes.saturating_add(4096);
    let mut conn = Conn {
        reader,
        shared,
        tx,
        calls: JoinSet::new(),
        trusted: false,
        deaf,
    };
    let mut buf: Vec<u8> = Vec::with_capacity(8192);
    let mut chunk = vec![0u8; (64 * 1024).max(head.len())];
    // What the first request's check read comes first.
    let mut first = Some(head);
    // (its id, and whether its first bytes carried the token)
    let mut skipping: Option<(Value, bool)> = None;
    'read: loop {
        let n = match first.take() {
            Some(head) if !head.is_empty() => {
                chunk[..head.len()].copy_from_slice(&head);
                head.len()
            }
            _ => tokio::select! {
                n = conn.reader.read(&mut chunk) => match n { Ok(0) | Err(_) => break, Ok(n) => n },
                Some(_) = conn.calls.join_next(), if !conn.calls.is_empty() => continue,
            },
        };
        let mut rest = &chunk[..n];
        while !rest.is_empty() {
            let (part, ended) = match memchr::memchr(b'\n', rest) {
                Some(i) => (&rest[..i], Some(i + 1)),
                None => (rest, None),
            };
            if skipping.is_none() {
                buf.extend_from_slice(part);
                if buf.len() > max_line {
                    // Too long to take: answered (by the id its first
                    // bytes carry) once the line ends, the rest unread.
                    let token = leading_str(&buf, "token");
                    let with_token = conn.shared.is_token(token.as_deref());
                    skipping = Some((leading_id(&buf), with_token));
                    buf.clear();
                }
            }
            let Some(used) = ended else { break };
            rest = &rest[used..];
            let next = match skipping.take() {
                Some((id, with_token)) => conn.over_long(&id, with_token).await,
                None => conn.line(std::mem::take(&mut buf)).await,
            };
            if let Next::Close = next {
                break 'read;
            }
        }
    }
    // The script closed its end (or sent a request without the token):
    // the connection no longer counts toward the limit, and what it
    // asked is still answered (a `result` sent just before exit), then
    // the writer ends.
    drop(slot);
    while conn.calls.join_next().await.is_some() {}
    drop(conn);
    let _ = write.await;
}

/// Writes the answers in turn, each giving back its budget once written.
/// Past a failed write the rest are dropped as they come (their budget
/// with them), and the connection is marked deaf.
async fn write_answers(
    mut writer: tokio::net::unix::OwnedWriteHalf,
    mut rx: mpsc::Receiver<Queued>,
    deaf: Arc<AtomicBool>,
) {
    while let Some(mut q) = rx.recv().await {
        if deaf.load(Ordering::Relaxed) {
            continue;
        }
        q.line.push(b'\n');
        if writer.write_all(&q.line).await.is_err() {
            deaf.store(true, Ordering::Relaxed);
        }
    }
}

impl Conn {
    /// Queues a short answer the reading gives itself.
    async fn say(&self, id: &Value, f: ToolFailure) {
        let q = Queued {
            line: answer(id, Err(f)),
            _held: None,
        };
        let _ = self.tx.send(q).await;
    }

    /// Queues the refusal after which the connection is closed.
    async fn say_last(&self, id: &Value, f: ToolFailure) {
        let q = Queued {
            line: closing_answer(id, f),
            _held: None,
        };
        let _ = self.tx.send(q).await;
    }

    /// Whether a call's answer would reach nobody: the script stopped
    /// reading this connection, closed it (what it wrote before is still
    /// read: a `result` is kept), or its run has ended.
    fn unheard(&self) -> bool {
        self.deaf.load(Ordering::Relaxed) || self.shared.lock().ended || self.hung_up()
    }

    /// Whether the script closed its end of the connection entirely (not
    /// only its writing half, as `nc -N` does before reading the answers).
    fn hung_up(&self) -> bool {
        use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
        use std::os::fd::AsFd;
        let mut fds = [PollFd::new(
            self.reader.as_ref().as_fd(),
            PollFlags::empty(),
        )];
        matches!(poll(&mut fds, PollTimeout::ZERO), Ok(n) if n > 0)
            && fds[0]
                .revents()
                .is_some_and(|r| r.contains(PollFlags::POLLHUP))
    }

    /// A line too long to take, read to its end unkept.
    async fn over_long(&mut self, id: &Value, with_token: bool) -> Next {
        if !(self.trusted || with_token) {
            self.say_last(id, self.shared.stranger()).await;
            return Next::Close;
        }
        let f = self.shared.breach(
            "too_large",
            format!(
                "a request of more than {} bytes was refused unread; pass less per call",
                self.shared.limits.max_bytes
            ),
        );
        self.say(id, f).await;
        Next::Go
    }

    /// One whole line: checked, then answered by a task of its own.
    async fn line(&mut self, line: Vec<u8>) -> Next {
        if line.iter().all(u8::is_ascii_whitespace) {
            return Next::Go;
        }
        let msg: Value = match serde_json::from_slice(&line) {
            Ok(v) => v,
            // Without the token no more is said than that.
            Err(_) if !self.trusted => {
                self.say_last(&leading_id(&line), self.shared.stranger())
                    .await;
                return Next::Close;
            }
            Err(e) => {
                let f = self
                    .shared
                    .breach("bad_request", format!("a request that is not JSON: {e}"));
                self.say(&leading_id(&line), f).await;
                return Next::Go;
            }
        };
        if !self
            .shared
            .is_token(msg.get("token").and_then(Value::as_str))
        {
            let id = msg.get("id").cloned().unwrap_or(Value::Null);
            self.say_last(&id, self.shared.stranger()).await;
            return Next::Close;
        }
        self.trusted = true;
        let is_call = msg.get("method").and_then(Value::as_str) == Some("call");
        if is_call && self.unheard() {
            return Next::Go;
        }
        // Too many in flight, or the run's budget for requests and answers
        // held is spent: this connection is not read until some end (a
        // script that never reads its answers stalls itself, and this
        // server's memory stays bounded).
        while self.calls.len() >= MAX_TASKS_PER_CONNECTION {
            self.calls.join_next().await;
        }
        let held = self
            .shared
            .budget
            .hold(line.len() + self.shared.budget.max_answer())
            .await;
        drop(line);
        // The wait may have outlasted the script.
        if is_call && self.unheard() {
            return Next::Go;
        }
        let (shared, tx) = (self.shared.clone(), self.tx.clone());
        self.calls.spawn(async move {
            if let Some(reply) = handle(msg, &shared).await {
                let held = shared.budget.rehold(held, reply.len()).await;
                let _ = tx
                    .send(Queued {
                        line: reply,
                        _held: Some(held),
                    })
                    .await;
            }
        });
        Next::Go
    }
}

/// How much of an over-long line is looked at for its id and token.
const HEAD: usize = 256;

/// The id at the start of an over-long line (the stubs write it first).
fn leading_id(head: &[u8]) -> Value {
    let head = &head[..head.len().min(HEAD)];
    let text = String::from_utf8_lossy(head);
    text.split_once("\"id\":")
        .and_then(|(_, rest)| {
            let digits: String = rest
                .trim_start()
                .chars()
                .take_while(char::is_ascii_digit)
                .collect();
            digits.parse::<u64>().ok()
        })
        .map_or(Value::Null, Value::from)
}

/// The string field `key` near the start of an over-long line (the stubs
/// write the token right after the id).
pub(crate) fn leading_str(head: &[u8], key: &str) -> Option<String> {
    let head = &head[..head.len().min(HEAD)];
    let text = String::from_utf8_lossy(head);
    let (_, rest) = text.split_once(&format!("\"{key}\":"))?;
    let rest = rest.trim_start().strip_prefix('"')?;
    let (value, _) = rest.split_once('"')?;
    Some(value.to_owned())
}

/// A refusal after which the server closes the connection: `data.closed`
/// tells the stubs to open another for their next call.
fn closing_answer(id: &Value, f: ToolFailure) -> Vec<u8> {
    let v = json!({"jsonrpc": "2.0", "id": id, "error": {
        "code": -32000, "message": f.message, "data": {"code": f.code, "closed": true}
    }});
    serde_json::to_vec(&v).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_over_long_lines_id_and_token_are_read_from_its_first_bytes() {
        assert_eq!(leading_id(br#"{"id":42,"jsonrpc":"2.0","#), json!(42));
        assert_eq!(leading_id(br#"{"id": 7, "#), json!(7));
        assert_eq!(leading_id(br#"{"jsonrpc":"2.0""#), Value::Null);
        let head = br#"{"id":3,"token":"ab12","jsonrpc":"2.0","params":{"#;
        assert_eq!(leading_str(head, "token").as_deref(), Some("ab12"));
        assert_eq!(leading_str(br#"{"id":3,"token":"ab1"#, "token"), None);
    }
}
