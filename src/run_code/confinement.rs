//! What confines a run, decided once per server, and the command line that
//! starts one run under it.
//!
//! Every run goes through the project's own sandbox, armed for the
//! session's workspace and the run's own directory, whether or not the
//! agent that called the tool is itself armed:
//! - Linux: the `__sandbox` helper with a launch spec of its own (passed in
//!   a sealed memfd: nothing on disk, so a server inside a sandbox that
//!   cannot write its managed root still launches). Inside an armed agent,
//!   where nested user namespaces are refused, the run keeps the inherited
//!   sandbox, adds its own Landlock layer, and the helper is its subreaper;
//!   the label says `inherited: ...`.
//! - macOS: Seatbelt, or inside an armed agent the inherited Seatbelt
//!   sandbox as it is (a sandboxed process cannot apply another).
//! - Nothing: refused (`no_confinement`) unless the user's config accepts
//!   unconfined runs; then every result says `none`.

use std::os::fd::OwnedFd;
use std::path::Path;

use crate::config::managed::ManagedRoot;
use crate::confine::Command;
use crate::policy::PolicyInput;

pub use crate::confine::CONFINED_ENV;

pub use crate::seatbelt::MACOS_SEATBELT;

/// What confines this server's runs.
pub enum Confiner {
    #[cfg(target_os = "linux")]
    Linux {
        enforcer: crate::linux::enforce::LinuxEnforcer,
        /// What confines this server itself, when it runs inside a sandbox.
        inherited: Option<String>,
        input: Box<PolicyInput>,
        managed: ManagedRoot,
    },
    #[cfg(target_os = "macos")]
    Seatbelt {
        sandbox: crate::confine::Sandbox,
        input: Box<PolicyInput>,
        managed: ManagedRoot,
    },
    /// The sandbox this server already runs in, as it is.
    Inherited(String),
    /// Nothing, and the user accepted that.
    Unconfined,
    /// Nothing, so nothing runs.
    Refused(String),
}

/// A run ready to start: its argv, the environment the started process
/// gets, and the descriptor it reads its launch spec from (fd 3).
pub struct Prepared {
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    pub spec_fd: Option<OwnedFd>,
    /// Whatever the arming keeps on disk while the run lives (Seatbelt's
    /// profile directory).
    pub keep: Option<crate::confine::Confinement>,
}

impl Confiner {
    /// Decides what confines runs for `workspace`. Forks to probe the
    /// kernel (Linux): call it before any thread is started.
    pub fn detect(workspace: &Path, allow_unconfined: bool) -> Confiner {
        let fallback = |why: String| {
            if allow_unconfined {
                tracing::warn!("run_code runs UNCONFINED: {why} (runCode.allowUnconfined is set)");
                Confiner::Unconfined
            } else {
                Confiner::Refused(why)
            }
        };
        let inherited = inherited();
        #[cfg(target_os = "linux")]
        {
            let enforcer = match crate::linux::enforce::LinuxEnforcer::probe() {
                // Inside a sandbox, namespaces may seem to work in a probe
                // and still fail to map ids when armed: the inherited
                // sandbox holds the mounts, the run adds Landlock.
                Ok(mut e) if inherited.is_some() => {
                    if e.landlock_abi < 1 {
                        return Confiner::Inherited(inherited.unwrap_or_default());
                    }
                    e.level = crate::linux::exec::Level::LandlockOnly;
                    e
                }
                Ok(e) => e,
                Err(_) => {
                    return match inherited {
                        Some(what) => Confiner::Inherited(what),
                        None => {
                            fallback("neither namespaces nor Landlock are available here".into())
                        }
                    }
                }
            };
            match gather(crate::policy::Platform::Linux, workspace) {
                Ok((input, managed)) => Confiner::Linux {
                    enforcer,
                    inherited,
                    input: Box::new(input),
                    managed,
                },
                Err(e) => Confiner::Refused(format!("cannot build the sandbox's policy: {e:#}")),
            }
        }
        #[cfg(target_os = "macos")]
        {
            if let Some(what) = inherited {
                return Confiner::Inherited(what);
            }
            let probe = crate::seatbelt::enforce::SeatbeltEnforcer::new()
                .map(|e| std::sync::Arc::new(e) as std::sync::Arc<dyn crate::confine::Enforce>)
                .map_err(|e| e.to_string());
            let sandbox = crate::confine::Sandbox::detect("run_code".into(), probe);
            if !sandbox.arms() {
                return fallback("Seatbelt's sandbox-exec is not available".into());
            }
            match gather(crate::policy::Platform::Macos, workspace) {
                Ok((input, managed)) => Confiner::Seatbelt {
                    sandbox,
                    input: Box::new(input),
                    managed,
                },
                Err(e) => Confiner::Refused(format!("cannot build the sandbox's policy: {e:#}")),
            }
        }
        #[cfg(not(any(target_os = "linux", target_os = "macos")))]
        {
            let _ = (workspace, inherited);
            fallback("zcode-acp has no sandbox for this operating system".into())
        }
    }

