//! The editor writes exactly what was judged.
//!
//! A write the agent asks the editor to make (`fs/write_text_file`, its own
//! or code's through `run_code`) is judged on a path that the agent's
//! processes could change a moment later: a directory on the way swapped
//! for a symlink, and the editor, following it as editors do, would write
//! outside. So an allowed write is made with the agent held still
//! (`backend::hold`): its processes are stopped, the path is judged again,
//! the write goes to the editor, and the processes go on once the editor
//! has answered. Several writes share one hold; a terminal the editor is
//! still starting for the agent waits for the release (its helper takes the
//! generation's hold lock, see `linux::hold`), and one asked for while the
//! hold is being taken or held is sent to the editor after it.
//!
//! A write the editor does not answer in time, or one whose turn the user
//! cancels, is withdrawn; the editor may still make it, by path, so the
//! agent's processes are ended rather than let go, and the agent restarts
//! with its sessions, as after a crash.
//!
//! The hold is taken off the loop (stopping and checking the processes
//! takes milliseconds, or up to `backend::hold::WITHIN` for one that will
//! not stop); a hold that cannot be taken refuses the writes waiting on
//! it, saying why, rather than making them with the agent moving.

use std::collections::HashMap;

use tokio::sync::mpsc;
use tracing::{debug, warn};

use super::permissions::{Asker, HeldWrite};
use super::police::Policed;
use super::Bridge;
use crate::backend::hold::{Held, World};
use crate::relay::codes;
use crate::relay::Frame;

/// How long the editor gets to answer the writes made under a hold: past
/// it they are withdrawn and the agent goes on (an editor that never
/// answers, a FIFO it blocks on, would otherwise hold the agent for good).
const EDITOR_ANSWER: std::time::Duration = std::time::Duration::from_secs(60);

/// Writes waiting for the hold, at most, in number and in bytes: past
/// them a write is refused at once (an agent that keeps a terminal
/// starting must not fill the bridge's memory with frames).
const MAX_WAITING: usize = 256;
const MAX_WAITING_BYTES: usize = 64 << 20;

/// What the hold reports to the loop.
pub(super) enum HoldEvent {
    /// The hold was taken, or could not be.
    Taken(Result<Held, String>),
    /// The editor did not answer the writes under the hold in time.
    Overdue,
}

/// Where the hold is.
enum State {
    Free,
    /// Being taken off the loop.
    Taking,
    Held(Held),
}

pub(super) struct WriteHold {
    state: State,
    /// Writes waiting for the hold, in order.
    waiting: Vec<HeldWrite>,
    /// Requests made under the hold that the editor has not answered, with
    /// the session each is for.
    in_flight: HashMap<u64, String>,
    /// The bytes of the writes waiting for the hold.
    waiting_bytes: usize,
    /// Why the agent's processes were ended (see `end_held_world`): its
    /// loss is then a restart zcode-acp made, not a crash.
    pub(super) ended: Option<String>,
    /// When they are withdrawn, unanswered.
    overdue_at: Option<tokio::time::Instant>,
    /// Terminals asked for while the hold is taken or held: sent once it
    /// is released.
    deferred_terminals: Vec<(u64, crate::relay::RawId, Frame)>,
    tx: mpsc::UnboundedSender<Result<Held, String>>,
    rx: mpsc::UnboundedReceiver<Result<Held, String>>,
}

impl Default for WriteHold {
    fn default() -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        WriteHold {
            state: State::Free,
            waiting: Vec::new(),
            in_flight: HashMap::new(),
            waiting_bytes: 0,
            ended: None,
            overdue_at: None,
            deferred_terminals: Vec::new(),
            tx,
            rx,
        }
    }
}

impl WriteHold {
    /// The next hold taken (or refused), or writes under it overdue.
    pub async fn next(&mut self) -> HoldEvent {
        match (&self.state, self.overdue_at) {
            (State::Taking, _) => {
                HoldEvent::Taken(self.rx.recv().await.expect("the hold keeps a sender"))
            }
            (State::Held(_), Some(at)) if !self.in_flight.is_empty() => {
                tokio::time::sleep_until(at).await;
                HoldEvent::Overdue
            }
            _ => std::future::pending().await,
        }
    }

    /// Whether the agent is held, or about to be.
    pub fn busy(&self) -> bool {
        !matches!(self.state, State::Free)
    }
}

impl Bridge {
    /// An allowed write: made with the agent held still.
    pub(super) fn write_held(&mut self, write: HeldWrite) {
        let bytes = write.frame.bytes.len();
        if self.hold.waiting.len() >= MAX_WAITING
            || self.hold.waiting_bytes + bytes > MAX_WAITING_BYTES
        {
            let message = format!(
                "zcode-acp refused this write: {} writes ({} MiB) already wait for the agent to be held still",
                self.hold.waiting.len(),
                self.hold.waiting_bytes >> 20
            );
            return self.refuse_write(write, codes::WRITE_DENIED, message);
        }
        self.hold.waiting_bytes += bytes;
        self.hold.waiting.push(write);
        match self.hold.state {
            State::Held(_) => self.make_held_writes(),
            State::Taking => {}
            State::Free => self.take_hold(),
        }
    }

