//! The post-turn audit in the bridge (see `crate::audit`): a baseline when
//! an armed generation starts, a look when a turn ends and before a
//! re-arm. Every finding is reverted at once, shown as a tool call of the
//! bridge's own, and put to the user, who may keep it; the turn's end
//! reaches the editor after that.

use tracing::{info, warn};

use super::{AtEditor, Bridge};
use crate::audit::{self, Finding};
use crate::relay::envelope::request;

impl Bridge {
    /// The state the running generation was armed in (armed bridges
    /// only), taken before it started; where the audit cannot look is said
    /// in the log now and to the editor with the sandbox's notice.
    pub(super) fn take_audit_baseline(&mut self, baseline: Option<audit::Baseline>) {
        // An audit of the last baseline still running is stale from now.
        self.audit.looks.outdate();
        // Stopped already (`stop_audit_watch`); its thread ends on its own.
        if let Some(old) = self.audit.watch.take() {
            old.let_go();
        }
        self.audit.watch_serial += 1;
        if let Some(base) = &baseline {
            for (path, why) in &base.unchecked {
                warn!(path = %path.display(), "the audit cannot check everything here: {why}; what the agent leaves there is not reverted (open a narrower workspace)");
            }
            // Watched for as long as this generation lives: a change by a
            // process the agent left running is looked at within a second.
            let (tx, serial) = (self.audit.changes_tx.clone(), self.audit.watch_serial);
            let watcher = audit::watch::Watcher::start(base.watch_targets(), move |dirty| {
                let _ = tx.send((serial, dirty));
            });
            if let Some(why) = &watcher.degraded {
                warn!("the audit cannot watch everything for changes ({why}): it also looks every {} s, which costs a walk of the roots each time; raise the limit (sysctl fs.inotify.max_user_watches) to have it act on each change instead", audit::watch::POLL.as_secs());
            }
            self.audit.watch = Some(watcher);
        }
        self.audit.base = baseline;
    }

    /// The stopped generation was audited: its watcher has nothing left to
    /// watch for, and is told to stop now, so that its thread closes its
    /// inotify instance (which waits for the kernel) while the next
    /// generation is armed, and its watches no longer count against the
    /// user's limit when the next watcher adds its own.
    pub(super) fn stop_audit_watch(&mut self) {
        if let Some(watch) = self.audit.watch.as_mut() {
            watch.stop();
        }
    }

    /// The watcher saw a change the audit judges: it looks now, whatever
    /// the agent is doing, and puts what it finds to the session whose root
    /// holds it (else the latest turn's, else the first live one).
    pub(super) fn on_audit_change(&mut self, dirty: Vec<std::path::PathBuf>) {
        if self.audit.base.is_none() {
            return;
        }
        self.audit.dirty.extend(dirty);
        let session = self.turn_or_first_session().unwrap_or_default();
        self.run_audit(&session);
    }

    /// The session of the latest turn, else the first live one: where the
    /// bridge speaks up about what happened outside any request.
    pub(super) fn turn_or_first_session(&self) -> Option<String> {
        self.routes
            .latest_turn()
            .map(str::to_owned)
            .or_else(|| self.sessions.table.live().next().map(|s| s.id.clone()))
    }

    /// What the watcher cannot do, in words for the editor.
    pub(super) fn audit_watch_note(&self) -> Option<String> {
        let why = self.audit.watch.as_ref()?.degraded.as_ref()?;
        Some(format!(
            "The audit cannot watch everything for changes ({why}): it looks every {} s instead, so what the agent leaves between turns stays on disk up to that long. Raise the limit (sysctl fs.inotify.max_user_watches) to have it act on each change.",
            audit::watch::POLL.as_secs()
        ))
    }

    /// Where the audit of the running generation cannot look, in words
    /// for the editor.
    pub(super) fn audit_unchecked_note(&self) -> Option<String> {
        let base = self.audit.base.as_ref()?;
        if base.unchecked.is_empty() {
            return None;
        }
        Some(format!(
            "The audit cannot check everything the agent leaves: {}. What it leaves there that a tool would run is not reverted: open a narrower workspace, or look there before you run anything.",
            base.unchecked
                .iter()
                .map(|(p, why)| format!("{} ({why})", p.display()))
                .collect::<Vec<_>>()
                .join("; ")
        ))
    }

