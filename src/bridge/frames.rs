//! Small readings and rewrites of frames that several of the bridge's
//! files share (kept apart so that none of them imports another's).

use crate::relay::{Frame, RawId};

/// The `requestId` of a `$/cancel_request`.
pub(super) fn cancel_target(frame: &Frame) -> Option<RawId> {
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Cancel<'a> {
        #[serde(borrow)]
        request_id: &'a serde_json::value::RawValue,
    }
    let c: Cancel<'_> = serde_json::from_str(frame.params_raw()?).ok()?;
    Some(RawId(c.request_id.get().to_owned()))
}

/// The frame with `params.requestId` replaced by `new_id` (JSON text).
pub(super) fn rewrite_request_id(frame: &Frame, new_id: &str) -> Option<Vec<u8>> {
    crate::relay::splice::set(&frame.bytes, &["params", "requestId"], new_id).ok()
}

/// The code and message of an error answer.
pub(super) fn error_fields(frame: &Frame) -> (i64, String) {
    #[derive(serde::Deserialize)]
    struct E {
        #[serde(default)]
        code: i64,
        #[serde(default)]
        message: String,
    }
    frame
        .payload_as::<E>()
        .map(|e| (e.code, e.message))
        .unwrap_or((0, "unreadable error".into()))
}

/// The session a request is for (`params.sessionId`), or "".
pub(super) fn session_of(frame: &Frame) -> String {
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Session {
        session_id: String,
    }
    frame
        .params_as::<Session>()
        .map(|s| s.session_id)
        .unwrap_or_default()
}
