//! The shell agent's transcripts on disk, so a session can be loaded or
//! resumed by a later process (across backend restarts).

use std::io::Write;
use std::path::{Path, PathBuf};

/// The agent's state directory: `$ZCODE_SHELL_AGENT_HOME`, else
/// `~/.zcode-shell-agent` (inside the `~/.zcode*` state the sandbox keeps
/// writable for zcode backends, and outside the bridge's own managed root).
pub fn state_dir() -> anyhow::Result<PathBuf> {
    if let Some(dir) = std::env::var_os("ZCODE_SHELL_AGENT_HOME").filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(dir));
    }
    let home = dirs::home_dir()
        .ok_or_else(|| anyhow::anyhow!("no home directory; set ZCODE_SHELL_AGENT_HOME"))?;
    Ok(home.join(".zcode-shell-agent"))
}

/// Session ids become directory names: only a safe alphabet is accepted.
pub fn valid_session_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 128
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

pub struct Store {
    root: PathBuf,
}

impl Store {
    pub fn new(root: PathBuf) -> Store {
        Store { root }
    }

    fn dir(&self, id: &str) -> PathBuf {
        self.root.join("sessions").join(id)
    }

    pub fn create(&self, id: &str, cwd: &Path) -> std::io::Result<()> {
        let dir = self.dir(id);
        std::fs::create_dir_all(&dir)?;
        let meta = serde_json::json!({ "cwd": cwd });
        std::fs::write(dir.join("meta.json"), meta.to_string())
    }

    pub fn exists(&self, id: &str) -> bool {
        valid_session_id(id) && self.dir(id).join("meta.json").is_file()
    }

    /// Appends one `session/update` payload to the transcript.
    pub fn append(&self, id: &str, update: &serde_json::Value) -> std::io::Result<()> {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir(id).join("transcript.jsonl"))?;
        let mut line = update.to_string();
        line.push('\n');
        f.write_all(line.as_bytes())
    }

    /// The transcript, oldest first. Unreadable lines are skipped.
    pub fn transcript(&self, id: &str) -> Vec<serde_json::Value> {
        std::fs::read_to_string(self.dir(id).join("transcript.jsonl"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transcripts_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::new(dir.path().to_path_buf());
        assert!(!store.exists("s1"));
        store.create("s1", Path::new("/w")).unwrap();
        assert!(store.exists("s1"));
        store.append("s1", &serde_json::json!({"n": 1})).unwrap();
        store.append("s1", &serde_json::json!({"n": 2})).unwrap();
        assert_eq!(
            store.transcript("s1"),
            vec![serde_json::json!({"n": 1}), serde_json::json!({"n": 2})]
        );
    }

    #[test]
    fn ids_cannot_escape_the_store() {
        assert!(!valid_session_id("../x"));
        assert!(!valid_session_id(""));
        assert!(valid_session_id("sa-0123abcd"));
    }
}
