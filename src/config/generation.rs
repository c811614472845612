//! Per-generation private directories under `~/.zcode-acp/sandbox/`.
//!
//! Each backend generation gets a fresh, unpredictable directory (mode
//! 0700) for its profile or launch spec; files in it are created with
//! create-new and no-follow semantics, so a pre-placed file or symlink makes
//! arming fail instead of being used. The live generation holds a lock in
//! its directory; start-up sweeps the directories whose lock nobody holds
//! (judging liveness by a lock, never by a pid that may be reused).

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::PathBuf;

use nix::fcntl::{Flock, FlockArg};

use super::managed::ManagedRoot;

const LOCK: &str = "lock";

#[derive(Debug, thiserror::Error)]
pub enum GenerationError {
    #[error("cannot prepare the sandbox directory {dir}: {source}")]
    Dir {
        dir: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot write {path}: {source} (was something already there?)")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// A generation's private directory, locked while the generation lives.
#[derive(Debug)]
pub struct GenerationDir {
    pub path: PathBuf,
    _lock: Flock<File>,
}

impl GenerationDir {
    pub fn create(managed: &ManagedRoot) -> Result<GenerationDir, GenerationError> {
        let base = managed
            .sandbox_dir()
            .map_err(|source| GenerationError::Dir {
                dir: managed.path.join("sandbox"),
                source,
            })?;
        let path = base.join(format!(
            "gen-{:016x}{:016x}",
            rand::random::<u64>(),
            rand::random::<u64>()
        ));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&path)
            .map_err(|source| GenerationError::Dir {
                dir: path.clone(),
                source,
            })?;
        let lock = create_new(&path.join(LOCK)).map_err(|source| GenerationError::Dir {
            dir: path.clone(),
            source,
        })?;
        let lock = Flock::lock(lock, FlockArg::LockExclusiveNonblock).map_err(|(_, e)| {
            GenerationError::Dir {
                dir: path.clone(),
                source: e.into(),
            }
        })?;
        Ok(GenerationDir { path, _lock: lock })
    }

    /// Writes a file into the directory (create-new, no-follow) and returns
    /// its path.
    pub fn write_file(&self, name: &str, text: &str) -> Result<PathBuf, GenerationError> {
        let path = self.path.join(name);
        let mut f = create_new(&path).map_err(|source| GenerationError::Write {
            path: path.clone(),
            source,
        })?;
        // Not synced: only this generation reads it, through the page
        // cache, and a crash ends the generation (its directory is swept).
        f.write_all(text.as_bytes())
            .map_err(|source| GenerationError::Write {
                path: path.clone(),
                source,
            })?;
        Ok(path)
    }
}

impl Drop for GenerationDir {
    fn drop(&mut self) {
        // The generation is over: its profile is no longer needed.
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

fn create_new(path: &std::path::Path) -> std::io::Result<File> {
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(path)
}

/// Removes the directories of generations that are gone (nobody holds
/// their lock). Returns how many were removed.
pub fn sweep_dead(managed: &ManagedRoot) -> usize {
    let Ok(base) = managed.sandbox_dir() else {
        return 0;
    };
    let Ok(entries) = std::fs::read_dir(&base) else {
        return 0;
    };
    let mut removed = 0;
    for entry in entries.flatten() {
        let path = entry.path();
        let lock = OpenOptions::new()
            .read(true)
            .custom_flags(nix::libc::O_NOFOLLOW)
            .open(path.join(LOCK));
        let dead = match lock {
            Ok(f) => Flock::lock(f, FlockArg::LockExclusiveNonblock).is_ok(),
            // No lock file: a generation that died while being set up, or
            // something that is not ours. Only old ones are removed.
            Err(_) => entry
                .metadata()
                .and_then(|m| m.modified())
                .is_ok_and(|t| t.elapsed().is_ok_and(|age| age.as_secs() > 60)),
        };
        if dead && std::fs::remove_dir_all(&path).is_ok() {
            removed += 1;
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sweeping_removes_only_dead_generations() {
        let home = tempfile::tempdir().unwrap();
        let managed = ManagedRoot::for_home(home.path());
        let live = GenerationDir::create(&managed).unwrap();
        // A generation whose bridge died: its lock file is there, unheld.
        let dead = managed.sandbox_dir().unwrap().join("gen-dead");
        std::fs::create_dir(&dead).unwrap();
        std::fs::write(dead.join(LOCK), "").unwrap();
        std::fs::write(dead.join("profile.sb"), "(version 1)").unwrap();
        assert_eq!(sweep_dead(&managed), 1);
        assert!(!dead.exists());
        assert!(live.path.exists(), "a held lock means alive");
        let path = live.path.clone();
        drop(live);
        assert!(
            !path.exists(),
            "a finished generation cleans up after itself"
        );
    }
}
