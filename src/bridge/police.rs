//! Judging what an armed agent asks the editor to do for it.
//!
//! The editor performs `fs/write_text_file` and runs `terminal/create`
//! commands with the user's full rights, outside any sandbox, and MCP over
//! ACP runs tools in the editor: without this, the sandbox would be
//! theatre for agents that work through ACP. What the agent writes in its
//! request is a hint; only the policy decides.

use crate::relay::splice;
use agent_client_protocol_schema::v1 as acp;

use super::Bridge;
use crate::policy::{Band, Op};
use crate::relay::codes;
use crate::relay::Frame;

pub(super) enum Policed {
    /// Forward as is.
    Pass,
    /// Forward these bytes instead (same id as the original).
    Rewrite(Vec<u8>),
    Refuse {
        code: i64,
        message: String,
    },
    /// Put it to the user; `frame` is the request with the real path.
    Ask {
        session: String,
        path: std::path::PathBuf,
        reason: String,
        frame: Frame,
    },
}

impl Bridge {
    pub(super) fn police_backend_request(&self, method: &str, frame: &Frame) -> Policed {
        if !self.armed() {
            return Policed::Pass;
        }
        match method {
            "fs/write_text_file" => self.police_write(frame),
            "terminal/create" => self.police_terminal(frame),
            m if m.starts_with("mcp/") => Policed::Refuse {
                code: codes::NOT_WHILE_ARMED,
                message: format!("zcode-acp refused {m}: MCP over ACP runs tools in the editor, outside the sandbox"),
            },
            _ => Policed::Pass,
        }
    }

    /// The editor runs terminal commands with the user's rights: the command
    /// is rewritten to run under this binary's sandbox helper, with the
    /// policy written by the bridge (never rebuilt from sandbox.json, which
    /// the agent may have edited), and the requested environment applied
    /// only inside, after arming: the editor applies a terminal's `env` to the
    /// process it starts, so `LD_PRELOAD`, `PATH` or `ZCODE_ACP_*` there would
    /// otherwise run agent code in the unconfined helper.
    fn police_terminal(&self, frame: &Frame) -> Policed {
        let refuse = |message: String| Policed::Refuse {
            code: codes::NOT_WHILE_ARMED,
            message,
        };
        let request: acp::CreateTerminalRequest = match frame.params_as() {
            Ok(r) => r,
            Err(e) => {
                return refuse(format!(
                    "zcode-acp could not read this terminal/create request: {e}"
                ))
            }
        };
        // An empty `args` means `command` is a whole shell line, as the
        // editor runs it through a shell.
        let argv = if request.args.is_empty() {
            vec![
                "/bin/sh".to_owned(),
                "-c".to_owned(),
                request.command.clone(),
            ]
        } else {
            std::iter::once(request.command.clone())
                .chain(request.args.iter().cloned())
                .collect()
        };
        let env = request
            .env
            .iter()
            .map(|e| (e.name.clone(), e.value.clone()))
            .collect();
        // The real path is what the terminal runs in: entered with no
        // symlink on the way, so a directory the agent swaps for one later
        // is refused there rather than followed.
        let cwd = request
            .cwd
            .as_ref()
            .map(|c| crate::policy::resolve_real(c).unwrap_or_else(|_| c.clone()));
        let command = crate::confine::Command { argv, env, cwd };
        if self.confinement.policy().is_none() {
            return refuse(
                "zcode-acp refused terminal/create: no generation is armed, so there is no sandbox to run it in"
                    .into(),
            );
        }
        let wrapped = match self
            .confinement
            .wrap(&command, crate::confine::Launch::Terminal)
        {
            Ok(w) => w,
            Err(e) => {
                return refuse(format!(
                    "zcode-acp refused terminal/create: it could not run the command in the sandbox ({e})"
                ))
            }
        };
        match rewrite_terminal(frame, &wrapped) {
            Ok(bytes) => Policed::Rewrite(bytes),
            Err(e) => refuse(format!(
                "zcode-acp could not rewrite this terminal/create: {e}"
            )),
        }
    }

