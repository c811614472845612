//! Edits to one value inside a frame's JSON text that keep every other
//! byte as it came: unknown fields, key order, whitespace and escapes
//! survive, because nothing is re-serialized but the value being set.
//!
//! The text must already be valid JSON (every frame is parsed before it is
//! routed). A key that appears twice on the path is an error, not a guess:
//! the two peers could read different copies (the envelope refuses
//! duplicate keys for the same reason).

use std::ops::Range;

use serde::Deserialize;
use serde_json::value::RawValue;

/// Why an edit could not be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpliceError {
    #[error("`{0}` is missing or not an object")]
    NotAnObject(String),
    #[error("`{0}` is missing")]
    Missing(String),
    #[error("`{0}` appears more than once")]
    Duplicate(String),
    #[error("the text is not valid JSON at `{0}`")]
    Malformed(String),
}

/// One member of an object, as spans of the object's text.
struct Member {
    key: String,
    /// From the key's opening quote to the end of its value.
    entry: Range<usize>,
    value: Range<usize>,
}

fn skip_ws(b: &[u8], mut i: usize) -> usize {
    while i < b.len() && matches!(b[i], b' ' | b'\t' | b'\n' | b'\r') {
        i += 1;
    }
    i
}

/// The members of the object whose text is `obj` (spans relative to it),
/// or `None` when `obj` is not an object.
fn members(obj: &str) -> Option<Vec<Member>> {
    let b = obj.as_bytes();
    let mut i = skip_ws(b, 0);
    if b.get(i) != Some(&b'{') {
        return None;
    }
    i = skip_ws(b, i + 1);
    let mut out = Vec::new();
    if b.get(i) == Some(&b'}') {
        return Some(out);
    }
    loop {
        let key_start = i;
        if b.get(i) != Some(&b'"') {
            return None;
        }
        i += 1;
        while *b.get(i)? != b'"' {
            i += if b[i] == b'\\' { 2 } else { 1 };
        }
        let key_end = i + 1;
        let key: String = serde_json::from_str(&obj[key_start..key_end]).ok()?;
        i = skip_ws(b, key_end);
        if b.get(i) != Some(&b':') {
            return None;
        }
        i = skip_ws(b, i + 1);
        let mut de = serde_json::Deserializer::from_str(&obj[i..]);
        let raw = <&RawValue>::deserialize(&mut de).ok()?;
        // `raw` borrows from `obj`, so its address lies within it.
        let start = raw.get().as_ptr() as usize - obj.as_ptr() as usize;
        let end = start + raw.get().len();
        out.push(Member {
            key,
            entry: key_start..end,
            value: start..end,
        });
        i = skip_ws(b, end);
        match b.get(i)? {
            b',' => i = skip_ws(b, i + 1),
            b'}' => return Some(out),
            _ => return None,
        }
    }
}

/// The span of the object at `path` (the whole text for an empty path).
fn object_span(json: &str, path: &[&str]) -> Result<Range<usize>, SpliceError> {
    let mut span = 0..json.len();
    for (depth, key) in path.iter().enumerate() {
        let here = path[..=depth].join(".");
        let inner = &json[span.clone()];
        let members =
            members(inner).ok_or_else(|| SpliceError::NotAnObject(parent(path, depth)))?;
        let found = unique(&members, key, &here)?.ok_or(SpliceError::Missing(here))?;
        span = span.start + found.value.start..span.start + found.value.end;
    }
    Ok(span)
}

fn parent(path: &[&str], depth: usize) -> String {
    if depth == 0 {
        "(the frame)".into()
    } else {
        path[..depth].join(".")
    }
}

fn unique<'m>(
    members: &'m [Member],
    key: &str,
    here: &str,
) -> Result<Option<&'m Member>, SpliceError> {
    let mut matching = members.iter().filter(|m| m.key == key);
    let first = matching.next();
    if matching.next().is_some() {
        return Err(SpliceError::Duplicate(here.to_owned()));
    }
    Ok(first)
}

fn assemble(json: &str, cut: Range<usize>, insert: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(json.len() + insert.len());
    out.extend_from_slice(&json.as_bytes()[..cut.start]);
    out.extend_from_slice(insert.as_bytes());
    out.extend_from_slice(&json.as_bytes()[cut.end..]);
    out
}

fn text(json: &[u8]) -> Result<&str, SpliceError> {
    std::str::from_utf8(json).map_err(|_| SpliceError::Malformed("(the frame)".into()))
}

/// `json` with the value at `path` set to `value` (JSON text): replaced
/// where it exists, added as the object's last member where it does not.
pub fn set(json: &[u8], path: &[&str], value: &str) -> Result<Vec<u8>, SpliceError> {
    let json = text(json)?;
    let (last, parents) = path.split_last().expect("a path names at least one key");
    let obj = object_span(json, parents)?;
    let inner = &json[obj.clone()];
    let here = path.join(".");
    let members =
        members(inner).ok_or_else(|| SpliceError::NotAnObject(parent(path, parents.len())))?;
    if let Some(m) = unique(&members, last, &here)? {
        let at = obj.start + m.value.start..obj.start + m.value.end;
        return Ok(assemble(json, at, value));
    }
    // Added before the closing brace, after the last member if there is one.
    let key = serde_json::to_string(last).expect("a string serializes");
    let (at, insert) = match members.last() {
        Some(m) => (obj.start + m.value.end, format!(",{key}:{value}")),
        None => {
            let close = obj.start + inner.rfind('}').ok_or(SpliceError::Malformed(here))?;
            (close, format!("{key}:{value}"))
        }
    };
    Ok(assemble(json, at..at, &insert))
}

