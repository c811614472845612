//! Restarting the backend under a live editor connection, as steps the
//! event loop takes one at a time; `lifecycle` decides the phase, this
//! file carries it out. No step waits for an answer by running a loop of
//! its own: a request of the bridge's own is sent, and its answer, when the
//! loop delivers it, takes the next step.
//!
//! The order matters: drain first (never kill a running turn), then stop
//! the old generation completely (so nothing of it can race the new one),
//! audit what it left, then start the new one and put every live session
//! back before any queued editor request is released, so the editor's next
//! message finds its session where it left it.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::time::Instant;

use serde_json::json;
use tracing::{debug, error, info, warn};

use super::lifecycle::{AfterCrash, Phase};
use super::Bridge;
use crate::backend::{Generation, PreparedCommand};
use crate::confine::{ArmError, BackendRequest, Confinement, Launch};
use crate::relay::codes;
use crate::relay::envelope::request;
use crate::session::Session;

/// The answer to a request of the bridge's own.
#[derive(Debug)]
pub(super) enum CallOutcome {
    Ok(String),
    Rejected { code: i64, message: String },
}

/// Why a start attempt did not produce a generation.
enum StartFailure {
    /// Retrying cannot help (the sandbox cannot be armed as configured).
    Refused(String),
    /// The process could not be started.
    Failed(String),
}

/// What the loop does after a step.
pub(super) enum Flow {
    /// Something was done: look again before waiting.
    Again,
    /// Nothing to do until an event (or the lifecycle's wake-up time).
    Wait,
    /// The bridge is done.
    Exit,
}

/// A generation being set up: the request awaited and what comes next.
#[derive(Debug)]
pub(super) struct Setup {
    awaiting: u64,
    step: SetUpStep,
    /// Live sessions still to restore, in order.
    sessions: VecDeque<Session>,
    /// Set when the replayed login was refused: no session can be restored.
    login_problem: Option<String>,
}

#[derive(Debug)]
enum SetUpStep {
    Initialize,
    Authenticate,
    /// `method` is being tried; `rest` are the methods left to try.
    Restore {
        session: Session,
        method: &'static str,
        rest: Vec<&'static str>,
        refusals: Vec<String>,
    },
    /// The editor's settings put back on a restored session.
    Reapply {
        session: Session,
        restored_by: &'static str,
        calls: VecDeque<(&'static str, String)>,
    },
}

impl Setup {
    /// The session whose history `session/load` is replaying now, if any:
    /// the replay is not the editor's business. It ends with the step,
    /// whatever ends the step.
    pub(super) fn loading(&self) -> Option<&str> {
        match &self.step {
            SetUpStep::Restore {
                session,
                method: "session/load",
                ..
            } => Some(&session.id),
            _ => None,
        }
    }
}

impl Bridge {
    /// Takes the step the lifecycle's phase calls for now, if any.
    pub(super) async fn advance(&mut self) -> Flow {
        // The clock is read only where a phase has a time (this runs
        // between any two frames).
        // Each step below waits (an agent stopping or starting); every such
        // wait hands what is staged for the editor to its writer first
        // (`stop_generation`, `arm`, `finish_shutdown`).
        match self.life.phase().clone() {
            Phase::ShuttingDown { deadline }
                if self.gens.current.is_none() || Instant::now() >= deadline =>
            {
                self.finish_shutdown().await;
                return Flow::Exit;
            }
            Phase::Draining
                if self.gens.current.is_none() || self.editor_requests_in_flight() == 0 =>
            {
                self.stop_drained().await;
                return Flow::Again;
            }
            Phase::Starting { at } if Instant::now() >= at => {
                self.try_start().await;
                return Flow::Again;
            }
            _ => {}
        }
        if self.gens.dying.is_empty() {
            return Flow::Wait;
        }
        for generation in std::mem::take(&mut self.gens.dying) {
            self.stop_generation(generation).await;
        }
        Flow::Again
    }

