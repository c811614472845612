//! What the bridge says in the editor in its own voice, built from the ACP
//! schema's types: permission prompts (allow a write, accept config edits,
//! keep what the audit reverted) and its tool-call announcements; and the
//! user's answers read back as values, never compared as loose strings.

use std::path::Path;

use agent_client_protocol_schema::v1 as acp;

use crate::relay::Frame;

/// One option of a prompt: its id on the wire, its label, its kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct PromptOption {
    pub id: &'static str,
    pub name: &'static str,
    pub kind: acp::PermissionOptionKind,
}

const fn option(
    id: &'static str,
    name: &'static str,
    kind: acp::PermissionOptionKind,
) -> PromptOption {
    PromptOption { id, name, kind }
}

/// The allow flow's four answers.
pub(super) const ALLOW_ONCE: PromptOption = option(
    "allow-once",
    "Allow once",
    acp::PermissionOptionKind::AllowOnce,
);
pub(super) const ALLOW_ALWAYS: PromptOption = option(
    "allow-always",
    "Always allow",
    acp::PermissionOptionKind::AllowAlways,
);
pub(super) const REJECT_ONCE: PromptOption = option(
    "reject-once",
    "Don't allow",
    acp::PermissionOptionKind::RejectOnce,
);
pub(super) const REJECT_ALWAYS: PromptOption = option(
    "reject-always",
    "Never allow",
    acp::PermissionOptionKind::RejectAlways,
);
pub(super) const ALLOW_FLOW: &[PromptOption] =
    &[ALLOW_ONCE, ALLOW_ALWAYS, REJECT_ONCE, REJECT_ALWAYS];

/// Where an agent no profile knows keeps its state.
pub(super) const STATE_ALWAYS: PromptOption = option(
    "state-always",
    "Allow for this agent, always",
    acp::PermissionOptionKind::AllowAlways,
);
pub(super) const STATE_ONCE: PromptOption = option(
    "state-once",
    "Allow until zcode-acp exits",
    acp::PermissionOptionKind::AllowOnce,
);
pub(super) const STATE_NO: PromptOption = option(
    "state-no",
    "Don't allow",
    acp::PermissionOptionKind::RejectOnce,
);
pub(super) const STATE_FLOW: &[PromptOption] = &[STATE_ALWAYS, STATE_ONCE, STATE_NO];

/// Hand edits of sandbox.json.
pub(super) const ACCEPT_CONFIG: PromptOption = option(
    "accept-config",
    "Accept the changes",
    acp::PermissionOptionKind::AllowOnce,
);
pub(super) const IGNORE_CONFIG: PromptOption = option(
    "ignore-config",
    "Keep ignoring them",
    acp::PermissionOptionKind::RejectOnce,
);

/// What the post-turn audit reverted.
pub(super) const KEEP: PromptOption = option(
    "keep",
    "Keep the agent's version",
    acp::PermissionOptionKind::AllowOnce,
);
pub(super) const REVERT: PromptOption = option(
    "revert",
    "Keep it reverted",
    acp::PermissionOptionKind::RejectOnce,
);

/// The `session/request_permission` params of a prompt about `path`.
pub(super) fn permission_request(
    session: &str,
    tool_call_id: String,
    title: String,
    path: &Path,
    text: String,
    answers: &[PromptOption],
) -> String {
    let fields = acp::ToolCallUpdateFields::new()
        .title(title)
        .kind(acp::ToolKind::Edit)
        .status(acp::ToolCallStatus::Pending)
        .locations(vec![acp::ToolCallLocation::new(path)])
        .content(vec![acp::ToolCallContent::from(text)]);
    request_with(session, tool_call_id, fields, answers)
}

/// The `session/request_permission` params of a prompt about a refused
/// connection, with the allow flow's answers.
pub(super) fn connection_request(
    session: &str,
    tool_call_id: String,
    title: String,
    text: String,
) -> String {
    let fields = acp::ToolCallUpdateFields::new()
        .title(title)
        .kind(acp::ToolKind::Fetch)
        .status(acp::ToolCallStatus::Pending)
        .content(vec![acp::ToolCallContent::from(text)]);
    request_with(session, tool_call_id, fields, ALLOW_FLOW)
}

