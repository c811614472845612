//! Subcommands that inspect or change the sandbox from a terminal.

pub use crate::policy::gather::{backend_command, gather_as_user, workspaces, Gathered};

/// Why this machine cannot arm a sandbox.
#[derive(Debug, thiserror::Error)]
pub enum Unavailable {
    #[cfg(target_os = "linux")]
    #[error(transparent)]
    Linux(#[from] crate::linux::exec::NothingToArm),
    #[error(transparent)]
    Macos(#[from] crate::seatbelt::enforce::MissingSandboxExec),
    #[error("zcode-acp cannot arm a sandbox on this operating system")]
    UnsupportedOs,
}

/// This platform's enforcer, or why there is none: the one place the
/// platform is chosen (the bridge and `run_code` are handed it).
pub fn platform_enforcer() -> Result<std::sync::Arc<dyn crate::confine::Enforce>, String> {
    #[cfg(target_os = "linux")]
    return crate::linux::enforce::LinuxEnforcer::probe()
        .map(|e| std::sync::Arc::new(e) as std::sync::Arc<dyn crate::confine::Enforce>)
        .map_err(|e| Unavailable::from(e).to_string());
    #[cfg(target_os = "macos")]
    return crate::seatbelt::enforce::SeatbeltEnforcer::new()
        .map(|e| std::sync::Arc::new(e) as std::sync::Arc<dyn crate::confine::Enforce>)
        .map_err(|e| Unavailable::from(e).to_string());
    #[allow(unreachable_code)]
    Err(Unavailable::UnsupportedOs.to_string())
}

pub mod allow;
#[cfg(target_os = "linux")]
pub mod doctor;
pub mod exec_env;
pub mod profile;
#[cfg(any(target_os = "linux", target_os = "macos"))]
pub mod run;
#[cfg(any(target_os = "linux", target_os = "macos"))]
pub mod shield;
