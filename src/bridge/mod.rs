//! The bridge: owns the editor connection for its whole life while backend
//! generations come and go beneath it.
//!
//! Everything happens on one task that owns all state, in one loop
//! (`main_loop`) that is never re-entered: it takes the step the backend's
//! lifecycle calls for (`lifecycle` decides, `restart` carries it out:
//! drain, stop, start, set up one answer at a time), else handles the next
//! event. Frames are handled one at a time, in arrival order, so
//! per-session ordering is kept by construction, and every "exactly one
//! response" decision is made in one place. Readers and writers are separate
//! tasks (the editor's: threads, see `editor_io`) connected by queues the
//! loop never waits on; what is in flight each way is bounded by the
//! readers (see `relay::budget`).

mod agent_state;
mod allow;
mod announce;
mod audit;
mod backend_side;
mod code_tools;
mod disk;
mod editor_io;
mod editor_side;
mod frames;
mod hold;
mod ledger;
mod lifecycle;
mod net_asks;
mod parts;
mod permissions;
mod police;
mod prompts;
mod refusals;
mod restart;
mod routing;
pub mod track;
mod watch;

use std::time::{Duration, Instant};

use tokio::signal::unix::{signal, Signal, SignalKind};
use tokio::sync::mpsc;
use tracing::{debug, error, info, warn};

use crate::backend::{BackendEvent, Generation};
use crate::confine::{Confinement, Sandbox};
use crate::procs;
use crate::relay::budget::{Budget, Permit};
use crate::relay::codes;
use crate::relay::envelope::error_response;
use crate::relay::{Frame, FrameKind, RawId};

/// How the bridge is run.
#[derive(Debug, Clone)]
pub struct BridgeConfig {
    /// The backend command line.
    pub backend: Vec<String>,
    /// The largest frame accepted from either side.
    pub max_frame_bytes: usize,
    /// How long a backend gets between SIGTERM and SIGKILL.
    pub stop_grace: Duration,
    /// Stop restarting after this many crashes within `crash_window`.
    pub crash_limit: usize,
    pub crash_window: Duration,
    /// How long a give-up after crashes lasts; the editor's next request
    /// after it starts the agent again.
    pub crash_cooldown: Duration,
    /// Honour a project's `"enabled": true` (false with --no-sandbox): arm
    /// the bridge for it, or refuse its sessions where nothing can be armed.
    pub honor_project_switch: bool,
    /// `~/.zcode-acp`: the approval ledger lives there.
    pub managed: crate::config::managed::ManagedRoot,
    /// How the agent's own state directories are chosen.
    pub state: crate::policy::backends::StateSettings,
    /// Said with the first session's announcement (why the sandbox is
    /// armed when the user did not ask for it).
    pub startup_note: Option<String>,
    /// Why no agent can be started at all: every request is answered with
    /// it (the editor's log would otherwise be the only place to see it).
    pub cannot_start: Option<String>,
    /// Offer the `run_code` MCP server to every session (opt-in).
    pub code_exec: Option<crate::run_code::inject::CodeExec>,
    /// This platform's sandbox, or why there is none: chosen by the
    /// command line, asked when a project turns the sandbox on.
    pub platform: fn() -> Result<std::sync::Arc<dyn crate::confine::Enforce>, String>,
}

use routing::{AtEditor, Origin, Routes, Terminal};

enum EditorEvent {
    /// A frame, with its share of the bytes in flight toward the backend
    /// (none once the editor hung up: what is left is read to the end).
    Frame(Vec<u8>, Option<Permit>),
    TooLarge {
        prefix: Vec<u8>,
        size: usize,
    },
    Closed,
}

