//! The JSON-RPC envelope: just enough of a frame to route it.
//!
//! The relay parses `id`, `method`, and whether a frame carries `result` or
//! `error`; everything else stays as the peer wrote it. When an id must change
//! (id remapping), the new id is spliced into the original bytes at the exact
//! span the old one occupied, so every other byte, unknown fields, `_meta`,
//! key order and whitespace included, reaches the other side unchanged.
//!
//! Strict at the edge: what crosses the bridge is a JSON object whose
//! `jsonrpc` is `"2.0"` (a frame without one, as Zed wrote them until
//! September 2025, gets the field spliced in; another version is refused);
//! an id is a string or an integer (null only in an error answer to an
//! unreadable request), of bounded size; nesting is bounded; an array (a
//! batch, which ACP does not use) is refused. What the bridge cannot route
//! exactly is never passed on for the other peer to guess at.

use std::borrow::Cow;
use std::ops::Range;

use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;

/// A JSON-RPC id exactly as a peer wrote it (`7`, `"abc"`), as JSON text.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RawId(pub String);

impl RawId {
    /// The id as a bridge-allocated number, if it is one.
    pub fn as_bridge_number(&self) -> Option<u64> {
        self.0.parse().ok()
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for RawId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// An id as the log shows it: as written, or `none`.
pub fn shown(id: &Option<RawId>) -> &str {
    id.as_ref().map_or("none", |i| i.0.as_str())
}

/// What a frame is, by JSON-RPC's rules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FrameKind {
    Request { id: RawId, method: String },
    Notification { method: String },
    Response { id: RawId, is_error: bool },
}

/// A parsed frame: the original bytes plus its envelope.
#[derive(Debug, Clone)]
pub struct Frame {
    pub bytes: Vec<u8>,
    pub kind: FrameKind,
    id_span: Option<Range<usize>>,
    params_span: Option<Range<usize>>,
    payload_span: Option<Range<usize>>,
}

/// The deepest nesting of arrays and objects a frame may have: far above
/// anything ACP carries (a tool's input included), far below what would
/// exhaust a peer's parser.
pub const MAX_DEPTH: usize = 1024;
/// The longest id, as JSON text (quotes included).
pub const MAX_ID_BYTES: usize = 256;

/// Why a frame could not be routed.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("not valid JSON: {0}")]
    Parse(serde_json::Error),
    #[error("not a JSON-RPC 2.0 message: {0}")]
    Invalid(String),
    #[error("a JSON-RPC batch (an array of messages), which ACP does not use; send each message as a JSON object on a line of its own")]
    Batch,
}

impl FrameError {
    /// The JSON-RPC error code that answers this failure.
    pub fn code(&self) -> i64 {
        match self {
            FrameError::Parse(_) => crate::relay::codes::PARSE_ERROR,
            FrameError::Invalid(_) | FrameError::Batch => crate::relay::codes::INVALID_REQUEST,
        }
    }
}

#[derive(Deserialize)]
struct Envelope<'a> {
    #[serde(default, borrow, deserialize_with = "present")]
    jsonrpc: Option<&'a RawValue>,
    #[serde(default, borrow, deserialize_with = "present")]
    id: Option<&'a RawValue>,
    #[serde(default, borrow)]
    method: Option<Cow<'a, str>>,
    #[serde(default, borrow, deserialize_with = "present")]
    params: Option<&'a RawValue>,
    #[serde(default, borrow, deserialize_with = "present")]
    result: Option<&'a RawValue>,
    #[serde(default, borrow, deserialize_with = "present")]
    error: Option<&'a RawValue>,
}

/// A field that is present, even as `null`, is `Some`: a response whose
/// result is `null` is still a response.
fn present<'de, D: Deserializer<'de>>(d: D) -> Result<Option<&'de RawValue>, D::Error> {
    <&RawValue>::deserialize(d).map(Some)
}

fn span_of(base: &[u8], part: &RawValue) -> Range<usize> {
    // `part` borrows from `base`, so its address lies within it.
    let start = part.get().as_ptr() as usize - base.as_ptr() as usize;
    start..start + part.get().len()
}

