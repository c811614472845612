//! Writing a generation's profile where no generation can touch it, and
//! wrapping the backend command with `sandbox-exec`.
//!
//! Each generation gets a fresh, unpredictable directory under
//! `~/.zcode-acp/sandbox/` (mode 0700). The profile is created with
//! create-new and no-follow semantics, so a pre-placed file or symlink makes
//! arming fail instead of being used. The live generation holds a lock in
//! its directory; start-up sweeps the directories whose lock nobody holds
//! (judging liveness by a lock, never by a pid that may be reused).

use std::path::PathBuf;

use super::build_profile_tagged;
pub use crate::config::generation::{sweep_dead, GenerationDir};
use crate::config::managed::ManagedRoot;
use crate::policy::{Policy, PolicyInput};

pub const SANDBOX_EXEC: &str = "/usr/bin/sandbox-exec";

#[derive(Debug, thiserror::Error)]
pub enum ArmError {
    #[error(transparent)]
    Dir(#[from] crate::config::generation::GenerationError),
    #[error("cannot build the profile: {0}")]
    Quote(#[from] super::quote::QuoteError),
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
/// an island), writes the profile (its write denials carrying `tag` in the
/// system log), and wraps `argv`.
pub fn arm_argv(
    argv: &[String],
    input: &PolicyInput,
    managed: &ManagedRoot,
    tag: Option<&str>,
) -> Result<Armed, ArmError> {
    let dir = GenerationDir::create(managed)?;
    let mut input = input.clone();
    input.profile_dir = Some(dir.path.clone());
    input.managed_root = managed.path.clone();
    let policy = Policy::build(&input);
    let profile = dir.write_file("profile.sb", &build_profile_tagged(&policy, tag)?)?;
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
            Some("zcode-acp-test"),
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
            "(deny file-write* (subpath \"{}\") (with message \"zcode-acp-test\"))",
            dir.display()
        )));
        // The managed root's island is the last file rule of all.
        let last_file_rule = text
            .lines()
            .rev()
            .find(|l| l.contains("file-write"))
            .unwrap();
        assert_eq!(
            last_file_rule,
            format!(
                "(deny file-write* (subpath \"{}\") (with message \"zcode-acp-test\"))",
                managed.path.display()
            )
        );
        // Every write denial is tagged, so the log can be read for our own.
        for line in text.lines().filter(|l| l.starts_with("(deny file-write")) {
            assert!(
                line.ends_with("(with message \"zcode-acp-test\"))"),
                "{line}"
            );
        }
        // A second write into the same directory is refused, not followed.
        assert!(armed.dir.write_file("profile.sb", "x").is_err());
    }
}
