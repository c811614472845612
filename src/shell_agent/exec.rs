//! Carrying out one prompt of the shell agent.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::AsyncReadExt;
use tokio::sync::watch;

use super::Agent;

/// How long output is still read after the command exits: a background
/// process may hold the pipe open forever.
const DRAIN_AFTER_EXIT: Duration = Duration::from_millis(200);
/// How much output is kept for the tool call's final content.
const KEEP_OUTPUT: usize = 64 * 1024;

/// Runs one prompt; returns the stop reason.
pub(super) async fn prompt(
    agent: &Agent,
    sid: &str,
    cwd: &Path,
    mode: &str,
    text: &str,
    cancel: watch::Receiver<bool>,
) -> &'static str {
    if text.is_empty() {
        agent.say(
            sid,
            "Type a shell command to run it in this session's folder.",
        );
        return "end_turn";
    }
    if mode == "dry-run" {
        agent.say(sid, &format!("dry-run: would run `{text}`"));
        return "end_turn";
    }
    if let Some(rest) = text.strip_prefix("/write-many ") {
        return many_writes(agent, sid, cwd, rest, true).await;
    }
    if let Some(rest) = text.strip_prefix("/write-seq ") {
        return many_writes(agent, sid, cwd, rest, false).await;
    }
    if let Some(rest) = text.strip_prefix("/write ") {
        return write_through_editor(agent, sid, cwd, rest).await;
    }
    if let Some(command) = text.strip_prefix("/terminal ") {
        return terminal_through_editor(agent, sid, cwd, command).await;
    }
    if let Some(rest) = text.strip_prefix("/terminal-in ") {
        let (dir, command) = rest.split_once(' ').unwrap_or((rest, ""));
        return terminal_through_editor(agent, sid, &cwd.join(dir), command).await;
    }
    run_shell(agent, sid, cwd, text, cancel).await
}

async fn write_through_editor(agent: &Agent, sid: &str, cwd: &Path, rest: &str) -> &'static str {
    let (path, content) = rest.split_once(' ').unwrap_or((rest, ""));
    let path = cwd.join(path);
    let params = json!({"sessionId": sid, "path": path, "content": content});
    match agent.call("fs/write_text_file", params).await {
        Ok(_) => agent.say(sid, &format!("wrote {}", path.display())),
        Err(e) => agent.say(
            sid,
            &format!(
                "the editor refused to write {}: {}",
                path.display(),
                message(&e)
            ),
        ),
    }
    "end_turn"
}

/// `N PREFIX CONTENT`: N writes through the editor, of `PREFIX0` to
/// `PREFIX{N-1}`, all at once or one after another; says how many the
/// editor made and how many were refused (a test's flood and race).
async fn many_writes(
    agent: &Agent,
    sid: &str,
    cwd: &Path,
    rest: &str,
    at_once: bool,
) -> &'static str {
    let mut words = rest.splitn(3, ' ');
    let n: usize = words.next().and_then(|w| w.parse().ok()).unwrap_or(0);
    let prefix = cwd.join(words.next().unwrap_or("f"));
    let content = words.next().unwrap_or("");
    let one = |i: usize| {
        let path = format!("{}{i}", prefix.display());
        let params = json!({"sessionId": sid, "path": path, "content": content});
        agent.call("fs/write_text_file", params)
    };
    let results: Vec<bool> = if at_once {
        join_all((0..n).map(|i| Box::pin(one(i))).collect())
            .await
            .into_iter()
            .map(|r| r.is_ok())
            .collect()
    } else {
        let mut out = Vec::with_capacity(n);
        for i in 0..n {
            out.push(one(i).await.is_ok());
        }
        out
    };
    let ok = results.iter().filter(|r| **r).count();
    agent.say(sid, &format!("writes: ok={ok} refused={}", n - ok));
    "end_turn"
}

