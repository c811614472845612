//! `zcode-acp __sandbox --spec FILE`: the helper stage that arms a launch
//! spec written by [`super::enforce`] and runs its command.

use std::path::{Path, PathBuf};

use super::exec::{LaunchError, LaunchSpec};

/// Why the helper could not run its spec.
#[derive(Debug, thiserror::Error)]
pub enum HelperError {
    #[error("cannot set the parent-death signal: {0}")]
    ParentDeath(nix::errno::Errno),
    #[error("cannot read the launch spec {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the launch spec is not valid: {0}")]
    Invalid(serde_json::Error),
    #[error("cannot arm the sandbox: {0}")]
    Launch(#[from] LaunchError),
}

/// Reads the spec (never through a symlink) and runs it. Must run before
/// any thread.
pub fn helper(spec_file: &Path, consume: bool, die_with_parent: bool) -> Result<i32, HelperError> {
    if die_with_parent {
        nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
            .map_err(HelperError::ParentDeath)?;
    }
    let bytes =
        crate::config::atomic::read_nofollow(spec_file).map_err(|source| HelperError::Read {
            path: spec_file.to_path_buf(),
            source,
        })?;
    if consume {
        let _ = std::fs::remove_file(spec_file);
    }
    let spec: LaunchSpec = serde_json::from_slice(&bytes).map_err(HelperError::Invalid)?;
    Ok(super::exec::run(&spec)?)
}
