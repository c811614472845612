//! Routing: which request is whose, both ways, as a state machine of its
//! own. Every request crossing the bridge gets a bridge id (a number no
//! peer chose, so the bridge's own requests and successive generations'
//! ids never collide); this remembers what each id stands for, the frames
//! held while the backend restarts, and the editor terminals each
//! generation made. It decides nothing about permissions or the backend's
//! life; the bridge asks it and carries out what it answers. Tests drive it
//! directly.
//!
//! `session/new`, from the editor to the backend and back. Before it, the
//! loop's gate (`Bridge::admit`) has asked the lifecycle whether editor
//! messages go on now; while the backend restarts they are held here
//! (`hold`) and enter at step 1 once it is back (`release_queue`):
//! 1. `editor_side::dispatch`: `track::editor_request` reads what the
//!    request will change (a session with its roots); roots the armed
//!    generation does not cover ask for a re-arm, and the request is held
//!    for the new generation (`lifecycle`); unarmed, the bridge reads
//!    whether their project turns the sandbox on (its template is made off
//!    the loop, `disk`); with code execution on, the `run_code` server is
//!    spliced into `params.mcpServers` (`editor_side::with_code_server`,
//!    `run_code::inject`); `Routes::editor_request` gives it a bridge id,
//!    spliced in, and the frame goes to the backend;
//! 2. `backend_side::on_backend_bytes`: the response's id is a bridge id;
//!    `Routes::backend_answered` says it was the editor's request and its
//!    id; `track::apply_success` records the session in the session table;
//!    the frame goes to the editor with the editor's id spliced back in,
//!    byte for byte otherwise; the session's editor socket, if one was made
//!    for it, is bound to it (`code_tools::opened`);
//! 3. only then, the session's first announcement and any question about
//!    hand edits of its sandbox.json (the permission side) follow it.
//!
//! Nothing on that way asks the permission side or the lifecycle
//! anything. Two turns aside from it in step 1 ask the lifecycle for a
//! re-arm (`Bridge::request_restart`) and hold the request for the new
//! generation: a root the armed generation does not cover, and a project
//! that turns the sandbox on. The permission side comes after the answer
//! has gone (step 3).

use std::collections::{HashMap, VecDeque};

use super::track::Track;
use crate::relay::{Frame, FrameKind, RawId};

/// A request in flight at the backend.
#[derive(Debug)]
pub(super) struct AtBackend {
    pub generation: u64,
    pub origin: Origin,
}

#[derive(Debug)]
pub(super) enum Origin {
    Editor {
        id: RawId,
        method: String,
        track: Track,
    },
    /// The bridge's own request (setting a generation up); its answer
    /// takes the set-up's next step.
    Bridge,
}

/// A request in flight at the editor.
#[derive(Debug)]
pub(super) enum AtEditor {
    /// A request a `run_code` run made through its editor socket; its
    /// answer goes back to that socket.
    CodeTool { id: RawId },
    Backend {
        generation: u64,
        id: RawId,
        /// For `terminal/create`: the session the terminal belongs to.
        terminal_for: Option<String>,
    },
    /// The bridge's own request, answered into the void.
    Bridge,
    /// One of the bridge's permission prompts (see `allow`).
    Prompt,
    /// A prompt about a refused connection (see `net_asks`).
    NetPrompt,
    /// Whether an agent no profile knows may keep its state at `location`.
    AgentStatePrompt {
        agent: String,
        location: std::path::PathBuf,
    },
    /// A confirmation of hand edits of a project's sandbox.json.
    ConfigPrompt { root: std::path::PathBuf },
    /// Keep or revert what the audit reverted: each finding, with what
    /// puts the agent's version back.
    AuditPrompt {
        kept: Vec<(crate::audit::Finding, crate::audit::Action)>,
    },
}

/// A terminal a backend generation created through the editor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Terminal {
    pub generation: u64,
    pub session: String,
    pub id: String,
}

/// What a generation left in flight when it ended.
#[derive(Debug, Default)]
pub(super) struct Orphans {
    /// The editor's requests it never answered: (the editor's id, method).
    pub editor_requests: Vec<(RawId, String)>,
    /// The ids they were sent to the backend under.
    pub sent_as: Vec<u64>,
    /// Its requests the editor has not answered yet, by bridge id.
    pub at_editor: Vec<u64>,
}