    fn police_write(&self, frame: &Frame) -> Policed {
        let refuse = |message: String| Policed::Refuse {
            code: codes::WRITE_DENIED,
            message,
        };
        let request: acp::WriteTextFileRequest = match frame.params_as() {
            Ok(r) => r,
            Err(e) => {
                return refuse(format!(
                    "zcode-acp could not read this fs/write_text_file request: {e}"
                ))
            }
        };
        let Some(policy) = self.confinement.policy() else {
            return refuse(
                "zcode-acp has no sandbox policy for this agent, so it cannot judge the write"
                    .into(),
            );
        };
        let (real, decision) = match policy.evaluate(&request.path, Op::Write) {
            Ok(d) => d,
            Err(e) => {
                return refuse(format!(
                    "zcode-acp denied writing {}: {e}",
                    request.path.display()
                ))
            }
        };
        // The editor opens what it writes: a FIFO would block it (and the
        // agent, held until it answers), a device or socket is no file.
        if let Ok(meta) = std::fs::symlink_metadata(&real) {
            if !meta.is_file() {
                return refuse(format!(
                    "zcode-acp refused writing {}: it is not a regular file (a directory, FIFO, socket or device), which the editor cannot write as text",
                    real.display()
                ));
            }
        }
        let real_frame = || {
            if real == request.path {
                Some(frame.clone())
            } else {
                rewrite_path(frame, &real).and_then(|b| Frame::parse(b).ok())
            }
        };
        let granted = decision.kind != Band::Island
            && !self.asks.writes.refused_for_good(&real)
            && self.asks.writes.granted(&real);
        if decision.allowed || granted {
            // The editor follows symlinks when it writes: it gets the real
            // path that was judged, not the one the agent named. (A symlink
            // swapped in between the check and the write is the residual race.)
            if real == request.path {
                return Policed::Pass;
            }
            return match real_frame() {
                Some(f) => Policed::Rewrite(f.bytes),
                None => refuse("zcode-acp could not rewrite the path of this write".into()),
            };
        }
        let home = crate::policy::offerable::real_home();
        let why = match crate::policy::offerable::refusal(&real, &decision, home.as_deref()) {
            Some(never) => never,
            None if self.asks.writes.refused_for_good(&real) => {
                "you chose never to allow it".to_owned()
            }
            None => {
                let rule = decision.rule.unwrap_or_else(|| "no rule allows it".into());
                return match real_frame() {
                    Some(f) => Policed::Ask {
                        session: request.session_id.0.to_string(),
                        path: real,
                        reason: format!("{} ({rule})", decision.kind),
                        frame: f,
                    },
                    None => refuse("zcode-acp could not rewrite the path of this write".into()),
                };
            }
        };
        refuse(format!(
            "zcode-acp denied writing {} ({}): {why}",
            real.display(),
            decision.kind
        ))
    }
}

fn rewrite_path(frame: &Frame, real: &std::path::Path) -> Option<Vec<u8>> {
    let path = serde_json::to_string(real.to_str()?).ok()?;
    splice::set(&frame.bytes, &["params", "path"], &path).ok()
}

/// The terminal's command becomes the sandbox's wrapper (`wrapped`: argv),
/// which carries the environment itself.
fn rewrite_terminal(frame: &Frame, wrapped: &[String]) -> Result<Vec<u8>, splice::SpliceError> {
    let json = |v: &[String]| serde_json::to_string(v).expect("strings serialize");
    let command = serde_json::to_string(&wrapped[0]).expect("a string serializes");
    let bytes = splice::set(&frame.bytes, &["params", "command"], &command)?;
    let bytes = splice::set(&bytes, &["params", "args"], &json(&wrapped[1..]))?;
    splice::set(&bytes, &["params", "env"], "[]")
}

