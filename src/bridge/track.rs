//! What the bridge remembers about the requests it relays, and what it does
//! with their answers.
//!
//! Intercepted requests are read with the ACP schema types (never
//! re-serialized: the frame itself is forwarded as the editor wrote it).
//! Only the pieces needed to restore a session on a new backend are kept.

use agent_client_protocol_schema::v1 as acp;
use serde::Deserialize;
use tracing::warn;

use crate::relay::Frame;
use crate::session::{Session, SessionTable};

/// The effect an editor request has on the bridge's state once it succeeds.
#[derive(Debug, Clone, PartialEq)]
pub enum Track {
    None,
    /// A turn of this session (None when its id could not be read).
    Prompt(Option<String>),
    Initialize {
        params: String,
    },
    Authenticate {
        params: String,
    },
    /// `session/new` or `session/fork`: the id comes with the response.
    Create(Box<Session>),
    /// `session/load` or `session/resume`: the id is in the request.
    Reopen(Box<Session>),
    Forget(String),
    SetMode {
        session: String,
        mode: String,
    },
    SetModel {
        session: String,
        model: String,
    },
    SetConfig {
        session: String,
        config_id: String,
        value: serde_json::Value,
    },
}

/// `mcpServers` as the editor wrote it (`[]` where it wrote none).
fn mcp_servers(frame: &Frame) -> String {
    #[derive(Deserialize)]
    struct Raw {
        #[serde(rename = "mcpServers", default)]
        mcp_servers: Option<Box<serde_json::value::RawValue>>,
    }
    frame
        .params_as::<Raw>()
        .ok()
        .and_then(|r| r.mcp_servers)
        .map(|v| v.get().to_owned())
        .filter(|v| v != "null")
        .unwrap_or_else(|| "[]".to_owned())
}

fn unreadable(method: &str, e: serde_json::Error) -> Track {
    warn!("could not read the editor's {method} ({e}); passing it on, but this session cannot be restored after a backend restart");
    Track::None
}

/// Reads an editor request the bridge needs to follow.
pub fn editor_request(method: &str, frame: &Frame) -> Track {
    let params = || frame.params_raw().unwrap_or("null").to_owned();
    match method {
        "session/prompt" => {
            // Only the id: a prompt's content may be large, and is not ours.
            #[derive(Deserialize)]
            struct Turn {
                #[serde(rename = "sessionId")]
                session_id: String,
            }
            Track::Prompt(frame.params_as::<Turn>().ok().map(|t| t.session_id))
        }
        "initialize" => Track::Initialize { params: params() },
        "authenticate" => Track::Authenticate { params: params() },
        "session/new" => match frame.params_as::<acp::NewSessionRequest>() {
            Ok(r) => Track::Create(Box::new(Session::new(
                String::new(),
                r.cwd,
                r.additional_directories,
                mcp_servers(frame),
            ))),
            Err(e) => unreadable(method, e),
        },
        "session/fork" => match frame.params_as::<acp::ForkSessionRequest>() {
            Ok(r) => Track::Create(Box::new(Session::new(
                String::new(),
                r.cwd,
                r.additional_directories,
                mcp_servers(frame),
            ))),
            Err(e) => unreadable(method, e),
        },
        "session/load" => match frame.params_as::<acp::LoadSessionRequest>() {
            Ok(r) => Track::Reopen(Box::new(Session::new(
                r.session_id.0.to_string(),
                r.cwd,
                r.additional_directories,
                mcp_servers(frame),
            ))),
            Err(e) => unreadable(method, e),
        },
        "session/resume" => match frame.params_as::<acp::ResumeSessionRequest>() {
            Ok(r) => Track::Reopen(Box::new(Session::new(
                r.session_id.0.to_string(),
                r.cwd,
                r.additional_directories,
                mcp_servers(frame),
            ))),
            Err(e) => unreadable(method, e),
        },
        "session/close" => match frame.params_as::<acp::CloseSessionRequest>() {
            Ok(r) => Track::Forget(r.session_id.0.to_string()),
            Err(e) => unreadable(method, e),
        },
        "session/delete" => match frame.params_as::<acp::DeleteSessionRequest>() {
            Ok(r) => Track::Forget(r.session_id.0.to_string()),
            Err(e) => unreadable(method, e),
        },
        "session/set_mode" => match frame.params_as::<acp::SetSessionModeRequest>() {
            Ok(r) => Track::SetMode {
                session: r.session_id.0.to_string(),
                mode: r.mode_id.0.to_string(),
            },
            Err(e) => unreadable(method, e),
        },
        "session/set_config_option" => {
            // The typed read validates; the value itself is kept as the
            // editor wrote it, to be replayed verbatim.
            #[derive(Deserialize)]
            struct Raw {
                value: serde_json::Value,
            }
            match (
                frame.params_as::<acp::SetSessionConfigOptionRequest>(),
                frame.params_as::<Raw>(),
            ) {
                (Ok(r), Ok(raw)) => Track::SetConfig {
                    session: r.session_id.0.to_string(),
                    config_id: r.config_id.0.to_string(),
                    value: raw.value,
                },
                (Err(e), _) | (_, Err(e)) => unreadable(method, e),
            }
        }
        // Not in the stable schema, but sent by editors to agents that
        // still offer model selection this way.
        "session/set_model" => {
            #[derive(Deserialize)]
            #[serde(rename_all = "camelCase")]
            struct Raw {
                session_id: String,
                model_id: String,
            }
            match frame.params_as::<Raw>() {
                Ok(r) => Track::SetModel {
                    session: r.session_id,
                    model: r.model_id,
                },
                Err(e) => unreadable(method, e),
            }
        }
        _ => Track::None,
    }
}

