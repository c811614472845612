//! Turning a backend command line (already wrapped by its confinement,
//! see [`crate::confine`]) into a running process.

use std::process::Stdio;

use tokio::process::{Child, ChildStderr, ChildStdin, ChildStdout, Command};

/// The command to run for one generation.
#[derive(Debug, Clone)]
pub struct PreparedCommand {
    pub argv: Vec<String>,
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
}

/// A started backend process and its pipes.
pub struct Spawned {
    pub child: Child,
    pub pid: i32,
    pub stdin: ChildStdin,
    pub stdout: ChildStdout,
    pub stderr: ChildStderr,
}

/// Starts `cmd` with piped stdin/stdout/stderr (its stderr is passed on by
/// the generation, which keeps its last lines), in its own
/// process group (so the whole group can be signalled), and with a
/// parent-death signal so it dies even if the editor SIGKILLs the bridge.
pub fn spawn(cmd: &PreparedCommand) -> Result<Spawned, SpawnError> {
    let (program, args) = cmd.argv.split_first().ok_or(SpawnError::Empty)?;
    let mut command = Command::new(program);
    command
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
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
    let stderr = child.stderr.take().expect("stderr was piped");
    Ok(Spawned {
        child,
        pid,
        stdin,
        stdout,
        stderr,
    })
}

/// A launcher started before the arming it launches is done: this
/// binary's `__sandbox --args-on-stdin`, which waits for its command line
/// as the first line of stdin. Its start (an `exec` of this binary, about
/// a millisecond) then overlaps the arming's own work. Dropped unused, its
/// stdin closes, it leaves without doing anything, and it is waited for.
pub struct Ahead {
    spawned: Option<Spawned>,
    program: String,
}

impl Ahead {
    /// Starts the launcher `program` (this binary) ahead.
    pub fn start(program: String) -> std::io::Result<Ahead> {
        let spawned = spawn(&PreparedCommand {
            argv: vec![
                program.clone(),
                "__sandbox".into(),
                "--args-on-stdin".into(),
            ],
            confinement: String::new(),
            backend_profile: None,
        })
        .map_err(|e| match e {
            SpawnError::Start { source, .. } => source,
            SpawnError::Empty => std::io::Error::other(e.to_string()),
        })?;
        Ok(Ahead {
            spawned: Some(spawned),
            program,
        })
    }

    /// The process, and the first line to hand it (its command line after
    /// the program), when `argv` is what it runs: this launcher's
    /// `__sandbox --spec FILE`, as the Linux arming wraps a generation.
    /// Otherwise it is dropped (and leaves).
    pub fn run(mut self, argv: &[String]) -> Option<(Spawned, String)> {
        let (program, args) = argv.split_first()?;
        let takes = *program == self.program
            && args.len() == 3
            && args[0] == "__sandbox"
            && args[1] == "--spec";
        if !takes {
            return None;
        }
        let line = serde_json::to_string(args).ok()?;
        Some((self.spawned.take()?, line))
    }
}

impl Drop for Ahead {
    fn drop(&mut self) {
        let Some(unused) = self.spawned.take() else {
            return;
        };
        let Spawned { mut child, .. } = unused;
        // Its stdin closed (dropped with the rest): it leaves at once.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let _ = child.wait().await;
            });
        }
    }
}
