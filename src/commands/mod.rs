//! Subcommands that inspect or change the sandbox from a terminal.

pub mod profile;
#[cfg(target_os = "linux")]
pub mod run;