/// `json` without the member at `path`; `Missing` when it is not there.
pub fn remove(json: &[u8], path: &[&str]) -> Result<Vec<u8>, SpliceError> {
    let json = text(json)?;
    let (last, parents) = path.split_last().expect("a path names at least one key");
    let obj = object_span(json, parents)?;
    let here = path.join(".");
    let members = members(&json[obj.clone()])
        .ok_or_else(|| SpliceError::NotAnObject(parent(path, parents.len())))?;
    let Some(k) = members.iter().position(|m| m.key == *last) else {
        return Err(SpliceError::Missing(here));
    };
    unique(&members, last, &here)?;
    // The separating comma goes with it: the one after it, or, for the
    // last member, the one before.
    let cut = match (members.get(k + 1), k.checked_sub(1).map(|p| &members[p])) {
        (Some(next), _) => members[k].entry.start..next.entry.start,
        (None, Some(prev)) => prev.value.end..members[k].entry.end,
        (None, None) => members[k].entry.clone(),
    };
    Ok(assemble(
        json,
        obj.start + cut.start..obj.start + cut.end,
        "",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: Result<Vec<u8>, SpliceError>) -> String {
        String::from_utf8(v.unwrap()).unwrap()
    }

    const FRAME: &str = "{ \"params\" : {\"z\":[1, {\"k\":\"}\"}], \"path\" :\"/a\\\"b\",\"\\u0061\":1 } ,\"id\":3,\"jsonrpc\":\"2.0\"}";

    #[test]
    fn set_replaces_only_the_value() {
        let out = s(set(FRAME.as_bytes(), &["params", "path"], "\"/real\""));
        assert_eq!(out, FRAME.replace("\"/a\\\"b\"", "\"/real\""));
        let out = s(set(FRAME.as_bytes(), &["id"], "17"));
        assert_eq!(out, FRAME.replace("\"id\":3", "\"id\":17"));
        // An escaped key is the key it decodes to.
        let out = s(set(FRAME.as_bytes(), &["params", "a"], "2"));
        assert_eq!(out, FRAME.replace("\"\\u0061\":1", "\"\\u0061\":2"));
    }

    #[test]
    fn set_adds_a_missing_member_last() {
        let out = s(set(FRAME.as_bytes(), &["params", "env"], "[]"));
        assert_eq!(
            out,
            FRAME.replace("\"\\u0061\":1 }", "\"\\u0061\":1,\"env\":[] }")
        );
        let out = s(set(b"{\"params\": { } }", &["params", "env"], "[]"));
        assert_eq!(out, "{\"params\": { \"env\":[]} }");
    }

    #[test]
    fn remove_takes_the_member_and_one_comma() {
        let j = br#"{"c":{"a":1, "acp":true ,"b":2}}"#;
        assert_eq!(s(remove(j, &["c", "acp"])), r#"{"c":{"a":1, "b":2}}"#);
        let j = br#"{"c":{"a":1, "acp":true}}"#;
        assert_eq!(s(remove(j, &["c", "acp"])), r#"{"c":{"a":1}}"#);
        let j = br#"{"c":{ "acp":true }}"#;
        assert_eq!(s(remove(j, &["c", "acp"])), r#"{"c":{  }}"#);
        let j = br#"{"c":{"acp":true,"b":2}}"#;
        assert_eq!(s(remove(j, &["c", "acp"])), r#"{"c":{"b":2}}"#);
        for out in [
            remove(br#"{"c":{"acp":1}}"#, &["c", "acp"]).unwrap(),
            remove(br#"{"c":{"a":1,"acp":{"x":[1]},"b":2}}"#, &["c", "acp"]).unwrap(),
        ] {
            serde_json::from_slice::<serde_json::Value>(&out).unwrap();
        }
    }

    #[test]
    fn duplicates_and_wrong_shapes_are_errors() {
        let dup = br#"{"params":{"path":"/a","path":"/b"}}"#;
        assert_eq!(
            set(dup, &["params", "path"], "\"/c\""),
            Err(SpliceError::Duplicate("params.path".into()))
        );
        assert_eq!(
            remove(dup, &["params", "path"]),
            Err(SpliceError::Duplicate("params.path".into()))
        );
        assert_eq!(
            set(br#"{"params":[1]}"#, &["params", "path"], "1"),
            Err(SpliceError::NotAnObject("params".into()))
        );
        assert_eq!(
            set(br#"{"x":1}"#, &["params", "path"], "1"),
            Err(SpliceError::Missing("params".into()))
        );
        assert_eq!(
            remove(br#"{"params":{}}"#, &["params", "acp"]),
            Err(SpliceError::Missing("params.acp".into()))
        );
    }
}
