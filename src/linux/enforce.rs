//! Linux's half of confinement: a command runs under this same binary
//! re-executed as `zcode-acp __sandbox --spec FILE`, a fresh
//! single-threaded process that arms the namespaces and Landlock from the
//! launch spec and then runs the command.
//!
//! The spec is written into the arming's private directory under the
//! managed root, which no sandboxed process can write. The launch spec is
//! built here and nowhere else.

use crate::confine::{ArmError, Armed, Command, Enforce, Launch};
use crate::linux::exec::{choose_level, namespaces_available, LaunchSpec, Level};
use crate::linux::plan::{self, RealFs, UserFacts};
use crate::policy::Platform;

/// What this machine lets us arm, probed once: every launch carries the
/// level and Landlock ABI decided here, so what is announced is what is
/// armed (the helper refuses anything less). `zcode-acp run`, which
/// announces nothing, takes one [`LinuxEnforcer::unprobed`] instead.
#[derive(Debug, Clone, Copy)]
pub struct LinuxEnforcer {
    pub level: Level,
    pub landlock_abi: i32,
    /// Whether its sandboxes can have a network namespace of their own.
    pub network_namespace: bool,
}

impl LinuxEnforcer {
    /// Checks what this machine can arm, refusing when it is nothing.
    pub fn probe() -> Result<LinuxEnforcer, crate::linux::exec::NothingToArm> {
        // The test knobs only ever take capabilities away, never the sandbox.
        let no_test = |var: &str| std::env::var_os(var).is_none();
        let abi = super::landlock_abi();
        let landlock = abi >= 1 && no_test("ZCODE_ACP_TEST_NO_LANDLOCK");
        let available = namespaces_available();
        let namespaces = available.namespaces && no_test("ZCODE_ACP_TEST_NO_NAMESPACES");
        let level = choose_level(namespaces, landlock)?;
        if level != Level::Full {
            tracing::warn!(
                "the sandbox will be armed at a lower level: {}",
                level.name()
            );
        }
        let network_namespace = level != Level::LandlockOnly
            && available.network
            && no_test("ZCODE_ACP_TEST_NO_NETWORK_NAMESPACE");
        if level != Level::LandlockOnly && !network_namespace {
            tracing::warn!("this machine refuses the sandbox a network namespace of its own: the network is NOT confined");
        }
        Ok(LinuxEnforcer {
            level,
            landlock_abi: abi,
            network_namespace,
        })
    }

    /// For a launch that decides its own level (`zcode-acp run`): nothing
    /// forked to probe. A namespace made and thrown away costs about what
    /// the launch's own does (its network namespace's teardown most), so
    /// the launcher tries the full sandbox and arms what the machine
    /// allows, saying what it could not (see [`LaunchSpec::level_left_to_the_launcher`]).
    /// None under the test knobs that take namespaces away: those probe.
    pub fn unprobed() -> Option<LinuxEnforcer> {
        const KNOBS: [&str; 3] = [
            "ZCODE_ACP_TEST_NO_LANDLOCK",
            "ZCODE_ACP_TEST_NO_NAMESPACES",
            "ZCODE_ACP_TEST_NO_NETWORK_NAMESPACE",
        ];
        if KNOBS.iter().any(|k| std::env::var_os(k).is_some()) {
            return None;
        }
        // The test knob stands for an older kernel's Landlock (one without
        // the scoping of signals and abstract sockets): it only lowers.
        let abi = std::env::var("ZCODE_ACP_TEST_LANDLOCK_ABI")
            .ok()
            .and_then(|v| v.parse().ok())
            .map_or(super::landlock_abi(), |cap: i32| {
                cap.min(super::landlock_abi())
            });
        Some(LinuxEnforcer {
            level: if abi >= 1 {
                Level::Full
            } else {
                Level::MountsOnly
            },
            landlock_abi: abi,
            network_namespace: true,
        })
    }

    /// The launch of `command` under `armed`'s policy.
    pub fn spec(&self, armed: &Armed, command: &Command) -> LaunchSpec {
        let facts = UserFacts {
            layers: armed.layers.clone(),
            ..UserFacts::current()
        };
        let plan = plan::build(&armed.policy, &RealFs, &facts);
        for gap in &plan.gaps {
            tracing::debug!(path = %gap.path.display(), "not enforced on Linux: {}", gap.why);
        }
        LaunchSpec::new(
            plan,
            &armed.policy,
            command.argv.clone(),
            command.env.clone(),
            command.cwd.clone(),
        )
        .armed_at(self.level, self.landlock_abi)
        .with_network(
            &armed.policy.network,
            self.own_network(&armed.policy.network),
        )
    }
}

/// The generation's own launch spec, in its directory for as long as it runs.
const BACKEND_SPEC: &str = "launch.json";
/// Where the helpers of an arming say what they set up less than planned.
pub const REPORT: &str = "degraded.txt";

/// What the helpers of `armed` set up less than planned, each said once.
pub fn degradations(armed: &Armed) -> Vec<String> {
    let Some(dir) = &armed.dir else {
        return Vec::new();
    };
    let Ok(bytes) = crate::config::atomic::read_nofollow(&dir.path.join(REPORT)) else {
        return Vec::new();
    };
    let mut out: Vec<String> = Vec::new();
    for line in String::from_utf8_lossy(&bytes).lines() {
        if !line.is_empty() && !out.iter().any(|l| l == line) && out.len() < 20 {
            out.push(line.to_owned());
        }
    }
    out
}