enum Event {
    Editor(EditorEvent),
    /// Writing to the editor failed (EPIPE): nothing reaches it any more.
    EditorGone(std::io::Error),
    Backend(u64, BackendEvent),
    /// One frame of a batch a generation handed on (see `backlog`).
    Backlog(u64, Vec<u8>, Option<Permit>),
    Terminate(&'static str),
    Hangup,
    Child,
    /// The sandbox refused a write (from the system log).
    Refused(crate::seatbelt::violations::Violation),
    /// Disk work done off the loop.
    Disk(disk::DiskDone),
    /// The generation's proxy asks about a refused connection.
    NetworkAsk(crate::network::asks::Question),
    /// The generation's proxy counted what it carried.
    Ledger,
    /// Code run by run_code calls the editor (see `code_tools`).
    CodeTool(code_tools::EditorCall),
    /// The agent is held still for the editor's writes, or cannot be.
    Held(hold::HoldEvent),
    /// The audit's watcher saw a change it judges (at these paths; none:
    /// look everywhere).
    /// `None`: only from a watcher let go.
    AuditChange(Option<Vec<std::path::PathBuf>>),
}

/// A frame of a generation's batch, not handled yet.
struct Backlogged {
    generation: u64,
    bytes: Vec<u8>,
    /// The batch's share of the bytes in flight, with its last frame.
    permit: Option<Permit>,
}

struct Signals {
    term: Signal,
    int: Signal,
    hup: Signal,
    chld: Signal,
}

pub struct Bridge {
    cfg: BridgeConfig,
    /// What the bridge can do about confinement (a project may turn it on).
    sandbox: Sandbox,
    /// What the running generation (and its terminals) run under.
    confinement: Confinement,
    /// Which phase of the backend's life the bridge is in (see `lifecycle`).
    life: lifecycle::Lifecycle,
    /// Which request is whose, held frames, terminals (see `routing`).
    routes: Routes,
    /// Project files written off the loop (see `disk`).
    disk: disk::Disk,
    signals: Signals,
    /// The editor's side: its reader and writer, and what it was told.
    editor: parts::EditorLink,
    /// The backend generations: the running one, the ones ending, the one
    /// being set up, and their frames.
    gens: parts::Generations,
    /// The sessions, and what restoring them needs.
    sessions: parts::Sessions,
    /// What is put to the user: writes, connections, the system's refusals.
    asks: parts::Asks,
    /// The audit of the running generation.
    audit: parts::AuditState,
    /// `run_code`'s side: its servers' files and the editor's sockets.
    code: parts::CodeSide,
    /// The agent held still while the editor writes for it (see `hold`).
    hold: hold::WriteHold,
}

impl Bridge {
    /// Whether the running generation is confined: what judges its writes,
    /// its terminals and its prompts. Not `sandbox.arms()`, which says
    /// whether generations started from now on are: the two differ from a
    /// project turning the sandbox on until its generation has started.
    fn armed(&self) -> bool {
        self.confinement.policy().is_some()
    }

