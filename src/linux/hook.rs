//! The bridge's spawn hook on Linux: every backend generation runs under the
//! launcher, armed for the roots of that moment.
//!
//! The launch spec (plan and command) is written to the generation's
//! private directory under the managed root, then this same binary is
//! re-executed as `zcode-acp __sandbox --spec FILE`: a fresh single-threaded
//! process that arms the namespaces and Landlock and runs the backend.

use std::path::PathBuf;

use crate::backend::spawn::{
    arming_input, PreparedCommand, SpawnContext, SpawnError, SpawnHook, TerminalCommand,
};
use crate::config::generation::GenerationDir;
use crate::config::managed::ManagedRoot;
use crate::linux::exec::LaunchSpec;
use crate::linux::plan::{self, RealFs, Session};
use crate::policy::backends::StateSettings;
use crate::policy::{Platform, Policy};

pub struct LinuxSandbox {
    pub managed: ManagedRoot,
    pub state: StateSettings,
    /// What this machine lets us arm (the helper decides again at each
    /// launch; this is for what the log and the editor are told).
    pub level: crate::linux::exec::Level,
    /// The directory of the running generation; replaced (and removed) when
    /// the next one is prepared, which happens after the old one stopped.
    current: Option<GenerationDir>,
    /// The policy the running generation was armed with.
    policy: Option<Policy>,
    /// Where the running generation's caches' layers live (its terminals
    /// take slots there too).
    layers: Option<PathBuf>,
    landlock_abi: i32,
}

impl LinuxSandbox {
    /// Checks what this machine can arm, refusing when it is nothing.
    pub fn new(managed: ManagedRoot, state: StateSettings) -> Result<LinuxSandbox, String> {
        // The test knob only ever takes capabilities away, never the sandbox.
        let no_test = |var: &str| std::env::var_os(var).is_none();
        // Probed once: every launch of this bridge carries the level and
        // ABI decided here, so what is announced is what is armed.
        let abi = super::landlock_abi();
        let landlock = abi >= 1 && no_test("ZCODE_ACP_TEST_NO_LANDLOCK");
        let namespaces =
            crate::linux::exec::namespaces_available() && no_test("ZCODE_ACP_TEST_NO_NAMESPACES");
        let level = crate::linux::exec::choose_level(namespaces, landlock)?;
        if level != crate::linux::exec::Level::Full {
            tracing::warn!(
                "the sandbox will be armed at a lower level: {}",
                level.name()
            );
        }
        Ok(LinuxSandbox {
            managed,
            state,
            level,
            landlock_abi: abi,
            current: None,
            policy: None,
            layers: None,
        })
    }
}

impl SpawnHook for LinuxSandbox {
    fn prepare(&mut self, ctx: &SpawnContext<'_>) -> Result<PreparedCommand, SpawnError> {
        if ctx.argv.is_empty() {
            return Err(SpawnError::Empty);
        }
        self.current = None;
        self.policy = None;
        let (mut input, backend_profile) =
            arming_input(Platform::Linux, ctx, &self.state, &self.managed)?;
        let dir = GenerationDir::create(&self.managed).map_err(SpawnError::cannot_arm)?;
        input.profile_dir = Some(dir.path.clone());
        let policy = Policy::build(&input);
        self.layers = ctx.roots.first().map(|r| layers_for(&self.managed, r));
        let session = Session {
            layers: self.layers.clone(),
            ..Session::current()
        };
        let plan = plan::build(&policy, &RealFs, &session);
        for gap in &plan.gaps {
            tracing::debug!(path = %gap.path.display(), "not enforced on Linux: {}", gap.why);
        }
        let spec = LaunchSpec::new(plan, &policy, ctx.argv.to_vec(), Vec::new(), None)
            .armed_at(self.level, self.landlock_abi);
        let text = serde_json::to_string(&spec).map_err(SpawnError::cannot_arm)?;
        let file = dir
            .write_file("launch.json", &text)
            .map_err(SpawnError::cannot_arm)?;
        let exe = std::env::current_exe().map_err(SpawnError::cannot_arm)?;
        self.current = Some(dir);
        self.policy = Some(policy);
        Ok(PreparedCommand {
            argv: vec![
                exe.to_string_lossy().into_owned(),
                "__sandbox".into(),
                "--spec".into(),
                file.to_string_lossy().into_owned(),
            ],
            env: Vec::new(),
            confinement: format!(
                "Linux {}, {} root{} writable",
                match self.level {
                    crate::linux::exec::Level::Full => "namespaces+Landlock",
                    crate::linux::exec::Level::MountsOnly => "mounts only (no Landlock)",
                    crate::linux::exec::Level::LandlockOnly => "Landlock only (no namespaces)",
                },
                ctx.roots.len(),
                if ctx.roots.len() == 1 { "" } else { "s" }
            ),
            backend_profile: Some(backend_profile),
        })
    }

