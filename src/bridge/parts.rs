//! The bridge's state, in named parts: each holds the fields of one
//! concern, so that `Bridge` itself is a handful of parts a reader can hold
//! in their head. The decisions live in the state machines the parts hold
//! (`lifecycle`, `permissions`, `routing`, `net_asks`, `hold`), each tested
//! alone; the loop in `mod.rs` carries their effects out.

use std::collections::{HashSet, VecDeque};
use std::path::PathBuf;

use tokio::sync::mpsc;

use super::track::RestoreCaps;
use super::{net_asks, permissions, restart, watch, Backlogged, EditorEvent};
use crate::backend::{BackendEvent, Generation};
use crate::relay::budget::{Budget, Permit};
use crate::relay::writer::{FrameWriter, WriteFailed};
use crate::session::SessionTable;

/// The editor's side of the bridge.
pub(super) struct EditorLink {
    /// The thread writing the editor's stdout (see `editor_io`).
    pub out: Option<FrameWriter>,
    /// Fires when writing to the editor fails: it has gone.
    pub failed: WriteFailed,
    /// The bytes in flight toward the editor, shared by every generation's
    /// reader (see `relay::budget`).
    pub budget: Budget,
    /// The permit of the frame being handled: it goes with the first frame
    /// that handling sends on, and is released when handling ends.
    pub carried: std::cell::Cell<Option<Permit>>,
    /// What the editor sends, frame by frame.
    pub inbox: mpsc::Receiver<EditorEvent>,
    /// Whether the first session was told the sandbox state.
    pub announced_first: bool,
    /// How many notices of the bridge's own were sent (their ids).
    pub announcements: u64,
    /// Projects whose sandbox.json's unknown keys were said (once each).
    pub keys_said: std::collections::HashSet<std::path::PathBuf>,
}

/// The backend generations.
pub(super) struct Generations {
    pub tx: crate::backend::EventSender,
    pub rx: mpsc::UnboundedReceiver<(u64, BackendEvent)>,
    /// Frames a generation handed on in a batch and not handled yet; they
    /// come before any later event.
    pub backlog: VecDeque<Backlogged>,
    /// The generation being set up, while it is.
    pub setup: Option<restart::Setup>,
    /// The running one.
    pub current: Option<Generation>,
    /// Generations that died; stopped (leftovers killed) by the restart.
    pub dying: Vec<Generation>,
    /// How many were started.
    pub started: u64,
    /// The roots the running generation was armed for.
    pub armed_roots: Vec<PathBuf>,
    /// Roots a queued request needs, for the next generation.
    pub pending_roots: Vec<PathBuf>,
}

/// The sessions, and what restoring them in a new generation needs.
#[derive(Default)]
pub(super) struct Sessions {
    pub table: SessionTable,
    /// The editor's `initialize` and `authenticate`, replayed to each new
    /// generation.
    pub initialize: Option<String>,
    pub authenticate: Option<String>,
    pub caps: RestoreCaps,
}

/// What is put to the user.
pub(super) struct Asks {
    /// What the user said about writes (see `permissions`).
    pub writes: permissions::Permissions,
    /// What the user said about connections, and the socket the running
    /// generation's proxy asks on (see `net_asks`).
    pub net: net_asks::NetPermissions,
    pub net_asks: net_asks::NetAsks,
    /// The places an agent no profile knows was asked about (once each),
    /// and whether such a question is open now (one at a time).
    pub agent_state: HashSet<PathBuf>,
    pub agent_state_open: bool,
    /// The system log reader for the sandbox's tag, when it has one (macOS).
    pub violations: Option<watch::ViolationWatch>,
    /// What the generation's proxy carried, by turn (see `ledger`).
    pub ledger: super::ledger::TurnLedger,
}

/// The audit of the running generation.
pub(super) struct AuditState {
    /// What the running armed generation started with.
    pub base: Option<crate::audit::Baseline>,
    /// Which look runs off the loop, which is asked for next, and the
    /// turns' answers each holds back.
    pub looks: Looks,
    /// Where the agent's versions it cannot hold in memory are kept.
    pub stash: crate::audit::stash::Stash,
    /// Paths with a keep question open (asked once until answered).
    pub questions: HashSet<PathBuf>,
    /// The watcher of the running generation, and where it says a change
    /// was seen, with its number: what a watcher let go still says is
    /// dropped (its generation was audited as it stopped).
    pub watch: Option<crate::audit::watch::Watcher>,
    pub watch_serial: u64,
    pub changes_tx: mpsc::UnboundedSender<(u64, Vec<PathBuf>)>,
    pub changes: mpsc::UnboundedReceiver<(u64, Vec<PathBuf>)>,
    /// The paths the watcher saw change since the last look.
    pub dirty: Vec<PathBuf>,
}

/// `run_code`'s side.
pub(super) struct CodeSide {
    /// The files handing sessions' MCP servers to their run_code server.
    pub servers_files: crate::run_code::inject::ServersFiles,
    /// The sockets that give run_code the editor's files.
    pub tools: super::code_tools::CodeTools,
}