    /// Runs the bridge on this process's stdin/stdout until the editor
    /// leaves or a signal ends it.
    pub async fn run(cfg: BridgeConfig, sandbox: Sandbox) -> anyhow::Result<()> {
        crate::backend::become_subreaper();
        let (editor_tx, editor_in) = mpsc::channel(64);
        let max = cfg.max_frame_bytes;
        let to_backend = Budget::new(crate::relay::budget::DEFAULT_BYTES);
        let to_editor_budget = Budget::new(crate::relay::budget::DEFAULT_BYTES);
        editor_io::start_reader(max, to_backend, editor_tx)?;
        let (writer, editor_failed) = editor_io::start_writer()?;

        let (backend_tx, backend_rx) = mpsc::unbounded_channel();
        let signals = Signals {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
            hup: signal(SignalKind::hangup())?,
            chld: signal(SignalKind::child())?,
        };
        let (crash_limit, crash_window, crash_cooldown) =
            (cfg.crash_limit, cfg.crash_window, cfg.crash_cooldown);
        let managed_path = cfg.managed.path.clone();
        let stash = crate::audit::stash::Stash::new(
            &cfg.managed,
            &format!("bridge-{}-{}", std::process::id(), unix_secs()),
        );
        let (audit_changes_tx, audit_changes) = mpsc::unbounded_channel();
        let mut bridge = Bridge {
            cfg,
            sandbox,
            confinement: Confinement::Refused("no backend generation is armed yet".into()),
            life: lifecycle::Lifecycle::new(
                Instant::now(),
                crash_limit,
                crash_window,
                crash_cooldown,
            ),
            routes: Routes::default(),
            disk: disk::Disk::new(),
            signals,
            editor: parts::EditorLink {
                out: Some(writer),
                failed: editor_failed,
                budget: to_editor_budget,
                carried: std::cell::Cell::new(None),
                inbox: editor_in,
                announced_first: false,
                announcements: 0,
                keys_said: Default::default(),
            },
            gens: parts::Generations {
                tx: backend_tx,
                rx: backend_rx,
                backlog: std::collections::VecDeque::new(),
                setup: None,
                current: None,
                dying: Vec::new(),
                started: 0,
                armed_roots: Vec::new(),
                pending_roots: Vec::new(),
            },
            sessions: parts::Sessions::default(),
            asks: parts::Asks {
                writes: permissions::Permissions::default(),
                net: net_asks::NetPermissions::default(),
                net_asks: net_asks::NetAsks::new(),
                ledger: Default::default(),
                agent_state: Default::default(),
                agent_state_open: false,
                violations: None,
            },
            audit: parts::AuditState {
                base: None,
                looks: parts::Looks::default(),
                stash,
                questions: Default::default(),
                watch: None,
                watch_serial: 0,
                changes_tx: audit_changes_tx,
                changes: audit_changes,
                dirty: Vec::new(),
            },
            code: parts::CodeSide {
                servers_files: crate::run_code::inject::ServersFiles::new(&managed_path),
                tools: code_tools::CodeTools::new(),
            },
            hold: hold::WriteHold::default(),
        };
        if let Some(why) = bridge.cfg.cannot_start.clone() {
            error!("{why}");
            bridge.life.fail(why);
        }
        bridge.main_loop().await;
        // Every queued frame reaches the editor before the process exits.
        if let Some(writer) = bridge.editor.out.take() {
            writer.close().await;
        }
        Ok(())
    }

    /// The one event loop: take the step the backend's lifecycle calls
    /// for, else wait for the next event (or the lifecycle's wake-up time,
    /// a backoff or a shutdown deadline) and handle it.
    async fn main_loop(&mut self) {
        loop {
            if self.gens.backlog.is_empty() {
                // A batch ended with frames that sent nothing on.
                self.flush_editor();
            }
            match self.advance().await {
                restart::Flow::Exit => return,
                restart::Flow::Again => continue,
                restart::Flow::Wait => {}
            }
            if let Some(b) = self.gens.backlog.pop_front() {
                self.handle(Event::Backlog(b.generation, b.bytes, b.permit));
                continue;
            }
            let wake = self.life.wake_at();
            let event = tokio::select! {
                event = self.next_event() => event,
                _ = sleep_until(wake) => continue,
            };
            self.handle(event);
        }
    }

    async fn next_event(&mut self) -> Event {
        tokio::select! {
            Some((generation, event)) = self.gens.rx.recv() => Event::Backend(generation, event),
            event = self.editor.inbox.recv() => Event::Editor(event.unwrap_or(EditorEvent::Closed)),
            e = self.editor.failed.wait() => Event::EditorGone(e),
            _ = self.signals.term.recv() => Event::Terminate("SIGTERM"),
            _ = self.signals.int.recv() => Event::Terminate("SIGINT"),
            _ = self.signals.hup.recv() => Event::Hangup,
            _ = self.signals.chld.recv() => Event::Child,
            Some(v) = watch::next(&mut self.asks.violations) => Event::Refused(v),
            done = self.disk.next() => Event::Disk(done),
            question = self.asks.net_asks.next() => Event::NetworkAsk(question),
            _ = self.asks.ledger.ready() => Event::Ledger,
            call = self.code.tools.next() => Event::CodeTool(call),
            event = self.hold.next() => Event::Held(event),
            Some((serial, dirty)) = self.audit.changes.recv() => {
                // A burst is one look; what a watcher let go said, none.
                let current = self.audit.watch_serial;
                let mut seen = (serial == current).then_some(dirty);
                while let Ok((serial, more)) = self.audit.changes.try_recv() {
                    if serial == current {
                        seen.get_or_insert_with(Vec::new).extend(more);
                    }
                }
                Event::AuditChange(seen)
            }
        }
    }

