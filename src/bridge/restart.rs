//! Restarting the backend under a live editor connection.
//!
//! The order matters: drain first (never kill a running turn), then stop
//! the old generation completely (so nothing of it can race the new one),
//! then start the new one and put every live session back before any queued
//! editor request is released, so the editor's next message finds its
//! session where it left it.

use serde_json::json;
use tracing::{error, info, warn};

use super::{Bridge, CallOutcome, Mode, Origin, RestartReason};
use crate::backend::{Generation, SpawnContext};
use crate::relay::codes;
use crate::relay::envelope::request;

/// Why a start attempt did not produce a working generation.
enum StartError {
    /// The process could not be started, or refused to be set up.
    Failed(String),
    /// The process died while being set up (already counted as a crash).
    Died(String),
    /// Retrying cannot help: give up at once, with this message.
    Refused(String),
    /// The bridge is shutting down; stop trying.
    Aborted,
}

impl Bridge {
    pub(super) async fn restart(&mut self, reason: RestartReason) {
        if !reason.crash {
            warn!(
                "restarting the agent backend: {}. Processes the agent started (dev servers, MCP servers it spawned) will be stopped",
                reason.text
            );
            self.mode = Mode::Draining;
            while self.editor_requests_in_flight() > 0 && self.generation.is_some() {
                if self.shutdown.is_some() {
                    return;
                }
                let event = self.next_event().await;
                self.handle(event);
            }
        } else if reason.text != "start" {
            warn!(
                "restarting the agent backend: {}. Anything the agent had running was lost with it",
                reason.text
            );
        }
        if matches!(self.mode, Mode::Failed(_)) {
            return;
        }
        // Before a re-arm: the audit of what this generation left.
        let first = self.sessions.live().next().map(|s| s.id.clone());
        if let Some(session) = first {
            self.run_audit(&session);
        }
        self.mode = Mode::Restarting;
        if let Some(old) = self.generation.take() {
            let id = old.id;
            self.stop_generation(old).await;
            // A graceful restart waited for every editor request, but the
            // bridge answers anything left rather than lose it.
            self.fail_in_flight(
                id,
                codes::BACKEND_CRASHED,
                "the agent was restarted before it answered",
            );
        }
        for dead in std::mem::take(&mut self.dying) {
            self.stop_generation(dead).await;
        }

        loop {
            let delay = self.backoff();
            if !delay.is_zero() {
                info!(?delay, "waiting before starting the agent backend again");
                if !self.pump_for(delay).await {
                    return;
                }
            }
            self.pending_restart = None;
            match self.start_generation().await {
                Ok(()) => break,
                Err(StartError::Aborted) => return,
                Err(StartError::Refused(why)) => {
                    error!("{why}");
                    self.give_up(why);
                    return;
                }
                Err(StartError::Failed(why)) => {
                    error!("starting the agent backend failed: {why}");
                    self.last_failure = Some(why);
                    if let Some(g) = self.generation.take() {
                        self.dying.push(g);
                    }
                    self.note_crash();
                }
                Err(StartError::Died(why)) => {
                    // on_backend_lost has answered its requests and counted it.
                    error!("the agent backend died while being set up: {why}");
                }
            }
            for dead in std::mem::take(&mut self.dying) {
                self.stop_generation(dead).await;
            }
            if matches!(self.mode, Mode::Failed(_)) {
                return;
            }
            self.mode = Mode::Restarting;
        }
        // A restart asked for while this one was setting up (after the
        // command was prepared) stays pending: the main loop runs it next.
        self.mode = Mode::Running;
        self.take_audit_baseline();
        if reason.text != "start" {
            self.announce_restart(&reason.text);
        }
        self.release_queue();
    }

    fn editor_requests_in_flight(&self) -> usize {
        self.at_backend
            .values()
            .filter(|r| matches!(r.origin, Origin::Editor { .. }))
            .count()
    }

