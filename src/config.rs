//! The user config file and backend selection.
//!
//! `dirs::config_dir()/zcode-acp/config.json`. Issue-level settings (the
//! sandbox switch, extra state paths) join this file later; unknown keys are
//! ignored so an older bridge still reads a newer file.

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
}

#[derive(Debug, Default, Deserialize)]
pub struct SandboxSettings {
    /// The global switch: arm the sandbox for every workspace.
    #[serde(default)]
    pub enabled: bool,
}

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

/// The project's sandbox config file inside a workspace root.
pub fn project_config_path(root: &std::path::Path) -> PathBuf {
    root.join(".zcode").join("acp").join("sandbox.json")
}

/// Whether a project turns the sandbox on. A file that cannot be read as a
/// JSON object with a boolean `enabled` counts as on: a half-saved edit of
/// a user who opted in must not silently disarm.
pub fn project_requests_sandbox(root: &std::path::Path) -> Option<PathBuf> {
    let path = project_config_path(root);
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(_) => return Some(path),
    };
    let enabled = match serde_json::from_slice::<serde_json::Value>(&bytes) {
        Ok(serde_json::Value::Object(map)) => match map.get("enabled") {
            None => false,
            Some(serde_json::Value::Bool(b)) => *b,
            Some(_) => true,
        },
        _ => true,
    };
    enabled.then_some(path)
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum BackendSpec {
    Argv(Vec<String>),
    Line(String),
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

/// Reads the user config. A missing file is an empty config; a broken one
/// is an error that names the file, so the user can fix it.
pub fn load_user_config() -> anyhow::Result<UserConfig> {
    let Some(path) = user_config_path() else {
        return Ok(UserConfig::default());
    };
    match std::fs::read(&path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map_err(|e| anyhow::anyhow!("{} is not valid: {e}; fix or remove it", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(UserConfig::default()),
        Err(e) => Err(anyhow::anyhow!("cannot read {}: {e}", path.display())),
    }
}

/// The backend command: the command line first, then `ZCODE_ACP_BACKEND`,
/// then the user config.
pub fn resolve_backend(cli: &[String]) -> anyhow::Result<Option<Vec<String>>> {
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
    fn a_project_switch_that_cannot_be_read_counts_as_on() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        assert_eq!(project_requests_sandbox(root), None);
        let path = project_config_path(root);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        for (text, on) in [
            (r#"{"enabled": false}"#, false),
            (r#"{"allow": []}"#, false),
            (r#"{"enabled": true}"#, true),
            (r#"{"enabled": "no"}"#, true),
            (r#"{"enabled": fal"#, true),
            ("[]", true),
        ] {
            std::fs::write(&path, text).unwrap();
            assert_eq!(project_requests_sandbox(root).is_some(), on, "{text}");
        }
    }

    #[test]
    fn the_command_line_wins() {
        let argv = resolve_backend(&["a".into(), "b".into()]).unwrap().unwrap();
        assert_eq!(argv, vec!["a", "b"]);
    }
}
