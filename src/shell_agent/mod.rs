//! `zcode-acp shell-agent`: a small, real ACP agent whose prompts are shell
//! commands. It exists for demos and tests of the bridge, and is useful on
//! its own as a (sandboxed, once the bridge arms it) shell inside the editor.
//!
//! - a prompt's text runs as `sh -c TEXT` in the session's cwd; its output
//!   streams back as `agent_message_chunk`s inside a `tool_call`;
//! - `/write PATH CONTENT` asks the editor to write a file
//!   (`fs/write_text_file`), `/terminal COMMAND` asks it to run a command
//!   (`terminal/create`), `/terminal-in DIR COMMAND` the same in DIR
//!   (relative to the session's cwd), so the bridge's policing of those can
//!   be tested;
//! - `session/cancel` kills the running command's process group;
//! - transcripts are kept on disk so `session/load` (which replays history)
//!   and `session/resume` (which does not) work across restarts.
//!
//! Test knobs: `ZCODE_SHELL_AGENT_NO_RESUME=1` and `ZCODE_SHELL_AGENT_NO_LOAD=1`
//! stop advertising those capabilities.

mod exec;
pub mod store;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::{json, Value};
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::sync::{mpsc, oneshot, watch};
use tracing::{debug, warn};

use crate::relay::framing::{FrameReader, ReadItem};
use store::Store;

const MODES: &[(&str, &str, &str)] = &[
    ("run", "Run", "Run each prompt with sh -c"),
    ("dry-run", "Dry run", "Show the command without running it"),
];

struct SessionState {
    cwd: PathBuf,
    mode: String,
    cancel: Option<watch::Sender<bool>>,
}

/// An error answer: (code, message).
type RpcError = (i64, String);

/// A prompt whose cancel switch is registered.
struct Started {
    sid: String,
    text: String,
    cwd: PathBuf,
    mode: String,
    cancel: watch::Receiver<bool>,
}

pub(crate) struct Agent {
    out: mpsc::UnboundedSender<String>,
    sessions: Mutex<HashMap<String, SessionState>>,
    pending: Mutex<HashMap<u64, oneshot::Sender<Result<Value, Value>>>>,
    next_id: AtomicU64,
    next_tool: AtomicU64,
    store: Store,
    resume: bool,
    load: bool,
}

fn flag(name: &str) -> bool {
    std::env::var(name).is_ok_and(|v| v == "1")
}

pub async fn run() -> anyhow::Result<()> {
    let store = Store::new(store::state_dir()?);
    let (out, mut out_rx) = mpsc::unbounded_channel::<String>();
    let writer = tokio::spawn(async move {
        let mut stdout = tokio::io::stdout();
        while let Some(mut line) = out_rx.recv().await {
            line.push('\n');
            if stdout.write_all(line.as_bytes()).await.is_err() || stdout.flush().await.is_err() {
                return;
            }
        }
    });
    let agent = Arc::new(Agent {
        out,
        sessions: Mutex::new(HashMap::new()),
        pending: Mutex::new(HashMap::new()),
        next_id: AtomicU64::new(0),
        next_tool: AtomicU64::new(0),
        store,
        resume: !flag("ZCODE_SHELL_AGENT_NO_RESUME"),
        load: !flag("ZCODE_SHELL_AGENT_NO_LOAD"),
    });

    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut reader = FrameReader::new(BufReader::new(tokio::io::stdin()), 1 << 30);
    loop {
        let item = tokio::select! {
            item = reader.next() => item?,
            _ = term.recv() => break,
        };
        let bytes = match item {
            ReadItem::Frame(bytes) => bytes,
            ReadItem::TooLarge { .. } => continue,
            ReadItem::Eof => break,
        };
        let msg: Value = match serde_json::from_slice(&bytes) {
            Ok(v) => v,
            Err(e) => {
                warn!("shell-agent: unreadable frame: {e}");
                continue;
            }
        };
        agent.clone().on_message(msg);
    }
    agent.cancel_all();
    drop(agent);
    let _ = writer.await;
    Ok(())
}

impl Agent {
    fn send(&self, msg: Value) {
        let _ = self.out.send(msg.to_string());
    }

