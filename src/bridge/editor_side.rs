//! Frames from the editor.

use tracing::{debug, warn};

use super::lifecycle::Phase;
use super::{track, AtEditor, Bridge, Terminal};
use crate::relay::codes;
use crate::relay::envelope::{error_response, recover, result_response, shown, FrameError};
use crate::relay::{Frame, FrameKind, RawId};

impl Bridge {
    pub(super) fn on_editor_bytes(&mut self, bytes: Vec<u8>) {
        match Frame::parse(bytes) {
            Ok(frame) => self.on_editor_frame(frame),
            Err((bytes, err)) => self.on_malformed_editor_frame(&bytes, &err),
        }
    }

    /// A frame of the editor's over `--max-frame-bytes`: dropped, and
    /// answered toward whoever waits on it, as an unreadable one is.
    pub(super) fn on_editor_too_large(&mut self, prefix: &[u8], size: usize) {
        let limit = self.cfg.max_frame_bytes;
        let found = recover(prefix);
        tracing::error!(size, limit, id = %shown(&found.id), "dropped a frame from the editor that exceeds --max-frame-bytes");
        let Some(id) = found.id else { return };
        let awaited = id
            .as_bridge_number()
            .is_some_and(|n| self.routes.awaits_editor(n));
        if awaited && !found.method {
            let message = format!(
                "zcode-acp dropped the editor's answer: it is {size} bytes, over the limit of {limit} bytes"
            );
            if let Ok(frame) =
                Frame::parse(error_response(&id, codes::FRAME_TOO_LARGE, &message, None))
            {
                self.on_editor_response(id, frame);
            }
            return;
        }
        let message = format!(
            "zcode-acp dropped this request: the frame is {size} bytes, over the limit of {limit} bytes; raise it with --max-frame-bytes"
        );
        self.answer_error(&id, codes::FRAME_TOO_LARGE, &message);
    }

    /// A frame the bridge cannot route exactly is never passed on: a
    /// request is answered with an error where its id can be read, an
    /// unreadable answer to a request the editor was asked is routed as an
    /// error answer (so whoever asked is not left waiting), a batch gets
    /// one error, and anything else is logged.
    fn on_malformed_editor_frame(&mut self, bytes: &[u8], err: &FrameError) {
        let found = recover(bytes);
        warn!(id = %shown(&found.id), "malformed frame from the editor: {err}");
        let message = format!("zcode-acp could not read this message: {err}");
        match found.id {
            Some(id) if found.answer && !found.method => {
                let garbled = error_response(&id, err.code(), &message, None);
                if let Ok(frame) = Frame::parse(garbled) {
                    self.on_editor_response(id, frame);
                }
            }
            Some(id) => self.answer_error(&id, err.code(), &message),
            // An id JSON-RPC allows but the bridge does not route by
            // (`null`, a fraction): the refusal is answered to it as written.
            None if found.reply_id.is_some() && !found.answer => {
                let id = found.reply_id.clone().unwrap_or(RawId("null".into()));
                self.answer_error(&id, err.code(), &message)
            }
            None if matches!(err, FrameError::Batch) => {
                self.answer_error(&RawId("null".into()), err.code(), &message)
            }
            None => {}
        }
    }

    pub(super) fn on_editor_frame(&mut self, frame: Frame) {
        if let FrameKind::Response { id, .. } = &frame.kind {
            let id = id.clone();
            return self.on_editor_response(id, frame);
        }
        // A held agent could not act on a cancelled turn: the writes it
        // waits on are withdrawn first.
        if frame.method() == Some("session/cancel")
            && self.writes_under_hold_for(&super::frames::session_of(&frame))
        {
            self.withdraw_held_writes("the user cancelled the turn");
        }
        // Whether it goes on now is the lifecycle's to say (`Bridge::admit`).
        self.admit(frame)
    }

    /// Holds an editor message until the backend is back, unless it is a
    /// `$/cancel_request` of a request held already: that one is answered
    /// as cancelled instead.
    pub(super) fn hold_for_backend(&mut self, frame: Frame) {
        if frame.method() == Some("$/cancel_request") && self.cancel_queued(&frame) {
            return;
        }
        debug!(
            method = frame.method(),
            "queued an editor message until the backend restart completes"
        );
        self.hold(frame);
    }

