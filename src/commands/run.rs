//! `zcode-acp run`: any command under the same sandbox a backend gets
//! (Linux: namespaces + Landlock; macOS: `sandbox-exec`).

use std::path::PathBuf;
use std::sync::Arc;

use crate::config::managed::ManagedRoot;
#[cfg(target_os = "macos")]
use crate::confine::Launch;
use crate::confine::{Command, Confinement, Enforce, Sandbox, Starter};
use crate::policy::build::PolicyInput;
use crate::policy::Platform;

#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// A writable workspace root (repeatable; default: the current directory).
    #[arg(long = "workspace", value_name = "DIR")]
    pub workspaces: Vec<PathBuf>,
    /// Also allow writes beneath PATH, for this run only (repeatable).
    #[arg(long = "allow", value_name = "PATH")]
    pub allow: Vec<PathBuf>,
    /// Whose state the command may write: claude, codex, gemini, zcode or
    /// none (default: read from the command, as for a backend).
    #[arg(long, value_name = "PROFILE")]
    pub backend_profile: Option<String>,
    /// The command to run.
    #[arg(last = true, required = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

/// What the policy for `args` is built from, and which backend profile
/// chose the command's writable state. Creates each workspace's
/// `.zcode/acp` (the island must exist to be made read-only) and the
/// missing state and cache directories the policy makes writable.
fn policy_input(
    args: &RunArgs,
    platform: Platform,
) -> anyhow::Result<(PolicyInput, ManagedRoot, String)> {
    let allow = args
        .allow
        .iter()
        .map(|a| crate::policy::resolve::absolutize(a))
        .collect::<Result<Vec<_>, _>>()?;
    let workspaces = super::workspaces(&args.workspaces)?;
    let gathered = super::gather_as_user(
        platform,
        &workspaces,
        &args.command,
        args.backend_profile.as_deref(),
        &allow,
        false,
    )?;
    let profile = gathered.backend.describe();
    tracing::debug!(backend_profile = %profile, "state the command may write");
    crate::policy::discover::create_writable_dirs(&gathered.input);
    Ok((gathered.input, gathered.managed, profile))
}

fn cannot_arm(why: impl std::fmt::Display) -> anyhow::Error {
    anyhow::anyhow!(
        "cannot arm the sandbox: {why}; nothing was run (to run it unconfined on purpose, run the command without zcode-acp)"
    )
}

/// Arms this platform's sandbox for `args`, through the same arming as
/// the bridge's generations.
fn arm(
    args: &RunArgs,
    enforcer: Arc<dyn Enforce>,
    starter: Starter,
) -> anyhow::Result<Confinement> {
    let (input, managed, profile) = policy_input(args, enforcer.platform())?;
    match Sandbox::Ready(enforcer).arm(input, &managed, profile, starter) {
        // Already said: "cannot arm the sandbox: ...".
        Confinement::Refused(why) => Err(anyhow::anyhow!(
            "{why}; nothing was run (to run it unconfined on purpose, run the command without zcode-acp)"
        )),
        armed => Ok(armed),
    }
}

fn command(args: &RunArgs) -> Command {
    Command {
        argv: args.command.clone(),
        ..Command::default()
    }
}

/// Runs the command sandboxed, in this process (the launcher arms it
/// directly: there is nothing to re-execute); returns its exit code. Must
/// be called before any thread is started.
#[cfg(target_os = "linux")]
pub fn run(args: RunArgs) -> anyhow::Result<i32> {
    let enforcer = crate::linux::enforce::LinuxEnforcer::probe().map_err(cannot_arm)?;
    let confinement = arm(&args, Arc::new(enforcer), Starter::ThisProcess)?;
    let Confinement::Armed(armed) = &confinement else {
        return Err(cannot_arm("the sandbox did not arm"));
    };
    let spec = enforcer.spec(armed, &command(&args));
    crate::linux::exec::run(&spec).map_err(cannot_arm)
}

/// Runs the command under `sandbox-exec` with a profile written for this
/// run (removed when it ends); returns its exit code, or 128 + the signal
/// that ended it, as a shell would.
#[cfg(target_os = "macos")]
pub fn run(args: RunArgs) -> anyhow::Result<i32> {
    use std::os::unix::process::ExitStatusExt;
    let enforcer = crate::seatbelt::enforce::SeatbeltEnforcer::new().map_err(cannot_arm)?;
    let confinement = arm(&args, Arc::new(enforcer), Starter::Spawned)?;
    let argv = confinement
        .wrap(&command(&args), Launch::Backend)
        .map_err(cannot_arm)?;
    let status = std::process::Command::new(&argv[0])
        .args(&argv[1..])
        .status()
        .map_err(|e| anyhow::anyhow!("cannot start {}: {e}", argv[0]))?;
    drop(confinement);
    Ok(status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(1))
}
