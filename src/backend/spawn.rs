//! Turning a backend command line into a running process.
//!
//! The command passes through a [`SpawnHook`] first: the bridge core knows
//! nothing about sandboxes, and the sandbox issues wrap the command there
//! (with the roots of the moment) without touching the relay.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::Stdio;

use tokio::process::{Child, ChildStdin, ChildStdout, Command};

/// What a spawn hook gets to decide how a generation is started.
#[derive(Debug)]
pub struct SpawnContext<'a> {
    /// The backend command line as the user configured it.
    pub argv: &'a [String],
    /// The union of the live sessions' roots at spawn time.
    pub roots: &'a [PathBuf],
    /// The generation about to start (1 for the first).
    pub generation: u64,
    /// Writes the user allowed for this bridge's lifetime.
    pub grants: &'a [PathBuf],
}

/// The command to run for one generation.
#[derive(Debug, Clone)]
pub struct PreparedCommand {
    pub argv: Vec<String>,
    pub env: Vec<(OsString, OsString)>,
    /// A short description for logs and the editor ("unconfined", ...).
    pub confinement: String,
    /// Which backend profile decided the agent's writable state, and why
    /// (None when nothing is confined).
    pub backend_profile: Option<String>,
}

/// Why a generation could not be started.
#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    #[error("no backend command was given")]
    Empty,
    #[error("could not start the agent backend `{program}`: {source}; check the command (zcode-acp -- BACKEND ARGS, ZCODE_ACP_BACKEND, or `backend` in the user config)")]
    Start {
        program: String,
        source: std::io::Error,
    },
    /// Starting the backend as configured is impossible, and retrying will
    /// not help (the sandbox was asked for and cannot be armed).
    #[error("{0}")]
    Refused(String),
}

impl SpawnError {
    /// The sandbox could not be armed for this generation.
    pub fn cannot_arm(e: impl std::fmt::Display) -> SpawnError {
        SpawnError::Refused(format!("cannot arm the sandbox: {e}"))
    }
}

/// What a sandbox hook arms a generation with: the policy input for its
/// roots, gathered as the bridge does (templates created, the ledger kept),
/// with the writable state and cache directories created, and the backend
/// profile that chose the agent's state, in words.
pub fn arming_input(
    platform: crate::policy::Platform,
    ctx: &SpawnContext<'_>,
    state: &crate::policy::backends::StateSettings,
    managed: &crate::config::managed::ManagedRoot,
) -> Result<(crate::policy::PolicyInput, String), SpawnError> {
    use crate::policy::discover::{create_writable_dirs, gather, Sources};
    let gathered = gather(&Sources {
        platform,
        workspaces: ctx.roots,
        backend: ctx.argv,
        state,
        once_allows: ctx.grants,
        managed,
        inspect: false,
    })
    .map_err(SpawnError::cannot_arm)?;
    create_writable_dirs(&gathered.input);
    let profile = gathered.backend.describe();
    tracing::info!(backend_profile = %profile, "the agent's own state is chosen by its backend profile");
    Ok((gathered.input, profile))
}

/// Decides how each backend generation is started.
pub trait SpawnHook: Send {
    fn prepare(&mut self, ctx: &SpawnContext<'_>) -> Result<PreparedCommand, SpawnError>;

    /// Whether generations started through this hook are confined (and so
    /// must be re-armed when a session brings a root they do not cover).
    fn confines(&self) -> bool {
        false
    }

    /// The policy the running generation was armed with, for judging what
    /// the agent asks the editor to do on its behalf.
    fn policy(&self) -> Option<&crate::policy::Policy> {
        None
    }

    /// Wraps a command the editor will run for the agent (an ACP terminal)
    /// so it runs in the running generation's sandbox, and returns the
    /// argv the editor should start instead, with an empty environment.
    fn terminal(&self, _command: TerminalCommand) -> Result<Vec<String>, String> {
        Err("this sandbox cannot confine the editor's terminals".into())
    }

    /// The message every write denial of this hook's profiles carries in
    /// the system log (Seatbelt), so the bridge reads only its own agent's.
    fn violation_tag(&self) -> Option<&str> {
        None
    }
}

/// A command the agent asked the editor to run (`terminal/create`).
#[derive(Debug, Clone)]
pub struct TerminalCommand {
    pub argv: Vec<String>,
    /// Applied only inside the sandbox, after arming.
    pub env: Vec<(String, String)>,
    pub cwd: Option<PathBuf>,
}

/// Runs the backend as configured, with no confinement. The confinement
/// string says so plainly: this is not a sandbox.
pub struct Unconfined;

impl SpawnHook for Unconfined {
    fn prepare(&mut self, ctx: &SpawnContext<'_>) -> Result<PreparedCommand, SpawnError> {
        if ctx.argv.is_empty() {
            return Err(SpawnError::Empty);
        }
        Ok(PreparedCommand {
            argv: ctx.argv.to_vec(),
            env: Vec::new(),
            confinement: "unconfined (no sandbox)".into(),
            backend_profile: None,
        })
    }
}

/// Refuses every start: the user asked for a sandbox that this build cannot
/// arm, and running the agent unconfined would betray that request.
pub struct RefuseUnsandboxed {
    pub requested_by: String,
    /// Why the sandbox cannot be armed here.
    pub reason: String,
}

impl SpawnHook for RefuseUnsandboxed {
    fn prepare(&mut self, _ctx: &SpawnContext<'_>) -> Result<PreparedCommand, SpawnError> {
        Err(SpawnError::Refused(format!(
            "the sandbox was requested ({}), but {}, so the agent was not started; \
             remove the request, or start zcode-acp with --no-sandbox to run the agent unconfined on purpose",
            self.requested_by, self.reason
        )))
    }
}

/// A started backend process and its pipes.
pub struct Spawned {
    pub child: Child,
    pub pid: i32,
    pub stdin: ChildStdin,
    pub stdout: ChildStdout,
}

/// Starts `cmd` with piped stdin/stdout, stderr passed through, in its own
/// process group (so the whole group can be signalled), and with a
/// parent-death signal so it dies even if the editor SIGKILLs the bridge.
pub fn spawn(cmd: &PreparedCommand) -> Result<Spawned, SpawnError> {
    let (program, args) = cmd.argv.split_first().ok_or(SpawnError::Empty)?;
    let mut command = Command::new(program);
    command
        .args(args)
        .envs(cmd.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .process_group(0)
        .kill_on_drop(false);
    #[cfg(target_os = "linux")]
    {
        let parent = nix::unistd::getpid();
        // SAFETY: the closure runs in the forked child before exec and only
        // makes async-signal-safe system calls (prctl, getppid); it touches no
        // locks or allocations shared with the parent.
        unsafe {
            command.pre_exec(move || {
                nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)?;
                // The bridge may have died between fork and prctl; the death
                // signal would then never come.
                if nix::unistd::getppid() != parent {
                    return Err(std::io::Error::other("the bridge exited during spawn"));
                }
                Ok(())
            });
        }
    }
    let mut child = command.spawn().map_err(|source| SpawnError::Start {
        program: program.clone(),
        source,
    })?;
    let pid = child.id().map(|p| p as i32).unwrap_or(0);
    let stdin = child.stdin.take().expect("stdin was piped");
    let stdout = child.stdout.take().expect("stdout was piped");
    Ok(Spawned {
        child,
        pid,
        stdin,
        stdout,
    })
}