    fn confines(&self) -> bool {
        true
    }

    fn policy(&self) -> Option<&Policy> {
        self.policy.as_ref()
    }

    fn terminal(&self, command: TerminalCommand) -> Result<Vec<String>, String> {
        let (Some(policy), Some(dir)) = (&self.policy, &self.current) else {
            return Err(
                "no generation is armed, so there is no policy to run the terminal under".into(),
            );
        };
        terminal_launch(
            (self.level, self.landlock_abi),
            policy,
            dir,
            self.layers.clone(),
            command.argv,
            command.env,
            command.cwd,
        )
    }
}

/// Where the copy-on-write layers of a project's shared caches live.
pub fn layers_for(managed: &ManagedRoot, root: &std::path::Path) -> PathBuf {
    managed
        .path
        .join("layers")
        .join(crate::config::managed::project_key(root))
}

/// `zcode-acp __sandbox --spec FILE`: the helper stage. Reads the spec
/// (never through a symlink) and runs it. Must run before any thread.
pub fn helper(
    spec_file: &std::path::Path,
    consume: bool,
    die_with_parent: bool,
) -> Result<i32, String> {
    if die_with_parent {
        nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
            .map_err(|e| format!("cannot set the parent-death signal: {e}"))?;
    }
    let bytes = crate::config::atomic::read_nofollow(spec_file)
        .map_err(|e| format!("cannot read the launch spec {}: {e}", spec_file.display()))?;
    if consume {
        let _ = std::fs::remove_file(spec_file);
    }
    let spec: LaunchSpec =
        serde_json::from_slice(&bytes).map_err(|e| format!("the launch spec is not valid: {e}"))?;
    crate::linux::exec::run(&spec).map_err(|e| format!("cannot arm the sandbox: {e}"))
}

/// Writes a one-shot launch spec for a command the editor will run (an
/// ACP terminal) under the same policy, and returns the helper's argv.
/// The spec lives in the running generation's directory under the managed
/// root, which no sandboxed process can write; the helper removes it once
/// read, and one the editor never started goes with the directory (when
/// the next generation is prepared, or by the sweep after a crash).
pub fn terminal_launch(
    level: (crate::linux::exec::Level, i32),
    policy: &Policy,
    dir: &GenerationDir,
    layers: Option<PathBuf>,
    argv: Vec<String>,
    env: Vec<(String, String)>,
    cwd: Option<PathBuf>,
) -> Result<Vec<String>, String> {
    let session = Session {
        layers,
        ..Session::current()
    };
    let plan = plan::build(policy, &RealFs, &session);
    let spec = LaunchSpec::new(plan, policy, argv, env, cwd).armed_at(level.0, level.1);
    let text = serde_json::to_string(&spec).map_err(|e| e.to_string())?;
    let name = format!(
        "terminal-{:016x}{:016x}.json",
        rand::random::<u64>(),
        rand::random::<u64>()
    );
    let file = dir.write_file(&name, &text).map_err(|e| e.to_string())?;
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    Ok(vec![
        exe.to_string_lossy().into_owned(),
        "__sandbox".into(),
        "--spec".into(),
        file.to_string_lossy().into_owned(),
        "--consume".into(),
        "--die-with-parent".into(),
    ])
}