/// Runs the futures concurrently on this task; their outputs in order.
async fn join_all<F: std::future::Future + Unpin>(mut futures: Vec<F>) -> Vec<F::Output> {
    let mut outputs: Vec<Option<F::Output>> = futures.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (f, out) in futures.iter_mut().zip(outputs.iter_mut()) {
            if out.is_none() {
                match std::pin::Pin::new(f).poll(cx) {
                    std::task::Poll::Ready(v) => *out = Some(v),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    outputs
        .into_iter()
        .map(|o| o.expect("every future is done"))
        .collect()
}

async fn terminal_through_editor(
    agent: &Agent,
    sid: &str,
    cwd: &Path,
    command: &str,
) -> &'static str {
    let create = json!({"sessionId": sid, "command": "sh", "args": ["-c", command], "cwd": cwd, "outputByteLimit": 1 << 20});
    let terminal = match agent.call("terminal/create", create).await {
        Ok(r) => r
            .get("terminalId")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned(),
        Err(e) => {
            agent.say(
                sid,
                &format!("the editor refused to run `{command}`: {}", message(&e)),
            );
            return "end_turn";
        }
    };
    let tool = agent.tool_call_id();
    agent.update(
        sid,
        json!({"sessionUpdate": "tool_call", "toolCallId": tool, "title": command, "kind": "execute", "status": "in_progress",
               "content": [{"type": "terminal", "terminalId": terminal}]}),
    );
    let ids = json!({"sessionId": sid, "terminalId": terminal});
    let exit = agent
        .call("terminal/wait_for_exit", ids.clone())
        .await
        .unwrap_or(Value::Null);
    let output = agent
        .call("terminal/output", ids.clone())
        .await
        .unwrap_or(Value::Null);
    let _ = agent.call("terminal/release", ids).await;
    let code = exit.get("exitCode").and_then(Value::as_i64);
    let status = if code == Some(0) {
        "completed"
    } else {
        "failed"
    };
    agent.update(
        sid,
        json!({"sessionUpdate": "tool_call_update", "toolCallId": tool, "status": status, "rawOutput": {"exitCode": code}}),
    );
    if let Some(text) = output.get("output").and_then(Value::as_str) {
        agent.say(sid, text);
    }
    "end_turn"
}

async fn run_shell(
    agent: &Agent,
    sid: &str,
    cwd: &Path,
    command: &str,
    mut cancel: watch::Receiver<bool>,
) -> &'static str {
    let tool = agent.tool_call_id();
    agent.update(
        sid,
        json!({"sessionUpdate": "tool_call", "toolCallId": tool, "title": command, "kind": "execute",
               "status": "in_progress", "rawInput": {"command": command}}),
    );
    let spawned = tokio::process::Command::new("sh")
        .arg("-c")
        .arg(command)
        .current_dir(cwd)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true)
        .spawn();
    let mut child = match spawned {
        Ok(c) => c,
        Err(e) => {
            agent.update(sid, json!({"sessionUpdate": "tool_call_update", "toolCallId": tool, "status": "failed"}));
            agent.say(sid, &format!("could not start sh: {e}"));
            return "end_turn";
        }
    };
    let group = child.id().map(|p| nix::unistd::Pid::from_raw(p as i32));
    let mut stdout = child.stdout.take();
    let mut stderr = child.stderr.take();
    let (mut out_buf, mut err_buf) = ([0u8; 8192], [0u8; 8192]);
    let (mut out_carry, mut err_carry) = (Vec::new(), Vec::new());
    let mut kept = String::new();
    let mut status = None;
    let mut cancelled = false;
    let mut drain_deadline: Option<tokio::time::Instant> = None;
    loop {
        if stdout.is_none() && stderr.is_none() && status.is_some() {
            break;
        }
        tokio::select! {
            n = read_some(&mut stdout, &mut out_buf) => {
                match n { Some(n) => emit(agent, sid, &mut out_carry, &out_buf[..n], &mut kept), None => stdout = None }
            }
            n = read_some(&mut stderr, &mut err_buf) => {
                match n { Some(n) => emit(agent, sid, &mut err_carry, &err_buf[..n], &mut kept), None => stderr = None }
            }
            s = child.wait(), if status.is_none() => {
                status = Some(s.ok());
                drain_deadline = Some(tokio::time::Instant::now() + DRAIN_AFTER_EXIT);
            }
            _ = tokio::time::sleep_until(drain_deadline.unwrap_or_else(tokio::time::Instant::now)), if drain_deadline.is_some() => break,
            changed = cancel.changed(), if !cancelled => {
                if changed.is_err() || *cancel.borrow() {
                    cancelled = true;
                    if let Some(g) = group {
                        let _ = nix::sys::signal::killpg(g, nix::sys::signal::Signal::SIGKILL);
                    }
                }
            }
        }
    }
    let code = status.flatten().and_then(|s| s.code());
    let state = if cancelled {
        "failed"
    } else if code == Some(0) {
        "completed"
    } else {
        "failed"
    };
    agent.update(
        sid,
        json!({"sessionUpdate": "tool_call_update", "toolCallId": tool, "status": state,
               "rawOutput": {"exitCode": code, "output": kept},
               "content": [{"type": "content", "content": {"type": "text", "text": format!("exit {}", code.map_or("by signal".into(), |c| c.to_string()))}}]}),
    );
    if cancelled {
        "cancelled"
    } else {
        "end_turn"
    }
}

async fn read_some<R: tokio::io::AsyncRead + Unpin>(
    r: &mut Option<R>,
    buf: &mut [u8],
) -> Option<usize> {
    match r {
        Some(r) => match r.read(buf).await {
            Ok(0) | Err(_) => None,
            Ok(n) => Some(n),
        },
        None => std::future::pending().await,
    }
}

/// Streams output as message chunks, never splitting a UTF-8 character.
fn emit(agent: &Agent, sid: &str, carry: &mut Vec<u8>, bytes: &[u8], kept: &mut String) {
    carry.extend_from_slice(bytes);
    let valid = match std::str::from_utf8(carry) {
        Ok(_) => carry.len(),
        Err(e) if e.error_len().is_none() => e.valid_up_to(),
        Err(_) => carry.len(),
    };
    let text = String::from_utf8_lossy(&carry[..valid]).into_owned();
    carry.drain(..valid);
    if text.is_empty() {
        return;
    }
    for ch in text.chars() {
        if kept.len() >= KEEP_OUTPUT {
            break;
        }
        kept.push(ch);
    }
    agent.say(sid, &text);
}

fn message(error: &Value) -> String {
    error
        .get("message")
        .and_then(Value::as_str)
        .unwrap_or("no reason given")
        .to_owned()
}
