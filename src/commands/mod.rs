//! Subcommands that inspect or change the sandbox from a terminal.

use std::path::PathBuf;

/// The `--workspace` arguments made absolute; the current directory when
/// none was given.
pub fn workspaces(given: &[PathBuf]) -> std::io::Result<Vec<PathBuf>> {
    if given.is_empty() {
        return Ok(vec![std::env::current_dir()?]);
    }
    given
        .iter()
        .map(|w| crate::policy::resolve::absolutize(w))
        .collect()
}

pub mod allow;
#[cfg(target_os = "linux")]
pub mod doctor;
pub mod exec_env;
pub mod profile;
#[cfg(any(target_os = "linux", target_os = "macos"))]
pub mod run;