impl Frame {
    /// Parses the envelope of one frame. Duplicate keys are rejected: a frame
    /// whose two `id`s are read differently by the two peers could be used to
    /// smuggle a response past the remapping.
    ///
    /// A frame without `jsonrpc` that is otherwise sound gets
    /// `"jsonrpc":"2.0",` spliced in right after its opening brace (it has
    /// an id or a method, so a member follows): nothing else moves.
    pub fn parse(bytes: Vec<u8>) -> Result<Frame, (Vec<u8>, FrameError)> {
        let frame = |bytes: Vec<u8>, parts: Parts| Frame {
            bytes,
            kind: parts.kind,
            id_span: parts.id_span,
            params_span: parts.params_span,
            payload_span: parts.payload_span,
        };
        match parse_envelope(&bytes) {
            Ok(parts) if !parts.unversioned => Ok(frame(bytes, parts)),
            Ok(_) => {
                let brace = skip_ws(&bytes, 0) + 1;
                let mut versioned = Vec::with_capacity(bytes.len() + VERSION_MEMBER.len());
                versioned.extend_from_slice(&bytes[..brace]);
                versioned.extend_from_slice(VERSION_MEMBER);
                versioned.extend_from_slice(&bytes[brace..]);
                match parse_envelope(&versioned) {
                    Ok(parts) => Ok(frame(versioned, parts)),
                    Err(e) => Err((bytes, e)),
                }
            }
            Err(e) => Err((bytes, e)),
        }
    }

    pub fn method(&self) -> Option<&str> {
        match &self.kind {
            FrameKind::Request { method, .. } | FrameKind::Notification { method } => Some(method),
            FrameKind::Response { .. } => None,
        }
    }

    /// The raw `params` JSON text, if any.
    pub fn params_raw(&self) -> Option<&str> {
        self.params_span.clone().map(|r| self.text(r))
    }

    /// The raw `params` JSON bytes, if any: for quick looks that need no
    /// text (a search for a word), without checking UTF-8 again.
    pub fn params_bytes(&self) -> Option<&[u8]> {
        self.params_span.clone().map(|r| &self.bytes[r])
    }

    /// The raw `result` (or `error`) JSON text of a response.
    pub fn payload_raw(&self) -> Option<&str> {
        self.payload_span.clone().map(|r| self.text(r))
    }

    fn text(&self, r: Range<usize>) -> &str {
        // The whole frame parsed as JSON, which is UTF-8, and spans come from
        // the parser's own token boundaries.
        std::str::from_utf8(&self.bytes[r]).unwrap_or("null")
    }

    /// Reads `params` with a typed (schema) struct.
    pub fn params_as<T: for<'de> Deserialize<'de>>(&self) -> Result<T, serde_json::Error> {
        serde_json::from_str(self.params_raw().unwrap_or("null"))
    }

    /// Reads the response payload with a typed (schema) struct.
    pub fn payload_as<T: for<'de> Deserialize<'de>>(&self) -> Result<T, serde_json::Error> {
        serde_json::from_str(self.payload_raw().unwrap_or("null"))
    }

    /// The `sessionId` named in `params`, if any.
    pub fn session_id(&self) -> Option<String> {
        #[derive(Deserialize)]
        struct SessionRef<'a> {
            #[serde(rename = "sessionId", borrow, default)]
            session_id: Option<Cow<'a, str>>,
        }
        let raw = self.params_raw()?;
        serde_json::from_str::<SessionRef<'_>>(raw)
            .ok()
            .and_then(|s| s.session_id.map(Cow::into_owned))
    }

    /// The frame's bytes with its id replaced by `new_id` (JSON text); all
    /// other bytes are kept exactly.
    pub fn with_id(&self, new_id: &str) -> Vec<u8> {
        match &self.id_span {
            Some(span) => {
                let mut out = Vec::with_capacity(self.bytes.len() + new_id.len());
                out.extend_from_slice(&self.bytes[..span.start]);
                out.extend_from_slice(new_id.as_bytes());
                out.extend_from_slice(&self.bytes[span.end..]);
                out
            }
            None => self.bytes.clone(),
        }
    }
}

