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
    /// The system log reader for the sandbox's tag, when it has one (macOS).
    pub violations: Option<watch::ViolationWatch>,
}

/// The audit of the running generation.
pub(super) struct AuditState {
    /// What the running armed generation started with.
    pub base: Option<crate::audit::Baseline>,
    /// Which baseline `base` is (a new one at each arming, and each time
    /// the user keeps a finding): an audit of an older one that finishes
    /// late is dropped (and run again on the new one).
    pub epoch: u64,
    /// The session of the audit running off the loop, if one is; and of
    /// one asked for meanwhile, run when it is done.
    pub running: Option<String>,
    pub again: Option<String>,
    /// Turns' answers held until the audit that looks after them has
    /// reverted what it found: the one running, and the one asked for
    /// meanwhile. The editor sees a turn end only once its reverts are on
    /// disk.
    pub turn_ends: Vec<Vec<u8>>,
    pub turn_ends_next: Vec<Vec<u8>>,
    /// Where the agent's versions it cannot hold in memory are kept.
    pub stash: crate::audit::stash::Stash,
    /// Paths with a keep question open (asked once until answered).
    pub questions: HashSet<PathBuf>,
    /// The watcher of the running generation, and where it says a change
    /// was seen.
    pub watch: Option<crate::audit::watch::Watcher>,
    pub changes_tx: mpsc::UnboundedSender<Vec<PathBuf>>,
    pub changes: mpsc::UnboundedReceiver<Vec<PathBuf>>,
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
