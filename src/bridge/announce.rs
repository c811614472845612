//! Telling the user, in the editor, what the sandbox is doing.
//!
//! The state is shown as a bridge-made `tool_call` update (kind `other`, the
//! schema's default, left out on the wire; status completed), never as text
//! in the agent's voice: at the first session of each bridge and after every
//! restart of the backend.

use super::Bridge;
use crate::relay::envelope::notification;

impl Bridge {
    /// A tool call of the bridge's own on one session.
    pub(super) fn announce_to(&mut self, session: &str, title: String, text: String) {
        self.announce(session, title, text);
    }

    fn announce(&mut self, session: &str, title: String, text: String) {
        self.editor.announcements += 1;
        let params = super::prompts::announcement(
            session,
            format!("zcode-acp-sandbox-{}", self.editor.announcements),
            title,
            text,
        );
        self.to_editor(notification("session/update", &params));
    }

    fn state_title(&self) -> String {
        match &self.gens.current {
            Some(g) => format!("Sandbox: {}", g.confinement),
            None => "Sandbox: no agent is running".into(),
        }
    }

    /// What the sandbox of the running generation set up less than
    /// planned (its helpers report it), in words for the editor.
    pub(super) fn degraded_note(&self) -> Option<String> {
        #[cfg(target_os = "linux")]
        if let crate::confine::Confinement::Armed(armed) = &self.confinement {
            let lines = crate::linux::enforce::degradations(armed);
            if !lines.is_empty() {
                return Some(format!(
                    "The sandbox is set up less than planned here:\n- {}",
                    lines.join("\n- ")
                ));
            }
        }
        None
    }

    /// Roots that open `/` or the whole home directory, in words.
    fn dangerous_note(&self) -> Option<String> {
        let home = crate::policy::offerable::real_home();
        let dangerous: Vec<String> = self
            .sessions
            .table
            .roots()
            .into_iter()
            .filter_map(|r| crate::policy::resolve_real(&r).ok())
            .filter(|r| crate::policy::offerable::opens_everything(r, home.as_deref()))
            .map(|r| r.display().to_string())
            .collect();
        (!dangerous.is_empty()).then(|| {
            format!(
                "Warning: a workspace root is {}, which makes that whole tree writable.",
                dangerous.join(" and ")
            )
        })
    }

    /// After the first session of this bridge appears.
    pub(super) fn announce_first_session(&mut self, session: &str) {
        if self.editor.announced_first {
            return;
        }
        self.editor.announced_first = true;
        let mut text = if self.armed() {
            let mut text = format!(
                "The agent runs in a writes-only sandbox: it can write in the workspace roots ({}), temp and cache \
                 directories and its own state; writes elsewhere are denied.",
                self.gens.armed_roots
                    .iter()
                    .map(|r| r.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            if let Some(profile) = self
                .gens
                .current
                .as_ref()
                .and_then(|g| g.backend_profile.as_ref())
            {
                text.push_str(&format!(
                    "\nIts own state is chosen by the backend profile: {profile}."
                ));
            }
            if let crate::confine::Confinement::Armed(armed) = &self.confinement {
                text.push_str(&format!("\nNetwork: {}.", armed.network_line()));
                if let Some(weaker) = armed.weaker() {
                    text.push_str(&format!("\n{weaker}"));
                }
            }
            text
        } else {
            "The agent runs unconfined: zcode-acp relays it, but no sandbox limits what it writes. \
             Set ZCODE_ACP_SANDBOX=1 in the agent's env, or `\"enabled\": true` in the project's \
             .zcode/acp/sandbox.json, to arm one."
                .to_owned()
        };
        for note in self.unknown_keys_notes(session) {
            text = format!("{text}\n{note}");
        }
        if let Some(note) = self.dangerous_note() {
            text = format!("{text}\n{note}");
        }
        if let Some(note) = self.audit_unchecked_note() {
            text = format!("{text}\n{note}");
        }
        if let Some(note) = self.audit_watch_note() {
            text = format!("{text}\n{note}");
        }
        if let Some(note) = self.degraded_note() {
            text = format!("{text}\n{note}");
        }
        if let Some(why) = &self.code.tools.unavailable {
            text = format!("{text}\nrun_code's code cannot reach the editor's files: {why}.");
        }
        if let Some(note) = &self.cfg.startup_note {
            text = format!("{text}\n{note}");
        }
        let title = self.state_title();
        self.announce(session, title, text);
    }

    /// What the sandbox.json of the session's projects have that zcode-acp
    /// does not know (a misspelled `enable` leaves the sandbox off), each
    /// project once per bridge. Only read.
    fn unknown_keys_notes(&mut self, session: &str) -> Vec<String> {
        let roots: Vec<std::path::PathBuf> = self
            .sessions
            .table
            .get(session)
            .map(|s| s.roots().cloned().collect())
            .unwrap_or_default();
        let mut notes = Vec::new();
        for root in roots {
            let Ok(real) = crate::policy::resolve_real(&root) else {
                continue;
            };
            if !self.editor.keys_said.insert(real.clone()) {
                continue;
            }
            let read = crate::config::project::read_with(&real, false);
            if let Some(note) = crate::config::project::unknown_keys_note(&real, &read.config) {
                notes.push(format!("{note}."));
            }
        }
        notes
    }

    /// A session after the first: what its projects' sandbox.json have
    /// that zcode-acp does not know, if not said yet.
    pub(super) fn announce_unknown_keys(&mut self, session: &str) {
        if !self.editor.announced_first {
            return;
        }
        let notes = self.unknown_keys_notes(session);
        if !notes.is_empty() {
            let title = self.state_title();
            self.announce(session, title, notes.join("\n"));
        }
    }

    /// After a restart: every live session is told why, and what it cost.
    pub(super) fn announce_restart(&mut self, reason: &str) {
        if !self.editor.announced_first {
            return;
        }
        let mut text = format!(
            "The agent was restarted ({reason}). Processes it had running (dev servers, MCP servers it started) were stopped."
        );
        if let Some(note) = self.dangerous_note() {
            text = format!("{text}\n{note}");
        }
        if let Some(note) = self.audit_unchecked_note() {
            text = format!("{text}\n{note}");
        }
        if let Some(note) = self.audit_watch_note() {
            text = format!("{text}\n{note}");
        }
        if let Some(note) = self.degraded_note() {
            text = format!("{text}\n{note}");
        }
        let title = format!("{} (restarted)", self.state_title());
        let sessions: Vec<String> = self.sessions.table.live().map(|s| s.id.clone()).collect();
        for session in sessions {
            self.announce(&session, title.clone(), text.clone());
        }
    }
}