    /// Starts taking the hold, once no terminal is being started.
    fn take_hold(&mut self) {
        if self.hold.waiting.is_empty() || !matches!(self.hold.state, State::Free) {
            return;
        }
        let Some(world) = self.world() else {
            // Nothing of the agent runs (no armed generation): nothing to
            // hold, and nothing to race the write.
            self.hold.state = State::Held(Held::empty());
            return self.make_held_writes();
        };
        self.hold.state = State::Taking;
        let tx = self.hold.tx.clone();
        tokio::task::spawn_blocking(move || {
            let t = std::time::Instant::now();
            let held = crate::backend::hold::hold(&world);
            debug!(took_us = t.elapsed().as_micros() as u64, "taking the hold");
            let _ = tx.send(held);
        });
    }

    /// The running generation's processes, when it is armed and runs.
    fn world(&self) -> Option<World> {
        let crate::confine::Confinement::Armed(armed) = &self.confinement else {
            return None;
        };
        #[cfg(target_os = "linux")]
        let holder = armed.holder?;
        #[cfg(not(target_os = "linux"))]
        let holder = self.gens.current.as_ref()?.pid;
        Some(World {
            holder,
            generation_dir: armed.dir.as_ref().map(|d| d.path.clone()),
        })
    }

    /// The hold was taken, or could not be.
    fn on_held(&mut self, taken: Result<Held, String>) {
        match taken {
            Ok(held) => {
                debug!(
                    processes = held.len(),
                    "the agent is held still for the editor's writes"
                );
                self.hold.state = State::Held(held);
                self.make_held_writes();
            }
            Err(why) => {
                self.hold.state = State::Free;
                warn!("the agent's processes could not be held still while the editor writes ({why}); the writes waiting for it are refused");
                self.hold.waiting_bytes = 0;
                for write in std::mem::take(&mut self.hold.waiting) {
                    let message = format!(
                        "zcode-acp did not ask the editor to make this write: the agent's processes could not be held still meanwhile ({why})"
                    );
                    self.refuse_write(write, codes::WRITE_DENIED, message);
                }
                self.send_deferred_terminals();
            }
        }
    }

    /// With the agent held: each waiting write is judged again (its path
    /// can no longer change) and sent, or refused.
    fn make_held_writes(&mut self) {
        self.hold.waiting_bytes = 0;
        for write in std::mem::take(&mut self.hold.waiting) {
            let session = super::frames::session_of(&write.frame);
            let current = self.gens.current.as_ref().map(|g| g.id);
            if let Asker::Agent(generation) = write.from {
                if Some(generation) != current {
                    continue; // that agent is gone; nothing to answer
                }
            }
            if write.from == Asker::CodeTool && !self.code.tools.waiting(&write.backend_id) {
                continue; // its run has ended: nothing is written
            }
            let judged = self.police_backend_request("fs/write_text_file", &write.frame);
            let frame = match judged {
                Policed::Pass => write.frame,
                Policed::Rewrite(bytes) => match Frame::parse(bytes) {
                    Ok(f) => f,
                    Err(_) => {
                        let m = "zcode-acp could not rewrite the path of this write".to_owned();
                        self.refuse_write(write, codes::WRITE_DENIED, m);
                        continue;
                    }
                },
                Policed::Refuse { code, message } => {
                    self.refuse_write(write, code, message);
                    continue;
                }
                Policed::Ask { path, .. } => {
                    // Allowed when first judged, not now: the path changed
                    // in between.
                    let message = format!(
                        "zcode-acp refused writing {}: the path changed since it was judged (it now leads where the sandbox does not let the agent write)",
                        path.display()
                    );
                    self.refuse_write(write, codes::WRITE_DENIED, message);
                    continue;
                }
            };
            let bid = match write.from {
                Asker::Agent(generation) => {
                    self.forward_backend_request(generation, write.backend_id, frame)
                }
                Asker::CodeTool => self.forward_code_tool_request(write.backend_id, frame),
            };
            self.hold.in_flight.insert(bid, session);
            self.hold
                .overdue_at
                .get_or_insert_with(|| tokio::time::Instant::now() + EDITOR_ANSWER);
        }
        self.release_hold_when_done();
    }

    /// What the hold reports.
    pub(super) fn on_hold_event(&mut self, event: HoldEvent) {
        match event {
            HoldEvent::Taken(taken) => self.on_held(taken),
            HoldEvent::Overdue => self.withdraw_held_writes(&format!(
                "the editor did not answer it within {} s",
                EDITOR_ANSWER.as_secs()
            )),
        }
    }