/// What a frame without `jsonrpc` is given.
const VERSION_MEMBER: &[u8] = br#""jsonrpc":"2.0","#;

struct Parts {
    /// It had no `jsonrpc` member.
    unversioned: bool,
    kind: FrameKind,
    id_span: Option<Range<usize>>,
    params_span: Option<Range<usize>>,
    payload_span: Option<Range<usize>>,
}

fn parse_envelope(bytes: &[u8]) -> Result<Parts, FrameError> {
    // Only an object is a message: serde's derived reader would take an
    // array for one, field by field.
    match bytes.get(skip_ws(bytes, 0)) {
        Some(b'{') => {}
        Some(b'[') => return Err(FrameError::Batch),
        _ => {
            return Err(
                match serde_json::from_slice::<serde::de::IgnoredAny>(bytes) {
                    Err(e) if !e.is_data() => FrameError::Parse(e),
                    _ => FrameError::Invalid("a message is a JSON object".into()),
                },
            )
        }
    }
    let env: Envelope<'_> = serde_json::from_slice(bytes).map_err(|e| match e.classify() {
        serde_json::error::Category::Data => FrameError::Invalid(e.to_string()),
        _ => FrameError::Parse(e),
    })?;
    if too_deep(bytes, MAX_DEPTH) {
        return Err(FrameError::Invalid(format!(
            "nested more than {MAX_DEPTH} levels deep"
        )));
    }
    // Present, it must say 2.0. Missing, the frame is taken and given it
    // (see `Frame::parse`): Zed omitted it until September 2025 (zed#37128),
    // and ACP's own libraries still read such frames; the other side, which
    // may be strict, never sees one without it.
    let unversioned = match env.jsonrpc {
        None => true,
        Some(v)
            if serde_json::from_str::<Cow<'_, str>>(v.get())
                .ok()
                .as_deref()
                == Some("2.0") =>
        {
            false
        }
        Some(_) => return Err(FrameError::Invalid("`jsonrpc` must be \"2.0\"".into())),
    };
    if let Some(id) = env.id {
        let null_error = id.get() == "null" && env.error.is_some() && env.method.is_none();
        if !null_error {
            check_id(id.get())?;
        }
    }
    let id_span = env.id.map(|id| span_of(bytes, id));
    let params_span = env.params.map(|p| span_of(bytes, p));
    let id = env.id.map(|id| RawId(id.get().to_owned()));
    let (kind, payload_span) = match (env.method, id, env.result, env.error) {
        (Some(method), Some(id), None, None) => (
            FrameKind::Request {
                id,
                method: method.into_owned(),
            },
            None,
        ),
        (Some(method), None, None, None) => (
            FrameKind::Notification {
                method: method.into_owned(),
            },
            None,
        ),
        (None, Some(id), Some(result), None) => (
            FrameKind::Response {
                id,
                is_error: false,
            },
            Some(span_of(bytes, result)),
        ),
        (None, Some(id), None, Some(error)) => (FrameKind::Response { id, is_error: true }, Some(span_of(bytes, error))),
        _ => {
            return Err(FrameError::Invalid(
                "a message needs `method` (request or notification) or `id` with exactly one of `result` and `error`".into(),
            ))
        }
    };
    Ok(Parts {
        unversioned,
        kind,
        id_span,
        params_span,
        payload_span,
    })
}

/// An id is a string or an integer (no fraction, no exponent), of at most
/// [`MAX_ID_BYTES`].
fn check_id(text: &str) -> Result<(), FrameError> {
    let integer = {
        let digits = text.strip_prefix('-').unwrap_or(text);
        !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())
    };
    if !(integer || text.starts_with('"')) {
        return Err(FrameError::Invalid(
            "an id is a string or an integer".into(),
        ));
    }
    if text.len() > MAX_ID_BYTES {
        return Err(FrameError::Invalid(format!(
            "an id is at most {MAX_ID_BYTES} bytes long"
        )));
    }
    Ok(())
}