/// Applies a successful response to the session table. Returns the id of
/// a session that appeared, if any.
pub fn apply_success(
    track: Track,
    response: &Frame,
    sessions: &mut SessionTable,
) -> Option<String> {
    match track {
        Track::Create(mut session) => {
            #[derive(Deserialize)]
            #[serde(rename_all = "camelCase")]
            struct Created {
                session_id: acp::SessionId,
            }
            match response.payload_as::<Created>() {
                Ok(created) => {
                    session.id = created.session_id.0.to_string();
                    let id = session.id.clone();
                    sessions.insert(*session);
                    Some(id)
                }
                Err(e) => {
                    warn!("the agent's answer to session/new carried no readable sessionId ({e}); the session cannot be restored after a backend restart");
                    None
                }
            }
        }
        Track::Reopen(session) => {
            let id = session.id.clone();
            // A reopened session keeps the mode the editor had set, if the
            // bridge already knew it.
            let previous = sessions.get(&id).cloned();
            let mut session = *session;
            if let Some(prev) = previous {
                session.mode = prev.mode;
                session.model = prev.model;
                session.config_options = prev.config_options;
            }
            sessions.insert(session);
            Some(id)
        }
        Track::Forget(id) => {
            sessions.remove(&id);
            None
        }
        Track::SetMode { session, mode } => {
            if let Some(s) = sessions.get_mut(&session) {
                s.mode = Some(mode);
            }
            None
        }
        Track::SetModel { session, model } => {
            if let Some(s) = sessions.get_mut(&session) {
                s.model = Some(model);
            }
            None
        }
        Track::SetConfig {
            session,
            config_id,
            value,
        } => {
            if let Some(s) = sessions.get_mut(&session) {
                s.set_config_option(config_id, value);
            }
            None
        }
        Track::None | Track::Prompt(_) | Track::Initialize { .. } | Track::Authenticate { .. } => {
            None
        }
    }
}

/// The capabilities of a backend that restoring depends on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RestoreCaps {
    pub load: bool,
    pub resume: bool,
}

impl std::fmt::Display for RestoreCaps {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match (self.resume, self.load) {
            (true, true) => "session/resume and session/load",
            (true, false) => "session/resume",
            (false, true) => "session/load",
            (false, false) => "neither session/resume nor session/load",
        })
    }
}

/// Reads the restore capabilities from an `initialize` result.
pub fn restore_caps(result_raw: &str) -> RestoreCaps {
    match serde_json::from_str::<acp::InitializeResponse>(result_raw) {
        Ok(r) => RestoreCaps {
            load: r.agent_capabilities.load_session,
            resume: r.agent_capabilities.session_capabilities.resume.is_some(),
        },
        Err(e) => {
            warn!("could not read the agent's initialize answer ({e}); assuming it can neither load nor resume sessions");
            RestoreCaps::default()
        }
    }
}