    /// The writes under the hold are withdrawn from the editor
    /// (`$/cancel_request`) and answered as refused toward whoever asked (an
    /// answer the editor sends later is dropped): past the editor's time,
    /// or when the user cancels a turn one of them is for (a held agent
    /// could not act on it). The editor may still make such a write, by
    /// path, so the agent's processes must not go on and race it: they are
    /// ended, and the agent restarts as after a crash, its sessions
    /// restored.
    pub(super) fn withdraw_held_writes(&mut self, why: &str) {
        let in_flight = std::mem::take(&mut self.hold.in_flight);
        let mut ids: Vec<u64> = in_flight.into_keys().collect();
        ids.sort_unstable();
        for bid in ids {
            let Some(entry) = self.routes.editor_answered(bid) else {
                continue;
            };
            self.to_editor(crate::relay::envelope::notification(
                "$/cancel_request",
                &serde_json::json!({ "requestId": bid }).to_string(),
            ));
            let message = format!(
                "zcode-acp withdrew this write from the editor: {why} (it may have been made; read the file to know)"
            );
            warn!("{message}");
            match entry {
                super::routing::AtEditor::CodeTool { id } => self
                    .code
                    .tools
                    .answer(&id, Err((codes::WRITE_DENIED, message))),
                super::routing::AtEditor::Backend { generation, id, .. } => {
                    if let Some(g) = self.gens.current.as_ref().filter(|g| g.id == generation) {
                        g.send(crate::relay::envelope::error_response(
                            &id,
                            codes::WRITE_DENIED,
                            &message,
                            None,
                        ));
                    }
                }
                _ => {}
            }
        }
        self.end_held_world(why, true);
    }

    /// Ends the held processes rather than letting them go on (a write
    /// may still be made for them), and says so.
    fn end_held_world(&mut self, why: &str, restart: bool) {
        self.hold.overdue_at = None;
        if let State::Held(held) = std::mem::replace(&mut self.hold.state, State::Free) {
            if !held.is_empty() {
                warn!("the agent's processes were ended, not let go: {why}, and the editor may still make that write, which a process of the agent's could race; the agent restarts with its sessions");
                if restart {
                    self.hold.ended = Some(why.to_owned());
                }
            }
            held.kill();
        }
        self.send_deferred_terminals();
    }

    /// Whether a held write for `session` waits for the editor.
    pub(super) fn writes_under_hold_for(&self, session: &str) -> bool {
        self.hold.in_flight.values().any(|s| s == session)
    }

    /// The editor answered request `bid`: a write made under the hold is
    /// done; the hold is released with the last one. A terminal it
    /// started may let a waiting hold be taken.
    pub(super) fn editor_answered_under_hold(&mut self, bid: u64) {
        if self.hold.in_flight.remove(&bid).is_some() {
            self.release_hold_when_done();
        }
    }

    fn release_hold_when_done(&mut self) {
        if self.hold.in_flight.is_empty() && self.hold.waiting.is_empty() {
            self.hold.overdue_at = None;
            if let State::Held(held) = std::mem::replace(&mut self.hold.state, State::Free) {
                held.release();
            }
            self.send_deferred_terminals();
        }
    }

    /// Lets the agent go on whatever is in flight: before its generation
    /// is stopped (a stopped process would not act on SIGTERM) and when the
    /// bridge ends.
    pub(super) fn release_hold_now(&mut self) {
        if !self.hold.in_flight.is_empty() {
            // A write is still at the editor: they must not race it.
            self.hold.in_flight.clear();
            return self.end_held_world(
                "the agent is being stopped while a write it asked for is at the editor",
                false,
            );
        }
        self.hold.overdue_at = None;
        if let State::Held(held) = std::mem::replace(&mut self.hold.state, State::Free) {
            held.release();
        }
    }

    /// A terminal asked for while the agent is held waits for the release:
    /// its processes would start unheld. Returns whether it was deferred.
    pub(super) fn defer_terminal(
        &mut self,
        generation: u64,
        id: &crate::relay::RawId,
        frame: &Frame,
    ) -> bool {
        if !self.hold.busy() {
            return false;
        }
        self.hold
            .deferred_terminals
            .push((generation, id.clone(), frame.clone()));
        true
    }

    fn send_deferred_terminals(&mut self) {
        for (generation, id, frame) in std::mem::take(&mut self.hold.deferred_terminals) {
            if self.gens.current.as_ref().map(|g| g.id) == Some(generation) {
                self.forward_backend_request(generation, id, frame);
            }
        }
    }

    /// Answers a write with a refusal, toward whoever asked.
    pub(super) fn refuse_write(&mut self, write: HeldWrite, code: i64, message: String) {
        warn!("{message}");
        match write.from {
            Asker::CodeTool => self
                .code
                .tools
                .answer(&write.backend_id, Err((code, message))),
            Asker::Agent(generation) => {
                if let Some(g) = self.gens.current.as_ref().filter(|g| g.id == generation) {
                    g.send(crate::relay::envelope::error_response(
                        &write.backend_id,
                        code,
                        &message,
                        None,
                    ));
                }
            }
        }
    }
}