    fn handle(&mut self, event: Event) {
        let of_a_batch = matches!(event, Event::Backlog(..));
        self.handle_one(event);
        match (self.editor.carried.take(), &self.editor.out) {
            // A batch's share, its last frame sending nothing on: the
            // frames before it may still be on their way to the editor,
            // and the share stays in flight until they are written.
            (Some(permit), Some(out)) if of_a_batch => out.carry(permit),
            // What handling did not send on is no longer in flight.
            _ => {}
        }
    }

    /// Hands what is staged for the editor to its writer: before the loop
    /// waits on anything (an agent stopping or starting), so answers are
    /// never held back by it.
    fn flush_editor(&self) {
        if let Some(out) = &self.editor.out {
            out.flush();
        }
    }

    fn handle_one(&mut self, event: Event) {
        match event {
            Event::Editor(EditorEvent::Frame(bytes, permit)) => {
                self.editor.carried.set(permit);
                self.on_editor_bytes(bytes)
            }
            Event::Editor(EditorEvent::TooLarge { prefix, size }) => {
                self.on_editor_too_large(&prefix, size)
            }
            Event::Editor(EditorEvent::Closed) => {
                self.begin_shutdown("the editor closed the connection")
            }
            Event::EditorGone(e) => {
                // No grace: the backend's last answers have nowhere to go,
                // so it is stopped now rather than left producing.
                warn!("writing to the editor failed ({e}); stopping the backend now");
                self.begin_shutdown_within("the editor stopped reading", Duration::ZERO)
            }
            Event::Backlog(generation, bytes, permit) => {
                if self.gens.current.as_ref().map(|g| g.id) != Some(generation) {
                    return debug!(
                        generation,
                        "ignoring a frame of a stopped backend generation"
                    );
                }
                self.editor.carried.set(permit);
                self.on_backend_bytes(bytes)
            }
            Event::Backend(generation, event) => {
                if self.gens.current.as_ref().map(|g| g.id) != Some(generation) {
                    debug!(
                        generation,
                        "ignoring an event from a stopped backend generation"
                    );
                    return;
                }
                match event {
                    // Handled one at a time from the main loop, the
                    // lifecycle's step taken between any two of them.
                    BackendEvent::Frames(frames, permit) => {
                        // The batch's share goes with its last frame: the
                        // writer writes in order, so its bytes are out
                        // when that frame's are.
                        let last = frames.len().saturating_sub(1);
                        let mut permit = Some(permit);
                        self.gens.backlog.extend(frames.into_iter().enumerate().map(
                            |(i, bytes)| Backlogged {
                                generation,
                                bytes,
                                permit: if i == last { permit.take() } else { None },
                            },
                        ))
                    }
                    BackendEvent::TooLarge { prefix, size } => {
                        self.on_backend_too_large(&prefix, size)
                    }
                    BackendEvent::RefusedOnStderr(line) => self.on_refused_on_stderr(&line),
                    BackendEvent::Lost {
                        status,
                        stderr_tail,
                    } => self.on_backend_lost(status, stderr_tail),
                }
            }
            Event::Terminate(signal) => self.begin_shutdown(&format!("received {signal}")),
            Event::Hangup => {
                self.request_restart("SIGHUP received (restart requested by the user)")
            }
            Event::Child => {
                let spare: Vec<i32> = self
                    .gens
                    .current
                    .iter()
                    .chain(self.gens.dying.iter())
                    .map(|g| g.pid)
                    .chain(self.asks.violations.as_ref().and_then(|w| w.pid))
                    .collect();
                let reaped = procs::reap_zombie_children(&spare);
                if reaped > 0 {
                    debug!(reaped, "reaped processes a backend left behind");
                }
            }
            Event::Refused(v) => {
                debug!(process = v.process, "a refusal in the system log");
                self.on_refused_by_sandbox(&v.path)
            }
            Event::NetworkAsk(question) => self.on_network_ask(question),
            Event::Ledger => self.on_ledger(),
            Event::CodeTool(call) => self.on_code_tool(call),
            Event::Held(event) => self.on_hold_event(event),
            Event::AuditChange(Some(dirty)) => self.on_audit_change(dirty),
            Event::AuditChange(None) => {}
            Event::Disk(disk::DiskDone::NetworkRecorded {
                session,
                what,
                mirrored,
                result,
            }) => self.after_network_record(&session, &what, mirrored, result),
            Event::Disk(disk::DiskDone::Recorded {
                session,
                list,
                entry,
                result,
            }) => self.after_record(&session, list, &entry, result),
            Event::Disk(disk::DiskDone::Approved { root, result }) => {
                self.after_approval(root, result)
            }
            Event::Disk(disk::DiskDone::Audited {
                epoch,
                session,
                findings,
            }) => self.after_audit(epoch, &session, findings),
            Event::Disk(disk::DiskDone::Remembered {
                session,
                location,
                result,
            }) => self.after_remembered(&session, &location, result),
            Event::Disk(disk::DiskDone::Prepared { root }) => {
                debug!(root = %root.display(), "prepared the project's sandbox.json and ledger")
            }
        }
    }