    /// Holds an editor frame until the backend is back. Past the queue's
    /// bound a request is answered at once, and a notification dropped
    /// (and logged): the bridge does not grow without end while the agent
    /// restarts.
    fn hold(&mut self, frame: Frame) {
        let Err(frame) = self.routes.hold(frame) else {
            return;
        };
        match &frame.kind {
            FrameKind::Request { id, method } => {
                warn!(method, "the restart queue is full; answered at once");
                let message = format!(
                    "zcode-acp is restarting the agent and its queue for it is full (at most {} messages or {} MiB); send this again once it is back",
                    super::routing::MAX_HELD_FRAMES,
                    super::routing::MAX_HELD_BYTES >> 20
                );
                self.answer_error(id, codes::QUEUE_FULL, &message);
            }
            _ => warn!(
                method = frame.method(),
                "the restart queue is full; an editor notification was dropped"
            ),
        }
    }

    /// Sends queued editor frames on, in order, while the backend is up.
    pub(super) fn release_queue(&mut self) {
        while self.life.phase() == &Phase::Running {
            let Some(frame) = self.routes.next_held() else {
                return;
            };
            self.dispatch(frame);
        }
    }

    /// A `$/cancel_request` for a request still in the queue answers that
    /// request right here: it never reached the backend.
    fn cancel_queued(&mut self, frame: &Frame) -> bool {
        let Some(target) = cancel_target(frame) else {
            return false;
        };
        if !self.routes.cancel_held(&target) {
            return false;
        }
        self.answer_error(
            &target,
            codes::REQUEST_CANCELLED,
            "request cancelled before it reached the agent",
        );
        true
    }

    pub(super) fn dispatch(&mut self, frame: Frame) {
        let Some(generation) = self.gens.current.as_ref().map(|g| g.id) else {
            // No backend right now (it just died): hold the frame for the
            // next generation.
            return self.hold(frame);
        };
        match frame.kind.clone() {
            FrameKind::Notification { method } => {
                if method == "$/cancel_request" {
                    return self.forward_editor_cancel(&frame);
                }
                if let Some(sid) = self
                    .sessions
                    .table
                    .any_lost()
                    .then(|| frame.session_id())
                    .flatten()
                {
                    if let Some(reason) = self.sessions.table.lost_reason(&sid) {
                        debug!(
                            session = sid,
                            method,
                            "dropping a notification for a session that was not restored: {reason}"
                        );
                        return;
                    }
                }
                self.send_to_backend(frame.bytes);
            }
            FrameKind::Request { id, method } => {
                if let Some(sid) = self
                    .sessions
                    .table
                    .any_lost()
                    .then(|| frame.session_id())
                    .flatten()
                {
                    if let Some(reason) = self.sessions.table.lost_reason(&sid).map(str::to_owned) {
                        match method.as_str() {
                            // These may bring it back.
                            "session/load" | "session/resume" => {}
                            "session/close" => {
                                self.sessions.table.forget_lost(&sid);
                                return self.to_editor(result_response(&id, "{}"));
                            }
                            _ => {
                                let message = format!(
                                    "session {sid} could not be carried over to the restarted agent: {reason}. Open a new session (or load this one again if the agent supports it)."
                                );
                                return self.answer_error(
                                    &id,
                                    codes::SESSION_NOT_RESTORED,
                                    &message,
                                );
                            }
                        }
                    }
                }
                let track = track::editor_request(&method, &frame);
                if let track::Track::Prompt(_) = track {
                    // A new turn: refusals the user declined may be asked again.
                    self.asks.writes.new_turn();
                    self.asks.net.new_turn();
                    // What a process the agent left running planted since
                    // the last turn ended is reverted before the next one.
                    if let Some(sid) = frame.session_id() {
                        self.run_audit(&sid);
                    }
                }
                if let Some(uncovered) = self.uncovered_roots(&track) {
                    // The running generation cannot write there: re-arm
                    // first, and let the new generation answer this request.
                    let list = uncovered
                        .iter()
                        .map(|p| p.display().to_string())
                        .collect::<Vec<_>>()
                        .join(", ");
                    self.gens.pending_roots.extend(uncovered);
                    self.routes.hold_first(frame);
                    return self.request_restart(&format!(
                        "a session opened a workspace the sandbox does not cover yet ({list})"
                    ));
                }
                if let Some(config) = self.project_wants_sandbox(&track) {
                    // The user asked for confinement for this project: arm the
                    // bridge before the session opens, or refuse it; never the
                    // opposite silently.
                    match (self.cfg.platform)() {
                        Ok(enforcer) => {
                            self.sandbox = crate::confine::Sandbox::Ready(enforcer);
                            if let track::Track::Create(s) | track::Track::Reopen(s) = &track {
                                self.gens.pending_roots.extend(s.roots().cloned());
                            }
                            self.routes.hold_first(frame);
                            return self.request_restart(&format!(
                                "{} turns the sandbox on",
                                config.display()
                            ));
                        }
                        Err(why) => {
                            let message = format!(
                                "{} turns the sandbox on for this project, but {why}, so the session was not opened; \
                                 set \"enabled\": false there, or start zcode-acp with --no-sandbox to run the agent unconfined on purpose",
                                config.display()
                            );
                            warn!(method, "{message}");
                            return self.answer_error(&id, codes::SANDBOX_UNAVAILABLE, &message);
                        }
                    }
                }
                let (servers, socket) = self.with_code_server(&frame, &track).unzip();
                let (bid, reused) =
                    self.routes
                        .editor_request(generation, id.clone(), method, track);
                if let Some(index) = socket.flatten() {
                    self.code.tools.await_open(bid, index);
                }
                if reused {
                    warn!(%id, "the editor reused the id of a request still in flight");
                }
                let mut bytes = frame.with_id(&bid.to_string());
                if let Some(servers) = servers {
                    match crate::relay::splice::set(&bytes, &["params", "mcpServers"], &servers) {
                        Ok(with) => bytes = with,
                        Err(e) => {
                            warn!("cannot add the run_code server to this session ({e}); it is opened without it");
                            // Nobody is told of its editor socket: closed.
                            self.code.tools.opened(bid, None);
                        }
                    }
                }
                self.send_to_backend(bytes);
            }
            FrameKind::Response { .. } => unreachable!("responses are routed before dispatch"),
        }
    }

