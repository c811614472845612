//! An agent no profile knows, asked about once per place where it keeps its
//! own state. Its own writes do not show in any tool call, so a refusal is
//! read from what it prints on stderr (`Read-only file system: '~/.x/y'`,
//! see `refusals`); where the refused path lies in a place named after the
//! agent (`policy::agents::own_state_location`: `~/.NAME...`,
//! `~/.config/NAME...`), the editor is asked once whether the agent may keep
//! its state there: "for this agent, always" (remembered in the user config
//! under the agent's name, so no project asks again), "until zcode-acp
//! exits", or not. Only a place the policy could let the user allow is put
//! to them; the agent cannot choose the place, only fail to write it.

use std::path::{Path, PathBuf};

use tracing::{debug, info, warn};

use super::{prompts, AtEditor, Bridge};
use crate::confine::Confinement;
use crate::policy::{Band, Op};
use crate::relay::envelope::request;
use crate::relay::Frame;

/// At most this many places are put to the user per bridge: a line on
/// stderr is the agent's to print, so it must not become a flood.
const MAX_STATE_QUESTIONS: usize = 3;

impl Bridge {
    /// A line of the running agent's stderr that may report a refused
    /// write.
    pub(super) fn on_refused_on_stderr(&mut self, line: &str) {
        let Confinement::Armed(armed) = &self.confinement else {
            return;
        };
        // The sandbox's own word, for an agent whose shell shows nothing.
        if let Some(path) = crate::policy::refused::announced(line) {
            if armed.quiet_shell {
                self.on_refused_by_sandbox(&path);
            }
            return;
        }
        let Some(agent) = armed.unprofiled_agent.clone() else {
            return debug!("a refusal on the agent's stderr; its profile chooses its state");
        };
        let Some(home) = crate::policy::offerable::real_home() else {
            return;
        };
        let Some(session) = self.turn_or_first_session() else {
            return;
        };
        debug!(agent, session, line, "a refusal on the agent's stderr");
        for refused in super::refusals::refused_paths(line) {
            if let Some(place) = crate::policy::agents::own_state_location(&refused, &home, &agent)
            {
                self.ask_agent_state(&session, &agent, place, &home);
            }
        }
    }

    /// Puts `place` to the user, once per bridge, where the policy would
    /// let them allow it.
    fn ask_agent_state(&mut self, session: &str, agent: &str, place: PathBuf, home: &Path) {
        if self.asks.agent_state.contains(&place) {
            return;
        }
        // One question at a time, a few in all.
        let busy = self.asks.agent_state_open;
        let enough = self.asks.agent_state.len() >= MAX_STATE_QUESTIONS;
        if busy || enough {
            return debug!(place = %place.display(), "not asked: a question about the agent's state is open, or enough were asked");
        }
        let Some(policy) = self.confinement.policy() else {
            return;
        };
        let Ok((real, decision)) = policy.evaluate(&place, Op::Write) else {
            return debug!(place = %place.display(), "the agent's state place cannot be judged");
        };
        // Already writable (another generation's refusal), or not the
        // user's to open (an island, a protected path, a place
        // `never_granted` keeps closed).
        if decision.allowed
            || decision.kind != Band::Outside
            || crate::policy::offerable::refusal(&real, &decision, Some(home)).is_some()
        {
            return debug!(place = %place.display(), kind = %decision.kind, "the agent's state place is not the user's to allow");
        }
        // A file or a symlink there is not a state directory.
        if std::fs::symlink_metadata(&place).is_ok_and(|m| !m.is_dir()) {
            return;
        }
        self.asks.agent_state.insert(place.clone());
        self.asks.agent_state_open = true;
        let shown = shown(&place, home);
        let bid = self.alloc_id();
        self.editor.announcements += 1;
        let params = prompts::permission_request(
            session,
            format!("zcode-acp-state-{}", self.editor.announcements),
            format!("Let {agent} keep its state in {shown}?"),
            &place,
            format!(
                "The sandbox refused {agent} a write in {shown}, where it keeps its own state (no built-in profile knows this agent). \"Allow for this agent, always\" lets {agent} write there in every project (kept in the user config as sandbox.agentState); \"Allow until zcode-acp exits\" only now. Either takes effect from its next prompt (the sandbox is re-armed when this turn ends)."
            ),
            prompts::STATE_FLOW,
        );
        info!(agent, place = %place.display(), "asking whether the agent may keep its state there");
        self.routes.expect_from_editor(
            bid,
            AtEditor::AgentStatePrompt {
                agent: agent.to_owned(),
                location: place,
            },
        );
        self.to_editor(request(bid, "session/request_permission", &params));
    }

    /// The user answered: the place is made (as the user: the sandbox
    /// could not), granted for this bridge, remembered for the agent when
    /// "always", and the agent re-armed when the turn ends.
    pub(super) fn on_agent_state_answer(&mut self, agent: String, place: PathBuf, frame: &Frame) {
        self.asks.agent_state_open = false;
        let choice = prompts::chosen(frame, prompts::STATE_FLOW);
        let always = match choice {
            Some(prompts::STATE_ALWAYS) => true,
            Some(prompts::STATE_ONCE) => false,
            _ => {
                return info!(agent, place = %place.display(), "the user did not let the agent keep its state there");
            }
        };
        let Some(home) = crate::policy::offerable::real_home() else {
            return;
        };
        let session = self.turn_or_first_session().unwrap_or_default();
        if !place.is_dir() {
            if let Err(e) = crate::config::atomic::create_real_dir_path(&place, 0o700) {
                warn!(place = %place.display(), "cannot make the agent's state directory: {e}");
                let text = format!(
                    "zcode-acp could not make {} ({e}), so {agent} still cannot keep its state there.",
                    place.display()
                );
                return self.announce_to(&session, "Sandbox: state place not made".into(), text);
            }
        }
        self.asks.writes.grant(place.clone());
        if always {
            self.disk.remember_agent_state(
                &self.cfg.managed,
                agent.clone(),
                place.clone(),
                home.clone(),
                session.clone(),
            );
        }
        let text = format!(
            "{agent} may keep its state in {} from its next prompt{}: the sandbox is re-armed when the current turn ends.",
            shown(&place, &home),
            if always { ", in every project" } else { " until zcode-acp exits" }
        );
        self.announce_to(&session, "Sandbox: state place allowed".into(), text);
        self.request_restart(&format!(
            "you let {agent} keep its state in {}",
            place.display()
        ));
    }

    /// A remembered place is in the user config, or could not be written.
    pub(super) fn after_remembered(
        &mut self,
        session: &str,
        place: &Path,
        result: Result<(), String>,
    ) {
        if let Err(why) = result {
            let text = format!(
                "zcode-acp could not remember {} in the user config ({why}), so the agent may keep its state there only until zcode-acp exits; add it to sandbox.agentState by hand to keep it.",
                place.display()
            );
            self.announce_to(
                session,
                "Sandbox: allowed until zcode-acp exits".into(),
                text,
            );
        }
    }
}

/// `~/x` for a place in the home directory.
fn shown(place: &Path, home: &Path) -> String {
    match place.strip_prefix(home) {
        Ok(rest) => format!("~/{}", rest.display()),
        Err(_) => place.display().to_string(),
    }
}