    fn editor_requests_in_flight(&self) -> usize {
        self.routes.editor_requests_in_flight()
    }

    /// Drained: the old generation is stopped, and anything it still had
    /// is answered rather than lost.
    async fn stop_drained(&mut self) {
        self.audit_held_turns_now();
        if let Some(old) = self.gens.current.take() {
            let id = old.id;
            self.stop_generation(old).await;
            self.fail_in_flight(
                id,
                codes::BACKEND_CRASHED,
                "the agent was restarted before it answered",
            );
        }
        self.life.drained(Instant::now());
    }

    async fn try_start(&mut self) {
        for dead in std::mem::take(&mut self.gens.dying) {
            self.stop_generation(dead).await;
        }
        // Before a re-arm: the audit of what the last generation left.
        let first = self.sessions.table.live().next().map(|s| s.id.clone());
        match first {
            Some(session) => self.run_audit_now(&session),
            // Nobody to put a finding to; what waits on an audit goes out.
            None => self.release_turn_ends(),
        }
        self.stop_audit_watch();
        let roots = self.roots_to_arm();
        let served = self.served_sockets(&roots);
        let ahead = self.launcher_ahead();
        let (confinement, baseline) = self.arm(&roots, served).await;
        match self.start_generation(confinement, roots, ahead) {
            Ok(()) => {
                // Taken before the agent ran: nothing it does is in it.
                self.take_audit_baseline(baseline);
                self.life.started();
                self.begin_setup();
            }
            Err(StartFailure::Refused(why)) => {
                error!("{why}");
                self.give_up(why);
            }
            Err(StartFailure::Failed(why)) => {
                error!("starting the agent backend failed: {why}");
                self.on_crash(&why, &[], None);
            }
        }
    }

    /// The union of the live sessions' roots and those a queued request
    /// needs, as real paths.
    fn roots_to_arm(&self) -> Vec<PathBuf> {
        let mut roots: Vec<PathBuf> = self
            .sessions
            .table
            .roots()
            .iter()
            .chain(&self.gens.pending_roots)
            .map(|r| crate::policy::resolve_real(r).unwrap_or_else(|_| r.clone()))
            .collect();
        roots.sort();
        roots.dedup();
        roots
    }

    /// Arms the next generation for `roots`, on the blocking pool: it
    /// gathers the policy input (discovery walks the workspaces, creates
    /// templates and directories, keeps the ledger) and writes the arming
    /// out. The loop takes this step like the others of a restart, and the
    /// editor's reader and writer go on meanwhile.
    /// The directory of the editor's sockets for run_code, when sessions
    /// may be offered it: reachable from the sandbox (they are bound
    /// before a re-arm, and the bridge judges every call on them).
    /// The sockets zcode-acp serves the generation armed for `roots`: the
    /// directory of the editor sockets, where run_code is offered (on
    /// everywhere, or in a project among `roots` that approved it; one
    /// that does later re-arms, as a new root does).
    fn served_sockets(&mut self, roots: &[PathBuf]) -> Vec<PathBuf> {
        let Some(code_exec) = &self.cfg.code_exec else {
            return Vec::new();
        };
        let offered = code_exec.everywhere.is_some()
            || roots
                .iter()
                .any(|r| crate::config::project::inspect(r, &self.cfg.managed).code_exec);
        if !offered {
            return Vec::new();
        }
        match self.code.servers_files.dir() {
            Ok(dir) => vec![crate::policy::resolve_real(&dir).unwrap_or(dir)],
            Err(e) => {
                warn!(
                    "cannot make run_code's directory ({e}): code cannot reach the editor's files"
                );
                Vec::new()
            }
        }
    }

