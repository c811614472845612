//! Confinement as a value.
//!
//! Whatever this program starts for the agent (a backend generation, a
//! command the editor runs for it, `zcode-acp run`) goes through one
//! [`Sandbox::arm`], which says what it will run under: nothing because the
//! sandbox is off, nothing because it was asked for and cannot be armed
//! here, or a policy enforced by this platform's sandbox. The policy is
//! built here, the same way for both platforms; the platform only turns a
//! policy and a command into a command that runs confined by it
//! ([`Enforce`]).

use std::path::PathBuf;
use std::sync::Arc;

use crate::config::generation::{GenerationDir, GenerationError};
use crate::config::managed::ManagedRoot;
use crate::policy::{Platform, Policy, PolicyInput};

/// The environment variable a confined command carries, naming what
/// confines it (set by the Linux helper, and by the bridge in the entry it
/// adds for the run_code server).
pub const CONFINED_ENV: &str = "ZCODE_ACP_CONFINED";

/// The argv that runs `argv` under a keeper tied to this process, which
/// starts it (`exe`: `/proc/self/exe`, which still runs this program after
/// an upgrade replaced its file); `backend::keeper` is the keeper.
pub fn keeper_argv(exe: &str, argv: &[String]) -> Vec<String> {
    let mut out = vec![
        exe.to_owned(),
        "__keeper".to_owned(),
        "--bridge".to_owned(),
        std::process::id().to_string(),
        "--".to_owned(),
    ];
    out.extend(argv.iter().cloned());
    out
}

/// A fresh name for an arming's socket where the proxy asks about refused
/// connections (`network::asks`), in the abstract namespace.
pub fn network_asks_name() -> String {
    format!(
        "zcode-acp-network-asks-{:016x}{:016x}",
        rand::random::<u64>(),
        rand::random::<u64>()
    )
}

/// The socket where an arming's proxy says what it carried
/// (`network::ledger`), beside its questions' socket `asks`.
pub fn network_ledger_name(asks: &str) -> String {
    format!("{asks}.ledger")
}

/// A command to run confined.
#[derive(Debug, Clone, Default)]
pub struct Command {
    pub argv: Vec<String>,
    /// Applied only inside the sandbox, after arming.
    pub env: Vec<(String, String)>,
    pub cwd: Option<PathBuf>,
}

/// How the confined command is started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Launch {
    /// A backend generation: lives as long as the generation's files.
    Backend,
    /// A command the editor starts for the agent: its launch file is read
    /// once, and it dies with whoever started it.
    Terminal,
}

/// Who starts the confined commands of one arming.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Starter {
    /// Other processes (the bridge, the editor): what they read is written
    /// into a private directory under the managed root.
    Spawned,
    /// This process arms itself and runs the command (`zcode-acp run` on
    /// Linux): nothing is written, so a home it cannot write is no obstacle.
    ThisProcess,
}