/// Removes `agentCapabilities.mcpCapabilities.acp` from an `initialize`
/// result: while armed, MCP over ACP is not offered.
/// `Ok(None)` when there is nothing to hide; an error when the answer
/// cannot be read unambiguously (a key twice on the way), which must not
/// reach the editor as it is.
pub(super) fn hide_mcp_over_acp(
    frame: &Frame,
    editor_id: &str,
) -> Result<Option<Vec<u8>>, splice::SpliceError> {
    use splice::SpliceError::{Missing, NotAnObject};
    let path = ["result", "agentCapabilities", "mcpCapabilities", "acp"];
    match splice::remove(&frame.bytes, &path) {
        Ok(bytes) => splice::set(&bytes, &["id"], editor_id).map(Some),
        Err(Missing(_) | NotAnObject(_)) => Ok(None),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mcp_over_acp_is_hidden_and_nothing_else_changes() {
        let f = Frame::parse(
            br#"{"jsonrpc":"2.0","id":7,"result":{"protocolVersion":1,"agentCapabilities":{"loadSession":true,"mcpCapabilities":{"http":true,"acp":true,"_meta":{"x":1}}},"models":{"legacy":1}}}"#.to_vec(),
        )
        .unwrap();
        let out = hide_mcp_over_acp(&f, "\"editor-3\"").unwrap().unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["id"], "editor-3");
        assert_eq!(
            v["result"]["agentCapabilities"]["mcpCapabilities"],
            serde_json::json!({"http": true, "_meta": {"x": 1}})
        );
        assert_eq!(v["result"]["models"]["legacy"], 1);
        // Key order is kept.
        let text = String::from_utf8(out).unwrap();
        assert!(text.find("protocolVersion").unwrap() < text.find("agentCapabilities").unwrap());
        // Nothing to hide: the frame passes as it was.
        let g =
            Frame::parse(br#"{"jsonrpc":"2.0","id":7,"result":{"agentCapabilities":{}}}"#.to_vec())
                .unwrap();
        assert!(hide_mcp_over_acp(&g, "7").unwrap().is_none());
        // Said twice: refused, never passed on as it is.
        let twice = Frame::parse(
            br#"{"jsonrpc":"2.0","id":7,"result":{"agentCapabilities":{"mcpCapabilities":{"acp":true,"acp":true}}}}"#
                .to_vec(),
        )
        .unwrap();
        assert!(hide_mcp_over_acp(&twice, "7").is_err());
    }

    /// Every rewrite the bridge makes changes its value and no other byte:
    /// unknown fields, key order, spacing and escapes reach the peer as
    /// they were sent.
    #[test]
    fn every_rewrite_keeps_every_other_byte() {
        let parse = |t: &str| Frame::parse(t.as_bytes().to_vec()).unwrap();
        let text = |b: Vec<u8>| String::from_utf8(b).unwrap();

        let write = "{\"params\": {\"_meta\":{\"z\":1,\"a\":[ ]}, \"content\":\"caf\\u00e9\",\"path\" : \"/ws/./x\", \"sessionId\":\"s\"},\n \"method\":\"fs/write_text_file\",\"id\":4,\"jsonrpc\":\"2.0\",\"future\":true}";
        let out = rewrite_path(&parse(write), std::path::Path::new("/ws/x")).unwrap();
        assert_eq!(text(out), write.replace("\"/ws/./x\"", "\"/ws/x\""));

        let terminal = "{\"jsonrpc\":\"2.0\",\"id\":5,\"method\":\"terminal/create\",\"params\":{\"outputByteLimit\":10,\"command\":\"ls\", \"args\":[\"-l\"],\"env\":[{\"name\":\"A\",\"value\":\"b\"}],\"sessionId\":\"s\",\"x-unknown\":{\"k\":[1,2]}}}";
        let wrapped = [
            "zcode-acp".to_owned(),
            "run".to_owned(),
            "--".to_owned(),
            "ls".to_owned(),
        ];
        let out = rewrite_terminal(&parse(terminal), &wrapped).unwrap();
        let expected = terminal
            .replace("\"command\":\"ls\"", "\"command\":\"zcode-acp\"")
            .replace("\"args\":[\"-l\"]", "\"args\":[\"run\",\"--\",\"ls\"]")
            .replace("\"env\":[{\"name\":\"A\",\"value\":\"b\"}]", "\"env\":[]");
        assert_eq!(text(out), expected);
        // Without args or env, they are added after the last member.
        let bare = "{\"jsonrpc\":\"2.0\",\"id\":5,\"method\":\"terminal/create\",\"params\":{\"command\":\"ls\",\"sessionId\":\"s\"}}";
        let out = rewrite_terminal(&parse(bare), &wrapped).unwrap();
        assert_eq!(
            text(out),
            "{\"jsonrpc\":\"2.0\",\"id\":5,\"method\":\"terminal/create\",\"params\":{\"command\":\"zcode-acp\",\"sessionId\":\"s\",\"args\":[\"run\",\"--\",\"ls\"],\"env\":[]}}"
        );

        let init = "{\"result\":{\"zeta\":0,\"agentCapabilities\":{\"mcpCapabilities\":{\"acp\":true, \"http\":true}},\"authMethods\":[]},\"id\":2,\"jsonrpc\":\"2.0\"}";
        let out = hide_mcp_over_acp(&parse(init), "\"e-1\"").unwrap().unwrap();
        assert_eq!(
            text(out),
            init.replace("\"acp\":true, ", "")
                .replace("\"id\":2", "\"id\":\"e-1\"")
        );

        let cancel = "{\"method\":\"$/cancel_request\",\"params\":{\"requestId\":\"x\",\"_meta\":{\"b\":1,\"a\":2}},\"jsonrpc\":\"2.0\"}";
        let out = crate::bridge::editor_side::rewrite_request_id(&parse(cancel), "12").unwrap();
        assert_eq!(
            text(out),
            cancel.replace("\"requestId\":\"x\"", "\"requestId\":12")
        );

        // A duplicated key is refused, never guessed at.
        let twice = "{\"jsonrpc\":\"2.0\",\"id\":4,\"method\":\"fs/write_text_file\",\"params\":{\"path\":\"/a\",\"sessionId\":\"s\",\"content\":\"\"}}";
        assert!(rewrite_path(&parse(twice), std::path::Path::new("/b")).is_some());
        let frame = parse(&twice.replace("\"sessionId\"", "\"path\":\"/c\",\"sessionId\""));
        assert!(rewrite_path(&frame, std::path::Path::new("/b")).is_none());
    }
}