    /// The gate before routing: a message from the editor (not an answer)
    /// goes through routing now, waits for the backend, or is refused, as
    /// the lifecycle's phase says. Routing itself never asks.
    fn admit(&mut self, frame: Frame) {
        let request = matches!(frame.kind, FrameKind::Request { .. });
        let cancellation = editor_side::is_cancellation(&frame);
        match self.life.admit(request, cancellation, Instant::now()) {
            lifecycle::Admission::Dispatch => self.dispatch(frame),
            lifecycle::Admission::Hold => self.hold_for_backend(frame),
            lifecycle::Admission::Refuse(closed) => {
                let FrameKind::Request { id, .. } = &frame.kind else {
                    return;
                };
                match closed {
                    lifecycle::Closed::GaveUp(message) => {
                        self.answer_error(id, codes::BACKEND_UNAVAILABLE, &message)
                    }
                    lifecycle::Closed::ShuttingDown => {
                        self.answer_error(id, codes::SHUTTING_DOWN, "zcode-acp is shutting down")
                    }
                }
            }
        }
    }

    /// Asks for a restart at the next quiescent point. Editor requests that
    /// arrive from now on are queued until the new generation is ready.
    pub fn request_restart(&mut self, reason: &str) {
        let running = self.life.phase() == &lifecycle::Phase::Running;
        if !self.life.restart_asked(reason) {
            warn!("not restarting ({reason}): zcode-acp gave up on the agent or is shutting down");
            return;
        }
        if running {
            warn!(
                "restarting the agent backend: {reason}. Processes the agent started (dev servers, MCP servers it spawned) will be stopped"
            );
        }
    }

    fn alloc_id(&mut self) -> u64 {
        self.routes.alloc()
    }

    fn to_editor(&self, frame: Vec<u8>) {
        if let Some(out) = &self.editor.out {
            out.send(frame, self.editor.carried.take());
            // While a batch of the agent's frames is being handled, what
            // they produce goes to the writer together (see `main_loop`).
            if self.gens.backlog.is_empty() {
                out.flush();
            }
        }
    }

    fn answer_error(&self, id: &RawId, code: i64, message: &str) {
        self.to_editor(error_response(id, code, message, None));
    }

    /// Answers every editor request of `generation` still in flight with
    /// one error, and fails the bridge's own calls. Requests the dead
    /// generation sent to the editor are withdrawn with `$/cancel_request`.
    fn fail_in_flight(&mut self, generation: u64, code: i64, message: &str) {
        let orphans = self.routes.orphans_of(generation);
        for (id, method) in orphans.editor_requests {
            warn!(%id, method, "answering an in-flight request with an error: {message}");
            self.answer_error(&id, code, message);
        }
        // A session that will not open now: the editor socket made for it
        // is closed (the editor sends the request again, and gets another).
        for bid in orphans.sent_as {
            self.code.tools.opened(bid, None);
        }
        for bid in orphans.at_editor {
            self.to_editor(crate::relay::envelope::notification(
                "$/cancel_request",
                &serde_json::json!({ "requestId": bid }).to_string(),
            ));
        }
    }