/// The generation's namespaces for a terminal to enter, when its helper
/// has made them and they are what the terminal's own arming would make
/// now: a socket bound, or a protected path created, since the generation
/// was armed would be covered by a fresh arming, so then the terminal
/// arms afresh rather than take the generation's older view.
fn joinable(armed: &Armed, terminal: &LaunchSpec) -> Option<crate::linux::join::Join> {
    let holder = armed.holder?;
    let dir = armed.dir.as_ref()?;
    let bytes = crate::config::atomic::read_nofollow(&dir.path.join(BACKEND_SPEC)).ok()?;
    let generation: LaunchSpec = serde_json::from_slice(&bytes).ok()?;
    if generation.plan.mount_ops() != terminal.plan.mount_ops() {
        tracing::debug!(
            "the filesystem changed since the generation was armed: the terminal arms afresh"
        );
        return None;
    }
    let mut join = crate::linux::join::Join::of_child(holder)?;
    if join.net.is_some() != terminal.network.is_some() {
        // A network of its own was to be joined, or none was, and the
        // generation's is otherwise.
        return None;
    }
    // The slot whose layers the terminal will work in, which it holds
    // while it runs; a layered generation whose slot cannot be told is
    // not joined.
    if let (Some(base), false) = (&terminal.plan.layers, terminal.plan.layered.is_empty()) {
        join.slot = Some(crate::linux::layers::held_by(holder, base)?);
    }
    Some(join)
}

impl Enforce for LinuxEnforcer {
    fn platform(&self) -> Platform {
        Platform::Linux
    }

    fn confined_by(&self) -> String {
        self.level.confined_by().into()
    }

    fn weaker(&self) -> Option<String> {
        (self.level != Level::Full).then(|| {
            format!(
                "The sandbox is armed at a lower level here: {}.",
                self.level.name()
            )
        })
    }

    fn look_ahead(&self) {
        crate::linux::listening::prefetch();
    }

    fn own_network(&self, table: &crate::policy::network::NetworkPolicy) -> bool {
        table.confines() && self.level != Level::LandlockOnly && self.network_namespace
    }

    fn network(&self, table: &crate::policy::network::NetworkPolicy) -> String {
        if !table.confines() {
            return table.describe();
        }
        match self.level {
            Level::LandlockOnly => "NOT confined at this level (no namespaces): the host's loopback, the LAN and the internet are reachable directly".into(),
            _ if !self.network_namespace => "NOT confined: this machine refuses the sandbox a network namespace of its own, so the host's loopback, the LAN and the internet are reachable directly".into(),
            _ => format!(
                "a network of its own; out through the sandbox's proxy: {}",
                table.describe()
            ),
        }
    }

    fn describe(&self) -> String {
        match self.level {
            Level::Full => "Linux namespaces+Landlock",
            Level::MountsOnly => "Linux mounts only (no Landlock)",
            Level::LandlockOnly => "Linux Landlock only (no namespaces)",
        }
        .into()
    }

    /// `zcode-acp __sandbox --spec FILE`; a terminal's spec is removed by
    /// the helper once read (one the editor never started goes with the
    /// directory), and the terminal dies with whoever started it.
    fn wrap(
        &self,
        armed: &Armed,
        command: &Command,
        launch: Launch,
    ) -> Result<Vec<String>, ArmError> {
        let mut spec = self.spec(armed, command);
        // The bridge listens there for as long as the generation runs.
        if spec.network.is_some() && self.level != Level::LandlockOnly {
            spec.network_asks = armed.network_asks.clone();
            spec.network_ledger = armed
                .network_asks
                .as_deref()
                .map(crate::confine::network_ledger_name);
        }
        // An agent whose shell shows nothing: its refused writes are said
        // by the supervisor instead (where this kernel has one), at one
        // round trip per call that makes a name.
        if launch == Launch::Backend && armed.quiet_shell {
            spec = spec.noting_refusals(&armed.policy);
            spec.announce_refusals = spec.note_refusals;
            if !spec.announce_refusals {
                tracing::warn!("the agent's shell shows the editor nothing, and its writes cannot be watched here (a kernel before 5.14, or a sandbox or container around zcode-acp that already holds a seccomp listener): a write the sandbox refuses in its shell is refused without a question in the editor; allow a place with `zcode-acp allow PATH`");
            }
        }
        if launch == Launch::Terminal {
            spec.join = joinable(armed, &spec);
            spec.hold_lock = armed
                .dir
                .as_ref()
                .map(|d| d.path.join(crate::linux::hold::HOLD_LOCK));
        }
        // What the helper cannot set up as planned, for the bridge to say.
        spec.report = armed.dir.as_ref().map(|d| d.path.join(REPORT));
        let text = serde_json::to_string(&spec)?;
        let name = match launch {
            Launch::Backend => BACKEND_SPEC.to_owned(),
            Launch::Terminal => format!(
                "terminal-{:016x}{:016x}.json",
                rand::random::<u64>(),
                rand::random::<u64>()
            ),
        };
        let dir = armed.dir.as_ref().ok_or(ArmError::NoDir)?;
        let file = dir.write_file(&name, &text)?;
        let exe = std::env::current_exe().map_err(ArmError::OwnPath)?;
        let mut argv = vec![
            exe.to_string_lossy().into_owned(),
            "__sandbox".into(),
            "--spec".into(),
            file.to_string_lossy().into_owned(),
        ];
        if launch == Launch::Terminal {
            argv.extend(["--consume".into(), "--die-with-parent".into()]);
        }
        Ok(argv)
    }
}
