//! The editor's files for code run by `run_code`: one socket per session,
//! bound by the bridge in its own directory (`~/.zcode-acp/run-code/...`,
//! mode 0700) and named to the session's run_code server (`--editor`).
//! What arrives on it becomes the session's own `fs/read_text_file` or
//! `fs/write_text_file` request: a write is judged by the same policy and
//! allow flow as the agent's, and only what the editor advertised is
//! sent. The sockets are exempt from the sandbox's socket covering (see
//! `NetworkPolicy::served_sockets`): the bridge judges every call.
//!
//! A socket is made when the session is opened, before its id is known
//! (the agent chooses it): it is bound to the session when the agent's
//! answer names it, and refuses calls until then.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::sync::{mpsc, oneshot};
use tracing::{debug, warn};

use super::Bridge;
use crate::relay::{codes, Frame, RawId};

/// The most read from one connection, in bytes. A session's run_code
/// server (never a run: runs reach it only through that server) opens one
/// connection per call, so this bounds one request: a write's content is
/// at most the run's `runCode.maxToolBytes` (1 MiB by default), so 8 MiB
/// leaves room; a longer request is cut here and refused as not JSON.
const MAX_REQUEST: u64 = 8 << 20;

/// What an answer is: the editor's result, or an error's code and message.
pub(super) type ToolReply = Result<Value, (i64, String)>;

/// A call from a session's run_code server.
pub(super) struct EditorCall {
    pub session: String,
    pub method: &'static str,
    pub params: serde_json::Map<String, Value>,
    pub reply: oneshot::Sender<ToolReply>,
}

/// Connections one socket serves at once (one call each).
const MAX_CONNECTIONS: usize = 8;

struct Listening {
    path: PathBuf,
    token: String,
    session: Arc<Mutex<Option<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Listening {
    fn drop(&mut self) {
        self.task.abort();
        let _ = std::fs::remove_file(&self.path);
    }
}

/// A socket made for a session: where it is and its token.
pub(super) struct Made {
    pub path: PathBuf,
    pub token: String,
    /// Its slot, when it was made for a session being opened.
    pub opening: Option<usize>,
}

pub(super) struct CodeTools {
    tx: mpsc::UnboundedSender<EditorCall>,
    rx: mpsc::UnboundedReceiver<EditorCall>,
    /// By slot; a closed socket leaves None (slots are never reused).
    sockets: Vec<Option<Listening>>,
    /// Sockets made for a session being opened, by the opening request's
    /// bridge id.
    awaiting: HashMap<u64, usize>,
    /// Calls at the editor or held for the user's answer, by their id.
    pending: HashMap<String, oneshot::Sender<ToolReply>>,
    next_id: u64,
    /// Why the editor's socket could not be made (the editor is told).
    pub unavailable: Option<String>,
}

impl CodeTools {
    pub fn new() -> CodeTools {
        let (tx, rx) = mpsc::unbounded_channel();
        CodeTools {
            tx,
            rx,
            sockets: Vec::new(),
            awaiting: HashMap::new(),
            pending: HashMap::new(),
            next_id: 0,
            unavailable: None,
        }
    }

    /// The socket of `session` (opened or restored: its id is known),
    /// made in `dir` if it has none yet.
    pub fn for_session(&mut self, dir: &Path, session: &str) -> Option<Made> {
        let known = self.sockets.iter().flatten().find(|s| {
            s.session
                .lock()
                .map(|g| g.as_deref() == Some(session))
                .unwrap_or(false)
        });
        if let Some(s) = known {
            return Some(Made {
                path: s.path.clone(),
                token: s.token.clone(),
                opening: None,
            });
        }
        let i = self.listen(dir, Some(session.to_owned()))?;
        self.made(i, None)
    }

    /// A socket for a session being opened, bound to it once the agent
    /// answers with its id ([`CodeTools::await_open`], then
    /// [`CodeTools::opened`]).
    pub fn for_opening(&mut self, dir: &Path) -> Option<Made> {
        let i = self.listen(dir, None)?;
        self.made(i, Some(i))
    }

    fn made(&self, i: usize, opening: Option<usize>) -> Option<Made> {
        let s = self.sockets.get(i)?.as_ref()?;
        Some(Made {
            path: s.path.clone(),
            token: s.token.clone(),
            opening,
        })
    }

    /// The socket `index` is for the session the request `bid` opens.
    pub fn await_open(&mut self, bid: u64, index: usize) {
        self.awaiting.insert(bid, index);
    }

