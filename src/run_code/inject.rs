//! The `run_code` server added to a session's `mcpServers` (a pure
//! builder; the bridge decides when). The editor's own entries are kept
//! byte for byte: the new entry is spliced in after them, never
//! re-serialized with them.

use std::path::Path;

use serde_json::{json, Value};

/// The name the server is offered under, unless the editor already sent
/// a server of that name.
pub const SERVER_NAME: &str = "zcode-run-code";

/// What the bridge needs to add the server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CodeExec {
    /// This binary, as an absolute path (the agent starts the server).
    pub exe: std::path::PathBuf,
    /// Who turned it on for every session (`--code-exec`, the user
    /// config); None: only projects whose approved sandbox.json says
    /// `codeExec: true`.
    pub everywhere: Option<String>,
}

/// `servers` (the JSON text of the editor's `mcpServers`, if it sent one)
/// with the `run_code` server for a session rooted at `cwd` appended.
/// `confined_by`: what confines the agent (and so the server it starts),
/// passed on so the server names it truly (it checks it, see
/// `confinement::inherited`). None when `servers` is not an array: that
/// request is passed on as the editor wrote it.
pub fn with_code_server(
    servers: Option<&str>,
    exe: &Path,
    cwd: &Path,
    confined_by: Option<&str>,
) -> Option<String> {
    let text = servers.unwrap_or("[]").trim();
    let parsed: Value = serde_json::from_str(text).ok()?;
    let list = parsed.as_array()?;
    // The editor may hand the agent this very server already (as one of
    // its own context servers): one is enough.
    let already = list.iter().any(|s| {
        let program = s.get("command").and_then(Value::as_str).unwrap_or("");
        let first = s.get("args").and_then(|a| a.get(0)).and_then(Value::as_str);
        (program == exe.to_string_lossy() || program.rsplit('/').next() == Some("zcode-acp"))
            && first == Some("mcp")
    });
    if already {
        return None;
    }
    let taken: Vec<&str> = list
        .iter()
        .filter_map(|s| s.get("name").and_then(Value::as_str))
        .collect();
    let name = free_name(&taken);
    let env = match confined_by {
        Some(what) => json!([{"name": super::confinement::CONFINED_ENV, "value": what}]),
        None => json!([]),
    };
    let entry = json!({
        "name": name,
        "command": exe,
        "args": ["mcp", "--workspace", cwd],
        "env": env,
    });
    let inner = text.strip_prefix('[')?.strip_suffix(']')?;
    Some(if inner.trim().is_empty() {
        format!("[{entry}]")
    } else {
        format!("[{inner},{entry}]")
    })
}

/// `SERVER_NAME`, or the first `SERVER_NAME-N` nobody took.
fn free_name(taken: &[&str]) -> String {
    if !taken.contains(&SERVER_NAME) {
        return SERVER_NAME.to_owned();
    }
    (2..)
        .map(|n| format!("{SERVER_NAME}-{n}"))
        .find(|n| !taken.contains(&n.as_str()))
        .expect("a free name")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_editors_servers_are_kept_byte_for_byte_and_ours_follows() {
        let editor = r#"[ {"name":"m","command":"c","args":[],"env":[],"future":1.50} ]"#;
        let out =
            with_code_server(Some(editor), Path::new("/bin/z"), Path::new("/w"), None).unwrap();
        assert!(
            out.starts_with(r#"[ {"name":"m","command":"c","args":[],"env":[],"future":1.50} ,"#),
            "{out}"
        );
        let v: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v[1]["name"], SERVER_NAME);
        assert_eq!(v[1]["command"], "/bin/z");
        assert_eq!(v[1]["args"], json!(["mcp", "--workspace", "/w"]));
        assert_eq!(v[1]["env"], json!([]));
    }

    #[test]
    fn a_server_the_editor_already_sends_is_not_added_twice() {
        let editor = r#"[{"name":"code","command":"/usr/bin/zcode-acp","args":["mcp","--workspace","/w"],"env":[]}]"#;
        assert_eq!(
            with_code_server(Some(editor), Path::new("/z"), Path::new("/w"), None),
            None
        );
    }

    #[test]
    fn a_name_clash_keeps_the_editors_server() {
        let editor = r#"[{"name":"zcode-run-code","command":"theirs","args":[],"env":[]},{"type":"http","name":"zcode-run-code-2","url":"u","headers":[]}]"#;
        let out = with_code_server(
            Some(editor),
            Path::new("/z"),
            Path::new("/w"),
            Some("linux namespaces+landlock"),
        )
        .unwrap();
        let v: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v.as_array().unwrap().len(), 3);
        assert_eq!(v[0]["command"], "theirs");
        assert_eq!(v[2]["name"], "zcode-run-code-3");
        assert_eq!(v[2]["env"][0]["value"], "linux namespaces+landlock");
    }

    #[test]
    fn none_or_an_empty_list_gets_ours_alone_and_a_non_list_is_left_alone() {
        for given in [None, Some("[]"), Some(" [ ] ")] {
            let out = with_code_server(given, Path::new("/z"), Path::new("/w"), None).unwrap();
            let v: Value = serde_json::from_str(&out).unwrap();
            assert_eq!(v.as_array().unwrap().len(), 1, "{given:?}");
        }
        assert_eq!(
            with_code_server(Some("{}"), Path::new("/z"), Path::new("/w"), None),
            None
        );
        assert_eq!(
            with_code_server(Some("null"), Path::new("/z"), Path::new("/w"), None),
            None
        );
    }
}
