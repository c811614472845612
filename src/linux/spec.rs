//! The launch spec: everything the helper needs, written by the caller
//! (the bridge, `run`) and read once by the helper.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::level::Level;
use super::plan::Plan;

/// Everything the helper needs: the plan and the command.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LaunchSpec {
    pub plan: Plan,
    pub argv: Vec<String>,
    /// Applied after the sandbox is armed (so nothing the caller sets can
    /// run code in the helper itself).
    #[serde(default)]
    pub env: Vec<(String, String)>,
    #[serde(default)]
    pub cwd: Option<PathBuf>,
    /// The policy, when the plan has supervised directories: the
    /// supervisor decides each name with it.
    #[serde(default)]
    pub policy: Option<crate::policy::Policy>,
    /// The level the caller decided and announced, and the Landlock ABI it
    /// probed: the helper arms exactly that, or refuses. `None` (`zcode-acp
    /// run`, where the helper is the caller): the helper decides itself.
    #[serde(default)]
    pub level: Option<Level>,
    #[serde(default)]
    pub landlock_abi: Option<i32>,
    /// The command gets `env` alone, not the helper's environment with
    /// `env` on top (`run_code`: an allowlist, never inherited).
    #[serde(default)]
    pub clear_env: bool,
    /// A generation's namespaces to enter instead of building new ones
    /// (an editor terminal of an armed bridge; see [`super::join`]).
    #[serde(default)]
    pub join: Option<super::join::Join>,
    /// The network table, when the sandbox gets a network of its own
    /// (see [`super::net`]); `None`: the host's network, as it is.
    #[serde(default)]
    pub network: Option<crate::policy::network::NetworkPolicy>,
    /// Where the proxy asks about the connections the table refuses (the
    /// bridge's abstract socket, see `network::asks`); none: refusals are
    /// final.
    #[serde(default)]
    pub network_asks: Option<String>,
    /// Where the proxy says what it carried (`network::ledger`); none:
    /// nothing is counted.
    #[serde(default)]
    pub network_ledger: Option<String>,
    /// Where the helper says what it could not set up as planned (a
    /// file in the arming's private directory, which the bridge reads into
    /// the editor's notice); none: stderr only (`zcode-acp run`).
    #[serde(default)]
    pub report: Option<PathBuf>,
    /// An editor terminal's: the generation's hold lock (see
    /// `hold::HOLD_LOCK`), taken shared until the command's first process
    /// exists, so a terminal never starts while the agent is held.
    #[serde(default)]
    pub hold_lock: Option<PathBuf>,
    /// `zcode-acp run`: the supervisor also watches the calls that make or
    /// remove names, and the helper ends with a line naming the writes the
    /// sandbox refused (see `supervise::refusals`).
    #[serde(default)]
    pub note_refusals: bool,
    /// An agent whose shell shows the editor nothing (`Agent::quiet_shell`):
    /// the supervisor says each refused write on stderr as it happens
    /// (`policy::refused::announcement`), for the bridge to offer.
    #[serde(default)]
    pub announce_refusals: bool,
    /// `zcode-acp run`'s pipe, where the launcher writes one byte once it
    /// has decided: [`OWN_NETWORK`] when the command gets a network of its
    /// own (behind the proxy), anything else when it shares the host's
    /// (then the proxy's count socket, bound by `run` in the host's
    /// network, is one the command could send to, and its counts are not
    /// said). Only in a forked launcher: never written to a file.
    #[serde(skip)]
    pub says_its_network: Option<std::os::fd::RawFd>,
    /// `zcode-acp run`'s other pipe: the launcher sets the sandbox up
    /// while `run` takes the audit's baseline, and starts nothing of the
    /// command's until `run` writes one byte there (the baseline is
    /// whole). An end of file (`run` ended first) refuses the launch.
    /// Only in a forked launcher: never written to a file.
    #[serde(skip)]
    pub waits_for_go: Option<std::os::fd::RawFd>,
}

/// What the launcher writes on [`LaunchSpec::says_its_network`] when the
/// command has a network of its own.
pub const OWN_NETWORK: u8 = b'n';

impl LaunchSpec {
    /// The launch of `argv` under `plan`, carrying `policy` where the
    /// supervisor needs it.
    pub fn new(
        plan: Plan,
        policy: &crate::policy::Policy,
        argv: Vec<String>,
        env: Vec<(String, String)>,
        cwd: Option<PathBuf>,
    ) -> LaunchSpec {
        let policy = (!plan.supervised.is_empty()).then(|| policy.clone());
        LaunchSpec {
            plan,
            argv,
            env,
            cwd,
            policy,
            level: None,
            landlock_abi: None,
            clear_env: false,
            join: None,
            network: None,
            network_asks: None,
            network_ledger: None,
            report: None,
            hold_lock: None,
            note_refusals: false,
            announce_refusals: false,
            says_its_network: None,
            waits_for_go: None,
        }
    }

    /// Notes the writes the sandbox refuses, to name them when the command
    /// ends, where this kernel lets a supervisor watch them.
    pub fn noting_refusals(mut self, policy: &crate::policy::Policy) -> LaunchSpec {
        if super::supervise::available() {
            self.note_refusals = true;
            self.policy.get_or_insert_with(|| policy.clone());
        }
        self
    }

    /// A network of its own under `table` where `own` (the table does not
    /// share the host's, and the machine allows it).
    pub fn with_network(
        mut self,
        table: &crate::policy::network::NetworkPolicy,
        own: bool,
    ) -> LaunchSpec {
        self.network = own.then(|| table.clone());
        self
    }

    /// The level decided (and announced) by the caller, with the Landlock
    /// ABI it probed: the helper arms exactly that, or refuses.
    pub fn armed_at(mut self, level: Level, landlock_abi: i32) -> LaunchSpec {
        self.level = Some(level);
        self.landlock_abi = Some(landlock_abi);
        self
    }

    /// No level announced (a caller that did not probe): the launcher arms
    /// the most this machine allows, a network namespace of its own
    /// included where it can, and says in the log what it could not.
    pub fn level_left_to_the_launcher(mut self) -> LaunchSpec {
        self.level = None;
        self
    }
}