    /// What confines runs, as results name it.
    pub fn label(&self) -> String {
        match self {
            #[cfg(target_os = "linux")]
            Confiner::Linux {
                enforcer,
                inherited,
                ..
            } => {
                use crate::linux::exec::Level;
                match (enforcer.level, inherited) {
                    (Level::LandlockOnly, Some(what)) => format!("inherited: {what}"),
                    (Level::Full, _) => "linux: namespaces+landlock".into(),
                    (Level::MountsOnly, _) => "linux: namespaces (no landlock)".into(),
                    (Level::LandlockOnly, None) => "linux: landlock".into(),
                }
            }
            #[cfg(target_os = "macos")]
            Confiner::Seatbelt { .. } => "macos: seatbelt".into(),
            Confiner::Inherited(what) => format!("inherited: {what}"),
            Confiner::Unconfined => "none".into(),
            Confiner::Refused(_) => "none".into(),
        }
    }

    /// Why nothing runs, if nothing does.
    pub fn refusal(&self) -> Option<&str> {
        match self {
            Confiner::Refused(why) => Some(why),
            _ => None,
        }
    }

    pub fn is_unconfined(&self) -> bool {
        matches!(self, Confiner::Unconfined)
    }

    /// Whether runs stay in the sandbox this server runs in, and so in its
    /// network: they are then pointed at its proxy as the server is.
    pub fn inherits_a_sandbox(&self) -> bool {
        match self {
            #[cfg(target_os = "linux")]
            Confiner::Linux { inherited, .. } => inherited.is_some(),
            Confiner::Inherited(_) => true,
            _ => false,
        }
    }

    /// The command line that runs `command` confined, with `call_dir`
    /// writable beside the workspace and `served` (sockets this server
    /// serves the run) reachable.
    pub fn prepare(
        &self,
        call_dir: &Path,
        served: &[std::path::PathBuf],
        command: Command,
    ) -> Result<Prepared, String> {
        match self {
            #[cfg(target_os = "linux")]
            Confiner::Linux {
                enforcer,
                inherited,
                input,
                managed,
            } => {
                use crate::confine::{Confinement, Sandbox, Starter};
                let mut input = (**input).clone();
                input.once_allows.push(call_dir.to_path_buf());
                input.network.served_sockets.extend(served.iter().cloned());
                let sandbox = Sandbox::Ready(std::sync::Arc::new(*enforcer));
                let mut armed =
                    match sandbox.arm(input, managed, "none".into(), Starter::ThisProcess) {
                        Confinement::Armed(armed) => armed,
                        Confinement::Refused(why) => return Err(why),
                        Confinement::Unconfined => return Err("the sandbox did not arm".into()),
                    };
                // Inside a sandbox the caches are already layered by it, and
                // the managed root where layers live cannot be written.
                if inherited.is_some() {
                    armed.layers = None;
                }
                let mut spec = enforcer.spec(&armed, &command);
                spec.clear_env = true;
                // Inside a sandbox the run stays in its network, whose proxy
                // the code is pointed at (see the runner's environment).
                if inherited.is_some() {
                    spec.network = None;
                }
                let text = serde_json::to_vec(&spec).map_err(|e| e.to_string())?;
                let fd =
                    spec_memfd(&text).map_err(|e| format!("cannot pass the launch spec: {e}"))?;
                Ok(Prepared {
                    argv: vec![
                        "/proc/self/exe".into(),
                        "__sandbox".into(),
                        "--spec-fd".into(),
                        "3".into(),
                        "--die-with-parent".into(),
                    ],
                    // The helper's own log: its errors only (they end
                    // the run, and the result says so); never the code's.
                    env: vec![("ZCODE_ACP_LOG".into(), "error".into())],
                    spec_fd: Some(fd),
                    keep: None,
                })
            }
            #[cfg(target_os = "macos")]
            Confiner::Seatbelt {
                sandbox,
                input,
                managed,
            } => {
                use crate::confine::{Confinement, Launch, Starter};
                let mut input = (**input).clone();
                input.once_allows.push(call_dir.to_path_buf());
                input.network.served_sockets.extend(served.iter().cloned());
                let armed = sandbox.arm(input, managed, "none".into(), Starter::Spawned);
                if let Confinement::Refused(why) = &armed {
                    return Err(why.clone());
                }
                let argv = armed
                    .wrap(&command, Launch::Terminal)
                    .map_err(|e| e.to_string())?;
                Ok(Prepared {
                    argv,
                    env: Vec::new(),
                    spec_fd: None,
                    keep: Some(armed),
                })
            }
            Confiner::Inherited(_) | Confiner::Unconfined => Ok(Prepared {
                argv: command.argv,
                env: command.env,
                spec_fd: None,
                keep: None,
            }),
            Confiner::Refused(why) => Err(why.clone()),
        }
    }
}

