//! The allow flow: a write the policy denies, but that the user may grant,
//! is put to the user in the editor's own permission UI, as a
//! `session/request_permission` of the bridge's own on the session where
//! the denial happened. Only answers to these prompts change what is
//! allowed; the agent's own permission requests pass through untouched.
//!
//! Answers: allow once (a grant for this bridge's lifetime), always allow
//! (recorded in the project's sandbox.json and approved; if that cannot be
//! written, once, and the user is told), don't allow (nothing remembered),
//! never allow (recorded as a deny entry: never asked again). One prompt
//! per path is open at a time: a burst of denials of one path waits on it.

use std::path::{Path, PathBuf};

use tracing::{debug, info, warn};

use super::{prompts, AtEditor, Bridge};
use crate::config::project::{self, List};
use crate::policy::offerable::{never_granted, real_home};
use crate::relay::codes;
use crate::relay::envelope::request;
use crate::relay::Frame;

pub(super) use super::permissions::HeldWrite;
use super::permissions::{Answered, Joined, Prompt, MAX_JOINED};

impl Bridge {
    /// Puts a denied write to the user, or joins the prompt already open
    /// for the same path.
    pub(super) fn ask(&mut self, session: String, path: PathBuf, reason: String, held: HeldWrite) {
        let held = match self.asks.writes.join(&path, held) {
            Joined::Waits => return,
            Joined::New(held) => held,
            Joined::Full(held) => {
                let message = format!(
                    "zcode-acp refused writing {} without asking you: {MAX_JOINED} writes of it already wait on the question about it",
                    path.display()
                );
                return self.refuse_write(held, codes::WRITE_DENIED, message);
            }
        };
        if let Err(why) = self.asks.writes.may_ask() {
            // Too many questions: refused without asking, summed up when
            // the turn ends.
            self.asks.writes.not_asked(&path);
            let message = format!(
                "zcode-acp refused writing {} without asking you ({why}; it is {reason})",
                path.display()
            );
            debug!("{message}");
            return self.refuse_write(held, codes::WRITE_DENIED, message);
        }
        let title = format!("Allow the agent to write {}?", path.display());
        let text = format!(
            "The sandbox denies this write: {reason}. Allow once holds until zcode-acp exits; Always allow records it in the project's sandbox.json; Never allow records a deny entry."
        );
        info!(path = %path.display(), session, "asking the user whether the agent may write");
        self.open_prompt(session, path, title, text, vec![held], false);
    }

    /// Sends one of the bridge's allow prompts (the four answers) and
    /// remembers what it is about.
    fn open_prompt(
        &mut self,
        session: String,
        path: PathBuf,
        title: String,
        text: String,
        held: Vec<HeldWrite>,
        direct: bool,
    ) {
        let bid = self.alloc_id();
        self.editor.announcements += 1;
        let params = prompts::permission_request(
            &session,
            format!("zcode-acp-allow-{}", self.editor.announcements),
            title,
            &path,
            text,
            prompts::ALLOW_FLOW,
        );
        self.routes.expect_from_editor(bid, AtEditor::Prompt);
        self.asks.writes.opened(
            bid,
            Prompt {
                path,
                session,
                held,
                direct,
            },
        );
        self.to_editor(request(bid, "session/request_permission", &params));
    }

    /// The user answered one of the bridge's prompts. The answer takes
    /// effect at once; recording it in sandbox.json happens off the loop
    /// ([`super::disk`]).
    pub(super) fn on_prompt_answer(&mut self, bid: u64, frame: &Frame) {
        let choice = prompts::chosen(frame, prompts::ALLOW_FLOW);
        let Some(answered) = self.asks.writes.answered(bid, choice) else {
            return;
        };
        if let Some(list) = answered.record {
            let session = answered.prompt.session.clone();
            let entry = answered.prompt.path.to_string_lossy().into_owned();
            let root = self
                .sessions
                .table
                .get(&session)
                .and_then(|s| crate::policy::resolve_real(&s.cwd).ok());
            match root {
                Some(root) => self
                    .disk
                    .record(&self.cfg.managed, root, list, entry, session),
                None => self.after_record(
                    &session,
                    list,
                    &entry,
                    Err(super::disk::DiskError::WorkspaceGone),
                ),
            }
        }
        self.after_answer(answered);
    }

    /// An answer's record is on disk, or could not be made: a grant then
    /// holds for this bridge only, and the user is told.
    pub(super) fn after_record(
        &mut self,
        session: &str,
        list: List,
        entry: &str,
        result: Result<(), super::disk::DiskError>,
    ) {
        if let (Err(why), List::Allow) = (result, list) {
            let text = format!(
                "zcode-acp could not record the grant for {entry} in the project's sandbox.json ({why}), so it holds only until zcode-acp exits."
            );
            self.announce_to(
                session,
                "Sandbox: allowed for this session only".into(),
                text,
            );
        }
    }

