//! The one place zcode-acp writes the user config: an agent's state
//! location the user allowed in the editor "for this agent, always", kept
//! under `sandbox.agentState.<agent>` so that the agent keeps it in every
//! project. The file round-trips whole (unknown keys and their order kept),
//! the write is atomic and never goes through a symlink, and a lock keeps
//! two bridges from losing each other's entries. The agent cannot write
//! the user config itself: it is outside everything the sandbox opens.

use std::path::{Path, PathBuf};

use serde_json::Value;

use super::atomic::{create_real_dir_path, plain_file, read_nofollow, write_atomic};
use super::managed::ManagedRoot;

/// Why an agent's state location could not be remembered.
#[derive(Debug, thiserror::Error)]
pub enum RememberError {
    #[error("there is no user config directory here")]
    NoConfigDir,
    #[error("{0} is a symlink or not a plain file, so zcode-acp does not rewrite it; add the entry by hand")]
    NotPlain(PathBuf),
    #[error("{path} cannot be read as the user config ({why}); fix it first")]
    Malformed { path: PathBuf, why: String },
    #[error("cannot read or write {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

fn io_at(path: &Path) -> impl FnOnce(std::io::Error) -> RememberError + '_ {
    move |source| RememberError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Adds `location` (written `~/...` when it is in `home`) to the state
/// locations of `agent` in the user config at `path`. May wait for the
/// lock: callers on the bridge's loop run it off the loop.
pub fn remember_agent_state(
    path: Option<&Path>,
    agent: &str,
    location: &Path,
    home: &Path,
    managed: &ManagedRoot,
) -> Result<(), RememberError> {
    let path = path.ok_or(RememberError::NoConfigDir)?;
    let locks = managed.locks_dir().map_err(io_at(&managed.path))?;
    let lock_path = locks.join("user-config.lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(io_at(&lock_path))?;
    let _lock = nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, e)| io_at(&lock_path)(e.into()))?;

    let mut value = match plain_file(path).map_err(io_at(path))? {
        None => Value::Object(Default::default()),
        Some(false) => return Err(RememberError::NotPlain(path.to_path_buf())),
        Some(true) => {
            let bytes = read_nofollow(path).map_err(io_at(path))?;
            // A file zcode-acp cannot read as the user config is never
            // rewritten: what it would write back could lose a setting.
            super::parse_user_config(&bytes).map_err(|e| RememberError::Malformed {
                path: path.to_path_buf(),
                why: e.to_string(),
            })?;
            serde_json::from_slice(&bytes).map_err(|e| RememberError::Malformed {
                path: path.to_path_buf(),
                why: e.to_string(),
            })?
        }
    };
    let entry = match location.strip_prefix(home) {
        Ok(rest) => format!("~/{}", rest.display()),
        Err(_) => location.display().to_string(),
    };
    let malformed = |why: &str| RememberError::Malformed {
        path: path.to_path_buf(),
        why: why.to_owned(),
    };
    let list = value
        .as_object_mut()
        .ok_or_else(|| malformed("not a JSON object"))?
        .entry("sandbox")
        .or_insert_with(|| Value::Object(Default::default()))
        .as_object_mut()
        .ok_or_else(|| malformed("`sandbox` is not an object"))?
        .entry("agentState")
        .or_insert_with(|| Value::Object(Default::default()))
        .as_object_mut()
        .ok_or_else(|| malformed("`sandbox.agentState` is not an object"))?
        .entry(agent)
        .or_insert_with(|| Value::Array(Vec::new()))
        .as_array_mut()
        .ok_or_else(|| malformed("an agent's `sandbox.agentState` entry is not a list"))?;
    if !list.iter().any(|e| e.as_str() == Some(&entry)) {
        list.push(Value::from(entry));
    }
    let mut bytes = serde_json::to_vec_pretty(&value).expect("a JSON value serializes");
    bytes.push(b'\n');
    // The config directory may be a dotfile manager's symlink: only a
    // missing one is made.
    if let Some(dir) = path.parent().filter(|d| !d.is_dir()) {
        create_real_dir_path(dir, 0o700).map_err(io_at(dir))?;
    }
    write_atomic(path, &bytes, 0o600).map_err(io_at(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_agents_state_is_added_and_everything_else_kept() {
        let t = tempfile::tempdir().unwrap();
        let home = std::fs::canonicalize(t.path()).unwrap();
        let managed = ManagedRoot::new(home.join(".zcode-acp"));
        let path = home.join(".config/zcode-acp/config.json");
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(
            &path,
            r#"{"backend": ["x"], "zzz": 1, "sandbox": {"statePaths": ["~/.a"]}}"#,
        )
        .unwrap();
        let at = home.join(".newagent");
        for _ in 0..2 {
            remember_agent_state(Some(&path), "newagent", &at, &home, &managed).unwrap();
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let user = crate::config::parse_user_config(text.as_bytes()).unwrap();
        assert_eq!(
            user.sandbox.agent_state["newagent"],
            vec![PathBuf::from("~/.newagent")],
            "added once: {text}"
        );
        assert_eq!(user.sandbox.state_paths, vec![PathBuf::from("~/.a")]);
        // Unknown keys stay, in their order.
        assert!(text.find("\"backend\"").unwrap() < text.find("\"zzz\"").unwrap());
        // No config yet: one is made.
        std::fs::remove_file(&path).unwrap();
        remember_agent_state(Some(&path), "newagent", &at, &home, &managed).unwrap();
        assert!(std::fs::read_to_string(&path)
            .unwrap()
            .contains("~/.newagent"));
    }

    #[test]
    fn a_config_it_cannot_read_or_a_symlink_is_left_alone() {
        let t = tempfile::tempdir().unwrap();
        let home = std::fs::canonicalize(t.path()).unwrap();
        let managed = ManagedRoot::new(home.join(".zcode-acp"));
        let path = home.join("config.json");
        std::fs::write(&path, "{ not json").unwrap();
        let at = home.join(".newagent");
        assert!(matches!(
            remember_agent_state(Some(&path), "a", &at, &home, &managed),
            Err(RememberError::Malformed { .. })
        ));
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "{ not json");
        let real = home.join("real.json");
        std::fs::write(&real, "{}").unwrap();
        std::fs::remove_file(&path).unwrap();
        std::os::unix::fs::symlink(&real, &path).unwrap();
        assert!(matches!(
            remember_agent_state(Some(&path), "a", &at, &home, &managed),
            Err(RememberError::NotPlain(_))
        ));
        assert_eq!(std::fs::read_to_string(&real).unwrap(), "{}");
    }
}