/// The policy input for `workspace`, gathered once as `zcode-acp run`
/// gathers it (the user's config and project lists; no agent state is
/// writable; nothing is created or recorded).
fn gather(
    platform: crate::policy::Platform,
    workspace: &Path,
) -> anyhow::Result<(PolicyInput, ManagedRoot)> {
    let gathered = crate::policy::gather::gather_as_user(
        platform,
        &[workspace.to_path_buf()],
        &[],
        Some("none"),
        &[],
    )?;
    Ok((gathered.input, gathered.managed))
}

/// What confines this process, when it runs inside a zcode-acp sandbox.
/// The variable alone proves nothing (anyone can set it): on Linux it is
/// believed only with the facts every confined command has and no process
/// can undo, no_new_privs and a seccomp filter.
fn inherited() -> Option<String> {
    let what = std::env::var(CONFINED_ENV).ok().filter(|v| !v.is_empty())?;
    #[cfg(target_os = "linux")]
    {
        let status = std::fs::read_to_string("/proc/self/status").ok()?;
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .map(|v| v.trim().to_owned())
        };
        if field("NoNewPrivs:").as_deref() != Some("1") || field("Seccomp:").as_deref() != Some("2")
        {
            tracing::warn!(
                "{CONFINED_ENV} says this process is confined by {what}, but it has no seccomp filter or no no_new_privs: not believed"
            );
            return None;
        }
    }
    #[cfg(target_os = "macos")]
    if !macos_sandboxed() {
        tracing::warn!(
            "{CONFINED_ENV} says this process is confined by {what}, but the kernel says it runs in no sandbox: not believed"
        );
        return None;
    }
    Some(what)
}

/// Whether the kernel applies a sandbox to this process (libsystem's
/// `sandbox_check`, with no operation: any sandbox at all).
#[cfg(target_os = "macos")]
fn macos_sandboxed() -> bool {
    extern "C" {
        fn sandbox_check(
            pid: libc::pid_t,
            operation: *const libc::c_char,
            kind: libc::c_int,
            ...
        ) -> libc::c_int;
    }
    // SAFETY: no operation and SANDBOX_FILTER_NONE (0) take no further
    // arguments; the call only reads this process's state.
    unsafe { sandbox_check(libc::getpid(), std::ptr::null(), 0) == 1 }
}

/// A sealed memfd holding `bytes`.
#[cfg(target_os = "linux")]
fn spec_memfd(bytes: &[u8]) -> std::io::Result<OwnedFd> {
    use nix::sys::memfd::{memfd_create, MFdFlags};
    use std::io::Write;
    let fd = memfd_create(
        c"zcode-run-spec",
        MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING,
    )?;
    let mut file = std::fs::File::from(fd);
    file.write_all(bytes)?;
    // Nothing the run starts can change what the helper will read.
    let seals = libc::F_SEAL_SEAL | libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_WRITE;
    // SAFETY: fcntl on a descriptor this function owns.
    if unsafe {
        libc::fcntl(
            std::os::fd::AsRawFd::as_raw_fd(&file),
            libc::F_ADD_SEALS,
            seals,
        )
    } < 0
    {
        return Err(std::io::Error::last_os_error());
    }
    Ok(file.into())
}