    /// The writes refused without asking since the last summary, said in
    /// one notice on `session` (at the end of a turn).
    pub(super) fn say_unasked(&mut self, session: &str) {
        let Some((n, paths)) = self.asks.writes.take_unasked() else {
            return;
        };
        const SHOWN: usize = 10;
        let mut list: Vec<String> = paths
            .iter()
            .take(SHOWN)
            .map(|p| format!("- {}", p.display()))
            .collect();
        if paths.len() > SHOWN {
            list.push(format!("- and {} more paths", paths.len() - SHOWN));
        }
        warn!(
            refused = n,
            "writes refused without asking: too many questions at once or in one turn"
        );
        let text = format!(
            "The agent tried {n} more writes outside what it may write than zcode-acp puts to you at once ({} open) or in one turn ({}); they were refused without asking:\n{}\nTo allow a place for good, run `zcode-acp allow PATH` in the project, or answer \"Always allow\" when it is asked again.",
            super::permissions::MAX_OPEN_WRITE_PROMPTS,
            super::permissions::MAX_WRITE_PROMPTS_PER_TURN,
            list.join("\n")
        );
        self.announce_to(
            session,
            format!("Sandbox: {n} writes refused without asking"),
            text,
        );
    }

    /// Carries out an answer.
    fn after_answer(&mut self, answered: Answered) {
        let entry = answered.prompt.path.to_string_lossy().into_owned();
        let prompt = answered.prompt;
        let allowed = answered.allowed;
        info!(path = %prompt.path.display(), choice = answered.choice.map_or("cancelled", |a| a.id), "the user answered");
        if answered.rearm {
            // The agent writes these itself: the running generation cannot
            // see the grant; the next one, armed at the end of this turn, does.
            let text = format!(
                "The agent may write {} from its next prompt: the sandbox is re-armed when the current turn ends.",
                prompt.path.display()
            );
            self.announce_to(
                &prompt.session,
                "Sandbox: write allowed from the next prompt".into(),
                text,
            );
            self.request_restart(&format!("you allowed writes to {}", prompt.path.display()));
        }
        for held in prompt.held {
            if allowed {
                // Judged again, and made, with the agent held still.
                self.write_held(held);
            } else {
                let message = format!("the user did not allow writing {entry}");
                self.refuse_write(held, codes::WRITE_DENIED, message);
            }
        }
    }
}

fn collect_strings<'a>(v: &'a serde_json::Value, out: &mut Vec<&'a str>) {
    match v {
        serde_json::Value::String(s) => out.push(s),
        serde_json::Value::Array(items) => items.iter().for_each(|i| collect_strings(i, out)),
        serde_json::Value::Object(map) => map.values().for_each(|i| collect_strings(i, out)),
        _ => {}
    }
}

impl Bridge {
    /// A cheap first look: could this update report a refused write?
    pub(super) fn may_show_denial(&self, frame: &Frame) -> bool {
        static TOOL_CALL: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
            std::sync::LazyLock::new(|| memchr::memmem::Finder::new("tool_call"));
        self.armed()
            && frame
                .params_bytes()
                .is_some_and(|raw| TOOL_CALL.find(raw).is_some())
            && frame.params_raw().is_some_and(super::refusals::may_contain)
    }

    /// Watches the agent's tool calls for writes the kernel refused, and
    /// offers the user a grant for those the policy really denies.
    pub(super) fn spot_denials(&mut self, frame: &Frame) {
        if !self.may_show_denial(frame) {
            return;
        }
        let Some(raw) = frame.params_raw() else {
            return;
        };
        let Ok(params) = serde_json::from_str::<serde_json::Value>(raw) else {
            return;
        };
        let Some(session) = params["sessionId"].as_str().map(str::to_owned) else {
            return;
        };
        let mut texts = Vec::new();
        collect_strings(&params["update"], &mut texts);
        let home = real_home();
        for text in texts.iter().filter(|t| super::refusals::may_contain(t)) {
            for candidate in super::refusals::refused_paths(text) {
                self.offer_direct_grant(&session, &candidate, home.as_deref());
            }
        }
    }

    /// A write the sandbox says it refused (macOS: in the system log;
    /// Linux: its supervisor, on the agent's stderr): offered on the
    /// session whose turn is running (the latest, when several are).
    pub(super) fn on_refused_by_sandbox(&mut self, path: &Path) {
        if !self.armed() {
            return;
        }
        let Some(session) = self.routes.latest_turn().map(str::to_owned) else {
            debug!(path = %path.display(), "the sandbox refused a write outside any turn; not offered");
            return;
        };
        let home = real_home();
        self.offer_direct_grant(&session, path, home.as_deref());
    }