/// The most editor frames held while the backend restarts...
pub(super) const MAX_HELD_FRAMES: usize = 1024;
/// ...and the most bytes (a frame above this alone is still held).
pub(super) const MAX_HELD_BYTES: usize = 64 << 20;

#[derive(Debug, Default)]
pub(super) struct Routes {
    next_id: u64,
    at_backend: HashMap<u64, AtBackend>,
    editor_ids: HashMap<RawId, u64>,
    at_editor: HashMap<u64, AtEditor>,
    backend_ids: HashMap<(u64, RawId), u64>,
    held: VecDeque<Frame>,
    terminals: Vec<Terminal>,
}

impl Routes {
    /// A fresh bridge id.
    pub fn alloc(&mut self) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    /// An editor request sent on to `generation`: its bridge id, and
    /// whether the editor reused the id of a request still in flight.
    pub fn editor_request(
        &mut self,
        generation: u64,
        id: RawId,
        method: String,
        track: Track,
    ) -> (u64, bool) {
        let bid = self.alloc();
        let reused = self.editor_ids.insert(id.clone(), bid).is_some();
        self.at_backend.insert(
            bid,
            AtBackend {
                generation,
                origin: Origin::Editor { id, method, track },
            },
        );
        (bid, reused)
    }

    /// A request of the bridge's own to `generation`.
    pub fn bridge_request(&mut self, generation: u64) -> u64 {
        let bid = self.alloc();
        self.at_backend.insert(
            bid,
            AtBackend {
                generation,
                origin: Origin::Bridge,
            },
        );
        bid
    }

    /// The backend answered bridge id `bid`: whose request it was.
    pub fn backend_answered(&mut self, bid: u64) -> Option<Origin> {
        let entry = self.at_backend.remove(&bid)?;
        if let Origin::Editor { id, .. } = &entry.origin {
            self.editor_ids.remove(id);
        }
        Some(entry.origin)
    }

    /// Whether bridge id `bid` awaits the editor's answer.
    pub fn awaits_editor(&self, bid: u64) -> bool {
        self.at_editor.contains_key(&bid)
    }

    /// Whether bridge id `bid` awaits the backend's answer.
    pub fn awaits_backend(&self, bid: u64) -> bool {
        self.at_backend.contains_key(&bid)
    }

    /// The bridge id of the editor's request `id`, while in flight.
    pub fn editor_id_in_flight(&self, id: &RawId) -> Option<u64> {
        self.editor_ids.get(id).copied()
    }

    /// The editor's requests in flight at the backend.
    pub fn editor_requests_in_flight(&self) -> usize {
        self.at_backend
            .values()
            .filter(|r| matches!(r.origin, Origin::Editor { .. }))
            .count()
    }

    /// A backend request sent on to the editor: its bridge id.
    pub fn backend_request(
        &mut self,
        generation: u64,
        id: RawId,
        terminal_for: Option<String>,
    ) -> u64 {
        let bid = self.alloc();
        self.at_editor.insert(
            bid,
            AtEditor::Backend {
                generation,
                id: id.clone(),
                terminal_for,
            },
        );
        self.backend_ids.insert((generation, id), bid);
        bid
    }

    /// Keep questions of the audit's the editor has not answered.
    pub fn audit_prompts_open(&self) -> usize {
        self.at_editor
            .values()
            .filter(|r| matches!(r, AtEditor::AuditPrompt { .. }))
            .count()
    }

    /// A run's request (`run_code`'s editor socket, its call `id`) sent to
    /// the editor under a bridge id.
    pub fn code_tool_request(&mut self, id: RawId) -> u64 {
        let bid = self.alloc();
        self.at_editor.insert(bid, AtEditor::CodeTool { id });
        bid
    }

    /// A request of the bridge's own to the editor.
    pub fn bridge_to_editor(&mut self, what: AtEditor) -> u64 {
        let bid = self.alloc();
        self.at_editor.insert(bid, what);
        bid
    }

    /// A request of the bridge's own to the editor, under `bid` (allocated
    /// before the request was built).
    pub fn expect_from_editor(&mut self, bid: u64, what: AtEditor) {
        self.at_editor.insert(bid, what);
    }