/// Whether valid JSON `bytes` nest arrays and objects deeper than `limit`.
/// Strings are skipped with memchr: a frame is mostly file contents.
fn too_deep(bytes: &[u8], limit: usize) -> bool {
    let mut depth = 0usize;
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'"' => {
                // To the closing quote: the next quote not escaped.
                let mut j = i + 1;
                loop {
                    match memchr::memchr2(b'"', b'\\', &bytes[j..]) {
                        Some(off) if bytes[j + off] == b'\\' => j += off + 2,
                        Some(off) => {
                            j += off;
                            break;
                        }
                        None => return false,
                    }
                }
                i = j;
            }
            b'[' | b'{' => {
                depth += 1;
                if depth > limit {
                    return true;
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
        i += 1;
    }
    false
}

/// What could be read of a frame that did not parse (or was too large to
/// keep): its top-level id, and whether it named a method or carried an
/// answer, as far as the scan got.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Recovered {
    /// An id the bridge can route by (a string or an integer).
    pub id: Option<RawId>,
    /// The id a refusal is answered to where the bridge does not route by
    /// the one written: that id when JSON-RPC allows it (`null`, a
    /// fraction), and `null` when the `id` member holds something it does
    /// not (an object, an array, a boolean, an id too long or too deep to
    /// read), as JSON-RPC says for an id that cannot be read.
    pub reply_id: Option<RawId>,
    /// A `method` key was seen: a request (or notification).
    pub method: bool,
    /// A `result` or `error` key was seen: an answer.
    pub answer: bool,
}

/// Best-effort recovery of the top-level `id` of a frame that did not parse
/// (or was too large to keep), so the sender can still be answered.
pub fn recover_id(bytes: &[u8]) -> Option<RawId> {
    recover(bytes).id
}

/// Scans only the top level of the outermost object and stops at the first
/// sign of a structure it does not understand: an id recovered from a
/// nested object would answer the wrong request. An id is kept only when
/// it is a string or an integer.
pub fn recover(bytes: &[u8]) -> Recovered {
    let mut found = Recovered::default();
    let mut ids_seen = 0;
    let mut i = skip_ws(bytes, 0);
    if bytes.get(i) != Some(&b'{') {
        return found;
    }
    i += 1;
    loop {
        i = skip_ws(bytes, i);
        let Some((key, after_key)) = scan_string(bytes, i) else {
            return found;
        };
        i = skip_ws(bytes, after_key);
        if bytes.get(i) != Some(&b':') {
            return found;
        }
        i = skip_ws(bytes, i + 1);
        match key {
            b"\"method\"" => found.method = true,
            b"\"result\"" | b"\"error\"" => found.answer = true,
            _ => {}
        }
        if key == b"\"id\"" {
            if ids_seen > 0 {
                // Two ids: which one the sender meant is anyone's guess.
                found.id = None;
                found.reply_id = Some(RawId("null".into()));
                return found;
            }
            ids_seen += 1;
            found.reply_id = Some(RawId("null".into()));
        }
        let Some(value_end) = scan_value(bytes, i) else {
            return found;
        };
        if key == b"\"id\"" {
            let text = std::str::from_utf8(&bytes[i..value_end]).ok();
            found.id = text
                .filter(|t| check_id(t).is_ok())
                .map(|t| RawId(t.to_owned()));
            let number = |t: &str| serde_json::from_str::<serde_json::Number>(t).is_ok();
            found.reply_id = found.id.clone().or_else(|| {
                text.filter(|t| t.len() <= MAX_ID_BYTES && (*t == "null" || number(t)))
                    .map(|t| RawId(t.to_owned()))
                    .or(Some(RawId("null".into())))
            });
        }
        i = skip_ws(bytes, value_end);
        match bytes.get(i) {
            Some(b',') => i += 1,
            _ => return found,
        }
    }
}