    /// Offers a grant for a refused direct write at `candidate` when the
    /// policy really denies it and it may be offered; returns whether a
    /// prompt was opened. Tools save by writing a temporary file beside
    /// the target and renaming it over: the folder is granted when safe.
    fn offer_direct_grant(&mut self, session: &str, candidate: &Path, home: Option<&Path>) -> bool {
        let Some(policy) = self.confinement.policy() else {
            return false;
        };
        let Ok((real, decision)) = policy.evaluate(candidate, crate::policy::Op::Write) else {
            return false;
        };
        let offerable = !decision.allowed
            && (decision.kind == crate::policy::Band::Outside || decision.promptable)
            && !self.asks.writes.refused_for_good(&real)
            && crate::policy::offerable::refusal(&real, &decision, home).is_none();
        if !offerable {
            return false;
        }
        let grant = match real.parent() {
            Some(dir)
                if never_granted(dir, home).is_none()
                    && policy.evaluate_resolved(dir, crate::policy::Op::Write).kind
                        != crate::policy::Band::Island
                    && dir.is_dir() =>
            {
                dir.to_path_buf()
            }
            _ => real.clone(),
        };
        if let Err(why) = self.asks.writes.may_offer_direct(&grant) {
            debug!(path = %grant.display(), why = %why, "not offered");
            if matches!(
                why,
                super::permissions::NotOffered::EnoughOpen
                    | super::permissions::NotOffered::EnoughThisTurn
            ) {
                self.asks.writes.not_asked(&grant);
            }
            return false;
        }
        let reason = match decision.rule {
            Some(rule) => format!("{} ({rule})", decision.kind),
            None => "outside everything the sandbox lets the agent write".to_owned(),
        };
        self.ask_direct(session.to_owned(), grant, reason);
        true
    }

    fn ask_direct(&mut self, session: String, grant: PathBuf, reason: String) {
        let what = if grant.is_dir() {
            format!("in {}", grant.display())
        } else {
            format!(
                "{} (saves that replace the file through a temporary file may still fail)",
                grant.display()
            )
        };
        let text = format!(
            "The sandbox refused a write the agent made: {reason}. A grant takes effect from the agent's next prompt (the sandbox is re-armed when this turn ends)."
        );
        info!(path = %grant.display(), session, "asking the user whether the agent may write (a refused direct write)");
        self.open_prompt(
            session,
            grant,
            format!("Allow the agent to write {what}?"),
            text,
            Vec::new(),
            true,
        );
    }

    /// A project's sandbox.json says more than the user approved (a new
    /// allow entry, `enabled: false`, `strictGit: false`): until accepted it
    /// is ignored. Put it to the user once per project and bridge.
    pub(super) fn confirm_hand_edits(&mut self, session: &str) {
        // Asked whenever generations are armed from now on, not only when
        // the running one is: a session opened while a project turns the
        // sandbox on is restored into the armed generation, under its
        // project's config.
        if !self.sandbox.arms() {
            return;
        }
        let Some(roots) = self
            .sessions
            .table
            .get(session)
            .map(|s| s.roots().cloned().collect::<Vec<_>>())
        else {
            return;
        };
        for root in roots {
            let Ok(root) = crate::policy::resolve_real(&root) else {
                continue;
            };
            let effective = project::inspect(&root, &self.cfg.managed);
            if effective.ignored.is_empty() || !self.asks.writes.ask_config_once(&root) {
                continue;
            }
            let bid = self.alloc_id();
            self.editor.announcements += 1;
            let config = project::config_path(&root);
            let params = prompts::permission_request(
                session,
                format!("zcode-acp-config-{}", self.editor.announcements),
                format!("{} changed: accept?", config.display()),
                &config,
                format!(
                    "These changes were not made through zcode-acp, so they are ignored until you accept them (the agent may have written them):\n- {}",
                    effective.ignored.join("\n- ")
                ),
                &[prompts::ACCEPT_CONFIG, prompts::IGNORE_CONFIG],
            );
            info!(root = %root.display(), "asking the user to confirm hand edits of sandbox.json");
            self.routes
                .expect_from_editor(bid, AtEditor::ConfigPrompt { root });
            self.to_editor(request(bid, "session/request_permission", &params));
        }
    }

    /// The user answered a hand-edit confirmation.
    pub(super) fn on_config_answer(&mut self, root: PathBuf, frame: &Frame) {
        let accepted =
            prompts::chosen(frame, &[prompts::ACCEPT_CONFIG]) == Some(prompts::ACCEPT_CONFIG);
        if !accepted {
            return info!(root = %root.display(), "the user keeps ignoring the hand edits of sandbox.json");
        }
        self.disk.approve(&self.cfg.managed, root);
    }

    /// A hand edit's approval is on disk (or could not be written).
    pub(super) fn after_approval(
        &mut self,
        root: PathBuf,
        result: Result<(), super::disk::DiskError>,
    ) {
        match result {
            // Re-arm so direct writes see the accepted entries too.
            Ok(()) => self.request_restart(&format!(
                "the changes to {} were accepted",
                project::config_path(&root).display()
            )),
            Err(e) => warn!(root = %root.display(), "could not approve sandbox.json: {e}"),
        }
    }
}
