//! Subcommands that inspect or change the sandbox from a terminal.

#[cfg(target_os = "linux")]
pub mod doctor;
pub mod profile;
#[cfg(target_os = "linux")]
pub mod run;