fn skip_ws(b: &[u8], mut i: usize) -> usize {
    while matches!(b.get(i), Some(b' ' | b'\t' | b'\n' | b'\r')) {
        i += 1;
    }
    i
}

/// Returns the string token (with quotes) and the index after it.
fn scan_string(b: &[u8], start: usize) -> Option<(&[u8], usize)> {
    if b.get(start) != Some(&b'"') {
        return None;
    }
    let mut i = start + 1;
    loop {
        match *b.get(i)? {
            b'\\' => i += 2,
            b'"' => return Some((&b[start..=i], i + 1)),
            _ => i += 1,
        }
    }
}

/// Returns the index just after one JSON value starting at `start`.
fn scan_value(b: &[u8], start: usize) -> Option<usize> {
    match *b.get(start)? {
        b'"' => scan_string(b, start).map(|(_, end)| end),
        b'{' | b'[' => {
            let mut depth = 0usize;
            let mut i = start;
            loop {
                match *b.get(i)? {
                    b'"' => {
                        i = scan_string(b, i)?.1;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return Some(i + 1);
                        }
                    }
                    _ => {}
                }
                i += 1;
            }
        }
        _ => {
            let mut i = start;
            while let Some(c) = b.get(i) {
                if matches!(c, b',' | b'}' | b' ' | b'\t' | b'\n' | b'\r') {
                    break;
                }
                i += 1;
            }
            (i > start).then_some(i)
        }
    }
}