    async fn arm(
        &self,
        roots: &[PathBuf],
        served: Vec<PathBuf>,
    ) -> (Confinement, Option<crate::audit::Baseline>) {
        // Arming walks the disk off the loop: nothing staged waits for it.
        self.flush_editor();
        let sandbox = self.sandbox.clone();
        let (argv, roots) = (self.cfg.backend.clone(), roots.to_vec());
        let grants = self.asks.writes.grants().to_vec();
        let (state, managed) = (self.cfg.state.clone(), self.cfg.managed.clone());
        let armed = tokio::task::spawn_blocking(move || {
            let confinement = sandbox.arm_backend(&BackendRequest {
                argv: &argv,
                roots: &roots,
                grants: &grants,
                state: &state,
                managed: &managed,
                served_sockets: &served,
            });
            // What the audit compares with, taken before the agent runs
            // (and here, off the loop: it walks the roots).
            let baseline = confinement
                .policy()
                .map(|policy| crate::audit::baseline(policy, &roots));
            (confinement, baseline)
        })
        .await;
        armed.unwrap_or_else(|e| {
            (
                Confinement::Refused(format!("cannot arm the sandbox: {e}")),
                None,
            )
        })
    }

    /// Where the generation's proxy asks about refused connections, when
    /// it gets a network of its own (Linux, with namespaces).
    fn network_asks_socket(&self) -> Option<String> {
        let Confinement::Armed(armed) = &self.confinement else {
            return None;
        };
        let linux = self.sandbox.platform() == Some(crate::policy::Platform::Linux);
        armed
            .network_asks
            .clone()
            .filter(|_| linux && armed.own_network())
    }

    /// The proxy this process runs for the generation (macOS).
    fn outside_proxy(&self) -> Option<&crate::network::outside::OutsideProxy> {
        let Confinement::Armed(armed) = &self.confinement else {
            return None;
        };
        armed.outside.as_ref()?.as_any().downcast_ref()
    }

    /// Where generations are launched by this binary's helper (Linux), the
    /// helper started now, to be handed its command line once the arming
    /// is done: its start overlaps the arming's work.
    fn launcher_ahead(&self) -> Option<crate::backend::spawn::Ahead> {
        if self.sandbox.platform() != Some(crate::policy::Platform::Linux) {
            return None;
        }
        let exe = std::env::current_exe().ok()?;
        crate::backend::spawn::Ahead::start(exe.to_string_lossy().into_owned())
            .map_err(|e| {
                debug!("the sandbox's launcher could not be started ahead ({e}); it is started after the arming")
            })
            .ok()
    }

    fn start_generation(
        &mut self,
        confinement: Confinement,
        roots: Vec<PathBuf>,
        ahead: Option<crate::backend::spawn::Ahead>,
    ) -> Result<(), StartFailure> {
        self.gens.started += 1;
        let id = self.gens.started;
        // The last generation's files go now (it was stopped before), and
        // a refusal leaves nothing of it behind.
        self.confinement = confinement;
        // Listening before the generation's proxy may ask.
        if let Some(socket) = self.network_asks_socket() {
            self.asks
                .ledger
                .listen(&crate::confine::network_ledger_name(&socket));
            self.asks.net_asks.listen(socket);
        }
        // Or, where the proxy runs in this process (macOS), taking its
        // questions and counts.
        if let Some((ledger, questions)) = self
            .outside_proxy()
            .map(|proxy| (proxy.ledger(), proxy.questions()))
        {
            self.asks.ledger.count(ledger);
            match questions {
                Some(questions) => self.asks.net_asks.take(questions),
                None => warn!("the proxy's questions were taken already: refused connections are not put to the user"),
            }
        }
        let backend = crate::confine::Command {
            argv: self.cfg.backend.clone(),
            ..Default::default()
        };
        let argv = self
            .confinement
            .wrap(&backend, Launch::Backend)
            .map_err(|e| match e {
                ArmError::Empty => StartFailure::Failed(e.to_string()),
                ArmError::Refused(why) => StartFailure::Refused(why),
                other => StartFailure::Refused(format!("cannot arm the sandbox: {other}")),
            })?;
        let cmd = PreparedCommand {
            argv,
            confinement: self.confinement.describe(),
            backend_profile: match &self.confinement {
                Confinement::Armed(armed) => Some(armed.backend_profile.clone()),
                _ => None,
            },
        };
        // Before the agent starts, so its first refusals are seen too.
        self.watch_violations();
        let generation = Generation::start(
            id,
            &cmd,
            ahead,
            self.cfg.max_frame_bytes,
            self.gens.tx.clone(),
            self.editor.budget.clone(),
        )
        .map_err(|e| StartFailure::Failed(e.to_string()))?;
        // Editor terminals of this generation enter its namespaces.
        self.confinement.held_by(generation.pid);
        info!(
            generation = id,
            pid = generation.pid,
            confinement = generation.confinement,
            command = ?cmd.argv,
            "agent backend started"
        );
        self.gens.current = Some(generation);
        self.gens.armed_roots = roots;
        self.gens.pending_roots.clear();
        Ok(())
    }

