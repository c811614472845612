//! What a run's requests to its tools server do (`handle`: `call`,
//! `result`, `log`), with the bounds each keeps, and the state the run's
//! connections share (`Shared`: the token, the budget, the logs).

use std::collections::BTreeSet;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::{json, Value};

use super::budget::Budget;
use super::secret;

use super::{ToolFailure, ToolLimits};

/// The longest a run's socket path may be: `sun_path` holds 108 bytes on
/// Linux and 104 on macOS, the terminating NUL included.
pub const MAX_SOCKET_PATH: usize = 103;

/// Connections one run may hold open, requests one connection may have
/// in flight (past it the connection is not read until one ends), and
/// answers queued toward a script that is not reading them.
pub(super) const MAX_CONNECTIONS: usize = 16;
pub(super) const MAX_TASKS_PER_CONNECTION: usize = 64;
pub(super) const MAX_QUEUED_ANSWERS: usize = 64;
/// How long a connection past the limit waits for a slot the script has
/// just given back (a connection it closed, whose end is not read yet).
pub(super) const RECONNECT_GRACE: Duration = Duration::from_millis(200);
/// How long the end of a run waits for requests already written (a
/// `result` sent just before the script exited) to be read.
pub(super) const DRAIN: Duration = Duration::from_millis(250);
/// How long a new connection has to send its first request, carrying the
/// run's token: until it has, it holds none of the run's slots, so a
/// process that finds the socket and connects without a word takes
/// nothing from the run.
pub(super) const FIRST_REQUEST_WAIT: Duration = Duration::from_secs(2);
/// Connections still waiting for their first request, at most: one more
/// closes the oldest of them (a flood of silent connections pushes out
/// only its own, while the run's, which speak at once, get through).
pub(super) const MAX_UNPROVEN: usize = 32;
/// How much of a first request is read before its token is looked for:
/// the whole line where it ends within this, else its first bytes, where
/// the stubs (and the README's shell example) put the token.
pub(super) const FIRST_REQUEST_HEAD: usize = 4096;

/// Makes one tool call (the session's MCP servers, the editor).
pub trait Caller: Send + Sync {
    fn call<'a>(
        &'a self,
        tool: &'a str,
        args: Value,
    ) -> Pin<Box<dyn Future<Output = Result<Value, ToolFailure>> + Send + 'a>>;
}

/// One entry of a run's `logs`; `t` is milliseconds since the run began.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct LogEntry {
    pub level: String,
    pub message: String,
    pub t: u64,
}

/// What the script (and the server) left when the run ended.
#[derive(Debug, Default)]
pub struct Outcome {
    pub result: Option<Value>,
    pub logs: Vec<LogEntry>,
    pub calls: u32,
}

pub(super) struct State {
    /// The run's process has ended: what it wrote is still read (a
    /// `result` sent just before it exited), but no more tool calls are
    /// made, since nobody is left to read what they return.
    pub(super) ended: bool,
    pub(super) calls: u32,
    pub(super) in_flight: usize,
    pub(super) result: Option<Value>,
    pub(super) logs: Vec<LogEntry>,
    pub(super) logs_dropped: u64,
    /// Breaches already said in the logs (said once each, with a count at
    /// the end).
    pub(super) breaches: std::collections::BTreeMap<&'static str, u64>,
}

pub(super) struct Shared {
    /// The run's token, as its requests carry it.
    pub(super) token: String,
    /// For the requests being answered and the answers not yet written,
    /// across the run's connections.
    pub(super) budget: Budget,
    pub(super) allowed: BTreeSet<String>,
    pub(super) caller: Arc<dyn Caller>,
    pub(super) limits: ToolLimits,
    pub(super) started: Instant,
    pub(super) state: Mutex<State>,
}

impl Shared {
    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn log(&self, st: &mut State, level: &str, message: String) {
        if st.logs.len() >= self.limits.max_logs {
            st.logs_dropped += 1;
            return;
        }
        let message = cut(message, self.limits.max_log_bytes);
        st.logs.push(LogEntry {
            level: level.to_owned(),
            message,
            t: self.started.elapsed().as_millis() as u64,
        });
    }

    /// Whether `given` is the run's token (compared in constant time: how
    /// long a refusal takes says nothing of how much of it was right).
    pub(super) fn is_token(&self, given: Option<&str>) -> bool {
        given.is_some_and(|g| secret::same(g.as_bytes(), self.token.as_bytes()))
    }

    /// The refusal of a request without the run's token: the run's logs
    /// and this server's log say it (once, with the count at the end).
    pub(super) fn stranger(&self) -> ToolFailure {
        let first = !self.lock().breaches.contains_key("bad_token");
        if first {
            tracing::warn!("a request on a run's tools socket did not carry the run's token, and was refused: another process found the socket, or a client of the run's did not send ${}", super::TOKEN_ENV);
        }
        self.breach(
            "bad_token",
            format!("a request without this run's token was refused and its connection closed (every request carries \"token\": the value of ${})", super::TOKEN_ENV),
        )
    }

    /// A refusal: the script gets the error, the logs say it (once per
    /// kind; the count is added at the end).
    pub(super) fn breach(&self, code: &'static str, message: String) -> ToolFailure {
        let mut st = self.lock();
        let n = st.breaches.entry(code).or_insert(0);
        *n += 1;
        if *n == 1 {
            self.log(&mut st, "warn", format!("zcode-acp: {code}: {message}"));
        }
        ToolFailure::new(code, message)
    }
}

/// `s` cut to at most `max` bytes, at a character boundary.
pub(super) fn cut(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
        s.push_str("…[cut]");
    }
    s
}