/// A JSON-RPC error response, as one line (no terminator).
pub fn error_response(
    id: &RawId,
    code: i64,
    message: &str,
    data: Option<serde_json::Value>,
) -> Vec<u8> {
    let mut error = serde_json::Map::new();
    error.insert("code".into(), code.into());
    error.insert("message".into(), message.into());
    if let Some(data) = data {
        error.insert("data".into(), data);
    }
    let error = serde_json::Value::Object(error);
    format!(r#"{{"jsonrpc":"2.0","id":{id},"error":{error}}}"#).into_bytes()
}

/// A request built by the bridge itself. `params` is JSON text.
pub fn request(id: u64, method: &str, params: &str) -> Vec<u8> {
    let method = serde_json::Value::from(method);
    format!(r#"{{"jsonrpc":"2.0","id":{id},"method":{method},"params":{params}}}"#).into_bytes()
}

/// A notification built by the bridge itself. `params` is JSON text.
pub fn notification(method: &str, params: &str) -> Vec<u8> {
    let method = serde_json::Value::from(method);
    format!(r#"{{"jsonrpc":"2.0","method":{method},"params":{params}}}"#).into_bytes()
}

/// A success response built by the bridge itself. `result` is JSON text.
pub fn result_response(id: &RawId, result: &str) -> Vec<u8> {
    format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{result}}}"#).into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Frame {
        Frame::parse(s.as_bytes().to_vec()).unwrap()
    }

    #[test]
    fn classifies_the_four_shapes() {
        assert!(matches!(
            parse(r#"{"jsonrpc":"2.0","id":1,"method":"a"}"#).kind,
            FrameKind::Request { .. }
        ));
        assert!(matches!(
            parse(r#"{"jsonrpc":"2.0","method":"a"}"#).kind,
            FrameKind::Notification { .. }
        ));
        assert!(matches!(
            parse(r#"{"jsonrpc":"2.0","id":"x","result":null}"#).kind,
            FrameKind::Response {
                is_error: false,
                ..
            }
        ));
        assert!(matches!(
            parse(r#"{"jsonrpc":"2.0","id":2,"error":{"code":1,"message":"m"}}"#).kind,
            FrameKind::Response { is_error: true, .. }
        ));
    }

    #[test]
    fn rejects_what_cannot_be_routed() {
        let deep_id = format!(
            r#"{{"jsonrpc":"2.0","id":{}1{},"method":"x"}}"#,
            "[".repeat(100_000),
            "]".repeat(100_000)
        );
        let deep_params = format!(
            r#"{{"jsonrpc":"2.0","id":1,"method":"x","params":{}"[[[ in a string"{}}}"#,
            "[".repeat(MAX_DEPTH),
            "]".repeat(MAX_DEPTH)
        );
        let long_id = format!(
            r#"{{"jsonrpc":"2.0","id":"{}","method":"x"}}"#,
            "a".repeat(300)
        );
        for bad in [
            r#"{"jsonrpc":"2.0"}"#,
            r#"{"jsonrpc":"2.0","id":1,"result":1,"error":{}}"#,
            r#"{"jsonrpc":"2.0","id":1,"id":2,"method":"x"}"#,
            r#""str""#,
            r#"7"#,
            // jsonrpc wrong.
            r#"{"jsonrpc":null,"id":1,"method":"x"}"#,
            r#"{"jsonrpc":"1.0","id":1,"method":"x"}"#,
            r#"{"jsonrpc":2.0,"id":1,"method":"x"}"#,
            // Ids that are neither strings nor integers.
            r#"{"jsonrpc":"2.0","id":{"a":1},"method":"x"}"#,
            r#"{"jsonrpc":"2.0","id":[1],"method":"x"}"#,
            r#"{"jsonrpc":"2.0","id":true,"method":"x"}"#,
            r#"{"jsonrpc":"2.0","id":1.5,"method":"x"}"#,
            r#"{"jsonrpc":"2.0","id":1e3,"result":1}"#,
            // Null only in an error answer.
            r#"{"jsonrpc":"2.0","id":null,"method":"x"}"#,
            r#"{"jsonrpc":"2.0","id":null,"result":1}"#,
            &deep_id,
            &deep_params,
            &long_id,
        ] {
            let (_, err) = Frame::parse(bad.as_bytes().to_vec()).unwrap_err();
            assert!(matches!(err, FrameError::Invalid(_)), "{bad:.80}: {err}");
        }
        for batch in [r#"[1,2]"#, r#" [201,"_test/echo",{"x":1}]"#, "[]"] {
            let (_, err) = Frame::parse(batch.as_bytes().to_vec()).unwrap_err();
            assert!(matches!(err, FrameError::Batch), "{batch}: {err}");
        }
        let (_, err) = Frame::parse(b"{\"id\":1,".to_vec()).unwrap_err();
        assert!(matches!(err, FrameError::Parse(_)));
        // What is allowed: the deepest nesting, a null id in an error, a
        // negative id, brackets inside strings.
        let ok_depth = format!(
            r#"{{"jsonrpc":"2.0","id":-4,"method":"x","params":{}"]]]}}}}"{}}}"#,
            "[".repeat(MAX_DEPTH - 1),
            "]".repeat(MAX_DEPTH - 1)
        );
        for good in [
            ok_depth.as_str(),
            r#"{"id":0,"method":"initialize","params":{}}"#,
            r#"{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"m"}}"#,
            r#"{"jsonrpc":"2.0","id":"a\"b","method":"x","params":{"s":"\\"}}"#,
        ] {
            assert!(Frame::parse(good.as_bytes().to_vec()).is_ok(), "{good:.80}");
        }
    }

    #[test]
    fn a_frame_without_a_version_is_given_one_and_nothing_else_moves() {
        let f = parse(r#" {"id":"a","method":"x","params":{"k":[1, 2]},"_z":0}"#);
        assert_eq!(
            f.bytes,
            br#" {"jsonrpc":"2.0","id":"a","method":"x","params":{"k":[1, 2]},"_z":0}"#
        );
        assert_eq!(f.params_raw(), Some(r#"{"k":[1, 2]}"#));
        assert_eq!(
            f.with_id("7"),
            br#" {"jsonrpc":"2.0","id":7,"method":"x","params":{"k":[1, 2]},"_z":0}"#
        );
        // Invalid for another reason: refused, its bytes given back as sent.
        let (bytes, err) = Frame::parse(br#"{"id":1.5,"method":"x"}"#.to_vec()).unwrap_err();
        assert_eq!(bytes, br#"{"id":1.5,"method":"x"}"#);
        assert!(matches!(err, FrameError::Invalid(_)));
    }

    #[test]
    fn id_splice_keeps_every_other_byte() {
        let src = r#"{ "jsonrpc" : "2.0", "params":{"_meta":{"id":9},"z":"\u00e9"} ,"id" : "abc" , "method":"_x/y"}"#;
        let f = parse(src);
        assert_eq!(
            f.kind,
            FrameKind::Request {
                id: RawId("\"abc\"".into()),
                method: "_x/y".into()
            }
        );
        let out = String::from_utf8(f.with_id("42")).unwrap();
        assert_eq!(out, src.replace(r#""id" : "abc""#, r#""id" : 42"#));
        assert_eq!(
            f.params_raw().unwrap(),
            r#"{"_meta":{"id":9},"z":"\u00e9"}"#
        );
    }

    #[test]
    fn session_id_is_read_from_params() {
        let f =
            parse(r#"{"jsonrpc":"2.0","method":"session/cancel","params":{"sessionId":"s-1"}}"#);
        assert_eq!(f.session_id().as_deref(), Some("s-1"));
        let f = parse(r#"{"jsonrpc":"2.0","method":"x","params":[1]}"#);
        assert_eq!(f.session_id(), None);
    }

    #[test]
    fn recovers_top_level_ids_only() {
        assert_eq!(
            recover_id(br#"{"jsonrpc":"2.0","id":7,"method":"x","params":{"#),
            Some(RawId("7".into()))
        );
        assert_eq!(
            recover_id(br#"{"params":{"id":5},"id":"q\"r","#),
            Some(RawId(r#""q\"r""#.into()))
        );
        assert_eq!(recover_id(br#"{"params":{"id":5}"#), None);
        assert_eq!(recover_id(br#"{"method":"x""#), None);
        assert_eq!(recover_id(b"garbage"), None);
        assert_eq!(recover_id(br#"{"id":{"nested":1}}"#), None);
        assert_eq!(recover_id(br#"{"id":1.5,"method":"x"}"#), None);
        let r = recover(br#"{"id":1.5,"method":"x"}"#);
        assert_eq!(r.reply_id, Some(RawId("1.5".into())));
        assert_eq!(
            recover(br#"{"id":null,"method":"x"}"#).reply_id,
            Some(RawId("null".into()))
        );
        // An id JSON-RPC does not allow: answered to null, as it says.
        for bad in [
            &br#"{"id":{"a":1},"method":"x"}"#[..],
            br#"{"id":[1],"method":"x"}"#,
            br#"{"id":true,"method":"x"}"#,
            br#"{"id":[[[[[[1"#,
        ] {
            assert_eq!(recover(bad).reply_id, Some(RawId("null".into())));
        }
        assert_eq!(recover(br#"{"method":"x"}"#).reply_id, None);
        assert_eq!(recover_id(br#"{"id":1,"method":"x","id":2,"#), None);
        let r = recover(br#"{"jsonrpc":"1.0","id":3,"result":{"#);
        assert_eq!(
            (r.id, r.method, r.answer),
            (Some(RawId("3".into())), false, true)
        );
        let r = recover(br#"{"id":"x","method":"y","params":["#);
        assert!(r.method && !r.answer && r.id.is_some());
    }

    #[test]
    fn builders_produce_parseable_frames() {
        let e = error_response(&RawId("\"a\"".into()), -32700, "bad \"frame\"", None);
        assert!(matches!(
            Frame::parse(e).unwrap().kind,
            FrameKind::Response { is_error: true, .. }
        ));
        let r = request(3, "session/load", r#"{"sessionId":"s"}"#);
        assert_eq!(
            parse(std::str::from_utf8(&r).unwrap())
                .session_id()
                .as_deref(),
            Some("s")
        );
        let n = notification("terminal/release", "{}");
        assert!(matches!(
            Frame::parse(n).unwrap().kind,
            FrameKind::Notification { .. }
        ));
    }
}