    /// A turn ended with `answer`: it reaches the editor once the audit
    /// of what the turn left has reverted its findings (at once when the
    /// generation is not armed).
    pub(super) fn end_turn_after_audit(&mut self, session: &str, answer: Vec<u8>) {
        self.say_unasked(session);
        self.say_what_left(session);
        if self.audit.base.is_none() {
            self.to_editor(answer);
            return;
        }
        self.audit.looks.hold(answer);
        self.run_audit(session);
    }

    /// Looks, off the loop, for what the agent left that would run; what it
    /// finds is reverted and put to the user on `session` when it is done
    /// ([`Bridge::after_audit`]). One runs at a time: one asked for
    /// meanwhile runs after it.
    pub(super) fn run_audit(&mut self, session: &str) {
        let Some(base) = &self.audit.base else {
            // No audit will come for what waits on one.
            self.release_turn_ends();
            return;
        };
        let Some(epoch) = self.audit.looks.start(session) else {
            return;
        };
        let dirty = std::mem::take(&mut self.audit.dirty);
        self.disk
            .audit(base.clone(), dirty, epoch, session.to_owned());
    }

    /// The same, at once, on the loop: before a re-arm and at shutdown,
    /// where what follows must not start before it is done. It covers
    /// every turn that ended before it, so their answers go out.
    pub(super) fn run_audit_now(&mut self, session: &str) {
        if let Some(base) = &self.audit.base {
            let dirty = std::mem::take(&mut self.audit.dirty);
            let findings = base.audit_with(&dirty);
            // One still running off the loop would bring the same findings
            // again: dropped.
            self.audit.looks.outdate();
            self.revert_and_ask(session, findings);
        }
        self.release_turn_ends();
    }

    /// An audit finished: its findings are reverted and put to the user,
    /// unless the generation it was armed for is gone (the audit before the
    /// re-arm covered it); either way the turns it looked after end now.
    pub(super) fn after_audit(&mut self, epoch: u64, session: &str, findings: Vec<Finding>) {
        let done = self.audit.looks.finish(epoch);
        if done.current {
            self.revert_and_ask(session, findings);
        }
        for answer in done.release {
            self.to_editor(answer);
        }
        match done.again {
            Some(next) => self.run_audit(&next),
            None => self.release_turn_ends(),
        }
    }

    /// Before the agent is stopped for a re-arm: turns still waiting on
    /// the look off the loop get one now, so their ends do not wait for
    /// the agent's stop (the look after the stop covers what it did since).
    pub(super) fn audit_held_turns_now(&mut self) {
        if !self.audit.looks.holds_any() {
            return;
        }
        let first = self.sessions.table.live().next().map(|s| s.id.clone());
        match first {
            Some(session) => self.run_audit_now(&session),
            None => self.release_turn_ends(),
        }
    }

    /// Every turn's answer still held goes out.
    pub(super) fn release_turn_ends(&mut self) {
        for answer in self.audit.looks.take_held() {
            self.to_editor(answer);
        }
    }

    /// The live session a finding about `path` is put to: the one whose
    /// roots hold it (the first, where several do), else `fallback` (the
    /// session of the turn looked after: the home directory's findings).
    fn session_for(&self, path: &std::path::Path, fallback: &str) -> String {
        self.sessions
            .table
            .live()
            .find(|s| {
                s.roots().any(|r| {
                    let r = crate::policy::resolve_real(r).unwrap_or_else(|_| r.clone());
                    path.starts_with(&r)
                })
            })
            .map(|s| s.id.clone())
            .unwrap_or_else(|| fallback.to_owned())
    }