    async fn stop_generation(&mut self, generation: Generation) {
        // Stopping can take the grace period: nothing staged waits for it.
        self.flush_editor();
        let id = generation.id;
        // A stopped process would not act on SIGTERM: the agent is let go.
        self.release_hold_now();
        // Its helper's pid is nobody's to join from now on.
        self.confinement.released_by(generation.pid);
        self.asks.net_asks.stop();
        let spare: Vec<i32> = self
            .asks
            .violations
            .as_ref()
            .and_then(|w| w.pid)
            .into_iter()
            .collect();
        let survivors = generation.stop(self.cfg.stop_grace, &spare).await;
        // Its proxy (macOS) ends with it, as a sandbox's own does on Linux.
        self.confinement.stop_outside();
        if survivors.is_empty() {
            debug!(
                generation = id,
                "backend generation stopped; no process of it is left"
            );
        } else {
            error!(
                generation = id,
                ?survivors,
                "processes of a stopped backend generation could not be killed"
            );
        }
        self.release_terminals(id);
    }

    /// Terminals of a stopped generation are released toward the editor:
    /// the next generation cannot know them.
    fn release_terminals(&mut self, generation: u64) {
        for t in self.routes.terminals_of(generation) {
            let bid = self.routes.bridge_to_editor(AtEditor::Bridge);
            let params = serde_json::json!({ "sessionId": t.session, "terminalId": t.id });
            info!(
                terminal = t.id,
                session = t.session,
                "releasing a terminal of the stopped backend"
            );
            self.to_editor(crate::relay::envelope::request(
                bid,
                "terminal/release",
                &params.to_string(),
            ));
        }
    }

    /// Begins ending the bridge. The backend is asked politely first
    /// (stdin closed), and what it still answers within the grace period
    /// reaches the editor; `finish_shutdown` does the rest.
    fn begin_shutdown(&mut self, why: &str) {
        self.begin_shutdown_within(why, self.cfg.stop_grace)
    }

    /// As `begin_shutdown`, the backend given `grace` at most (asked while
    /// ending, a shorter grace cuts the running one short).
    fn begin_shutdown_within(&mut self, why: &str, grace: Duration) {
        let grace = if self.gens.current.is_some() {
            grace
        } else {
            Duration::ZERO
        };
        if self.life.is_shutting_down() {
            self.life.shut_down(Instant::now() + grace);
            return;
        }
        info!("shutting down: {why}");
        self.life.shut_down(Instant::now() + grace);
        self.gens.setup = None;
        for frame in self.routes.take_held() {
            if let crate::relay::FrameKind::Request { id, .. } = &frame.kind {
                self.answer_error(id, codes::SHUTTING_DOWN, "zcode-acp is shutting down");
            }
        }
        if let Some(generation) = self.gens.current.as_mut() {
            generation.close_stdin();
        }
    }

    /// The grace period is over (or the backend left): its process group
    /// and every leftover descendant is killed.
    async fn finish_shutdown(&mut self) {
        self.audit_held_turns_now();
        if let Some(generation) = self.gens.current.take() {
            let id = generation.id;
            self.fail_in_flight(id, codes::SHUTTING_DOWN, "zcode-acp is shutting down");
            self.stop_generation(generation).await;
        }
        for generation in std::mem::take(&mut self.gens.dying) {
            self.stop_generation(generation).await;
        }
        // Nothing of the agent runs any more: what it planted since the
        // last turn ended is reverted (and logged) before the bridge goes.
        let first = self.sessions.table.live().next().map(|s| s.id.clone());
        match first {
            Some(session) => self.run_audit_now(&session),
            // Nobody to put a finding to; what waits on an audit goes out.
            None => self.release_turn_ends(),
        }
        // Its `log` child would otherwise outlive the bridge.
        self.asks.violations = None;
        // The user's answers reach sandbox.json before the process exits.
        self.flush_editor();
        self.disk.settle(Duration::from_secs(5)).await;
    }
}

fn unix_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Sleeps until `at`, or forever without one.
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(tokio::time::Instant::from_std(at)).await,
        None => std::future::pending().await,
    }
}