    /// Handles events for `duration` (queueing editor requests). Returns
    /// false if the bridge is shutting down.
    async fn pump_for(&mut self, duration: std::time::Duration) -> bool {
        let deadline = tokio::time::Instant::now() + duration;
        loop {
            if self.shutdown.is_some() {
                return false;
            }
            tokio::select! {
                _ = tokio::time::sleep_until(deadline) => return true,
                event = self.next_event() => self.handle(event),
            }
        }
    }

    async fn start_generation(&mut self) -> Result<(), StartError> {
        self.generations_started += 1;
        let id = self.generations_started;
        let mut roots: Vec<std::path::PathBuf> = self
            .sessions
            .roots()
            .iter()
            .chain(&self.pending_roots)
            .map(|r| crate::policy::resolve_real(r).unwrap_or_else(|_| r.clone()))
            .collect();
        roots.sort();
        roots.dedup();
        let grants = self.grants.clone();
        let ctx = SpawnContext {
            argv: &self.cfg.backend,
            roots: &roots,
            generation: id,
            grants: &grants,
        };
        let cmd = self.hook.prepare(&ctx).map_err(|e| match e {
            crate::backend::SpawnError::Refused(why) => StartError::Refused(why),
            other => StartError::Failed(other.to_string()),
        })?;
        // Before the agent starts, so its first refusals are seen too.
        self.watch_violations();
        let generation =
            Generation::start(id, &cmd, self.cfg.max_frame_bytes, self.backend_tx.clone())
                .map_err(|e| StartError::Failed(e.to_string()))?;
        info!(
            generation = id,
            pid = generation.pid,
            confinement = generation.confinement,
            command = ?cmd.argv,
            "agent backend started"
        );
        self.generation = Some(generation);
        self.armed_roots = roots;
        self.pending_roots.clear();

        let Some(init) = self.initialize.clone() else {
            // The editor has not initialized yet; it will do so itself.
            return Ok(());
        };
        match self.call_backend("initialize", &init).await? {
            CallOutcome::Ok(result) => {
                let caps = super::track::restore_caps(&result);
                if caps != self.caps {
                    warn!(?caps, previous = ?self.caps, "the restarted agent advertises different session capabilities");
                }
                self.caps = caps;
            }
            CallOutcome::Rejected { message, .. } => {
                return Err(StartError::Failed(format!(
                    "the agent refused the replayed initialize: {message}"
                )))
            }
            CallOutcome::Lost => return Err(StartError::Died("during initialize".into())),
        }
        let mut login_problem = None;
        if let Some(auth) = self.authenticate.clone() {
            match self.call_backend("authenticate", &auth).await? {
                CallOutcome::Ok(_) => {}
                CallOutcome::Rejected { message, .. } => {
                    login_problem = Some(format!(
                        "the restarted agent refused the editor's saved login ({message}); log in again from the editor"
                    ))
                }
                CallOutcome::Lost => return Err(StartError::Died("during authenticate".into())),
            }
        }
        self.restore_sessions(login_problem).await
    }