    fn revert_and_ask(&mut self, session: &str, findings: Vec<Finding>) {
        // Keep questions of one look: a few on their own, the rest in one.
        let mut to_ask: Vec<(String, Finding, crate::audit::Action)> = Vec::new();
        // Keep questions: a few open at once, whatever the looks. With
        // none left, the agent's versions go to the stash on disk, and what
        // was reverted is summed up instead of asked.
        let room = MAX_OPEN_AUDIT_QUESTIONS.saturating_sub(self.routes.audit_prompts_open());
        // By session: notices given, reverts not given one, not asked.
        let mut said: std::collections::BTreeMap<String, (usize, usize, Vec<std::path::PathBuf>)> =
            Default::default();
        for finding in findings {
            if finding.blind {
                // Said once, not at every look.
                if let Some(base) = &mut self.audit.base {
                    base.said_blind(&finding);
                }
            }
            let session = self.session_for(&finding.path, session);
            if session.is_empty() {
                // No live session to tell: undone all the same, and logged.
                if finding.revert.is_some() {
                    let undone = self.audit.stash.undo(&finding, true);
                    warn!(path = %finding.path.display(), reverted = undone.reverted.is_ok(), kept = ?undone.kept_at, "the agent left what would run outside the sandbox, with no session open to tell: {}", finding.what);
                } else {
                    warn!(path = %finding.path.display(), "the agent left what would run outside the sandbox: {}", finding.what);
                }
                continue;
            }
            if finding.blind {
                warn!(path = %finding.path.display(), "the audit cannot look there: {}", finding.what);
                self.announce_to(
                    &session,
                    format!("Sandbox: the audit cannot look at {}", finding.path.display()),
                    format!(
                        "The audit cannot look at {}: {}. What the agent left there is not checked: look at it before you run anything there.",
                        finding.path.display(),
                        finding.what
                    ),
                );
                continue;
            }
            let Some(_) = &finding.revert else {
                // Nothing to undo that is the agent's alone: said, loudly.
                warn!(path = %finding.path.display(), "the agent left what would run outside the sandbox, and zcode-acp cannot undo it without touching what is yours: {}", finding.what);
                self.announce_to(
                    &session,
                    format!("Sandbox: look at {}", finding.path.display()),
                    format!(
                        "The agent left {}: {}. zcode-acp did not change it, since undoing it would touch what is yours: look at it before you run anything there.",
                        finding.path.display(),
                        finding.what
                    ),
                );
                continue;
            };
            let undone = self.audit.stash.undo(&finding, room == 0);
            let kept = match (&undone.kept_at, &undone.not_kept) {
                (Some(at), _) => format!(" The agent's version is kept in {}.", at.display()),
                (None, Some(why)) => format!(" The agent's version could not be kept: {why}."),
                (None, None) => String::new(),
            };
            match &undone.reverted {
                Ok(()) => {
                    warn!(path = %finding.path.display(), what = finding.what, "reverted what the agent left that would run outside the sandbox")
                }
                Err(e) => {
                    warn!(path = %finding.path.display(), "could not revert what the agent left ({e}): {}", finding.what)
                }
            }
            let shown = if finding.shown.is_empty() {
                String::new()
            } else {
                format!("\n\nThe agent's version:\n{}", finding.shown)
            };
            let text = match &undone.reverted {
                Ok(()) => format!(
                    "The agent left {}: {}. It was put back as it was when the agent started; choose Keep to have the agent's version back.{kept}{shown}",
                    finding.path.display(),
                    finding.what
                ),
                Err(e) => format!(
                    "The agent left {}: {}. zcode-acp could not put it back ({e}): look at it before you run anything there.{kept}{shown}",
                    finding.path.display(),
                    finding.what
                ),
            };
            // A flood is said in a few notices and one that sums it up.
            let told = said.entry(session.clone()).or_default();
            if told.0 < MAX_NOTICES {
                told.0 += 1;
                self.announce_to(
                    &session,
                    format!("Sandbox: reverted {}", finding.path.display()),
                    text,
                );
            } else {
                told.1 += 1;
            }
            if let (Ok(()), Some(keep)) = (&undone.reverted, undone.keep) {
                if self.audit.questions.insert(finding.path.clone()) {
                    to_ask.push((session, finding, keep));
                }
            }
        }
        let mut unasked: Vec<(String, Finding)> = Vec::new();
        if room == 0 {
            for (session, finding, _) in to_ask.drain(..) {
                self.audit.questions.remove(&finding.path);
                unasked.push((session, finding));
            }
        }
        // Within the room: a few alone, and the rest in the last question.
        let alone = if to_ask.len() > room {
            room.saturating_sub(1)
        } else {
            to_ask.len()
        };
        let rest = to_ask.split_off(alone);
        for (session, finding, keep) in to_ask {
            self.ask_keep(&session, vec![(finding, keep)]);
        }
        if let Some((session, _, _)) = rest.first() {
            let session = session.clone();
            self.ask_keep(&session, rest.into_iter().map(|(_, f, k)| (f, k)).collect());
        }
        for (session, finding) in unasked {
            said.entry(session).or_default().2.push(finding.path);
        }
        for (session, (_, more, unasked)) in said {
            if more == 0 && unasked.is_empty() {
                continue;
            }
            let at = match self.audit.stash.dir() {
                Ok(dir) => dir.display().to_string(),
                Err(_) => "zcode-acp's stash".to_owned(),
            };
            let mut text = String::new();
            if more > 0 {
                text.push_str(&format!(
                    "The agent left {more} more things that would run outside the sandbox; each was put back as it was (zcode-acp's log names them). "
                ));
            }
            if !unasked.is_empty() {
                text.push_str(&format!(
                    "{} reverted places are not asked about while {MAX_OPEN_AUDIT_QUESTIONS} questions are open: {}. ",
                    unasked.len(),
                    unasked.iter().take(5).map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
                ));
            }
            text.push_str(&format!("The agent's versions are kept in {at}."));
            self.announce_to(&session, "Sandbox: more reverted".into(), text);
        }
    }

