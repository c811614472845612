//! Writing a generation's profile where no generation can touch it, and
//! wrapping the backend command with `sandbox-exec`.
//!
//! Each generation gets a fresh, unpredictable directory under
//! `~/.zcode-acp/sandbox/` (mode 0700). The profile is created with
//! create-new and no-follow semantics, so a pre-placed file or symlink makes
//! arming fail instead of being used. The live generation holds a lock in
//! its directory; start-up sweeps the directories whose lock nobody holds
//! (judging liveness by a lock, never by a pid that may be reused).

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::PathBuf;

use nix::fcntl::{Flock, FlockArg};

use super::build_profile;
use crate::config::managed::ManagedRoot;
use crate::policy::{Policy, PolicyInput};

pub const SANDBOX_EXEC: &str = "/usr/bin/sandbox-exec";
const LOCK: &str = "lock";
const PROFILE: &str = "profile.sb";

#[derive(Debug, thiserror::Error)]
pub enum ArmError {
    #[error("cannot prepare the profile directory under {dir}: {source}")]
    Dir {
        dir: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot write the profile {path}: {source} (something was already there?)")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot build the profile: {0}")]
    Quote(#[from] super::quote::QuoteError),
}

/// A generation's private directory, locked while the generation lives.
#[derive(Debug)]
pub struct GenerationDir {
    pub path: PathBuf,
    _lock: Flock<File>,
}

impl GenerationDir {
    pub fn create(managed: &ManagedRoot) -> Result<GenerationDir, ArmError> {
        let base = managed.sandbox_dir().map_err(|source| ArmError::Dir {
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
            .map_err(|source| ArmError::Dir {
                dir: path.clone(),
                source,
            })?;
        let lock = create_new(&path.join(LOCK)).map_err(|source| ArmError::Dir {
            dir: path.clone(),
            source,
        })?;
        let lock =
            Flock::lock(lock, FlockArg::LockExclusiveNonblock).map_err(|(_, e)| ArmError::Dir {
                dir: path.clone(),
                source: e.into(),
            })?;
        Ok(GenerationDir { path, _lock: lock })
    }

    /// Writes the profile file (create-new, no-follow) and returns its path.
    pub fn write_profile(&self, text: &str) -> Result<PathBuf, ArmError> {
        let path = self.path.join(PROFILE);
        let mut f = create_new(&path).map_err(|source| ArmError::Write {
            path: path.clone(),
            source,
        })?;
        f.write_all(text.as_bytes())
            .and_then(|_| f.sync_all())
            .map_err(|source| ArmError::Write {
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

/// A backend command wrapped in its generation's Seatbelt profile.
#[derive(Debug)]
pub struct Armed {
    pub argv: Vec<String>,
    pub profile: PathBuf,
    pub policy: Policy,
    /// Keep alive as long as the generation runs.
    pub dir: GenerationDir,
}

/// Builds the policy for `input` (with this generation's own directory as
/// an island), writes the profile, and wraps `argv`.
pub fn arm_argv(
    argv: &[String],
    input: &PolicyInput,
    managed: &ManagedRoot,
) -> Result<Armed, ArmError> {
    let dir = GenerationDir::create(managed)?;
    let mut input = input.clone();
    input.profile_dir = Some(dir.path.clone());
    input.managed_root = managed.path.clone();
    let policy = Policy::build(&input);
    let profile = dir.write_profile(&build_profile(&policy)?)?;
    let mut wrapped = vec![
        SANDBOX_EXEC.to_owned(),
        "-f".to_owned(),
        profile.to_string_lossy().into_owned(),
        "--".to_owned(),
    ];
    wrapped.extend(argv.iter().cloned());
    Ok(Armed {
        argv: wrapped,
        profile,
        policy,
        dir,
    })
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
    use crate::policy::build::{Platform, ProjectRules, RootInput};
    use std::os::unix::fs::PermissionsExt;

    fn input(home: &std::path::Path) -> PolicyInput {
        PolicyInput {
            platform: Platform::Macos,
            home: home.to_path_buf(),
            roots: vec![RootInput {
                path: home.join("ws"),
                project: ProjectRules::default(),
                repos: vec![],
            }],
            backend_state: vec![],
            temp_and_caches: vec![],
            once_allows: vec![],
            profile_dir: None,
            managed_root: home.join(".zcode-acp"),
        }
    }

    #[test]
    fn arming_writes_a_private_profile_and_wraps_the_command() {
        let home = tempfile::tempdir().unwrap();
        let managed = ManagedRoot::for_home(home.path());
        let armed = arm_argv(
            &["codex-acp".into(), "-x".into()],
            &input(home.path()),
            &managed,
        )
        .unwrap();
        assert_eq!(&armed.argv[..2], &[SANDBOX_EXEC, "-f"]);
        assert_eq!(&armed.argv[3..], &["--", "codex-acp", "-x"]);
        let dir = armed.profile.parent().unwrap();
        assert_eq!(
            std::fs::metadata(dir).unwrap().permissions().mode() & 0o777,
            0o700
        );
        let text = std::fs::read_to_string(&armed.profile).unwrap();
        assert!(text.contains(&format!(
            "(deny file-write* (subpath \"{}\"))",
            dir.display()
        )));
        assert!(text.ends_with(&format!(
            "(deny file-write* (subpath \"{}\"))\n",
            managed.path.display()
        )));
        // A second write into the same directory is refused, not followed.
        assert!(armed.dir.write_profile("x").is_err());
    }

    #[test]
    fn sweeping_removes_only_dead_generations() {
        let home = tempfile::tempdir().unwrap();
        let managed = ManagedRoot::for_home(home.path());
        let live = GenerationDir::create(&managed).unwrap();
        // A generation whose bridge died: its lock file is there, unheld.
        let dead = managed.sandbox_dir().unwrap().join("gen-dead");
        std::fs::create_dir(&dead).unwrap();
        std::fs::write(dead.join(LOCK), "").unwrap();
        std::fs::write(dead.join(PROFILE), "(version 1)").unwrap();
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