    /// Closes a socket nobody will be told of (its session was not
    /// offered run_code after all).
    pub fn close(&mut self, index: usize) {
        if let Some(slot) = self.sockets.get_mut(index) {
            *slot = None;
        }
    }

    /// The request `bid` was answered: `session` is what it opened (None:
    /// it failed, and its socket is closed).
    pub fn opened(&mut self, bid: u64, session: Option<&str>) {
        let Some(i) = self.awaiting.remove(&bid) else {
            return;
        };
        match (session, self.sockets.get(i).and_then(Option::as_ref)) {
            (Some(session), Some(s)) => {
                if let Ok(mut bound) = s.session.lock() {
                    *bound = Some(session.to_owned());
                }
            }
            _ => self.close(i),
        }
    }

    fn listen(&mut self, dir: &Path, session: Option<String>) -> Option<usize> {
        let path = dir.join(format!("e{}.sock", self.sockets.len() + 1));
        // A long home directory makes a long path: bound through its
        // directory's descriptor (Linux), or said where that cannot be.
        let listener = match crate::run_code::tools::bind_socket(&path) {
            Ok(l) => l,
            Err(e) => {
                warn!("cannot make the editor's socket for run_code ({e}): code cannot reach the editor's files");
                self.unavailable = Some(e.to_string());
                return None;
            }
        };
        let token = {
            use rand::Rng;
            let bytes: [u8; 16] = rand::rng().random();
            bytes.iter().map(|b| format!("{b:02x}")).collect::<String>()
        };
        let session = Arc::new(Mutex::new(session));
        let task = tokio::spawn(serve(
            listener,
            token.clone(),
            session.clone(),
            self.tx.clone(),
        ));
        self.sockets.push(Some(Listening {
            path,
            token,
            session,
            task,
        }));
        Some(self.sockets.len() - 1)
    }

    /// The next call (never, while no socket is open).
    pub async fn next(&mut self) -> EditorCall {
        self.rx.recv().await.expect("the bridge holds a sender")
    }

    fn fresh_id(&mut self) -> RawId {
        self.next_id += 1;
        RawId(self.next_id.to_string())
    }

    /// Whether the call `id` still waits: its run may have ended (its
    /// connection closed) while the user was being asked.
    pub fn waiting(&mut self, id: &RawId) -> bool {
        match self.pending.get(id.as_str()) {
            Some(reply) if !reply.is_closed() => true,
            Some(_) => {
                self.pending.remove(id.as_str());
                false
            }
            None => false,
        }
    }

