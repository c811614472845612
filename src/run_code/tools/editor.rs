//! `editor.read_text_file` and `editor.write_text_file`: the editor's
//! files (unsaved buffers included), reached through the bridge over the
//! socket it bound to this server's session (`--editor SOCKET`). The
//! bridge judges every write as it judges the agent's own
//! `fs/write_text_file` (the policy, then the allow flow), and sends on
//! only what the editor advertised.
//!
//! The link: one JSON object per line, `{"id", "method", "params"}` with
//! ACP's `fs/*` params but the session (the bridge knows it), answered by
//! `{"id", "result"}` or `{"id", "error": {"code", "message"}}`.

use std::path::{Path, PathBuf};

use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

use super::{ToolFailure, ToolSpec};

pub const READ: &str = "editor.read_text_file";
/// The environment variable, in the run_code server's entry, holding its
/// editor socket's token: every call carries it. The server takes it out
/// of its environment as it starts, before it starts anything (and
/// overwrites it where `/proc` shows the environment it began with), so
/// neither the MCP servers it starts nor its runs get it (a run's
/// environment is an allowlist besides): code that finds a socket on disk
/// cannot use it, and no session can act as another. The agent, which
/// starts the server from the entry, is given it with the entry.
pub const TOKEN_ENV: &str = "ZCODE_ACP_EDITOR_TOKEN";
pub const WRITE: &str = "editor.write_text_file";

/// The largest answer read from the bridge (a file's content).
const MAX_ANSWER: usize = 64 << 20;

/// Takes the socket's token from this server's environment, where the
/// bridge put it (this server's entry): removed, so that no process this
/// server starts (an MCP server of the session's, a run) inherits it, and
/// its bytes overwritten where the kernel keeps the environment the
/// process began with (`/proc/PID/environ`, which the MCP servers it
/// starts, running as the same user, could read).
///
/// Call it once, before any thread or process is started: it changes
/// this process's environment.
pub fn take_token() -> String {
    let token = std::env::var(TOKEN_ENV).unwrap_or_default();
    if std::env::var_os(TOKEN_ENV).is_some() {
        scrub_value(TOKEN_ENV);
        std::env::remove_var(TOKEN_ENV);
    }
    token
}

/// Overwrites the value of the environment variable `name` in place.
fn scrub_value(name: &str) {
    let Ok(name) = std::ffi::CString::new(name) else {
        return;
    };
    // SAFETY: no other thread exists (the caller's precondition), so
    // nothing reads or changes the environment meanwhile; getenv returns
    // a pointer to the value's NUL-terminated bytes inside the entry the
    // environment holds (for the variables a process began with, in the
    // block the kernel shows), valid until the environment changes, and
    // only the bytes before that NUL are written.
    unsafe {
        let value = libc::getenv(name.as_ptr());
        if !value.is_null() {
            std::ptr::write_bytes(value, b'0', libc::strlen(value));
        }
    }
}

pub struct EditorLink {
    socket: PathBuf,
    /// The socket's token (`ZCODE_ACP_EDITOR_TOKEN`, in this server's
    /// entry, taken by [`take_token`]); every call carries it.
    token: String,
    workspace: PathBuf,
    can_read: bool,
    can_write: bool,
}

impl EditorLink {
    /// `can`: what the editor advertised (`read_text_file`,
    /// `write_text_file`), as the bridge passed it; `token`: the socket's.
    pub fn new(socket: PathBuf, workspace: PathBuf, can: &[String], token: String) -> EditorLink {
        EditorLink {
            socket,
            token,
            workspace,
            can_read: can.iter().any(|c| c == "read_text_file"),
            can_write: can.iter().any(|c| c == "write_text_file"),
        }
    }

    pub fn specs(&self) -> Vec<ToolSpec> {
        let mut out = Vec::new();
        if self.can_read {
            out.push(ToolSpec {
                name: READ.into(),
                description: "Reads a text file as the editor has it (unsaved changes included). Returns its content.".into(),
                input_schema: json!({"type": "object", "properties": {
                    "path": {"type": "string", "description": "The file, absolute or relative to the workspace."},
                    "line": {"type": "integer", "description": "The first line to read (1-based)."},
                    "limit": {"type": "integer", "description": "How many lines to read."}
                }, "required": ["path"]}),
            });
        }
        if self.can_write {
            out.push(ToolSpec {
                name: WRITE.into(),
                description: "Writes a text file through the editor. A write the sandbox does not allow is put to the user, as the agent's own writes are; refused, it raises ToolError(code=tool_error).".into(),
                input_schema: json!({"type": "object", "properties": {
                    "path": {"type": "string", "description": "The file, absolute or relative to the workspace."},
                    "content": {"type": "string"}
                }, "required": ["path", "content"]}),
            });
        }
        out
    }

    fn absolute(&self, path: &str) -> PathBuf {
        let p = Path::new(path);
        if p.is_absolute() {
            p.to_path_buf()
        } else {
            self.workspace.join(p)
        }
    }

    pub async fn call(&self, tool: &str, args: Value) -> Result<Value, ToolFailure> {
        let path = args
            .get("path")
            .and_then(Value::as_str)
            .ok_or_else(|| ToolFailure::new("bad_request", format!("{tool} needs a path")))?;
        let path = self.absolute(path);
        let (method, params) = match tool {
            READ if self.can_read => {
                let mut p = json!({"path": path});
                for key in ["line", "limit"] {
                    if let Some(n) = args.get(key).and_then(Value::as_u64) {
                        p[key] = json!(n);
                    }
                }
                ("fs/read_text_file", p)
            }
            WRITE if self.can_write => {
                let content = args.get("content").and_then(Value::as_str).ok_or_else(|| {
                    ToolFailure::new("bad_request", format!("{tool} needs a content string"))
                })?;
                (
                    "fs/write_text_file",
                    json!({"path": path, "content": content}),
                )
            }
            _ => {
                return Err(ToolFailure::new(
                    "unavailable",
                    format!("the editor does not offer {tool}"),
                ))
            }
        };
        let answer = self.ask(method, params).await?;
        Ok(match tool {
            READ => answer.get("content").cloned().unwrap_or(Value::Null),
            _ => Value::Null,
        })
    }

    async fn ask(&self, method: &str, params: Value) -> Result<Value, ToolFailure> {
        let unavailable = |e: std::io::Error| {
            ToolFailure::new(
                "unavailable",
                format!("cannot reach the editor through zcode-acp: {e}"),
            )
        };
        let stream = super::connect_socket(&self.socket)
            .await
            .map_err(unavailable)?;
        let (read, mut write) = stream.into_split();
        let mut line = serde_json::to_vec(
            &json!({"id": 1, "token": self.token, "method": method, "params": params}),
        )
        .map_err(|e| ToolFailure::new("bad_request", e.to_string()))?;
        line.push(b'\n');
        write.write_all(&line).await.map_err(unavailable)?;
        let mut answer = Vec::new();
        let mut reader = BufReader::new(read).take(MAX_ANSWER as u64);
        reader
            .read_until(b'\n', &mut answer)
            .await
            .map_err(unavailable)?;
        let v: Value = serde_json::from_slice(&answer).map_err(|_| {
            ToolFailure::new(
                "unavailable",
                "zcode-acp's bridge gave no readable answer (it may have exited)",
            )
        })?;
        if let Some(e) = v.get("error") {
            let message = e
                .get("message")
                .and_then(Value::as_str)
                .unwrap_or("refused")
                .to_owned();
            return Err(ToolFailure::new("tool_error", message));
        }
        Ok(v.get("result").cloned().unwrap_or(Value::Null))
    }
}
