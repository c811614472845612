//! `zcode-acp run`: any command under the same sandbox a backend gets
//! (Linux: namespaces + Landlock; macOS: `sandbox-exec`).

use std::path::PathBuf;

use crate::config::managed::ManagedRoot;
#[cfg(target_os = "linux")]
use crate::linux::exec::{self, LaunchSpec};
#[cfg(target_os = "linux")]
use crate::linux::plan::{self, RealFs, Session};
use crate::policy::build::PolicyInput;
use crate::policy::Platform;
#[cfg(target_os = "linux")]
use crate::policy::Policy;

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

/// What the policy for `args` is built from. Creates each workspace's
/// `.zcode/acp` (the island must exist to be made read-only) and the
/// missing state and cache directories the policy makes writable.
fn policy_input(args: &RunArgs, platform: Platform) -> anyhow::Result<(PolicyInput, ManagedRoot)> {
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
    tracing::debug!(backend_profile = %gathered.backend.describe(), "state the command may write");
    crate::policy::discover::create_writable_dirs(&gathered.input);
    Ok((gathered.input, gathered.managed))
}

/// Builds the launch for `args`.
#[cfg(target_os = "linux")]
pub fn launch_spec(args: &RunArgs) -> anyhow::Result<LaunchSpec> {
    let (input, managed) = policy_input(args, Platform::Linux)?;
    let policy = Policy::build(&input);
    let session = Session {
        layers: input
            .roots
            .first()
            .map(|r| crate::linux::hook::layers_for(&managed, &r.path)),
        ..Session::current()
    };
    let plan = plan::build(&policy, &RealFs, &session);
    for gap in &plan.gaps {
        tracing::debug!(path = %gap.path.display(), "not enforced: {}", gap.why);
    }
    Ok(LaunchSpec::new(
        plan,
        &policy,
        args.command.clone(),
        Vec::new(),
        None,
    ))
}

/// Runs the command sandboxed; returns its exit code. Must be called
/// before any thread is started.
#[cfg(target_os = "linux")]
pub fn run(args: RunArgs) -> anyhow::Result<i32> {
    let spec = launch_spec(&args)?;
    exec::run(&spec).map_err(|e| {
        anyhow::anyhow!(
            "cannot arm the sandbox: {e}; nothing was run (to run it unconfined on purpose, run the command without zcode-acp)"
        )
    })
}

/// Runs the command under `sandbox-exec` with a profile written for this
/// run (removed when it ends); returns its exit code, or 128 + the signal
/// that ended it, as a shell would.
#[cfg(target_os = "macos")]
pub fn run(args: RunArgs) -> anyhow::Result<i32> {
    use std::os::unix::process::ExitStatusExt;
    let (input, managed) = policy_input(&args, Platform::Macos)?;
    let armed = crate::seatbelt::arm::arm_argv(&args.command, &input, &managed, None).map_err(|e| {
        anyhow::anyhow!("cannot arm the sandbox: {e}; nothing was run (to run it unconfined on purpose, run the command without zcode-acp)")
    })?;
    let status = std::process::Command::new(&armed.argv[0])
        .args(&armed.argv[1..])
        .status()
        .map_err(|e| anyhow::anyhow!("cannot start {}: {e}", armed.argv[0]))?;
    drop(armed);
    Ok(status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(1))
}
