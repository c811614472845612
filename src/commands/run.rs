//! `zcode-acp run`: any command under the same sandbox a backend gets.

use std::path::PathBuf;

use crate::config::managed::ManagedRoot;
use crate::linux::exec::{self, LaunchSpec};
use crate::linux::plan::{self, RealFs, Session};
use crate::policy::discover::{gather, Sources};
use crate::policy::{Platform, Policy};

#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// A writable workspace root (repeatable; default: the current directory).
    #[arg(long = "workspace", value_name = "DIR")]
    pub workspaces: Vec<PathBuf>,
    /// Also allow writes beneath PATH, for this run only (repeatable).
    #[arg(long = "allow", value_name = "PATH")]
    pub allow: Vec<PathBuf>,
    /// The command to run.
    #[arg(last = true, required = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

/// Builds the launch for `args`. Creates each workspace's `.zcode/acp`
/// (the island must exist to be made read-only).
pub fn launch_spec(args: &RunArgs) -> anyhow::Result<LaunchSpec> {
    let workspaces = super::workspaces(&args.workspaces)?;
    let user = crate::config::load_user_config()?;
    let managed = ManagedRoot::user_default()?;
    let (input, _) = gather(&Sources {
        platform: Platform::Linux,
        workspaces: &workspaces,
        backend: &args.command,
        state_paths: &user.sandbox.state_paths,
        once_allows: &args
            .allow
            .iter()
            .map(|a| crate::policy::resolve::absolutize(a))
            .collect::<Result<Vec<_>, _>>()?,
        managed: &managed,
        inspect: false,
    })?;
    crate::policy::discover::create_missing_dirs(&input.backend_state, &input.home);
    crate::policy::discover::create_missing_dirs(&input.temp_and_caches, &input.home);
    let policy = Policy::build(&input);
    let session = Session::current();
    let plan = plan::build(&policy, &RealFs, &session);
    for gap in &plan.gaps {
        tracing::debug!(path = %gap.path.display(), "not enforced: {}", gap.why);
    }
    Ok(LaunchSpec {
        plan,
        argv: args.command.clone(),
        env: Vec::new(),
        cwd: None,
    })
}

/// Runs the command sandboxed; returns its exit code. Must be called
/// before any thread is started.
pub fn run(args: RunArgs) -> anyhow::Result<i32> {
    let spec = launch_spec(&args)?;
    exec::run(&spec).map_err(|e| {
        anyhow::anyhow!(
            "cannot arm the sandbox: {e}; nothing was run (to run it unconfined on purpose, run the command without zcode-acp)"
        )
    })
}