/// The audit's looks off the loop, one at a time, and the turns' answers
/// they hold back: the editor sees a turn end only once the look that
/// covers it has reverted what it found.
#[derive(Default)]
pub(super) struct Looks {
    /// Which baseline a look is judged against (a new one at each arming,
    /// and each time the user keeps a finding): a look started on an older
    /// one that finishes late is dropped.
    epoch: u64,
    /// The session of the look running, if one is; and of one asked for
    /// meanwhile, started when it is done.
    running: Option<String>,
    again: Option<String>,
    /// The answers of turns that ended before the running look started
    /// (it covers them), and of those that ended since (the next covers
    /// them).
    held: Vec<Vec<u8>>,
    held_next: Vec<Vec<u8>>,
}

/// What to do when a look is done.
#[derive(Debug, PartialEq)]
pub(super) struct LookDone {
    /// Whether its findings are about the baseline in force (else dropped).
    pub current: bool,
    /// The turns' answers it covered, for the editor now.
    pub release: Vec<Vec<u8>>,
    /// The session of a look asked for meanwhile, to start now.
    pub again: Option<String>,
}

impl Looks {
    /// The baseline changed (a new arming, or a look on the loop that
    /// covers everything so far): a look still running brings stale
    /// findings, which are dropped.
    pub fn outdate(&mut self) {
        self.epoch += 1;
    }

    /// The user kept a finding while a look ran on the baseline before it:
    /// that look would revert what was kept, so it is dropped and runs
    /// again on the new baseline.
    pub fn rerun(&mut self) {
        self.outdate();
        if let Some(session) = self.running.clone() {
            self.again.get_or_insert(session);
        }
    }

    /// A turn ended: its answer waits for the look that covers it (the
    /// next, when one is already running: that one started before the turn
    /// ended).
    pub fn hold(&mut self, answer: Vec<u8>) {
        if self.running.is_some() {
            self.held_next.push(answer);
        } else {
            self.held.push(answer);
        }
    }

    /// A look for `session` is wanted: the epoch it runs on when it starts
    /// now, or `None` when one is running (it is started after that one).
    pub fn start(&mut self, session: &str) -> Option<u64> {
        if self.running.is_some() {
            self.again = Some(session.to_owned());
            return None;
        }
        self.running = Some(session.to_owned());
        Some(self.epoch)
    }

    /// The look started on `epoch` is done.
    pub fn finish(&mut self, epoch: u64) -> LookDone {
        self.running = None;
        let current = epoch == self.epoch;
        let mut looked_after = std::mem::take(&mut self.held);
        let release = if !current && self.again.is_some() {
            // Dropped for a newer baseline: its turns wait for the look
            // that runs again.
            looked_after.append(&mut self.held_next);
            self.held_next = looked_after;
            Vec::new()
        } else {
            looked_after
        };
        self.held = std::mem::take(&mut self.held_next);
        LookDone {
            current,
            release,
            again: self.again.take(),
        }
    }

    /// Whether any turn's answer waits on a look.
    pub fn holds_any(&self) -> bool {
        !self.held.is_empty() || !self.held_next.is_empty()
    }

    /// Every answer held, in the order the turns ended.
    pub fn take_held(&mut self) -> Vec<Vec<u8>> {
        let mut all = std::mem::take(&mut self.held);
        all.append(&mut self.held_next);
        all
    }
}

#[cfg(test)]
mod looks_tests {
    use super::*;

    fn answer(n: u8) -> Vec<u8> {
        vec![n]
    }

    #[test]
    fn a_turn_ends_when_the_look_that_covers_it_is_done() {
        let mut looks = Looks::default();
        looks.hold(answer(1));
        let epoch = looks.start("s").unwrap();
        // A turn that ends while the look runs is not covered by it.
        looks.hold(answer(2));
        assert_eq!(looks.start("s"), None, "one look at a time");
        let done = looks.finish(epoch);
        assert!(done.current);
        assert_eq!(done.release, vec![answer(1)]);
        assert_eq!(done.again.as_deref(), Some("s"));
        let epoch = looks.start("s").unwrap();
        let done = looks.finish(epoch);
        assert_eq!(done.release, vec![answer(2)]);
        assert_eq!(done.again, None);
        assert!(!looks.holds_any());
    }

    #[test]
    fn a_look_outdated_by_a_kept_finding_runs_again_and_keeps_its_turns() {
        let mut looks = Looks::default();
        looks.hold(answer(1));
        let epoch = looks.start("s").unwrap();
        looks.rerun();
        let done = looks.finish(epoch);
        assert!(!done.current, "its findings would revert what was kept");
        assert!(done.release.is_empty(), "its turns wait for the new look");
        assert_eq!(done.again.as_deref(), Some("s"));
        let epoch = looks.start("s").unwrap();
        let done = looks.finish(epoch);
        assert!(done.current);
        assert_eq!(done.release, vec![answer(1)]);
    }

    #[test]
    fn a_look_outdated_by_a_new_baseline_lets_its_turns_go() {
        // A re-arm looked on the loop first, covering every turn so far.
        let mut looks = Looks::default();
        looks.hold(answer(1));
        let epoch = looks.start("s").unwrap();
        looks.outdate();
        let done = looks.finish(epoch);
        assert!(!done.current);
        assert_eq!(done.release, vec![answer(1)]);
        assert_eq!(done.again, None);
    }

    #[test]
    fn what_is_held_goes_out_in_the_order_the_turns_ended() {
        let mut looks = Looks::default();
        looks.hold(answer(1));
        looks.start("s");
        looks.hold(answer(2));
        assert!(looks.holds_any());
        assert_eq!(looks.take_held(), vec![answer(1), answer(2)]);
        assert!(!looks.holds_any());
    }
}