    /// Asks whether to keep the agent's version of what `kept` reverted
    /// (one finding, or several in one question).
    fn ask_keep(&mut self, session: &str, kept: Vec<(Finding, crate::audit::Action)>) {
        let bid = self.alloc_id();
        self.editor.announcements += 1;
        let (title, text) = match kept.as_slice() {
            [(f, _)] => (
                format!("Keep what the agent left in {}?", f.path.display()),
                f.what.clone(),
            ),
            many => (
                format!("Keep what the agent left in these {} places?", many.len()),
                many.iter()
                    .map(|(f, _)| format!("- {}: {}", f.path.display(), f.what))
                    .collect::<Vec<_>>()
                    .join("\n"),
            ),
        };
        let params = super::prompts::permission_request(
            session,
            format!("zcode-acp-audit-{}", self.editor.announcements),
            title,
            &kept[0].0.path,
            text,
            &[super::prompts::KEEP, super::prompts::REVERT],
        );
        self.routes
            .expect_from_editor(bid, AtEditor::AuditPrompt { kept });
        self.to_editor(request(bid, "session/request_permission", &params));
    }

    /// The user answered: keep puts the agent's version back, and it is
    /// the baseline from now on.
    pub(super) fn on_audit_answer(
        &mut self,
        kept: Vec<(Finding, crate::audit::Action)>,
        frame: &crate::relay::Frame,
    ) {
        let keep = super::prompts::chosen(frame, &[super::prompts::KEEP]).is_some();
        for (finding, action) in kept {
            self.audit.questions.remove(&finding.path);
            if !keep {
                info!(path = %finding.path.display(), "the user kept it reverted");
                continue;
            }
            match action.apply() {
                Ok(()) => {
                    info!(path = %finding.path.display(), "the user kept the agent's version");
                    if let Some(base) = &mut self.audit.base {
                        base.accept(&finding);
                        // An audit running on the baseline before this answer
                        // would revert what was just kept: it is dropped, and
                        // run again on this one.
                        self.audit.looks.rerun();
                    }
                }
                Err(e) => {
                    warn!(path = %finding.path.display(), "could not put the agent's version back: {e}")
                }
            }
        }
    }
}

/// Keep questions open at once, at most, of every look: past them, the
/// rest of a look share the last one, and a look with none left says what
/// it reverted instead of asking.
const MAX_OPEN_AUDIT_QUESTIONS: usize = 3;
/// Revert notices one look gives each session; past them, one sums up.
const MAX_NOTICES: usize = 5;