    /// A crash (or failed start) counted: another start is scheduled, or
    /// the bridge gives up. What `generation` left in flight is told which:
    /// being restarted, or given up and why.
    pub(super) fn on_crash(&mut self, how: &str, last_words: &[String], generation: Option<u64>) {
        let outcome = self.life.crashed(Instant::now(), how, last_words);
        let (code, message) = match &outcome {
            AfterCrash::Retry { at } => {
                let delay = at.saturating_duration_since(Instant::now());
                if !delay.is_zero() {
                    info!(?delay, "waiting before starting the agent backend again");
                }
                (
                    codes::BACKEND_CRASHED,
                    format!("the agent crashed ({how}) and is being restarted; send the request again once it is back"),
                )
            }
            AfterCrash::GiveUp(message) => {
                error!("{message}");
                (codes::BACKEND_UNAVAILABLE, message.clone())
            }
            AfterCrash::Ignored => (
                codes::BACKEND_UNAVAILABLE,
                format!("the agent stopped ({how})"),
            ),
        };
        if let Some(generation) = generation {
            self.fail_in_flight(generation, code, &message);
        }
        if let AfterCrash::GiveUp(message) = &outcome {
            self.answer_queue(codes::BACKEND_UNAVAILABLE, message);
        }
    }

    /// Gives up for good: queued requests and every later one get `message`.
    pub(super) fn give_up(&mut self, message: String) {
        self.answer_queue(codes::BACKEND_UNAVAILABLE, &message);
        self.life.fail(message);
    }

    fn answer_queue(&mut self, code: i64, message: &str) {
        for frame in self.routes.take_held() {
            if let crate::relay::FrameKind::Request { id, .. } = &frame.kind {
                self.answer_error(id, code, message);
            }
        }
    }

    /// Sends a request of the bridge's own to the running generation;
    /// its answer comes back through [`Bridge::on_bridge_answer`].
    fn call(&mut self, method: &str, params: &str) -> Option<u64> {
        let gen_id = self.gens.current.as_ref()?.id;
        let bid = self.routes.bridge_request(gen_id);
        if let Some(g) = &self.gens.current {
            g.send(request(bid, method, params));
        }
        Some(bid)
    }

    fn begin_setup(&mut self) {
        let Some(init) = self.sessions.initialize.clone() else {
            // The editor has not initialized yet; it will do so itself.
            return self.finish_setup();
        };
        self.await_step(
            "initialize",
            &init,
            SetUpStep::Initialize,
            VecDeque::new(),
            None,
        );
    }

    fn await_step(
        &mut self,
        method: &str,
        params: &str,
        step: SetUpStep,
        sessions: VecDeque<Session>,
        login_problem: Option<String>,
    ) {
        // Without a generation it died, and its loss was handled already.
        if let Some(awaiting) = self.call(method, params) {
            self.gens.setup = Some(Setup {
                awaiting,
                step,
                sessions,
                login_problem,
            });
        }
    }