    /// The session of the latest turn in flight, if any.
    pub fn latest_turn(&self) -> Option<&str> {
        self.at_backend
            .iter()
            .filter_map(|(bid, at)| match &at.origin {
                Origin::Editor {
                    track: Track::Prompt(Some(session)),
                    ..
                } => Some((*bid, session.as_str())),
                _ => None,
            })
            .max_by_key(|(bid, _)| *bid)
            .map(|(_, session)| session)
    }

    /// The bridge id of `generation`'s request `id` at the editor.
    pub fn backend_id_in_flight(&self, generation: u64, id: RawId) -> Option<u64> {
        self.backend_ids.get(&(generation, id)).copied()
    }

    /// The editor answered bridge id `bid`: what it was.
    pub fn editor_answered(&mut self, bid: u64) -> Option<AtEditor> {
        let entry = self.at_editor.remove(&bid)?;
        if let AtEditor::Backend { generation, id, .. } = &entry {
            self.backend_ids.remove(&(*generation, id.clone()));
        }
        Some(entry)
    }

    /// `generation` ended: its unanswered editor requests (removed, for the
    /// bridge to answer) and its requests at the editor (to withdraw; an
    /// answer to them still finds its entry, and is dropped). The bridge's
    /// own requests to it are gone with its set-up.
    pub fn orphans_of(&mut self, generation: u64) -> Orphans {
        let mut out = Orphans::default();
        let ids: Vec<u64> = self
            .at_backend
            .iter()
            .filter(|(_, r)| r.generation == generation)
            .map(|(id, _)| *id)
            .collect();
        for bid in ids {
            if let Some(Origin::Editor { id, method, .. }) = self.backend_answered(bid) {
                out.editor_requests.push((id, method));
                out.sent_as.push(bid);
            }
        }
        out.at_editor = self
            .at_editor
            .iter()
            .filter(
                |(_, r)| matches!(r, AtEditor::Backend { generation: g, .. } if *g == generation),
            )
            .map(|(id, _)| *id)
            .collect();
        out.at_editor.sort_unstable();
        out
    }

    // ---- Frames held while the backend restarts, in arrival order.

    /// Holds `frame` until the backend is back, unless the queue is full
    /// ([`MAX_HELD_FRAMES`], [`MAX_HELD_BYTES`]): then it is handed back.
    pub fn hold(&mut self, frame: Frame) -> Result<(), Box<Frame>> {
        let bytes: usize = self.held.iter().map(|f| f.bytes.len()).sum();
        let full = self.held.len() >= MAX_HELD_FRAMES
            || (!self.held.is_empty() && bytes + frame.bytes.len() > MAX_HELD_BYTES);
        if full {
            return Err(Box::new(frame));
        }
        self.held.push_back(frame);
        Ok(())
    }

    /// Held ahead of everything else (the request that caused a re-arm).
    pub fn hold_first(&mut self, frame: Frame) {
        self.held.push_front(frame);
    }

    pub fn next_held(&mut self) -> Option<Frame> {
        self.held.pop_front()
    }

    pub fn take_held(&mut self) -> Vec<Frame> {
        self.held.drain(..).collect()
    }

    /// Removes the held request `target` (a `$/cancel_request` for it);
    /// whether it was held.
    pub fn cancel_held(&mut self, target: &RawId) -> bool {
        let Some(pos) = self
            .held
            .iter()
            .position(|f| matches!(&f.kind, FrameKind::Request { id, .. } if id == target))
        else {
            return false;
        };
        self.held.remove(pos);
        true
    }

    // ---- Terminals.

    pub fn terminal_created(&mut self, terminal: Terminal) {
        self.terminals.push(terminal);
    }

    pub fn terminal_released(&mut self, id: &str) {
        self.terminals.retain(|t| t.id != id);
    }

    /// The terminals `generation` made, now the editor's to release.
    pub fn terminals_of(&mut self, generation: u64) -> Vec<Terminal> {
        let (gone, kept) = std::mem::take(&mut self.terminals)
            .into_iter()
            .partition(|t| t.generation == generation);
        self.terminals = kept;
        gone
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(id: &str) -> Frame {
        Frame::parse(format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"x"}}"#).into_bytes()).unwrap()
    }

