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
    #[error("cannot read the command line the bridge handed this launcher on stdin: {0}")]
    Handed(String),
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

/// The most a command line handed over on stdin may take.
const MAX_HANDED_ARGS: usize = 64 * 1024;

/// The command line handed to a launcher started ahead of its arming: the
/// first line of stdin, a JSON array of strings. Read a byte at a time,
/// so that nothing after it (the agent's first frames, which the same
/// pipe brings next) is taken from the command this launches. `None` when
/// stdin ends before anything: the arming it was started for did not come.
pub fn args_on_stdin() -> Result<Option<Vec<String>>, HelperError> {
    let stdin = std::io::stdin();
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    loop {
        match nix::unistd::read(&stdin, &mut byte) {
            Ok(0) if line.is_empty() => return Ok(None),
            Ok(0) => return Err(HelperError::Handed("stdin ended inside it".into())),
            Ok(_) if byte[0] == b'\n' => break,
            Ok(_) if line.len() >= MAX_HANDED_ARGS => {
                return Err(HelperError::Handed(
                    "longer than a command line may be".into(),
                ))
            }
            Ok(_) => line.push(byte[0]),
            Err(nix::errno::Errno::EINTR) => {}
            Err(e) => return Err(HelperError::Handed(e.to_string())),
        }
    }
    serde_json::from_slice(&line)
        .map(Some)
        .map_err(|e| HelperError::Handed(e.to_string()))
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
