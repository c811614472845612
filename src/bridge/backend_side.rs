//! Frames from the backend, and its death.

use std::process::ExitStatus;

use tracing::{debug, error, warn};

use super::frames::{cancel_target, rewrite_request_id};
use super::restart::CallOutcome;
use super::{police, track, Bridge, Origin};
use crate::relay::codes;
use crate::relay::envelope::{error_response, recover, FrameError, Recovered};
use crate::relay::{Frame, FrameKind, RawId};

impl Bridge {
    pub(super) fn on_backend_bytes(&mut self, bytes: Vec<u8>) {
        let frame = match Frame::parse(bytes) {
            Ok(frame) => frame,
            Err((bytes, err)) => return self.on_malformed_backend_frame(&bytes, &err),
        };
        let generation = self.gens.current.as_ref().map(|g| g.id).unwrap_or_default();
        match frame.kind.clone() {
            FrameKind::Request { id, method } => {
                let frame = match self.police_backend_request(&method, &frame) {
                    police::Policed::Pass => frame,
                    police::Policed::Rewrite(bytes) => match Frame::parse(bytes) {
                        Ok(f) => f,
                        Err(_) => return warn!("a rewritten frame did not parse; dropped"),
                    },
                    police::Policed::Refuse { code, message } => {
                        warn!(method, "{message}");
                        if let Some(g) = &self.gens.current {
                            g.send(error_response(&id, code, &message, None));
                        }
                        return;
                    }
                    police::Policed::Ask {
                        session,
                        path,
                        reason,
                        frame,
                    } => {
                        let held = super::allow::HeldWrite {
                            from: super::permissions::Asker::Agent(generation),
                            backend_id: id,
                            frame,
                        };
                        return self.ask(session, path, reason, held);
                    }
                };
                if !self.armed() {
                    self.forward_backend_request(generation, id, frame);
                } else if method == "fs/write_text_file" {
                    // Made with the agent held still (see `hold`).
                    self.write_held(super::allow::HeldWrite {
                        from: super::permissions::Asker::Agent(generation),
                        backend_id: id,
                        frame,
                    });
                } else if method == "terminal/create"
                    && self.defer_terminal(generation, &id, &frame)
                {
                    debug!("a terminal waits for the agent's processes to be let go");
                } else {
                    self.forward_backend_request(generation, id, frame);
                }
            }
            FrameKind::Notification { method } => match method.as_str() {
                "session/update" => {
                    // Only while a session is being loaded: most updates are chunks.
                    if let Some(sid) = self
                        .gens
                        .setup
                        .as_ref()
                        .is_some_and(|s| s.loading().is_some())
                        .then(|| frame.session_id())
                        .flatten()
                    {
                        if self.gens.setup.as_ref().and_then(|s| s.loading()) == Some(sid.as_str())
                        {
                            return debug!(
                                session = sid,
                                "swallowed a history replay update of a restored session"
                            );
                        }
                    }
                    if let Some((sid, mode)) = track::mode_change(&frame) {
                        if let Some(s) = self.sessions.table.get_mut(&sid) {
                            s.mode = Some(mode);
                        }
                    }
                    if self.may_show_denial(&frame) {
                        // The update first, then any prompt it leads to.
                        self.to_editor(frame.bytes.clone());
                        self.spot_denials(&frame);
                    } else {
                        self.to_editor(frame.bytes);
                    }
                }
                "$/cancel_request" => {
                    let target = cancel_target(&frame)
                        .and_then(|t| self.routes.backend_id_in_flight(generation, t));
                    match target.and_then(|bid| rewrite_request_id(&frame, &bid.to_string())) {
                        Some(bytes) => self.to_editor(bytes),
                        None => debug!("dropped a $/cancel_request from the backend for a request not in flight"),
                    }
                }
                _ => self.to_editor(frame.bytes),
            },
            FrameKind::Response { id, is_error } => {
                let entry = id
                    .as_bridge_number()
                    .and_then(|n| self.routes.backend_answered(n).map(|o| (n, o)));
                let Some((bid, origin)) = entry else {
                    return warn!(%id, "the backend answered a request that is not in flight; dropped");
                };
                match origin {
                    Origin::Editor {
                        id: editor_id,
                        track,
                        ..
                    } => {
                        let mut edited = None;
                        let mut opened = None;
                        let turn_of = match &track {
                            track::Track::Prompt(Some(session)) => Some(session.clone()),
                            _ => None,
                        };
                        if !is_error {
                            opened = track::apply_success(
                                track.clone(),
                                &frame,
                                &mut self.sessions.table,
                            );
                            match track {
                                track::Track::Initialize { params } => {
                                    let hidden = if self.armed() {
                                        police::hide_mcp_over_acp(&frame, editor_id.as_str())
                                    } else {
                                        Ok(None)
                                    };
                                    match hidden {
                                        // Only an answer the editor gets is
                                        // replayed to later generations.
                                        Ok(e) => {
                                            self.life.initialized();
                                            edited = e;
                                            self.sessions.caps = track::restore_caps(
                                                frame.payload_raw().unwrap_or("null"),
                                            );
                                            self.sessions.initialize = Some(params);
                                        }
                                        Err(e) => {
                                            let message = format!("zcode-acp cannot pass on the agent's initialize answer: {e}; the agent's answer is ambiguous, so MCP over ACP could not be hidden while the sandbox is armed");
                                            warn!("{message}");
                                            edited = Some(crate::relay::envelope::error_response(
                                                &editor_id,
                                                codes::INTERNAL_ERROR,
                                                &message,
                                                None,
                                            ));
                                        }
                                    }
                                }
                                track::Track::Authenticate { params } => {
                                    self.sessions.authenticate = Some(params)
                                }
                                _ => {}
                            }
                        }
                        let answer = edited.unwrap_or_else(|| frame.with_id(editor_id.as_str()));
                        match turn_of {
                            // The turn ended: what the agent left that would
                            // run outside is reverted, and put to the user,
                            // before the editor sees it end.
                            Some(session) => self.end_turn_after_audit(&session, answer),
                            None => self.to_editor(answer),
                        }
                        self.code.tools.opened(bid, opened.as_deref());
                        if let Some(session) = opened {
                            self.announce_first_session(&session);
                            self.announce_unknown_keys(&session);
                            self.confirm_hand_edits(&session);
                        }
                    }
                    Origin::Bridge => {
                        let outcome = if is_error {
                            let (code, message) = error_fields(&frame);
                            CallOutcome::Rejected { code, message }
                        } else {
                            CallOutcome::Ok(frame.payload_raw().unwrap_or("null").to_owned())
                        };
                        self.on_bridge_answer(bid, outcome);
                    }
                }
            }
        }
    }