pub(super) fn answer(id: &Value, outcome: Result<Value, ToolFailure>) -> Vec<u8> {
    let v = match outcome {
        Ok(result) => json!({"jsonrpc": "2.0", "id": id, "result": result}),
        Err(f) => json!({"jsonrpc": "2.0", "id": id, "error": {
            "code": -32000, "message": f.message, "data": {"code": f.code}
        }}),
    };
    serde_json::to_vec(&v).unwrap_or_default()
}

/// One request, its token checked; None for a notification (no id),
/// which gets no answer.
pub(super) async fn handle(msg: Value, shared: &Shared) -> Option<Vec<u8>> {
    let id = msg.get("id").cloned();
    let method = msg.get("method").and_then(Value::as_str).unwrap_or("");
    let params = msg.get("params").cloned().unwrap_or(Value::Null);
    let outcome = match method {
        "call" => call(shared, &params).await,
        "result" => {
            let value = params.get("value").cloned().unwrap_or(Value::Null);
            let size = serde_json::to_vec(&value).map_or(0, |v| v.len());
            if size > shared.limits.max_bytes {
                Err(shared.breach(
                    "too_large",
                    format!(
                        "result() was given {size} bytes, more than {}; return less, or write a file to $ZCODE_RUN_OUTPUTS",
                        shared.limits.max_bytes
                    ),
                ))
            } else {
                shared.lock().result = Some(value);
                Ok(Value::Null)
            }
        }
        "log" => {
            let level = match params.get("level").and_then(Value::as_str) {
                Some(l @ ("debug" | "info" | "warn" | "error")) => l.to_owned(),
                Some("warning") => "warn".to_owned(),
                _ => "info".to_owned(),
            };
            let message = match params.get("message") {
                Some(Value::String(s)) => s.clone(),
                Some(other) => other.to_string(),
                None => String::new(),
            };
            let mut st = shared.lock();
            shared.log(&mut st, &level, message);
            Ok(Value::Null)
        }
        other => Err(shared.breach(
            "bad_request",
            format!(
                "no method {:?}; the methods are call, result and log",
                cut(other.to_owned(), 200)
            ),
        )),
    };
    id.map(|id| answer(&id, outcome))
}

/// A tool call, checked against every bound before it is made.
async fn call(shared: &Shared, params: &Value) -> Result<Value, ToolFailure> {
    let Some(tool) = params.get("tool").and_then(Value::as_str) else {
        return Err(shared.breach(
            "bad_request",
            "a call names no tool (params: {tool, args})".into(),
        ));
    };
    if !shared.allowed.contains(tool) {
        let shown = cut(tool.to_owned(), 200);
        return Err(shared.breach(
            "not_allowed",
            format!(
                "{shown:?} is not among this run's tools ({}); list it in run_code's `tools`",
                shared
                    .allowed
                    .iter()
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ));
    }
    let args = match params.get("args") {
        None | Some(Value::Null) => json!({}),
        Some(a @ Value::Object(_)) => a.clone(),
        Some(_) => {
            return Err(shared.breach(
                "bad_request",
                format!("the arguments of {tool} must be an object"),
            ))
        }
    };
    let size = serde_json::to_vec(&args).map_or(0, |v| v.len());
    if size > shared.limits.max_bytes {
        return Err(shared.breach(
            "too_large",
            format!(
                "the arguments of {tool} are {size} bytes, more than {}",
                shared.limits.max_bytes
            ),
        ));
    }
    {
        let mut st = shared.lock();
        if st.ended {
            return Err(ToolFailure::new(
                "unavailable",
                "the run has ended; the call was not made",
            ));
        }
        if st.calls >= shared.limits.max_calls {
            drop(st);
            return Err(shared.breach(
                "call_limit",
                format!(
                    "this run has made its {} tool calls, the most a run may; do the rest in another run_code call",
                    shared.limits.max_calls
                ),
            ));
        }
        if st.in_flight >= shared.limits.concurrent {
            drop(st);
            return Err(shared.breach(
                "too_many_at_once",
                format!(
                    "{} calls are in flight already, the most at once; await some before starting more",
                    shared.limits.concurrent
                ),
            ));
        }
        st.calls += 1;
        st.in_flight += 1;
    }
    struct InFlight<'a>(&'a Shared);
    impl Drop for InFlight<'_> {
        fn drop(&mut self) {
            self.0.lock().in_flight -= 1;
        }
    }
    let _in_flight = InFlight(shared);
    let timeout = Duration::from_millis(shared.limits.call_timeout_ms);
    let value = match tokio::time::timeout(timeout, shared.caller.call(tool, args)).await {
        Ok(Ok(v)) => v,
        Ok(Err(f)) => {
            let mut st = shared.lock();
            shared.log(
                &mut st,
                "warn",
                format!("zcode-acp: {tool}: {}: {}", f.code, f.message),
            );
            return Err(f);
        }
        Err(_) => {
            return Err(shared.breach(
                "timeout",
                format!(
                    "{tool} did not answer within {} ms",
                    shared.limits.call_timeout_ms
                ),
            ))
        }
    };
    let size = serde_json::to_vec(&value).map_or(0, |v| v.len());
    if size > shared.limits.max_bytes {
        return Err(shared.breach(
            "too_large",
            format!(
                "{tool} returned {size} bytes, more than {}; ask it for less",
                shared.limits.max_bytes
            ),
        ));
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cut_keeps_whole_characters() {
        assert_eq!(cut("ééé".into(), 3), "é…[cut]");
        assert_eq!(cut("abc".into(), 3), "abc");
    }
}
