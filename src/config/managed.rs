//! `~/.zcode-acp`: the bridge's managed root. It holds every generation's
//! profile, the approval ledger and the project locks. It sits outside
//! every whitelisted path (the `~/.zcode*` glob admits it, and an island
//! takes it back last), which is the load-bearing defence against an agent
//! racing, symlinking or occupying what the next generation will use.

use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManagedRoot {
    pub path: PathBuf,
}

impl ManagedRoot {
    pub fn new(path: PathBuf) -> ManagedRoot {
        ManagedRoot { path }
    }

    /// `$HOME/.zcode-acp`, as a real path: what is made beneath it is
    /// made one component at a time without following symlinks, so a home
    /// reached through one (`/home` -> `var/home` on Fedora Atomic, a
    /// symlinked home, `..` in HOME) must be resolved first.
    pub fn for_home(home: &Path) -> ManagedRoot {
        let home = std::fs::canonicalize(home).unwrap_or_else(|_| home.to_path_buf());
        ManagedRoot::new(home.join(".zcode-acp"))
    }

    pub fn user_default() -> anyhow::Result<ManagedRoot> {
        let home =
            dirs::home_dir().ok_or_else(|| anyhow::anyhow!("no home directory: set HOME"))?;
        Ok(ManagedRoot::for_home(&home))
    }

    /// Creates `sub` (and the root) as real directories, mode 0700.
    pub fn dir(&self, sub: &str) -> std::io::Result<PathBuf> {
        let base = self
            .path
            .parent()
            .ok_or_else(|| std::io::Error::other("the managed root has no parent"))?;
        let name = self
            .path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        super::atomic::create_real_dirs(base, &[&name, sub], 0o700)
    }

    pub fn ledger_dir(&self) -> std::io::Result<PathBuf> {
        self.dir("ledger")
    }

    pub fn locks_dir(&self) -> std::io::Result<PathBuf> {
        self.dir("locks")
    }

    pub fn sandbox_dir(&self) -> std::io::Result<PathBuf> {
        self.dir("sandbox")
    }
}

/// A stable file name for a project root (FNV-1a of its real path).
pub fn project_key(root: &Path) -> String {
    format!("{:016x}", fnv1a(root.as_os_str().as_bytes()))
}

/// FNV-1a, 64 bits: the stable names of project directories on disk
/// (changing it would orphan every project's layers and ledgers).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_stable_and_distinct() {
        assert_eq!(project_key(Path::new("/a")), project_key(Path::new("/a")));
        assert_ne!(project_key(Path::new("/a")), project_key(Path::new("/b")));
        assert_eq!(project_key(Path::new("/a")).len(), 16);
    }

    #[test]
    fn dirs_are_private() {
        use std::os::unix::fs::PermissionsExt;
        let home = tempfile::tempdir().unwrap();
        let m = ManagedRoot::for_home(home.path());
        let d = m.ledger_dir().unwrap();
        assert_eq!(
            std::fs::metadata(&d).unwrap().permissions().mode() & 0o777,
            0o700
        );
        assert_eq!(
            std::fs::metadata(&m.path).unwrap().permissions().mode() & 0o777,
            0o700
        );
    }
}
