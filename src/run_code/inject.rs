//! The `run_code` server added to a session's `mcpServers` (a pure
//! builder; the bridge decides when). The editor's own entries are kept
//! byte for byte: the new entry is spliced in after them, never
//! re-serialized with them.

use std::path::{Path, PathBuf};

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
/// `more_args`: what follows `--workspace DIR` (`--servers FILE`, where
/// the editor's servers were written, see [`ServersFiles`]; `--editor
/// SOCKET`).
pub fn with_code_server(
    servers: Option<&str>,
    exe: &Path,
    cwd: &Path,
    confined_by: Option<&str>,
    more_args: &[String],
    more_env: &[(&str, &str)],
) -> Option<String> {
    let text = servers.unwrap_or("[]").trim();
    let parsed: Value = serde_json::from_str(text).ok()?;
    let list = parsed.as_array()?;
    // The editor may hand the agent this very server already (as one of
    // its own context servers): one is enough.
    if list.iter().any(|s| is_code_server(s, exe)) {
        return None;
    }
    let taken: Vec<&str> = list
        .iter()
        .filter_map(|s| s.get("name").and_then(Value::as_str))
        .collect();
    let name = free_name(&taken);
    let mut env: Vec<Value> = confined_by
        .map(|what| json!({"name": super::confinement::CONFINED_ENV, "value": what}))
        .into_iter()
        .collect();
    env.extend(more_env.iter().map(|(k, v)| json!({"name": k, "value": v})));
    let mut args = json!(["mcp", "--workspace", cwd]);
    if let Some(a) = args.as_array_mut() {
        a.extend(more_args.iter().map(|s| json!(s)));
    }
    let entry = json!({
        "name": name,
        "command": exe,
        "args": args,
        "env": env,
    });
    let inner = text.strip_prefix('[')?.strip_suffix(']')?;
    Some(if inner.trim().is_empty() {
        format!("[{entry}]")
    } else {
        format!("[{inner},{entry}]")
    })
}

/// Whether `entry` starts this very server (the editor may hand it to the
/// agent already, as one of its own context servers).
fn is_code_server(entry: &Value, exe: &Path) -> bool {
    let program = entry.get("command").and_then(Value::as_str).unwrap_or("");
    let first = entry
        .get("args")
        .and_then(|a| a.get(0))
        .and_then(Value::as_str);
    (program == exe.to_string_lossy() || program.rsplit('/').next() == Some("zcode-acp"))
        && first == Some("mcp")
}

/// The files that hand each session's MCP servers to its `run_code`
/// server: the definitions can hold secrets (tokens in `env` or
/// `headers`), so they go in a file only the user can read, never in argv
/// or the environment. They live in `~/.zcode-acp/run-code/<pid>-*/`
/// (readable inside the sandbox, where the agent starts the server; its
/// private /tmp would not do), one per distinct list, removed when the
/// bridge ends; a bridge that was killed leaves its directory to the next
/// one, which removes it.
pub struct ServersFiles {
    base: PathBuf,
    dir: Option<tempfile::TempDir>,
    written: std::collections::HashMap<String, PathBuf>,
}

const SERVERS_DIR_PREFIX: &str = "servers-";

impl ServersFiles {
    pub fn new(managed_root: &Path) -> ServersFiles {
        ServersFiles {
            base: managed_root.join("run-code"),
            dir: None,
            written: Default::default(),
        }
    }

    /// The file holding `servers` (the editor's list; this server's own
    /// entry left out, so a run cannot start a server that starts runs),
    /// written on first use. None when the list names no other server or
    /// is not a list.
    pub fn file_for(&mut self, servers: &str) -> std::io::Result<Option<PathBuf>> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let Ok(Value::Array(list)) = serde_json::from_str::<Value>(servers) else {
            return Ok(None);
        };
        let exe = std::env::current_exe().unwrap_or_default();
        let list: Vec<Value> = list
            .into_iter()
            .filter(|s| !is_code_server(s, &exe))
            .collect();
        if list.is_empty() {
            return Ok(None);
        }
        let text = Value::Array(list).to_string();
        if let Some(p) = self.written.get(&text) {
            return Ok(Some(p.clone()));
        }
        let dir = self.dir()?;
        let path = dir.join(format!("{}.json", self.written.len() + 1));
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)?;
        f.write_all(text.as_bytes())?;
        self.written.insert(text, path.clone());
        Ok(Some(path))
    }

    /// This bridge's directory (made on first use): the servers files and
    /// the editor's sockets for run_code (see `bridge::code_tools`).
    pub fn dir(&mut self) -> std::io::Result<PathBuf> {
        use std::os::unix::fs::DirBuilderExt;
        if self.dir.is_none() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&self.base)?;
            sweep_stale(&self.base);
            // Its real path: sockets are listed (and exempted from the
            // sandbox's covering) by the path they were bound at.
            let base = std::fs::canonicalize(&self.base)?;
            self.dir = Some(
                tempfile::Builder::new()
                    .prefix(&format!("{SERVERS_DIR_PREFIX}{}-", std::process::id()))
                    .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o700))
                    .tempdir_in(&base)?,
            );
        }
        Ok(self.dir.as_ref().expect("made above").path().to_path_buf())
    }
}