    /// Answers the call `id` (its entry goes).
    pub fn answer(&mut self, id: &RawId, answer: ToolReply) {
        if let Some(reply) = self.pending.remove(id.as_str()) {
            let _ = reply.send(answer);
        }
    }
}

/// How long a new connection has to send its first call with the
/// socket's token; until it has, it holds none of the socket's slots.
const FIRST_CALL_WAIT: std::time::Duration = std::time::Duration::from_secs(2);
/// How much of a connection's first call is read before its token is
/// checked.
const FIRST_CALL_HEAD: u64 = 4096;
/// Connections still waiting for their first call, at most: one more
/// closes the oldest of them.
const MAX_UNPROVEN: usize = 32;

/// Accepts a session's connections; each is one call at a time, and a
/// call whose connection closes is dropped (its run has ended), so a
/// late answer from the user writes nothing. A connection takes one of
/// the socket's slots only once its first call has shown the token: a
/// process that finds the socket and holds connections open without a
/// word takes none of them.
async fn serve(
    listener: tokio::net::UnixListener,
    token: String,
    session: Arc<Mutex<Option<String>>>,
    tx: mpsc::UnboundedSender<EditorCall>,
) {
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    let token = Arc::new(token);
    let mut unproven: std::collections::VecDeque<oneshot::Sender<()>> = Default::default();
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            continue;
        };
        unproven.retain(|s| !s.is_closed());
        if unproven.len() >= MAX_UNPROVEN {
            if let Some(oldest) = unproven.pop_front() {
                let _ = oldest.send(());
            }
        }
        let (evict, evicted) = oneshot::channel::<()>();
        unproven.push_back(evict);
        let (session, tx, token, slots) =
            (session.clone(), tx.clone(), token.clone(), slots.clone());
        tokio::spawn(async move {
            let (read, mut write) = stream.into_split();
            let mut reader = BufReader::new(read.take(MAX_REQUEST));
            // Proven from the start of the first call (zcode-acp's server
            // writes the token right after the id), so a connection not yet
            // proven holds at most FIRST_CALL_HEAD bytes of the bridge's.
            let mut line = Vec::new();
            let mut head = (&mut reader).take(FIRST_CALL_HEAD);
            let first = tokio::select! {
                r = head.read_until(b'\n', &mut line) => r,
                _ = tokio::time::sleep(FIRST_CALL_WAIT) => return,
                _ = evicted => return,
            };
            if !matches!(first, Ok(n) if n > 0) {
                return;
            }
            let shown = if line.ends_with(b"\n") {
                serde_json::from_slice::<Value>(&line)
                    .ok()
                    .and_then(|v| v.get("token").and_then(Value::as_str).map(str::to_owned))
            } else {
                crate::run_code::tools::rpc::leading_str(&line, "token")
            };
            let proven = shown.is_some_and(|t| {
                crate::run_code::tools::secret::same(t.as_bytes(), token.as_bytes())
            });
            if proven && !line.ends_with(b"\n") {
                // The rest of the call, now that it is the socket's.
                if !matches!(reader.read_until(b'\n', &mut line).await, Ok(n) if n > 0) {
                    return;
                }
            }
            if !proven {
                let id = serde_json::from_slice::<Value>(&line)
                    .ok()
                    .and_then(|v| v.get("id").cloned())
                    .unwrap_or(Value::Null);
                let answer = json!({"id": id, "error": {"code": codes::INVALID_REQUEST, "message": "not this socket's token"}});
                let mut out = serde_json::to_vec(&answer).unwrap_or_default();
                out.push(b'\n');
                let _ = write.write_all(&out).await;
                return;
            }
            let Ok(_slot) = slots.try_acquire_owned() else {
                debug!("a connection to the editor's socket past the most at once was closed");
                let answer = json!({"id": Value::Null, "error": {"code": codes::INVALID_REQUEST, "message": format!("{MAX_CONNECTIONS} calls to the editor are in flight already, the most at once")}});
                let mut out = serde_json::to_vec(&answer).unwrap_or_default();
                out.push(b'\n');
                let _ = write.write_all(&out).await;
                return;
            };
            loop {
                if line.is_empty() {
                    match reader.read_until(b'\n', &mut line).await {
                        Ok(0) | Err(_) => return,
                        Ok(_) => {}
                    }
                }
                let mut more = [0u8; 1];
                let answer = tokio::select! {
                    answer = call(&line, &token, &session, &tx) => answer,
                    // The caller went away (or broke the one-call-at-a-time
                    // rule): the call is dropped with its reply channel.
                    _ = reader.read(&mut more) => return,
                };
                line.clear();
                let mut out = serde_json::to_vec(&answer).unwrap_or_default();
                out.push(b'\n');
                if write.write_all(&out).await.is_err() {
                    return;
                }
            }
        });
    }
}

async fn call(
    line: &[u8],
    token: &str,
    session: &Mutex<Option<String>>,
    tx: &mpsc::UnboundedSender<EditorCall>,
) -> Value {
    let error = |id: &Value, message: String| json!({"id": id, "error": {"code": codes::INVALID_REQUEST, "message": message}});
    let Ok(Value::Object(msg)) = serde_json::from_slice::<Value>(line) else {
        return error(&Value::Null, "not a JSON object".into());
    };
    let id = msg.get("id").cloned().unwrap_or(Value::Null);
    let shown = msg.get("token").and_then(Value::as_str).unwrap_or_default();
    if !crate::run_code::tools::secret::same(shown.as_bytes(), token.as_bytes()) {
        return error(&id, "not this socket's token".into());
    }
    let method = match msg.get("method").and_then(Value::as_str) {
        Some("fs/read_text_file") => "fs/read_text_file",
        Some("fs/write_text_file") => "fs/write_text_file",
        other => return error(&id, format!("no method {other:?} here")),
    };
    let Some(Value::Object(params)) = msg.get("params").cloned() else {
        return error(&id, "params must be an object".into());
    };
    let Some(session) = session.lock().ok().and_then(|s| s.clone()) else {
        return error(&id, "the session is not open yet".into());
    };
    let (reply, answered) = oneshot::channel();
    let sent = tx.send(EditorCall {
        session,
        method,
        params,
        reply,
    });
    if sent.is_err() {
        return error(&id, "zcode-acp's bridge is shutting down".into());
    }
    match answered.await {
        Ok(Ok(result)) => json!({"id": id, "result": result}),
        Ok(Err((code, message))) => json!({"id": id, "error": {"code": code, "message": message}}),
        Err(_) => error(
            &id,
            "the call was dropped (the bridge is shutting down)".into(),
        ),
    }
}

