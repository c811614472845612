//! The user config file and backend selection.
//!
//! `dirs::config_dir()/zcode-acp/config.json`. Issue-level settings (the
//! sandbox switch, extra state paths) join this file later; unknown keys are
//! ignored so an older bridge still reads a newer file.

pub mod atomic;
pub mod generation;
pub mod keys;
pub mod ledger;
pub mod managed;
pub mod network;
pub mod project;
pub mod remember;

use std::path::PathBuf;

use serde::Deserialize;

pub const BACKEND_ENV: &str = "ZCODE_ACP_BACKEND";
pub const SANDBOX_ENV: &str = "ZCODE_ACP_SANDBOX";

#[derive(Debug, Default, Deserialize)]
pub struct UserConfig {
    /// The backend command line, as a list (`["codex-acp"]`) or a single
    /// string split on whitespace (`"gemini --acp"`).
    #[serde(default)]
    pub backend: Option<BackendSpec>,
    #[serde(default)]
    pub sandbox: SandboxSettings,
    /// Offer the `run_code` tool to every session (`--code-exec`).
    #[serde(default, rename = "codeExec")]
    pub code_exec: bool,
    /// How `run_code` runs code: plain data here, read by `run_code`
    /// (`RunCodeSettings::from_user_config`), which knows its keys.
    #[serde(default, rename = "runCode")]
    pub run_code: Option<serde_json::Value>,
    /// Which destinations the sandbox may reach (`policy::network`), read
    /// when a sandbox is armed.
    #[serde(default)]
    pub network: Option<serde_json::Value>,
    /// What in the file zcode-acp does not know (a misspelled key), in
    /// words for the log and the editor's notice.
    #[serde(skip)]
    pub unknown_keys: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxSettings {
    /// The global switch: arm the sandbox for every workspace.
    #[serde(default)]
    pub enabled: bool,
    /// State directories of backends the built-in profiles do not know
    /// (`~/...` allowed). Never the whole home directory.
    #[serde(default)]
    pub state_paths: Vec<PathBuf>,
    /// Which backend profile's state is writable (`claude`, `codex`,
    /// `gemini`, `zcode` or `none`), instead of the guess from the command.
    #[serde(default)]
    pub backend_profile: Option<String>,
    /// State directories of agents no profile knows, by the agent's name
    /// (read from its launch chain), as the user allowed them in the
    /// editor ("for this agent, always"; see `remember`).
    #[serde(default)]
    pub agent_state: std::collections::BTreeMap<String, Vec<PathBuf>>,
}

/// The environment variable that chooses the backend profile (over the
/// user config; `--backend-profile` wins over both).
pub const BACKEND_PROFILE_ENV: &str = "ZCODE_ACP_BACKEND_PROFILE";

/// Whether the user asked for the sandbox globally: `ZCODE_ACP_SANDBOX=1`
/// (or `true`/`yes`) or `sandbox.enabled` in the user config.
pub fn sandbox_requested_globally(user: &UserConfig) -> Option<String> {
    if let Ok(v) = std::env::var(SANDBOX_ENV) {
        if matches!(
            v.trim().to_ascii_lowercase().as_str(),
            "1" | "true" | "yes" | "on"
        ) {
            return Some(format!("{SANDBOX_ENV}={v}"));
        }
    }
    user.sandbox
        .enabled
        .then(|| "\"sandbox\": {\"enabled\": true} in the user config".to_owned())
}

/// The backend command as the user wrote it.
#[derive(Debug)]
pub enum BackendSpec {
    Argv(Vec<String>),
    Line(String),
}

/// Read by hand, so a wrong value is described in the user's terms (what
/// was found, what is expected), never by a Rust type's name.
impl<'de> Deserialize<'de> for BackendSpec {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Spec;
        impl<'de> serde::de::Visitor<'de> for Spec {
            type Value = BackendSpec;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(r#"a command, as a list of strings (["codex-acp"]) or one string ("gemini --acp")"#)
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<BackendSpec, E> {
                Ok(BackendSpec::Line(v.to_owned()))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<BackendSpec, A::Error> {
                let mut argv = Vec::new();
                while let Some(word) = seq.next_element::<String>()? {
                    argv.push(word);
                }
                Ok(BackendSpec::Argv(argv))
            }
        }
        d.deserialize_any(Spec)
    }
}

impl BackendSpec {
    pub fn argv(&self) -> Vec<String> {
        match self {
            BackendSpec::Argv(v) => v.clone(),
            BackendSpec::Line(s) => split_line(s),
        }
    }
}

fn split_line(s: &str) -> Vec<String> {
    s.split_whitespace().map(str::to_owned).collect()
}

pub fn user_config_path() -> Option<PathBuf> {
    dirs::config_dir().map(|d| d.join("zcode-acp").join("config.json"))
}

/// The user config file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum UserConfigError {
    #[error("the user config {path} is not valid at line {line}, column {column}: {what}; fix it (docs/command-line.md in zcode-acp's source says what it holds) or remove it")]
    Invalid {
        path: PathBuf,
        line: usize,
        column: usize,
        what: String,
    },
    #[error("cannot read the user config {path}: {source}")]
    Unreadable {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Reads the user config. A missing file is an empty config; a broken one
/// is an error that names the file, the place and what is expected there.
pub fn load_user_config() -> Result<UserConfig, UserConfigError> {
    let Some(path) = user_config_path() else {
        return Ok(UserConfig::default());
    };
    match std::fs::read(&path) {
        Ok(bytes) => {
            let mut config = parse_user_config(&bytes).map_err(|e| UserConfigError::Invalid {
                line: e.line(),
                column: e.column(),
                what: without_position(&e),
                path: path.clone(),
            })?;
            config.unknown_keys = unknown_keys_note(&path, &bytes);
            if let Some(note) = &config.unknown_keys {
                tracing::warn!("{note}");
            }
            Ok(config)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(UserConfig::default()),
        Err(source) => Err(UserConfigError::Unreadable { path, source }),
    }
}

pub fn parse_user_config(bytes: &[u8]) -> Result<UserConfig, serde_json::Error> {
    serde_json::from_slice(bytes)
}

const SANDBOX_KEYS: &[&str] = &["enabled", "statePaths", "backendProfile", "agentState"];
const TOP_KEYS: &[&str] = &["backend", "sandbox", "codeExec", "runCode", "network"];

/// The user config's unknown keys in words: every one in `sandbox`, and
/// those at the top that look like a misspelled known key (others may be a
/// newer version's).
fn unknown_keys_note(path: &std::path::Path, bytes: &[u8]) -> Option<String> {
    let top: Vec<String> = match serde_json::from_slice(bytes) {
        Ok(serde_json::Value::Object(top)) => top
            .keys()
            .filter(|k| !TOP_KEYS.contains(&k.as_str()))
            .filter(|k| keys::probably_meant(k, TOP_KEYS).is_some())
            .cloned()
            .collect(),
        _ => Vec::new(),
    };
    let notes: Vec<String> = [
        keys::unknown_keys_note(path, "", &top, TOP_KEYS),
        keys::unknown_keys_note(
            path,
            "sandbox.",
            &unknown_keys(bytes, "sandbox", SANDBOX_KEYS),
            SANDBOX_KEYS,
        ),
    ]
    .into_iter()
    .flatten()
    .collect();
    (!notes.is_empty()).then(|| notes.join("; "))
}

/// Keys of the `section` settings no setting has: a misspelled `enable`
/// would otherwise leave the sandbox off without a word. (Unknown keys
/// elsewhere are a newer version's, and are left alone.)
pub fn unknown_keys(bytes: &[u8], section: &str, known: &[&str]) -> Vec<String> {
    let Ok(serde_json::Value::Object(top)) = serde_json::from_slice(bytes) else {
        return Vec::new();
    };
    match top.get(section) {
        Some(serde_json::Value::Object(settings)) => settings
            .keys()
            .filter(|k| !known.contains(&k.as_str()))
            .cloned()
            .collect(),
        _ => Vec::new(),
    }
}

/// serde_json's message without its own " at line L column C", saying
/// plainly when the text is not JSON at all.
fn without_position(e: &serde_json::Error) -> String {
    let text = e.to_string();
    let text = match text.rfind(" at line ") {
        Some(i) => text[..i].to_owned(),
        None => text,
    };
    match e.classify() {
        serde_json::error::Category::Data => text,
        _ => format!("this is not valid JSON ({text})"),
    }
}

/// The backend command: the command line first, then `ZCODE_ACP_BACKEND`,
/// then the user config.
pub fn resolve_backend(cli: &[String]) -> Result<Option<Vec<String>>, UserConfigError> {
    if !cli.is_empty() {
        return Ok(Some(cli.to_vec()));
    }
    if let Ok(line) = std::env::var(BACKEND_ENV) {
        let argv = split_line(&line);
        if !argv.is_empty() {
            return Ok(Some(argv));
        }
    }
    Ok(load_user_config()?
        .backend
        .map(|b| b.argv())
        .filter(|v| !v.is_empty()))
}

#[cfg(test)]
mod tests {
    /// config returns plain values and policy resolves them: config never
    /// reaches into policy (they imported each other once, and a change to
    /// one rippled through the other).
    #[test]
    fn config_does_not_depend_on_policy() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/config");
        // Spelled apart, so this test's own text does not match.
        let (a, b) = (
            concat!("crate", "::policy"),
            concat!("super::super", "::policy"),
        );
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let text = std::fs::read_to_string(&path).unwrap();
            assert!(
                !text.contains(a) && !text.contains(b),
                "{} uses policy",
                path.display()
            );
        }
    }

    use super::*;

    #[test]
    fn backend_spec_accepts_list_or_line() {
        let c: UserConfig =
            serde_json::from_str(r#"{"backend":"gemini --acp","future":1}"#).unwrap();
        assert_eq!(c.backend.unwrap().argv(), vec!["gemini", "--acp"]);
        let c: UserConfig =
            serde_json::from_str(r#"{"backend":["codex-acp","-c","x y"]}"#).unwrap();
        assert_eq!(c.backend.unwrap().argv(), vec!["codex-acp", "-c", "x y"]);
    }

    #[test]
    fn a_wrong_value_is_described_in_the_users_terms() {
        for (text, expected) in [
            (
                r#"{"backend": 5}"#,
                "expected a command, as a list of strings",
            ),
            (r#"{"backend": ["codex-acp", 1]}"#, "expected a string"),
            (r#"{"sandbox": {"enabled": "yes"}}"#, "expected a boolean"),
            ("{\n  \"backend\": \"x\",\n}", "trailing comma"),
        ] {
            let e = parse_user_config(text.as_bytes()).unwrap_err();
            let what = without_position(&e);
            assert!(what.contains(expected), "{text}: {what}");
            assert!(
                !what.contains("BackendSpec") && !what.contains("enum"),
                "{what}"
            );
            assert!(e.line() >= 1);
        }
    }

    #[test]
    fn a_misspelled_sandbox_setting_is_named() {
        assert_eq!(
            unknown_keys(
                br#"{"sandbox": {"enable": true, "enabled": false}, "future": 1}"#,
                "sandbox",
                SANDBOX_KEYS
            ),
            ["enable"]
        );
        assert!(unknown_keys(
            br#"{"sandbox": {"enabled": true}}"#,
            "sandbox",
            SANDBOX_KEYS
        )
        .is_empty());
    }

    #[test]
    fn the_user_configs_misspellings_are_said_with_what_they_meant() {
        let path = std::path::Path::new("/h/.config/zcode-acp/config.json");
        let note = unknown_keys_note(
            path,
            br#"{"sandbox": {"enable": true}, "codeexec": true, "future": 1}"#,
        )
        .unwrap();
        assert!(
            note.contains("`sandbox.enable` (did you mean `sandbox.enabled`?)"),
            "{note}"
        );
        assert!(
            note.contains("`codeexec` (did you mean `codeExec`?)"),
            "{note}"
        );
        // A key nothing resembles at the top may be a newer version's.
        assert!(!note.contains("future"), "{note}");
        assert!(unknown_keys_note(path, br#"{"sandbox": {"enabled": true}}"#).is_none());
    }

    #[test]
    fn the_command_line_wins() {
        let argv = resolve_backend(&["a".into(), "b".into()]).unwrap().unwrap();
        assert_eq!(argv, vec!["a", "b"]);
    }
}