    /// The session's `mcpServers` with the `run_code` server added, when
    /// code execution is on and `frame` opens a session; the editor's own
    /// entries are kept as it wrote them.
    /// Also the editor's socket made for a session being opened (to bind
    /// once the agent names it).
    fn with_code_server(
        &mut self,
        frame: &Frame,
        track: &track::Track,
    ) -> Option<(String, Option<usize>)> {
        let session = match track {
            track::Track::Create(s) | track::Track::Reopen(s) => s,
            _ => {
                let opens = frame.method().is_some_and(|m| {
                    matches!(
                        m,
                        "session/new" | "session/load" | "session/resume" | "session/fork"
                    )
                });
                if opens
                    && self
                        .cfg
                        .code_exec
                        .as_ref()
                        .is_some_and(|c| c.everywhere.is_some())
                {
                    warn!("this session's request could not be read, so run_code is not offered to it");
                }
                return None;
            }
        };
        let code_exec = self.code_exec_for(session)?;
        #[derive(serde::Deserialize)]
        struct Raw {
            #[serde(rename = "mcpServers", default)]
            mcp_servers: Option<Box<serde_json::value::RawValue>>,
        }
        let raw = frame.params_as::<Raw>().ok()?.mcp_servers;
        let opening = matches!(track, track::Track::Create(_));
        self.code_server_entry(raw.as_ref().map(|r| r.get()), session, opening, &code_exec)
    }