    /// The answer to a request of the bridge's own.
    pub(super) fn on_bridge_answer(&mut self, bid: u64, outcome: CallOutcome) {
        let Some(setup) = self.gens.setup.take_if(|s| s.awaiting == bid) else {
            return debug!(
                bid,
                "an answer to a request of the bridge's own that nothing awaits"
            );
        };
        let Setup {
            step,
            sessions,
            mut login_problem,
            ..
        } = setup;
        match step {
            SetUpStep::Initialize => match outcome {
                CallOutcome::Ok(result) => {
                    self.life.initialized();
                    let caps = super::track::restore_caps(&result);
                    if caps != self.sessions.caps {
                        warn!(caps = %caps, previous = %self.sessions.caps, "the restarted agent advertises different session capabilities");
                    }
                    self.sessions.caps = caps;
                    match self.sessions.authenticate.clone() {
                        Some(auth) => self.await_step(
                            "authenticate",
                            &auth,
                            SetUpStep::Authenticate,
                            sessions,
                            None,
                        ),
                        None => self.begin_restore(None),
                    }
                }
                CallOutcome::Rejected { message, .. } => self.setup_failed(format!(
                    "the agent refused the replayed initialize: {message}"
                )),
            },
            SetUpStep::Authenticate => {
                if let CallOutcome::Rejected { message, .. } = outcome {
                    login_problem = Some(format!(
                        "the restarted agent refused the editor's saved login ({message}); log in again from the editor"
                    ));
                }
                self.begin_restore(login_problem)
            }
            SetUpStep::Restore {
                session,
                method,
                rest,
                mut refusals,
            } => {
                match outcome {
                    CallOutcome::Ok(_) => {
                        let calls = settings_calls(&session);
                        self.next_setting(session, method, calls, sessions, login_problem)
                    }
                    CallOutcome::Rejected { code, message } if code == codes::AUTH_REQUIRED => {
                        // A new login is needed: loading instead cannot help.
                        self.lose(&session.id, format!("the restarted agent needs you to log in again ({message}); zcode-acp never starts a login on its own"));
                        self.next_session(sessions, login_problem)
                    }
                    CallOutcome::Rejected { message, .. } => {
                        warn!(
                            session = session.id,
                            method, "the restarted agent refused to restore the session: {message}"
                        );
                        refusals.push(format!("the agent refused {method}: {message}"));
                        self.try_restore(session, rest, refusals, sessions, login_problem)
                    }
                }
            }
            SetUpStep::Reapply {
                session,
                restored_by,
                calls,
            } => {
                if let CallOutcome::Rejected { message, .. } = outcome {
                    warn!(
                        session = session.id,
                        "the restarted agent refused a setting the editor had made: {message}"
                    );
                }
                self.next_setting(session, restored_by, calls, sessions, login_problem)
            }
        }
    }

    /// Set-up failed short of a crash (the agent refused the replay): the
    /// generation is stopped and counted as a failure.
    fn setup_failed(&mut self, why: String) {
        error!("starting the agent backend failed: {why}");
        let generation = self.gens.current.take().map(|g| {
            let id = g.id;
            self.gens.dying.push(g);
            id
        });
        self.on_crash(&why, &[], generation);
    }

    fn begin_restore(&mut self, login_problem: Option<String>) {
        let sessions: VecDeque<Session> = self.sessions.table.live().cloned().collect();
        if !sessions.is_empty() {
            info!(count = sessions.len(), caps = %self.sessions.caps, "restoring live sessions on the new backend");
        }
        self.next_session(sessions, login_problem)
    }

    fn next_session(&mut self, mut sessions: VecDeque<Session>, login_problem: Option<String>) {
        while let Some(session) = sessions.pop_front() {
            if let Some(problem) = &login_problem {
                self.lose(&session.id, problem.clone());
                continue;
            }
            // Resume first (nothing is replayed); where the agent refuses it
            // but can load, load (the replayed history is swallowed) before
            // calling the session lost.
            let mut methods = Vec::new();
            if self.sessions.caps.resume {
                methods.push("session/resume");
            }
            if self.sessions.caps.load {
                methods.push("session/load");
            }
            if methods.is_empty() {
                self.lose(
                    &session.id,
                    "the agent supports neither session/resume nor session/load".into(),
                );
                continue;
            }
            return self.try_restore(session, methods, Vec::new(), sessions, login_problem);
        }
        self.finish_setup()
    }