    async fn restore_sessions(&mut self, login_problem: Option<String>) -> Result<(), StartError> {
        let sessions: Vec<crate::session::Session> = self.sessions.live().cloned().collect();
        if !sessions.is_empty() {
            info!(count = sessions.len(), caps = ?self.caps, "restoring live sessions on the new backend");
        }
        for session in sessions {
            if let Some(problem) = &login_problem {
                self.lose(&session.id, problem.clone());
                continue;
            }
            // Resume first (nothing is replayed); where the agent refuses it
            // but can load, load (the replayed history is swallowed) before
            // calling the session lost.
            let mut methods = Vec::new();
            if self.caps.resume {
                methods.push("session/resume");
            }
            if self.caps.load {
                methods.push("session/load");
            }
            if methods.is_empty() {
                self.lose(
                    &session.id,
                    "the agent supports neither session/resume nor session/load".into(),
                );
                continue;
            }
            let mut params = json!({
                "sessionId": session.id,
                "cwd": session.cwd,
                "mcpServers": session.mcp_servers,
            });
            if !session.additional_directories.is_empty() {
                params["additionalDirectories"] = json!(session.additional_directories);
            }
            let mut refusals: Vec<String> = Vec::new();
            let mut restored_by = None;
            for method in methods {
                if method == "session/load" {
                    self.swallow_updates.insert(session.id.clone());
                }
                let outcome = self.call_backend(method, &params.to_string()).await;
                self.swallow_updates.remove(&session.id);
                match outcome? {
                    CallOutcome::Ok(_) => {
                        restored_by = Some(method);
                        break;
                    }
                    CallOutcome::Rejected { code, message } if code == codes::AUTH_REQUIRED => {
                        // A new login is needed: loading instead cannot help.
                        refusals = vec![format!("the restarted agent needs you to log in again ({message}); zcode-acp never starts a login on its own")];
                        break;
                    }
                    CallOutcome::Rejected { message, .. } => {
                        warn!(
                            session = session.id,
                            method, "the restarted agent refused to restore the session: {message}"
                        );
                        refusals.push(format!("the agent refused {method}: {message}"));
                    }
                    CallOutcome::Lost => return Err(StartError::Died(format!("during {method}"))),
                }
            }
            let Some(method) = restored_by else {
                self.lose(&session.id, refusals.join("; then "));
                continue;
            };
            self.reapply_settings(&session).await?;
            info!(session = session.id, method, "session restored");
        }
        Ok(())
    }

    /// Puts back what the editor had set on the session.
    async fn reapply_settings(
        &mut self,
        session: &crate::session::Session,
    ) -> Result<(), StartError> {
        let mut calls: Vec<(&str, serde_json::Value)> = Vec::new();
        if let Some(mode) = &session.mode {
            calls.push((
                "session/set_mode",
                json!({ "sessionId": session.id, "modeId": mode }),
            ));
        }
        if let Some(model) = &session.model {
            calls.push((
                "session/set_model",
                json!({ "sessionId": session.id, "modelId": model }),
            ));
        }
        for (config_id, value) in &session.config_options {
            calls.push((
                "session/set_config_option",
                json!({ "sessionId": session.id, "configId": config_id, "value": value }),
            ));
        }
        for (method, params) in calls {
            match self.call_backend(method, &params.to_string()).await? {
                CallOutcome::Ok(_) => {}
                CallOutcome::Rejected { message, .. } => {
                    warn!(
                        session = session.id,
                        method,
                        "the restarted agent refused a setting the editor had made: {message}"
                    )
                }
                CallOutcome::Lost => return Err(StartError::Died(format!("during {method}"))),
            }
        }
        Ok(())
    }

    fn lose(&mut self, session: &str, reason: String) {
        error!(
            session,
            "session could not be carried over to the restarted agent: {reason}"
        );
        self.sessions.mark_lost(session, reason);
    }

    /// Sends a request of the bridge's own and handles events until it is
    /// answered (editor requests are queued meanwhile).
    async fn call_backend(
        &mut self,
        method: &str,
        params: &str,
    ) -> Result<CallOutcome, StartError> {
        let Some(gen_id) = self.generation.as_ref().map(|g| g.id) else {
            return Ok(CallOutcome::Lost);
        };
        let bid = self.alloc_id();
        self.at_backend.insert(
            bid,
            super::AtBackend {
                generation: gen_id,
                origin: Origin::Bridge,
            },
        );
        if let Some(g) = &self.generation {
            g.send(request(bid, method, params));
        }
        loop {
            if let Some(outcome) = self.bridge_results.remove(&bid) {
                return Ok(outcome);
            }
            if self.shutdown.is_some() {
                return Err(StartError::Aborted);
            }
            let event = self.next_event().await;
            self.handle(event);
        }
    }
}