    #[test]
    fn ids_both_ways_never_collide_and_are_answered_once() {
        let mut r = Routes::default();
        let (a, reused) =
            r.editor_request(1, RawId("\"e1\"".into()), "session/new".into(), Track::None);
        assert!(!reused);
        let own = r.bridge_request(1);
        let b = r.backend_request(1, RawId("7".into()), None);
        assert!(a != own && own != b && a != b);
        assert_eq!(r.editor_id_in_flight(&RawId("\"e1\"".into())), Some(a));
        assert_eq!(r.editor_requests_in_flight(), 1);
        match r.backend_answered(a) {
            Some(Origin::Editor { id, method, .. }) => {
                assert_eq!((id.as_str(), method.as_str()), ("\"e1\"", "session/new"))
            }
            other => panic!("{other:?}"),
        }
        assert!(r.backend_answered(a).is_none(), "answered twice");
        assert_eq!(r.editor_id_in_flight(&RawId("\"e1\"".into())), None);
        assert!(matches!(r.backend_answered(own), Some(Origin::Bridge)));
        assert_eq!(r.backend_id_in_flight(1, RawId("7".into())), Some(b));
        assert!(matches!(
            r.editor_answered(b),
            Some(AtEditor::Backend { .. })
        ));
        assert_eq!(r.backend_id_in_flight(1, RawId("7".into())), None);
        assert!(r.editor_answered(b).is_none());
        // The editor reusing an id still in flight is noticed.
        r.editor_request(1, RawId("1".into()), "a".into(), Track::None);
        assert!(
            r.editor_request(1, RawId("1".into()), "b".into(), Track::None)
                .1
        );
    }

    #[test]
    fn a_generation_that_ends_leaves_its_requests_to_be_answered() {
        let mut r = Routes::default();
        let (sent, _) =
            r.editor_request(1, RawId("1".into()), "session/prompt".into(), Track::None);
        r.editor_request(2, RawId("2".into()), "session/prompt".into(), Track::None);
        r.bridge_request(1);
        let at_editor = r.backend_request(1, RawId("9".into()), None);
        r.backend_request(2, RawId("9".into()), None);
        let orphans = r.orphans_of(1);
        assert_eq!(
            orphans.editor_requests,
            vec![(RawId("1".into()), "session/prompt".into())]
        );
        // And the id each went to the backend under (what the bridge keyed
        // on it, an editor socket made for a session, is let go).
        assert_eq!(orphans.sent_as, vec![sent]);
        assert_eq!(orphans.at_editor, vec![at_editor]);
        assert_eq!(r.editor_requests_in_flight(), 1);
        // Generation 1's request at the editor still finds its entry.
        assert!(matches!(
            r.editor_answered(at_editor),
            Some(AtEditor::Backend { generation: 1, .. })
        ));
        assert!(r.orphans_of(1).editor_requests.is_empty());
    }

    #[test]
    fn held_frames_keep_their_order_and_can_be_cancelled() {
        let mut r = Routes::default();
        assert!(r.hold(request("1")).is_ok());
        assert!(r.hold(request("2")).is_ok());
        r.hold_first(request("0"));
        assert!(r.cancel_held(&RawId("1".into())));
        assert!(!r.cancel_held(&RawId("1".into())));
        let ids: Vec<String> = std::iter::from_fn(|| r.next_held())
            .map(|f| match f.kind {
                FrameKind::Request { id, .. } => id.as_str().to_owned(),
                _ => unreachable!(),
            })
            .collect();
        assert_eq!(ids, ["0", "2"]);
    }

    #[test]
    fn the_restart_queue_is_bounded() {
        let mut r = Routes::default();
        for i in 0..MAX_HELD_FRAMES {
            assert!(r.hold(request(&format!("\"{i}\""))).is_ok());
        }
        let back = r.hold(request("\"over\"")).unwrap_err();
        assert!(matches!(back.kind, FrameKind::Request { .. }));
        assert_eq!(r.take_held().len(), MAX_HELD_FRAMES);
    }

    #[test]
    fn terminals_go_with_their_generation() {
        let mut r = Routes::default();
        let t = |g: u64, id: &str| Terminal {
            generation: g,
            session: "s".into(),
            id: id.into(),
        };
        r.terminal_created(t(1, "a"));
        r.terminal_created(t(1, "b"));
        r.terminal_created(t(2, "c"));
        r.terminal_released("b");
        assert_eq!(r.terminals_of(1), vec![t(1, "a")]);
        assert!(r.terminals_of(1).is_empty());
        assert_eq!(r.terminals_of(2), vec![t(2, "c")]);
    }
}