    /// Tries the first of `methods` on `session`, or calls it lost.
    fn try_restore(
        &mut self,
        session: Session,
        mut methods: Vec<&'static str>,
        refusals: Vec<String>,
        sessions: VecDeque<Session>,
        login_problem: Option<String>,
    ) {
        if methods.is_empty() {
            self.lose(&session.id, refusals.join("; then "));
            return self.next_session(sessions, login_problem);
        }
        let method = methods.remove(0);
        let mut params = json!({
            "sessionId": session.id,
            "cwd": session.cwd,
        });
        if !session.additional_directories.is_empty() {
            params["additionalDirectories"] = json!(session.additional_directories);
        }
        // The editor's servers as it wrote them, spliced in (with the
        // run_code server where code execution is on).
        let mut servers = session.mcp_servers.clone();
        if let Some(code_exec) = self.code_exec_for(&session) {
            if let Some((with, _)) =
                self.code_server_entry(Some(&session.mcp_servers), &session, false, &code_exec)
            {
                servers = with;
            }
        }
        let params_text =
            crate::relay::splice::set(params.to_string().as_bytes(), &["mcpServers"], &servers)
                .map(|b| String::from_utf8_lossy(&b).into_owned())
                .unwrap_or_else(|_| params.to_string());
        let step = SetUpStep::Restore {
            session,
            method,
            rest: methods,
            refusals,
        };
        self.await_step(method, &params_text, step, sessions, login_problem);
    }

    fn next_setting(
        &mut self,
        session: Session,
        restored_by: &'static str,
        mut calls: VecDeque<(&'static str, String)>,
        sessions: VecDeque<Session>,
        login_problem: Option<String>,
    ) {
        let Some((method, params)) = calls.pop_front() else {
            info!(
                session = session.id,
                method = restored_by,
                "session restored"
            );
            return self.next_session(sessions, login_problem);
        };
        let step = SetUpStep::Reapply {
            session,
            restored_by,
            calls,
        };
        self.await_step(method, &params, step, sessions, login_problem);
    }

    /// Set up: the generation runs, the editor hears why it was restarted,
    /// and what it sent meanwhile is released, in order.
    fn finish_setup(&mut self) {
        self.gens.setup = None;
        // What the sandbox's helpers could not set up as planned, in this
        // log too (theirs reaches only the agent's stderr).
        if let Some(note) = self.degraded_note() {
            warn!("{note}");
        }
        let (cause, pending) = self.life.set_up();
        if let Some(why) = cause.announced() {
            self.announce_restart(why);
        }
        self.release_queue();
        if let Some(why) = pending {
            self.request_restart(&why);
        }
    }

    fn lose(&mut self, session: &str, reason: String) {
        error!(
            session,
            "session could not be carried over to the restarted agent: {reason}"
        );
        self.sessions.table.mark_lost(session, reason);
    }
}

/// The calls that put back what the editor had set on `session`.
fn settings_calls(session: &Session) -> VecDeque<(&'static str, String)> {
    let mut calls = VecDeque::new();
    if let Some(mode) = &session.mode {
        calls.push_back((
            "session/set_mode",
            json!({ "sessionId": session.id, "modeId": mode }).to_string(),
        ));
    }
    if let Some(model) = &session.model {
        calls.push_back((
            "session/set_model",
            json!({ "sessionId": session.id, "modelId": model }).to_string(),
        ));
    }
    for (config_id, value) in &session.config_options {
        calls.push_back((
            "session/set_config_option",
            json!({ "sessionId": session.id, "configId": config_id, "value": value }).to_string(),
        ));
    }
    calls
}