    fn on_message(self: Arc<Self>, msg: Value) {
        let method = msg.get("method").and_then(Value::as_str).map(str::to_owned);
        let id = msg.get("id").cloned();
        let params = msg.get("params").cloned().unwrap_or(Value::Null);
        match (method, id) {
            (Some(method), Some(id)) => {
                let started = (method == "session/prompt").then(|| {
                    let sid = params
                        .get("sessionId")
                        .and_then(Value::as_str)
                        .map(str::to_owned);
                    self.begin_prompt(sid, &params)
                });
                tokio::spawn(async move {
                    let outcome = match started {
                        Some(Ok(p)) => Ok(self.run_prompt(p).await),
                        Some(Err(e)) => Err(e),
                        None => self.clone().handle_request(&method, params).await,
                    };
                    let reply = match outcome {
                        Ok(result) => json!({"jsonrpc": "2.0", "id": id, "result": result}),
                        Err((code, message)) => {
                            json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})
                        }
                    };
                    self.send(reply);
                });
            }
            (Some(method), None) => {
                if method == "session/cancel" {
                    if let Some(sid) = params.get("sessionId").and_then(Value::as_str) {
                        self.cancel(sid);
                    }
                }
            }
            (None, Some(id)) => {
                let Some(n) = id.as_u64() else { return };
                let waiter = self.pending.lock().unwrap().remove(&n);
                if let Some(waiter) = waiter {
                    let outcome = match msg.get("error") {
                        Some(e) => Err(e.clone()),
                        None => Ok(msg.get("result").cloned().unwrap_or(Value::Null)),
                    };
                    let _ = waiter.send(outcome);
                }
            }
            (None, None) => debug!("shell-agent: ignoring a message with neither method nor id"),
        }
    }

    /// Sends a request to the client and waits for its answer.
    pub(crate) async fn call(&self, method: &str, params: Value) -> Result<Value, Value> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.pending.lock().unwrap().insert(id, tx);
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        rx.await
            .unwrap_or_else(|_| Err(json!({"message": "no answer"})))
    }

    /// Sends a `session/update` and records it in the transcript.
    pub(crate) fn update(&self, sid: &str, update: Value) {
        if let Err(e) = self.store.append(sid, &update) {
            warn!("shell-agent: could not record the transcript of {sid}: {e}");
        }
        self.send(json!({"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": sid, "update": update}}));
    }

    pub(crate) fn say(&self, sid: &str, text: &str) {
        self.update(
            sid,
            json!({"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": text}}),
        );
    }

    pub(crate) fn tool_call_id(&self) -> String {
        format!("sh-{}", self.next_tool.fetch_add(1, Ordering::Relaxed))
    }

    fn cancel(&self, sid: &str) {
        if let Some(s) = self.sessions.lock().unwrap().get(sid) {
            if let Some(c) = &s.cancel {
                let _ = c.send(true);
            }
        }
    }

    fn cancel_all(&self) {
        for s in self.sessions.lock().unwrap().values() {
            if let Some(c) = &s.cancel {
                let _ = c.send(true);
            }
        }
    }

    fn modes(mode: &str) -> Value {
        json!({
            "currentModeId": mode,
            "availableModes": MODES.iter().map(|(id, name, description)| json!({"id": id, "name": name, "description": description})).collect::<Vec<_>>(),
        })
    }

    async fn handle_request(
        self: Arc<Self>,
        method: &str,
        params: Value,
    ) -> Result<Value, RpcError> {
        let sid = params
            .get("sessionId")
            .and_then(Value::as_str)
            .map(str::to_owned);
        match method {
            "initialize" => {
                let mut session_caps = json!({"close": {}});
                if self.resume {
                    session_caps["resume"] = json!({});
                }
                Ok(json!({
                    "protocolVersion": 1,
                    "agentCapabilities": {"loadSession": self.load, "sessionCapabilities": session_caps},
                    "authMethods": [],
                    "agentInfo": {"name": "zcode-acp-shell-agent", "title": "zcode-acp shell agent", "version": env!("CARGO_PKG_VERSION")},
                }))
            }
            "session/new" => {
                let cwd = cwd_param(&params)?;
                let id = format!("sa-{:016x}", rand::random::<u64>());
                self.store
                    .create(&id, &cwd)
                    .map_err(|e| (-32603, format!("cannot record the session: {e}")))?;
                self.open(&id, cwd);
                Ok(json!({"sessionId": id, "modes": Self::modes("run")}))
            }
            "session/load" | "session/resume" => {
                let enabled = if method == "session/load" {
                    self.load
                } else {
                    self.resume
                };
                if !enabled {
                    return Err((
                        -32601,
                        format!("{method} is turned off in this shell agent"),
                    ));
                }
                let sid = sid.ok_or((-32602, "sessionId is required".to_owned()))?;
                if !self.store.exists(&sid) {
                    return Err((-32002, format!("session {sid} not found")));
                }
                let cwd = cwd_param(&params)?;
                if method == "session/load" {
                    for update in self.store.transcript(&sid) {
                        self.send(json!({"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": sid, "update": update}}));
                    }
                }
                self.open(&sid, cwd);
                Ok(json!({"modes": Self::modes("run")}))
            }
            "session/close" => {
                let sid = sid.ok_or((-32602, "sessionId is required".to_owned()))?;
                self.cancel(&sid);
                self.sessions.lock().unwrap().remove(&sid);
                Ok(json!({}))
            }
            "session/set_mode" => {
                let sid = sid.ok_or((-32602, "sessionId is required".to_owned()))?;
                let mode = params
                    .get("modeId")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                if !MODES.iter().any(|(id, ..)| *id == mode) {
                    return Err((-32602, format!("unknown mode `{mode}`")));
                }
                let mut sessions = self.sessions.lock().unwrap();
                let s = sessions
                    .get_mut(&sid)
                    .ok_or((-32002, format!("session {sid} not found")))?;
                s.mode = mode.to_owned();
                Ok(json!({}))
            }
            "session/prompt" => {
                let started = self.begin_prompt(sid, &params)?;
                Ok(self.run_prompt(started).await)
            }
            _ => Err((-32601, format!("method not found: {method}"))),
        }
    }

    /// The part of a prompt that must happen in message order: registering
    /// its cancel switch, so a `session/cancel` right behind it is not lost.
    fn begin_prompt(&self, sid: Option<String>, params: &Value) -> Result<Started, RpcError> {
        let sid = sid.ok_or((-32602, "sessionId is required".to_owned()))?;
        let text = prompt_text(params);
        let mut sessions = self.sessions.lock().unwrap();
        let s = sessions
            .get_mut(&sid)
            .ok_or((-32002, format!("session {sid} not found")))?;
        if s.cancel.is_some() {
            return Err((-32600, "a prompt is already running in this session".into()));
        }
        let (tx, rx) = watch::channel(false);
        s.cancel = Some(tx);
        Ok(Started {
            cwd: s.cwd.clone(),
            mode: s.mode.clone(),
            cancel: rx,
            sid,
            text,
        })
    }

    async fn run_prompt(&self, p: Started) -> Value {
        self.store
            .append(&p.sid, &json!({"sessionUpdate": "user_message_chunk", "content": {"type": "text", "text": p.text}}))
            .ok();
        let outcome = exec::prompt(self, &p.sid, &p.cwd, &p.mode, p.text.trim(), p.cancel).await;
        if let Some(s) = self.sessions.lock().unwrap().get_mut(&p.sid) {
            s.cancel = None;
        }
        json!({"stopReason": outcome})
    }

    fn open(&self, sid: &str, cwd: PathBuf) {
        self.sessions.lock().unwrap().insert(
            sid.to_owned(),
            SessionState {
                cwd,
                mode: "run".into(),
                cancel: None,
            },
        );
    }
}

fn cwd_param(params: &Value) -> Result<PathBuf, RpcError> {
    let cwd = params
        .get("cwd")
        .and_then(Value::as_str)
        .map(PathBuf::from)
        .ok_or((-32602, "cwd is required".to_owned()))?;
    if !cwd.is_absolute() || !cwd.is_dir() {
        return Err((
            -32602,
            format!(
                "cwd {} is not an existing absolute directory",
                cwd.display()
            ),
        ));
    }
    Ok(cwd)
}

fn prompt_text(params: &Value) -> String {
    params
        .get("prompt")
        .and_then(Value::as_array)
        .map(|blocks| {
            blocks
                .iter()
                .filter(|b| b.get("type").and_then(Value::as_str) == Some("text"))
                .filter_map(|b| b.get("text").and_then(Value::as_str))
                .collect::<Vec<_>>()
                .join("\n")
        })
        .unwrap_or_default()
}