/// A prompt's params: the tool call it is about, and the answers offered.
fn request_with(
    session: &str,
    tool_call_id: String,
    fields: acp::ToolCallUpdateFields,
    answers: &[PromptOption],
) -> String {
    let options = answers
        .iter()
        .map(|a| acp::PermissionOption::new(a.id, a.name, a.kind))
        .collect();
    let request = acp::RequestPermissionRequest::new(
        session.to_owned(),
        acp::ToolCallUpdate::new(tool_call_id, fields),
        options,
    );
    serde_json::to_string(&request).expect("schema types serialize")
}

/// The `session/update` params of a completed tool call of the bridge's own.
pub(super) fn announcement(
    session: &str,
    tool_call_id: String,
    title: String,
    text: String,
) -> String {
    let call = acp::ToolCall::new(tool_call_id, title)
        .kind(acp::ToolKind::Other)
        .status(acp::ToolCallStatus::Completed)
        .content(vec![acp::ToolCallContent::from(text)]);
    let note =
        acp::SessionNotification::new(session.to_owned(), acp::SessionUpdate::ToolCall(call));
    serde_json::to_string(&note).expect("schema types serialize")
}

/// Which of `answers` the user chose; `None` when the prompt was
/// cancelled, the answer is malformed, or it names no option offered.
pub(super) fn chosen(frame: &Frame, answers: &[PromptOption]) -> Option<PromptOption> {
    match frame
        .payload_as::<acp::RequestPermissionResponse>()
        .ok()?
        .outcome
    {
        acp::RequestPermissionOutcome::Selected(s) => answers
            .iter()
            .copied()
            .find(|a| s.option_id.0.as_ref() == a.id),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    #[test]
    fn a_prompt_is_what_editors_expect() {
        let params = permission_request(
            "s-1",
            "zcode-acp-allow-3".into(),
            "Allow the agent to write /srv/x?".into(),
            Path::new("/srv/x"),
            "why".into(),
            ALLOW_FLOW,
        );
        let v: Value = serde_json::from_str(&params).unwrap();
        assert_eq!(v["sessionId"], "s-1");
        assert_eq!(v["toolCall"]["toolCallId"], "zcode-acp-allow-3");
        assert_eq!(v["toolCall"]["title"], "Allow the agent to write /srv/x?");
        assert_eq!(v["toolCall"]["kind"], "edit");
        assert_eq!(v["toolCall"]["status"], "pending");
        assert_eq!(v["toolCall"]["locations"], json!([{"path": "/srv/x"}]));
        assert_eq!(
            v["toolCall"]["content"],
            json!([{"type": "content", "content": {"type": "text", "text": "why"}}])
        );
        assert_eq!(
            v["options"],
            json!([
                {"optionId": "allow-once", "name": "Allow once", "kind": "allow_once"},
                {"optionId": "allow-always", "name": "Always allow", "kind": "allow_always"},
                {"optionId": "reject-once", "name": "Don't allow", "kind": "reject_once"},
                {"optionId": "reject-always", "name": "Never allow", "kind": "reject_always"},
            ])
        );
        let note: Value = serde_json::from_str(&announcement(
            "s-1",
            "zcode-acp-sandbox-1".into(),
            "T".into(),
            "x".into(),
        ))
        .unwrap();
        assert_eq!(note["update"]["sessionUpdate"], "tool_call");
        // `other` is the schema's default kind, so it is left out.
        assert_eq!(note["update"]["kind"].as_str().unwrap_or("other"), "other");
        assert_eq!(note["update"]["status"], "completed");
        assert_eq!(note["update"]["title"], "T");
    }

    #[test]
    fn answers_are_read_as_values() {
        let answer = |payload: &str| {
            let f = Frame::parse(
                format!(r#"{{"jsonrpc":"2.0","id":1,"result":{payload}}}"#).into_bytes(),
            )
            .unwrap();
            chosen(&f, ALLOW_FLOW)
        };
        assert_eq!(
            answer(r#"{"outcome":{"outcome":"selected","optionId":"allow-always"}}"#),
            Some(ALLOW_ALWAYS)
        );
        assert_eq!(answer(r#"{"outcome":{"outcome":"cancelled"}}"#), None);
        assert_eq!(
            answer(r#"{"outcome":{"outcome":"selected","optionId":"keep"}}"#),
            None
        );
        assert_eq!(answer(r#"{"nonsense":1}"#), None);
    }
}