    /// `servers` (the editor's list, kept as written) with the run_code
    /// server for `session` added: the session's MCP servers file and,
    /// where the editor offers its files, the session's socket and token.
    /// Also the socket's slot when it was made for a session being opened
    /// (bound once the agent names it); a socket nobody is told of is
    /// closed.
    pub(super) fn code_server_entry(
        &mut self,
        servers: Option<&str>,
        session: &crate::session::Session,
        opening: bool,
        code_exec: &crate::run_code::inject::CodeExec,
    ) -> Option<(String, Option<usize>)> {
        let mut args = self.servers_file_args(servers);
        let mut made = None;
        if let Some(can) = self.editor_fs() {
            made = match self.code.servers_files.dir() {
                Ok(dir) if opening => self.code.tools.for_opening(&dir),
                Ok(dir) => self.code.tools.for_session(&dir, &session.id),
                Err(e) => {
                    warn!("cannot make run_code's directory ({e}): code cannot reach the editor's files");
                    None
                }
            };
            if let Some(m) = &made {
                args.extend([
                    "--editor".to_owned(),
                    m.path.to_string_lossy().into_owned(),
                    "--editor-can".to_owned(),
                    can,
                ]);
            }
        }
        let env: Vec<(&str, &str)> = made
            .as_ref()
            .map(|m| (crate::run_code::tools::editor::TOKEN_ENV, m.token.as_str()))
            .into_iter()
            .collect();
        let with = crate::run_code::inject::with_code_server(
            servers,
            &code_exec.exe,
            &session.cwd,
            self.confinement.confined_by().as_deref(),
            &args,
            &env,
        );
        let slot = made.and_then(|m| m.opening);
        match with {
            Some(s) => Some((s, slot)),
            None => {
                if let Some(index) = slot {
                    self.code.tools.close(index);
                }
                None
            }
        }
    }

    /// What the editor lets code do with its files (`read_text_file`,
    /// `write_text_file`, comma-separated), if anything.
    /// Writes only where the bridge arms a sandbox: unarmed, nothing would
    /// judge them.
    pub(super) fn editor_fs(&self) -> Option<String> {
        let armed = self.armed();
        let can: Vec<&str> = [
            ("readTextFile", "read_text_file"),
            ("writeTextFile", "write_text_file"),
        ]
        .into_iter()
        .filter(|(cap, name)| self.editor_offers_fs(cap) && (armed || *name == "read_text_file"))
        .map(|(_, name)| name)
        .collect();
        (!can.is_empty()).then(|| can.join(","))
    }

    /// `--servers FILE` when the session has MCP servers to hand over.
    pub(super) fn servers_file_args(&mut self, servers: Option<&str>) -> Vec<String> {
        match self.servers_file(servers) {
            Some(file) => vec!["--servers".to_owned(), file.to_string_lossy().into_owned()],
            None => Vec::new(),
        }
    }

    /// The file that hands the session's MCP servers to its run_code
    /// server, if it has any; without it runs get no tools (and say so).
    pub(super) fn servers_file(&mut self, servers: Option<&str>) -> Option<std::path::PathBuf> {
        match self.code.servers_files.file_for(servers?) {
            Ok(file) => file,
            Err(e) => {
                warn!("cannot hand this session's MCP servers to run_code ({e}); its runs can call no tools");
                None
            }
        }
    }

    /// How to offer `run_code` to `session`, if it is offered: everywhere
    /// (`--code-exec`, the user config), or in a project whose approved
    /// sandbox.json says `codeExec: true` (read only, as for the switch).
    /// The project is the session's own (its `cwd`), never one of its
    /// additional directories.
    pub(super) fn code_exec_for(
        &mut self,
        session: &crate::session::Session,
    ) -> Option<crate::run_code::inject::CodeExec> {
        let code_exec = self.cfg.code_exec.clone()?;
        if code_exec.everywhere.is_some() {
            return Some(code_exec);
        }
        let real = crate::policy::resolve_real(&session.cwd).ok()?;
        let project = crate::config::project::inspect(&real, &self.cfg.managed);
        if project.ledger.code_exec == Some(false) && !project.code_exec {
            // Turned off: recorded (off the loop), so turning it on again
            // needs a new approval.
            self.disk.prepare(&self.cfg.managed, real.clone());
        }
        if project.code_exec_unapproved {
            warn!(root = %real.display(), "sandbox.json asks for run_code, but `codeExec: true` is not approved yet; approve it with `zcode-acp approve --workspace DIR`");
        }
        project.code_exec.then_some(code_exec)
    }

    /// Roots of a session being opened that the armed generation does not
    /// cover (only when generations are confined).
    fn uncovered_roots(&self, track: &track::Track) -> Option<Vec<std::path::PathBuf>> {
        if !self.sandbox.arms() {
            return None;
        }
        let session = match track {
            track::Track::Create(s) | track::Track::Reopen(s) => s,
            _ => return None,
        };
        let uncovered: Vec<std::path::PathBuf> = session
            .roots()
            .map(|r| crate::policy::resolve_real(r).unwrap_or_else(|_| r.clone()))
            .filter(|r| !self.gens.armed_roots.iter().any(|a| r.starts_with(a)))
            .collect();
        (!uncovered.is_empty()).then_some(uncovered)
    }