/// Why a command cannot be confined.
#[derive(Debug, thiserror::Error)]
pub enum ArmError {
    #[error("no command was given")]
    Empty,
    #[error(transparent)]
    Dir(#[from] GenerationError),
    #[error("cannot write the launch file: {0}")]
    Encode(#[from] serde_json::Error),
    #[error("this arming has no private directory to write the launch into")]
    NoDir,
    #[error("cannot find this program's own path: {0}")]
    OwnPath(std::io::Error),
    #[error("cannot build the Seatbelt profile: {0}")]
    Profile(String),
    #[error("{0}")]
    Refused(String),
}

/// A proxy this process runs for an arming whose commands may reach out
/// through one port only (macOS: `network::outside`), kept for as long as
/// the arming is.
pub trait Outside: Send + Sync {
    /// The port of the host's loopback it listens on.
    fn port(&self) -> u16;
    /// The environment that points a command at it (its credentials in
    /// the URL: it serves its own sandbox's commands only).
    fn env(&self) -> Vec<(String, String)>;
    /// For the layer that knows its type (the bridge takes its questions).
    fn as_any(&self) -> &dyn std::any::Any;
}

/// The platform's half of confinement.
pub trait Enforce: Send + Sync {
    fn platform(&self) -> Platform;
    /// How commands are confined, in words for the log and the editor
    /// ("Linux namespaces+Landlock").
    fn describe(&self) -> String;
    /// Carried by every write denial in the system log (Seatbelt), so the
    /// bridge reads its own agent's only.
    fn violation_tag(&self) -> Option<&str> {
        None
    }
    /// What confines commands, as a confined tool names what it inherits
    /// (`run_code`'s `inherited: ...`): the same words the sandbox's own
    /// marker uses.
    fn confined_by(&self) -> String;
    /// What the sandbox does with the network under `table`, in one line
    /// for `doctor` and the editor's notice.
    fn network(&self, table: &crate::policy::network::NetworkPolicy) -> String {
        table.describe()
    }
    /// What this machine's sandbox lacks against the full one, in words
    /// for the editor's notice and the log (None: nothing).
    fn weaker(&self) -> Option<String> {
        None
    }
    /// Whether commands get a network of their own under `table`.
    fn own_network(&self, _table: &crate::policy::network::NetworkPolicy) -> bool {
        false
    }
    /// Writes what every command confined by `policy` shares into its
    /// private directory (Seatbelt's profile), and starts what it needs
    /// running beside it (Seatbelt's proxy). Called once per arming.
    fn prepare(
        &self,
        _policy: &Policy,
        _dir: Option<&GenerationDir>,
    ) -> Result<Option<Box<dyn Outside>>, ArmError> {
        Ok(None)
    }
    /// Starts, beside an arming about to begin, the reading of what its
    /// launch will look up on the machine (Linux: the sockets bound in
    /// other network namespaces), so the two overlap.
    fn look_ahead(&self) {}
    /// The argv that runs `command` confined by `armed`.
    fn wrap(
        &self,
        armed: &Armed,
        command: &Command,
        launch: Launch,
    ) -> Result<Vec<String>, ArmError>;
}

/// What this process can do about confinement: decided at start, and
/// again when a project turns the sandbox on in a bridge started without it.
#[derive(Clone)]
pub enum Sandbox {
    /// Not asked for: commands run as given.
    Off,
    /// Asked for, and this machine cannot arm it: every start is refused.
    Unavailable {
        requested_by: String,
        reason: String,
    },
    /// This platform's sandbox, ready to arm.
    Ready(Arc<dyn Enforce>),
}

/// What one command runs under.
pub enum Confinement {
    /// Nothing confines it; the words say so plainly.
    Unconfined,
    /// The user asked for a sandbox that cannot be armed: nothing is run.
    Refused(String),
    Armed(Box<Armed>),
}

/// A policy written out for this platform, with its private directory
/// (kept while anything confined by it may still start).
pub struct Armed {
    pub policy: Policy,
    /// Its private directory (an island of the policy), when commands
    /// are started by others ([`Starter::Spawned`]).
    pub dir: Option<GenerationDir>,
    /// Where the copy-on-write layers of shared caches live (Linux).
    pub layers: Option<PathBuf>,
    /// Which backend profile chose the agent's writable state, in words.
    pub backend_profile: String,
    /// The agent's name (from its launch chain) when no profile knows it:
    /// where it keeps its own state is asked of the user (see
    /// `policy::agents::own_state_location`).
    pub unprofiled_agent: Option<String>,
    /// The agent's shell shows the editor nothing (`Agent::quiet_shell`):
    /// where the platform can, the sandbox says each refused write itself.
    pub quiet_shell: bool,
    /// How many workspace roots are writable.
    pub roots: usize,
    /// The running process of this arming whose namespaces the commands
    /// started later for it enter (Linux: the generation's helper, a
    /// child of this process); None until the backend runs.
    pub holder: Option<i32>,
    /// The abstract socket the bridge hears the proxy's questions on
    /// (`network::asks`), when commands are started by others.
    pub network_asks: Option<String>,
    /// The proxy this process runs for the arming's commands, where the
    /// platform needs one outside the sandbox (macOS).
    pub outside: Option<Box<dyn Outside>>,
    enforcer: Arc<dyn Enforce>,
}

impl Armed {
    /// What this arming does with the network, in one line.
    pub fn network_line(&self) -> String {
        self.enforcer.network(&self.policy.network)
    }

    /// What this arming lacks against the full sandbox, in words.
    pub fn weaker(&self) -> Option<String> {
        self.enforcer.weaker()
    }

    /// Whether its commands get a network of their own, with a proxy that
    /// asks about what the table refuses.
    pub fn own_network(&self) -> bool {
        self.enforcer.own_network(&self.policy.network)
    }
}

impl Sandbox {
    /// This platform's sandbox, or why this machine cannot arm one.
    /// (`probe`: what the command line found this platform can arm; the
    /// platform is chosen there, not here.)
    pub fn detect(requested_by: String, probe: Result<Arc<dyn Enforce>, String>) -> Sandbox {
        match probe {
            Ok(enforcer) => Sandbox::Ready(enforcer),
            Err(reason) => Sandbox::Unavailable {
                requested_by,
                reason,
            },
        }
    }

    /// Whether generations started from now on are confined (and so a
    /// session that brings a root they do not cover needs a new arming).
    /// What runs already, and what it starts, is judged by its own
    /// [`Confinement`], not by this.
    pub fn arms(&self) -> bool {
        matches!(self, Sandbox::Ready(_))
    }

    pub fn platform(&self) -> Option<Platform> {
        match self {
            Sandbox::Ready(e) => Some(e.platform()),
            _ => None,
        }
    }

    pub fn violation_tag(&self) -> Option<&str> {
        match self {
            Sandbox::Ready(e) => e.violation_tag(),
            _ => None,
        }
    }

    /// The confinement every start gets when this sandbox is not ready
    /// to arm (`Err`), or its enforcer.
    fn ready(&self) -> Result<&Arc<dyn Enforce>, Confinement> {
        match self {
            Sandbox::Off => Err(Confinement::Unconfined),
            Sandbox::Unavailable {
                requested_by,
                reason,
            } => Err(Confinement::Refused(format!(
                "the sandbox was requested ({requested_by}), but {reason}, so nothing was started; \
                 remove the request, or start zcode-acp with --no-sandbox to run the agent unconfined on purpose"
            ))),
            Sandbox::Ready(enforcer) => Ok(enforcer),
        }
    }

    /// The one arming: builds the policy for `input` (with the managed root
    /// and, for commands others start, a fresh private directory of its own
    /// as islands) and has the platform write it out. Failing to arm refuses: nothing runs
    /// unconfined because arming went wrong.
    pub fn arm(
        &self,
        mut input: PolicyInput,
        managed: &ManagedRoot,
        backend_profile: String,
        starter: Starter,
    ) -> Confinement {
        let enforcer = match self.ready() {
            Ok(enforcer) => enforcer.clone(),
            Err(confinement) => return confinement,
        };
        let armed = (|| {
            let dir = match starter {
                Starter::Spawned => Some(GenerationDir::create(managed)?),
                Starter::ThisProcess => None,
            };
            input.profile_dir = dir.as_ref().map(|d| d.path.clone());
            // Its real path: a symlinked `~/.zcode-acp` is protected where
            // it leads.
            input.managed_root =
                crate::policy::resolve_real(&managed.path).unwrap_or_else(|_| managed.path.clone());
            let policy =
                Policy::build_resolving_links(&mut input, crate::policy::build::link_chain);
            let outside = enforcer.prepare(&policy, dir.as_ref())?;
            Ok::<_, ArmError>(Armed {
                roots: input.roots.len(),
                // Caches are layered with no root too (a generation armed
                // before any session opened): never shared, written directly.
                layers: Some(layers_for(
                    managed,
                    input
                        .roots
                        .first()
                        .map_or(std::path::Path::new("/"), |r| &r.path),
                )),
                policy,
                dir,
                backend_profile,
                unprofiled_agent: None,
                quiet_shell: false,
                holder: None,
                network_asks: (starter == Starter::Spawned).then(network_asks_name),
                outside,
                enforcer,
            })
        })();
        match armed {
            Ok(armed) => Confinement::Armed(Box::new(armed)),
            Err(e) => Confinement::Refused(format!("cannot arm the sandbox: {e}")),
        }
    }
}

impl Confinement {
    /// What confines commands, as a confined tool names what it inherits
    /// (`linux namespaces+landlock`); None when nothing does.
    pub fn confined_by(&self) -> Option<String> {
        match self {
            Confinement::Armed(a) => Some(a.enforcer.confined_by()),
            _ => None,
        }
    }

    /// Stops the proxy this process runs for the arming (its commands
    /// ended): nothing reaches out through it any more.
    pub fn stop_outside(&mut self) {
        if let Confinement::Armed(armed) = self {
            armed.outside = None;
        }
    }

    /// Names the running process that holds this arming (see
    /// [`Armed::holder`]); nothing when nothing is confined.
    pub fn held_by(&mut self, pid: i32) {
        if let Confinement::Armed(armed) = self {
            armed.holder = Some(pid);
        }
    }

    /// `pid` has stopped: it holds nothing from now on.
    pub fn released_by(&mut self, pid: i32) {
        if let Confinement::Armed(armed) = self {
            if armed.holder == Some(pid) {
                armed.holder = None;
            }
        }
    }

    /// The policy commands run under, when they are confined.
    pub fn policy(&self) -> Option<&Policy> {
        match self {
            Confinement::Armed(a) => Some(&a.policy),
            _ => None,
        }
    }

    /// The argv that runs `command` under this confinement (as given when
    /// unconfined), with the words that say what confines it.
    pub fn wrap(&self, command: &Command, launch: Launch) -> Result<Vec<String>, ArmError> {
        if command.argv.is_empty() {
            return Err(ArmError::Empty);
        }
        match self {
            // A backend gets a keeper (Linux): nothing of its tree outlives
            // a bridge that is killed.
            #[cfg(target_os = "linux")]
            Confinement::Unconfined if launch == Launch::Backend => {
                Ok(keeper_argv("/proc/self/exe", &command.argv))
            }
            Confinement::Unconfined => Ok(command.argv.clone()),
            Confinement::Refused(why) => Err(ArmError::Refused(why.clone())),
            Confinement::Armed(armed) => armed.enforcer.wrap(armed, command, launch),
        }
    }

    /// What confines commands, in words.
    pub fn describe(&self) -> String {
        match self {
            Confinement::Armed(a) => {
                let roots = a.roots;
                format!(
                    "{}, {roots} root{} writable",
                    a.enforcer.describe(),
                    if roots == 1 { "" } else { "s" }
                )
            }
            Confinement::Unconfined => "unconfined (no sandbox)".into(),
            Confinement::Refused(_) => "refused (nothing runs)".into(),
        }
    }
}

/// Where the copy-on-write layers of a project's shared caches live.
pub fn layers_for(managed: &ManagedRoot, root: &std::path::Path) -> PathBuf {
    managed
        .path
        .join("layers")
        .join(crate::config::managed::project_key(root))
}

/// What a backend generation is armed for.
pub struct BackendRequest<'a> {
    /// The backend command line as the user configured it (its state
    /// directories are chosen from it).
    pub argv: &'a [String],
    /// The union of the live sessions' roots.
    pub roots: &'a [PathBuf],
    /// Writes the user allowed for this bridge's lifetime.
    pub grants: &'a [PathBuf],
    pub state: &'a crate::policy::backends::StateSettings,
    pub managed: &'a ManagedRoot,
    /// Sockets (or directories of them) the bridge serves the agent and
    /// judges every request on (see `NetworkPolicy::served_sockets`).
    pub served_sockets: &'a [PathBuf],
}

impl Sandbox {
    /// Arms a backend generation: each project prepared
    /// (`config::project::prepare`), its policy input gathered as the
    /// bridge does, with the writable state and cache directories created
    /// beforehand.
    pub fn arm_backend(&self, request: &BackendRequest<'_>) -> Confinement {
        use crate::policy::discover::{create_writable_dirs, gather, Sources};
        let platform = match self.ready() {
            Ok(enforcer) => {
                enforcer.look_ahead();
                enforcer.platform()
            }
            Err(confinement) => return confinement,
        };
        // Arming records what the projects say that needs no approval
        // (the one place it is written), then reads.
        for root in request.roots {
            let real = crate::policy::resolve_real(root).unwrap_or_else(|_| root.clone());
            crate::config::project::prepare(&real, request.managed);
        }
        let gathered = gather(&Sources {
            platform,
            workspaces: request.roots,
            backend: request.argv,
            state: request.state,
            once_allows: request.grants,
            managed: request.managed,
        });
        match gathered {
            Ok(mut gathered) => {
                gathered.input.network.served_sockets = request.served_sockets.to_vec();
                create_writable_dirs(&gathered.input);
                let profile = gathered.backend.describe();
                tracing::info!(backend_profile = %profile, "the agent's own state is chosen by its backend profile");
                let unprofiled = gathered
                    .backend
                    .profiles
                    .is_empty()
                    .then(|| gathered.backend.agent.clone())
                    .flatten();
                let quiet_shell = gathered
                    .backend
                    .profiles
                    .iter()
                    .any(|p| p.agent().quiet_shell);
                let mut armed =
                    self.arm(gathered.input, request.managed, profile, Starter::Spawned);
                if let Confinement::Armed(a) = &mut armed {
                    a.unprofiled_agent = unprofiled;
                    a.quiet_shell = quiet_shell;
                }
                armed
            }
            Err(e) => Confinement::Refused(format!("cannot arm the sandbox: {e}")),
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::policy::build::{ProjectRules, RootInput};

    /// One workspace root, `home/ws`, and nothing else: what the
    /// platforms' own tests arm too.
    pub(crate) fn input(home: &std::path::Path, platform: Platform) -> PolicyInput {
        PolicyInput {
            links: Vec::new(),
            platform,
            home: home.to_path_buf(),
            roots: vec![RootInput {
                path: home.join("ws"),
                project: ProjectRules::default(),
                repos: vec![],
            }],
            backend_state: vec![],
            temp_and_caches: vec![],
            once_allows: vec![],
            profile_dir: None,
            managed_root: PathBuf::new(),
            network: Default::default(),
        }
    }

    fn command() -> Command {
        Command {
            argv: vec!["make".into(), "-j2".into()],
            env: vec![("CC".into(), "clang".into())],
            cwd: Some("/w".into()),
        }
    }

    #[test]
    fn a_sandbox_asked_for_and_unavailable_refuses_and_never_runs_unconfined() {
        let home = tempfile::tempdir().unwrap();
        let managed = ManagedRoot::for_home(home.path());
        let sandbox = Sandbox::Unavailable {
            requested_by: "ZCODE_ACP_SANDBOX=1".into(),
            reason: "neither namespaces nor Landlock are available".into(),
        };
        assert!(!sandbox.arms());
        let c = sandbox.arm(
            input(home.path(), Platform::Linux),
            &managed,
            "none".into(),
            Starter::Spawned,
        );
        let Confinement::Refused(why) = &c else {
            panic!("not refused: {}", c.describe())
        };
        assert!(why.contains("ZCODE_ACP_SANDBOX=1") && why.contains("--no-sandbox"));
        assert!(c.wrap(&command(), Launch::Backend).is_err());
        assert!(c.policy().is_none());
        // Nothing was written for it.
        assert!(!managed.path.exists());
    }

    #[test]
    fn off_runs_the_command_as_given_and_says_so() {
        let home = tempfile::tempdir().unwrap();
        let managed = ManagedRoot::for_home(home.path());
        let c = Sandbox::Off.arm(
            input(home.path(), Platform::Linux),
            &managed,
            "x".into(),
            Starter::Spawned,
        );
        assert_eq!(
            c.wrap(&command(), Launch::Terminal).unwrap(),
            ["make", "-j2"]
        );
        // A backend runs under its keeper on Linux (nothing of its tree
        // outlives a killed bridge), otherwise as given.
        let backend = c.wrap(&command(), Launch::Backend).unwrap();
        if cfg!(target_os = "linux") {
            assert_eq!(backend[1], "__keeper");
            assert_eq!(backend[backend.len() - 3..], ["--", "make", "-j2"]);
        } else {
            assert_eq!(backend, ["make", "-j2"]);
        }
        assert_eq!(c.describe(), "unconfined (no sandbox)");
        assert!(c.policy().is_none());
        let empty = Command::default();
        assert!(matches!(
            c.wrap(&empty, Launch::Backend),
            Err(ArmError::Empty)
        ));
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn linux_launches_carry_the_probed_level_and_terminals_read_theirs_once() {
        use crate::linux::enforce::LinuxEnforcer;
        use crate::linux::exec::{LaunchSpec, Level};
        let home = tempfile::tempdir().unwrap();
        let home = crate::policy::resolve_real(home.path()).unwrap();
        std::fs::create_dir_all(home.join("ws")).unwrap();
        let managed = ManagedRoot::for_home(&home);
        let enforcer = LinuxEnforcer {
            level: Level::MountsOnly,
            landlock_abi: 3,
            network_namespace: true,
        };
        let sandbox = Sandbox::Ready(Arc::new(enforcer));
        let c = sandbox.arm(
            input(&home, Platform::Linux),
            &managed,
            "none".into(),
            Starter::Spawned,
        );
        assert_eq!(
            c.describe(),
            "Linux mounts only (no Landlock), 1 root writable"
        );
        let Confinement::Armed(armed) = &c else {
            panic!("not armed: {}", c.describe())
        };
        // Its own directory is an island of the policy it wrote.
        let dir = armed.dir.as_ref().unwrap().path.clone();
        assert!(dir.starts_with(&managed.path));
        let inside = dir.join("launch.json");
        assert!(
            !armed
                .policy
                .evaluate_resolved(&inside, crate::policy::Op::Write)
                .allowed
        );
        assert_eq!(armed.layers, Some(layers_for(&managed, &home.join("ws"))));

        let spec_of = |argv: &[String]| -> LaunchSpec {
            assert_eq!(&argv[1..3], &["__sandbox", "--spec"]);
            let file = PathBuf::from(&argv[3]);
            assert!(file.starts_with(&dir), "{argv:?}");
            serde_json::from_slice(&std::fs::read(file).unwrap()).unwrap()
        };
        let backend = c.wrap(&command(), Launch::Backend).unwrap();
        assert_eq!(backend.len(), 4, "{backend:?}");
        let spec = spec_of(&backend);
        assert_eq!(
            (spec.level, spec.landlock_abi),
            (Some(Level::MountsOnly), Some(3))
        );
        assert_eq!(spec.argv, ["make", "-j2"]);
        assert_eq!(spec.env, [("CC".to_owned(), "clang".to_owned())]);
        assert_eq!(spec.cwd, Some(PathBuf::from("/w")));

        let terminal = c.wrap(&command(), Launch::Terminal).unwrap();
        assert_eq!(&terminal[4..], &["--consume", "--die-with-parent"]);
        assert_ne!(terminal[3], backend[3]);
        assert_eq!(spec_of(&terminal).level, Some(Level::MountsOnly));

        // The arming's files go with it.
        drop(c);
        assert!(!dir.exists());
    }
}