    /// Sends a backend request on to the editor under a bridge id (which
    /// it returns).
    pub(super) fn forward_backend_request(
        &mut self,
        generation: u64,
        id: crate::relay::RawId,
        frame: Frame,
    ) -> u64 {
        let method = frame.method().unwrap_or_default().to_owned();
        let terminal_for = (method == "terminal/create")
            .then(|| frame.session_id())
            .flatten();
        if method == "terminal/release" {
            self.forget_terminal(&frame);
        }
        let bid = self.routes.backend_request(generation, id, terminal_for);
        self.to_editor(frame.with_id(&bid.to_string()));
        bid
    }

    fn forget_terminal(&mut self, frame: &Frame) {
        #[derive(serde::Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Release {
            terminal_id: String,
        }
        if let Ok(r) = frame.params_as::<Release>() {
            self.routes.terminal_released(&r.terminal_id);
        }
    }

    /// A frame too large to relay still must not leave its peer waiting.
    /// A frame of the agent's the bridge cannot route exactly is logged
    /// and never passed on; whoever waits on it hears why.
    fn on_malformed_backend_frame(&mut self, bytes: &[u8], err: &FrameError) {
        let preview = String::from_utf8_lossy(&bytes[..bytes.len().min(200)]).into_owned();
        warn!("dropped a malformed frame from the backend ({err}): {preview}");
        self.refuse_backend_frame(
            &recover(bytes),
            (
                codes::INTERNAL_ERROR,
                format!("the agent's answer could not be read ({err})"),
            ),
            (
                err.code(),
                format!("zcode-acp could not read this message: {err}"),
            ),
        );
    }

    /// A frame of the agent's over `--max-frame-bytes`: dropped, and
    /// answered like an unreadable one.
    pub(super) fn on_backend_too_large(&mut self, prefix: &[u8], size: usize) {
        let limit = self.cfg.max_frame_bytes;
        let found = recover(prefix);
        error!(size, limit, id = %crate::relay::envelope::shown(&found.id), "dropped a frame from the backend that exceeds --max-frame-bytes");
        self.refuse_backend_frame(
            &found,
            (
                codes::FRAME_TOO_LARGE,
                format!("zcode-acp dropped the agent's answer: it is {size} bytes, over the limit of {limit} bytes; raise it with --max-frame-bytes"),
            ),
            (
                codes::FRAME_TOO_LARGE,
                format!("zcode-acp dropped this request: it is {size} bytes, over the limit of {limit} bytes"),
            ),
        );
    }

    /// Answers an agent frame that is not passed on, toward whoever waits
    /// on it: an answer to a request in flight reaches whoever asked as the
    /// error `to_asker`; a request of the agent's own (also one whose id
    /// the bridge does not route by, `null` or a fraction) gets `to_agent`.
    fn refuse_backend_frame(
        &mut self,
        found: &Recovered,
        to_asker: (i64, String),
        to_agent: (i64, String),
    ) {
        let awaited = found
            .id
            .as_ref()
            .and_then(RawId::as_bridge_number)
            .is_some_and(|n| self.routes.awaits_backend(n));
        if let (Some(id), true, false) = (&found.id, awaited, found.method) {
            let answer = error_response(id, to_asker.0, &to_asker.1, None);
            return self.on_backend_bytes(answer);
        }
        let id = match &found.id {
            Some(id) if found.method || !found.answer => id,
            None if !found.answer => match &found.reply_id {
                Some(id) => id,
                None => return,
            },
            _ => return,
        };
        if let Some(g) = &self.gens.current {
            g.send(error_response(id, to_agent.0, &to_agent.1, None));
        }
    }

    /// The backend died (or closed its stdout) without being asked to.
    pub(super) fn on_backend_lost(&mut self, status: Option<ExitStatus>, last_words: Vec<String>) {
        let Some(generation) = self.gens.current.take() else {
            return;
        };
        let how = match status {
            Some(s) => format!("{s}"),
            None => "with an unknown status".into(),
        };
        if self.life.is_shutting_down() {
            tracing::info!(
                generation = generation.id,
                "the agent backend exited ({how})"
            );
            self.fail_in_flight(
                generation.id,
                codes::SHUTTING_DOWN,
                "zcode-acp is shutting down",
            );
            self.gens.dying.push(generation);
            return;
        }
        if let Some(why) = self.hold.ended.take() {
            // Ended on purpose (see `hold::end_held_world`): restarted as
            // asked, not counted as a crash.
            let id = generation.id;
            self.gens.dying.push(generation);
            self.fail_in_flight(
                id,
                codes::BACKEND_CRASHED,
                &format!("zcode-acp ended the agent's processes ({why}) and is starting it again; send the request again once it is back"),
            );
            return self.request_restart(&why);
        }
        error!(
            generation = generation.id,
            pid = generation.pid,
            "the agent backend exited unexpectedly ({how})"
        );
        if self.gens.setup.take().is_some() {
            error!("the agent backend died while being set up");
        }
        let id = generation.id;
        self.gens.dying.push(generation);
        self.on_crash(&how, &last_words, Some(id));
    }
}

pub(super) use super::frames::error_fields;