/// Removes the directories of bridges that are gone.
fn sweep_stale(base: &Path) {
    let Ok(entries) = std::fs::read_dir(base) else {
        return;
    };
    use super::stage::{owner_pid, process_gone};
    for e in entries.flatten() {
        let Some(pid) = owner_pid(&e.file_name(), SERVERS_DIR_PREFIX) else {
            continue;
        };
        if process_gone(pid) && e.file_type().is_ok_and(|t| t.is_dir()) {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
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
    fn the_servers_file_is_the_users_alone_written_once_per_list_and_never_holds_ours() {
        use std::os::unix::fs::PermissionsExt;
        let home = tempfile::tempdir().unwrap();
        let mut files = ServersFiles::new(home.path());
        let list = r#"[{"name":"fs","command":"x","args":[],"env":[{"name":"TOKEN","value":"s3cret"}]},
                       {"name":"zcode-run-code","command":"/usr/bin/zcode-acp","args":["mcp"],"env":[]}]"#;
        let path = files.file_for(list).unwrap().unwrap();
        assert_eq!(files.file_for(list).unwrap().unwrap(), path);
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        let parent = std::fs::metadata(path.parent().unwrap()).unwrap();
        assert_eq!(parent.permissions().mode() & 0o777, 0o700);
        let written: Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(written.as_array().unwrap().len(), 1, "{written}");
        assert_eq!(written[0]["env"][0]["value"], "s3cret");
        assert_eq!(files.file_for("[]").unwrap(), None);
        let dir = path.parent().unwrap().to_owned();
        drop(files);
        assert!(!dir.exists(), "removed with the bridge");
    }

    #[test]
    fn the_editors_servers_are_kept_byte_for_byte_and_ours_follows() {
        let editor = r#"[ {"name":"m","command":"c","args":[],"env":[],"future":1.50} ]"#;
        let out = with_code_server(
            Some(editor),
            Path::new("/bin/z"),
            Path::new("/w"),
            None,
            &[],
            &[],
        )
        .unwrap();
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
            with_code_server(
                Some(editor),
                Path::new("/z"),
                Path::new("/w"),
                None,
                &[],
                &[]
            ),
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
            &["--servers".to_owned(), "/m/servers.json".to_owned()],
            &[],
        )
        .unwrap();
        let v: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v.as_array().unwrap().len(), 3);
        assert_eq!(v[0]["command"], "theirs");
        assert_eq!(v[2]["name"], "zcode-run-code-3");
        assert_eq!(v[2]["env"][0]["value"], "linux namespaces+landlock");
        assert_eq!(
            v[2]["args"],
            json!(["mcp", "--workspace", "/w", "--servers", "/m/servers.json"])
        );
    }

    #[test]
    fn none_or_an_empty_list_gets_ours_alone_and_a_non_list_is_left_alone() {
        for given in [None, Some("[]"), Some(" [ ] ")] {
            let out =
                with_code_server(given, Path::new("/z"), Path::new("/w"), None, &[], &[]).unwrap();
            let v: Value = serde_json::from_str(&out).unwrap();
            assert_eq!(v.as_array().unwrap().len(), 1, "{given:?}");
        }
        assert_eq!(
            with_code_server(Some("{}"), Path::new("/z"), Path::new("/w"), None, &[], &[]),
            None
        );
        assert_eq!(
            with_code_server(
                Some("null"),
                Path::new("/z"),
                Path::new("/w"),
                None,
                &[],
                &[]
            ),
            None
        );
    }
}
