//! The approval ledger: the last state of each project's sandbox.json that
//! the user approved (through the allow flow, `zcode-acp allow/deny`, or a
//! confirmation of a hand edit). Kept under the managed root, where no
//! generation can write, because sandbox.json itself can be forged where
//! its island cannot be enforced (a closed project, a Landlock-only Linux).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::atomic::{read_nofollow, write_atomic};
use super::managed::{project_key, ManagedRoot};

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Approved {
    pub root: PathBuf,
    /// The last approved value of `enabled` (None: never recorded).
    #[serde(default)]
    pub enabled: Option<bool>,
    #[serde(default)]
    pub strict_git: Option<bool>,
    /// Approved `allow` entries, exactly as written in sandbox.json.
    #[serde(default)]
    pub allow: Vec<String>,
    /// The last approved value of `codeExec` (None: never recorded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code_exec: Option<bool>,
    /// The approved `network` table, as read (None: none approved).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<crate::config::network::NetworkTable>,
}

pub struct Ledger {
    managed: ManagedRoot,
}

impl Ledger {
    pub fn new(managed: ManagedRoot) -> Ledger {
        Ledger { managed }
    }

    fn file(&self, root: &Path) -> std::io::Result<PathBuf> {
        Ok(self
            .managed
            .ledger_dir()?
            .join(format!("{}.json", project_key(root))))
    }

    /// The approved state of `root`; empty if none was recorded (or the
    /// record is unreadable, or belongs to another root).
    pub fn load(&self, root: &Path) -> Approved {
        let empty = Approved {
            root: root.to_path_buf(),
            ..Approved::default()
        };
        // Read where it would be, without making the directory: reading
        // writes nothing.
        let file = self
            .managed
            .path
            .join("ledger")
            .join(format!("{}.json", project_key(root)));
        match read_nofollow(&file)
            .ok()
            .and_then(|b| serde_json::from_slice::<Approved>(&b).ok())
        {
            Some(a) if a.root == root => a,
            _ => empty,
        }
    }

    pub fn save(&self, approved: &Approved) -> std::io::Result<()> {
        let file = self.file(&approved.root)?;
        let bytes = serde_json::to_vec_pretty(approved).map_err(std::io::Error::other)?;
        write_atomic(&file, &bytes, 0o600)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_is_keyed_by_root() {
        let home = tempfile::tempdir().unwrap();
        let ledger = Ledger::new(ManagedRoot::for_home(home.path()));
        assert_eq!(ledger.load(Path::new("/p")).allow, Vec::<String>::new());
        let a = Approved {
            root: "/p".into(),
            enabled: Some(true),
            strict_git: None,
            allow: vec!["/x".into()],
            code_exec: Some(true),
            network: None,
        };
        ledger.save(&a).unwrap();
        assert_eq!(ledger.load(Path::new("/p")), a);
        assert_eq!(ledger.load(Path::new("/q")).enabled, None);
    }
}