impl Bridge {
    /// A call from a session's run_code server: sent to the editor as the
    /// session's own request, a write judged first.
    pub(super) fn on_code_tool(&mut self, call: EditorCall) {
        let capability = match call.method {
            "fs/read_text_file" => "readTextFile",
            _ => "writeTextFile",
        };
        // Unarmed, nothing judges a write: code, whose runs are confined
        // to the workspace, gets no way around that through the editor.
        if !self.editor_offers_fs(capability)
            || (call.method == "fs/write_text_file" && !self.armed())
        {
            let _ = call.reply.send(Err((
                codes::INVALID_REQUEST,
                format!("the editor does not offer {}", call.method),
            )));
            return;
        }
        let id = self.code.tools.fresh_id();
        let mut params = call.params;
        params.insert("sessionId".into(), json!(call.session));
        let text = json!({"jsonrpc": "2.0", "id": id.as_str().parse::<u64>().unwrap_or(0), "method": call.method, "params": params}).to_string();
        let frame = match Frame::parse(text.into_bytes()) {
            Ok(f) => f,
            Err(_) => {
                let _ = call.reply.send(Err((
                    codes::INTERNAL_ERROR,
                    "cannot build the request".into(),
                )));
                return;
            }
        };
        self.code
            .tools
            .pending
            .insert(id.as_str().to_owned(), call.reply);
        let frame = match self.police_backend_request(call.method, &frame) {
            super::police::Policed::Pass => frame,
            super::police::Policed::Rewrite(bytes) => match Frame::parse(bytes) {
                Ok(f) => f,
                Err(_) => {
                    return self.code.tools.answer(
                        &id,
                        Err((
                            codes::INTERNAL_ERROR,
                            "a rewritten request did not parse".into(),
                        )),
                    )
                }
            },
            super::police::Policed::Refuse { code, message } => {
                warn!("run_code's {}: {message}", call.method);
                return self.code.tools.answer(&id, Err((code, message)));
            }
            super::police::Policed::Ask {
                session,
                path,
                reason,
                frame,
            } => {
                let held = super::allow::HeldWrite {
                    from: super::permissions::Asker::CodeTool,
                    backend_id: id,
                    frame,
                };
                return self.ask(session, path, reason, held);
            }
        };
        debug!(method = call.method, "run_code calls the editor");
        if call.method == "fs/write_text_file" {
            // Made with the agent held still (see `hold`).
            self.write_held(super::allow::HeldWrite {
                from: super::permissions::Asker::CodeTool,
                backend_id: id,
                frame,
            });
        } else {
            self.forward_code_tool_request(id, frame);
        }
    }

    /// Sends a run's request to the editor; its answer comes back to the
    /// run's socket ([`AtEditor::CodeTool`](super::AtEditor)).
    pub(super) fn forward_code_tool_request(&mut self, id: RawId, frame: Frame) -> u64 {
        let bid = self.routes.code_tool_request(id);
        self.to_editor(frame.with_id(&bid.to_string()));
        bid
    }

    /// What the editor's `initialize` said it offers: `fs.<capability>`.
    pub(super) fn editor_offers_fs(&self, capability: &str) -> bool {
        let Some(init) = &self.sessions.initialize else {
            return false;
        };
        serde_json::from_str::<Value>(init)
            .ok()
            .and_then(|v| v["clientCapabilities"]["fs"][capability].as_bool())
            .unwrap_or(false)
    }

    /// The editor answered a call of a run (or the user refused it).
    pub(super) fn code_tool_answered(&mut self, id: &RawId, frame: &Frame) {
        let answer = match &frame.kind {
            crate::relay::FrameKind::Response {
                is_error: false, ..
            } => Ok(frame
                .payload_raw()
                .and_then(|r| serde_json::from_str(r).ok())
                .unwrap_or(Value::Null)),
            _ => {
                let (code, message) = super::frames::error_fields(frame);
                Err((code, message))
            }
        };
        self.code.tools.answer(id, answer);
    }
}