    /// The config of a project that turns the sandbox on, for a session
    /// being opened while the bridge is not armed. Decided by reading only;
    /// each project's template and ledger are prepared off the loop.
    fn project_wants_sandbox(&mut self, track: &track::Track) -> Option<std::path::PathBuf> {
        if !self.cfg.honor_project_switch || self.sandbox.arms() {
            return None;
        }
        let session = match track {
            track::Track::Create(s) | track::Track::Reopen(s) => s,
            _ => return None,
        };
        let roots: Vec<std::path::PathBuf> = session
            .roots()
            .filter_map(|root| crate::policy::resolve_real(root).ok())
            .collect();
        let wants = roots.iter().find_map(|real| {
            crate::config::project::inspect(real, &self.cfg.managed)
                .armed
                .then(|| crate::config::project::config_path(real))
        });
        for real in roots {
            self.disk.prepare(&self.cfg.managed, real);
        }
        wants
    }

    fn forward_editor_cancel(&mut self, frame: &Frame) {
        let Some(target) = cancel_target(frame) else {
            return warn!("ignoring a $/cancel_request without a readable requestId");
        };
        match self.routes.editor_id_in_flight(&target) {
            Some(bid) => match rewrite_request_id(frame, &bid.to_string()) {
                Some(bytes) => self.send_to_backend(bytes),
                None => warn!("could not rewrite a $/cancel_request; dropped"),
            },
            None => {
                if !self.cancel_queued(frame) {
                    debug!(%target, "$/cancel_request for a request that is no longer in flight");
                }
            }
        }
    }

    fn send_to_backend(&mut self, bytes: Vec<u8>) {
        match &self.gens.current {
            Some(g) if g.send_carrying(bytes, self.editor.carried.take()) => {}
            _ => debug!("the backend is gone; its stdin no longer takes frames"),
        }
    }

    fn on_editor_response(&mut self, id: RawId, frame: Frame) {
        let entry = id
            .as_bridge_number()
            .and_then(|n| self.routes.editor_answered(n).map(|e| (n, e)));
        let Some((bid, entry)) = entry else {
            return warn!(%id, "the editor answered a request that is not in flight; dropped");
        };
        match entry {
            AtEditor::Bridge => debug!(bid, "the editor answered a bridge request"),
            AtEditor::Prompt => self.on_prompt_answer(bid, &frame),
            AtEditor::NetPrompt => self.on_net_prompt_answer(bid, &frame),
            AtEditor::ConfigPrompt { root } => self.on_config_answer(root, &frame),
            AtEditor::AgentStatePrompt { agent, location } => {
                self.on_agent_state_answer(agent, location, &frame)
            }
            AtEditor::AuditPrompt { kept } => self.on_audit_answer(kept, &frame),
            AtEditor::CodeTool { id } => {
                self.code_tool_answered(&id, &frame);
                self.editor_answered_under_hold(bid);
            }
            AtEditor::Backend {
                generation,
                id: backend_id,
                terminal_for,
            } => {
                if self.gens.current.as_ref().map(|g| g.id) != Some(generation) {
                    self.editor_answered_under_hold(bid);
                    return debug!(%backend_id, "dropping the editor's answer to a stopped backend generation");
                }
                if let (
                    Some(session),
                    FrameKind::Response {
                        is_error: false, ..
                    },
                ) = (terminal_for, &frame.kind)
                {
                    #[derive(serde::Deserialize)]
                    #[serde(rename_all = "camelCase")]
                    struct Created {
                        terminal_id: String,
                    }
                    if let Ok(c) = frame.payload_as::<Created>() {
                        self.routes.terminal_created(Terminal {
                            generation,
                            session,
                            id: c.terminal_id,
                        });
                    }
                }
                self.send_to_backend(frame.with_id(backend_id.as_str()));
                self.editor_answered_under_hold(bid);
            }
        }
    }
}

/// Notifications that must reach a busy backend even while a restart waits
/// for it to finish: they are how the user stops the turn being waited on.
pub(super) fn is_cancellation(frame: &Frame) -> bool {
    matches!(frame.method(), Some("session/cancel" | "$/cancel_request"))
}

pub(super) use super::frames::{cancel_target, rewrite_request_id};
