//! `zcode-acp __sandbox --spec FILE`: the helper stage that arms a launch
//! spec written by [`super::enforce`] and runs its command.

use std::io::Read;
use std::os::fd::{FromRawFd, OwnedFd};
use std::path::PathBuf;

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

/// Where the launch spec comes from.
#[derive(Debug, Clone)]
pub enum SpecSource {
    /// A file in an arming's private directory (read never through a
    /// symlink), removed once read when `consume`.
    File { path: PathBuf, consume: bool },
    /// An inherited descriptor (a sealed memfd `run_code` writes): nothing
    /// on disk, so a caller that cannot write its managed root (inside a
    /// sandbox) can still launch.
    Fd(i32),
}

/// Reads the spec and runs it. Must run before any thread.
pub fn helper(source: &SpecSource, die_with_parent: bool) -> Result<i32, HelperError> {
    if die_with_parent {
        nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
            .map_err(HelperError::ParentDeath)?;
    }
    let bytes = match source {
        SpecSource::File { path, consume } => {
            let bytes =
                crate::config::atomic::read_nofollow(path).map_err(|source| HelperError::Read {
                    path: path.clone(),
                    source,
                })?;
            if *consume {
                let _ = std::fs::remove_file(path);
            }
            bytes
        }
        SpecSource::Fd(fd) => read_fd(*fd).map_err(|source| HelperError::Read {
            path: PathBuf::from(format!("/proc/self/fd/{fd}")),
            source,
        })?,
    };
    let spec: LaunchSpec = serde_json::from_slice(&bytes).map_err(HelperError::Invalid)?;
    Ok(super::exec::run(&spec)?)
}

/// Reads all of the inherited descriptor `fd` from its start, and closes it.
fn read_fd(fd: i32) -> std::io::Result<Vec<u8>> {
    use std::io::Seek;
    if fd < 3 {
        return Err(std::io::Error::other(
            "the spec descriptor must be above stderr",
        ));
    }
    // SAFETY: the descriptor was handed to this process for it alone (the
    // caller's `--spec-fd`); it is owned and closed here.
    let mut file = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    // A memfd is read from its start, whoever wrote it last.
    let _ = file.seek(std::io::SeekFrom::Start(0));
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes)?;
    Ok(bytes)
}
