//! The user config file and backend selection.
//!
//! `dirs::config_dir()/zcode-acp/config.json`. Issue-level settings (the
//! sandbox switch, extra state paths) join this file later; unknown keys are
//! ignored so an older bridge still reads a newer file.

pub mod atomic;
pub mod generation;
pub mod ledger;
pub mod managed;
pub mod project;

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
    fn the_command_line_wins() {
        let argv = resolve_backend(&["a".into(), "b".into()]).unwrap().unwrap();
        assert_eq!(argv, vec!["a", "b"]);
    }
}