/// If a `session/update` notification reports a mode change made by the
/// agent itself, returns (session, mode).
pub fn mode_change(frame: &Frame) -> Option<(String, String)> {
    // Cheap filter first: most updates are message chunks.
    static MODE: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
        std::sync::LazyLock::new(|| memchr::memmem::Finder::new("current_mode_update"));
    MODE.find(frame.params_bytes()?)?;
    let raw = frame.params_raw()?;
    let n: acp::SessionNotification = serde_json::from_str(raw).ok()?;
    match n.update {
        acp::SessionUpdate::CurrentModeUpdate(u) => {
            Some((n.session_id.0.to_string(), u.current_mode_id.0.to_string()))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(s: &str) -> Frame {
        Frame::parse(s.as_bytes().to_vec()).unwrap()
    }

    #[test]
    fn session_new_is_tracked_until_its_response() {
        let req = frame(
            r#"{"jsonrpc":"2.0","id":1,"method":"session/new","params":{"cwd":"/w","additionalDirectories":["/x"],"mcpServers":[{"name":"m", "command":"c","args":[],"env":[],"future":1.50}]}}"#,
        );
        let track = editor_request("session/new", &req);
        let mut t = SessionTable::default();
        let resp = frame(
            r#"{"jsonrpc":"2.0","id":1,"result":{"sessionId":"s1","models":{"legacy":true}}}"#,
        );
        assert_eq!(apply_success(track, &resp, &mut t).as_deref(), Some("s1"));
        let s = t.get("s1").unwrap();
        assert_eq!(s.roots().count(), 2);
        // mcpServers are kept for the replay as the editor wrote them:
        // unknown fields, spacing and number spelling included.
        assert_eq!(
            s.mcp_servers,
            r#"[{"name":"m", "command":"c","args":[],"env":[],"future":1.50}]"#
        );
    }

    #[test]
    fn mode_and_config_follow_the_editor() {
        let mut t = SessionTable::default();
        t.insert(Session::new(
            "s".into(),
            "/w".into(),
            vec![],
            "[]".to_owned(),
        ));
        let ok = frame(r#"{"jsonrpc":"2.0","id":1,"result":{}}"#);
        let m = editor_request(
            "session/set_mode",
            &frame(
                r#"{"jsonrpc":"2.0","id":1,"method":"session/set_mode","params":{"sessionId":"s","modeId":"plan"}}"#,
            ),
        );
        apply_success(m, &ok, &mut t);
        let c = editor_request(
            "session/set_config_option",
            &frame(
                r#"{"jsonrpc":"2.0","id":1,"method":"session/set_config_option","params":{"sessionId":"s","configId":"effort","value":"high"}}"#,
            ),
        );
        apply_success(c, &ok, &mut t);
        let s = t.get("s").unwrap();
        assert_eq!(s.mode.as_deref(), Some("plan"));
        assert_eq!(
            s.config_options,
            vec![("effort".to_string(), serde_json::json!("high"))]
        );
        let close = editor_request(
            "session/close",
            &frame(
                r#"{"jsonrpc":"2.0","id":1,"method":"session/close","params":{"sessionId":"s"}}"#,
            ),
        );
        apply_success(close, &ok, &mut t);
        assert!(t.is_empty());
    }

    #[test]
    fn caps_are_read_from_initialize() {
        let caps = restore_caps(
            r#"{"protocolVersion":1,"agentCapabilities":{"loadSession":true,"sessionCapabilities":{"resume":{}}}}"#,
        );
        assert_eq!(
            caps,
            RestoreCaps {
                load: true,
                resume: true
            }
        );
        assert_eq!(
            restore_caps(r#"{"protocolVersion":1}"#),
            RestoreCaps::default()
        );
        assert_eq!(restore_caps("[]"), RestoreCaps::default());
    }

    #[test]
    fn agent_mode_changes_are_seen() {
        let f = frame(
            r#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"current_mode_update","currentModeId":"dry-run"}}}"#,
        );
        assert_eq!(mode_change(&f), Some(("s".into(), "dry-run".into())));
        let g = frame(
            r#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"current_mode_update"}}}}"#,
        );
        assert_eq!(mode_change(&g), None);
    }
}
