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
    /// The state the running generation was armed in (armed bridges only).
    pub(super) fn take_audit_baseline(&mut self) {
        self.audit = None;
        // An audit of the last baseline still running is stale from now.
        self.audit_epoch += 1;
        let Some(policy) = self.confinement.policy() else {
            return;
        };
        self.audit = Some(audit::baseline(policy, &self.armed_roots));
    }

    /// A turn ended with `answer`: it reaches the editor once the audit
    /// of what the turn left has reverted its findings (at once when the
    /// generation is not armed).
    pub(super) fn end_turn_after_audit(&mut self, session: &str, answer: Vec<u8>) {
        self.say_unasked(session);
        if self.audit.is_none() {
            self.to_editor(answer);
            return;
        }
        if self.auditing.is_some() {
            self.turn_ends_next.push(answer);
        } else {
            self.turn_ends.push(answer);
        }
        self.run_audit(session);
    }

    /// Looks, off the loop, for what the agent left that would run; what it
    /// finds is reverted and put to the user on `session` when it is done
    /// ([`Bridge::after_audit`]). One runs at a time: one asked for
    /// meanwhile runs after it.
    pub(super) fn run_audit(&mut self, session: &str) {
        let Some(base) = &self.audit else {
            // No audit will come for what waits on one.
            self.release_turn_ends();
            return;
        };
        if self.auditing.is_some() {
            self.audit_again = Some(session.to_owned());
            return;
        }
        self.auditing = Some(session.to_owned());
        self.disk
            .audit(base.clone(), self.audit_epoch, session.to_owned());
    }

    /// The same, at once, on the loop: before a re-arm and at shutdown,
    /// where what follows must not start before it is done. It covers
    /// every turn that ended before it, so their answers go out.
    pub(super) fn run_audit_now(&mut self, session: &str) {
        if let Some(base) = &self.audit {
            let findings = base.audit();
            // One still running off the loop would bring the same findings
            // again: dropped.
            self.audit_epoch += 1;
            self.revert_and_ask(session, findings);
        }
        self.release_turn_ends();
    }

    /// An audit finished: its findings are reverted and put to the user,
    /// unless the generation it was armed for is gone (the audit before the
    /// re-arm covered it); either way the turns it looked after end now.
    pub(super) fn after_audit(&mut self, epoch: u64, session: &str, findings: Vec<Finding>) {
        self.auditing = None;
        let current = epoch == self.audit_epoch;
        if current {
            self.revert_and_ask(session, findings);
        }
        let mut looked_after = std::mem::take(&mut self.turn_ends);
        if !current && self.audit_again.is_some() {
            // Dropped for a newer baseline (the user kept a finding
            // meanwhile): its turns wait for the look that runs again.
            looked_after.append(&mut self.turn_ends_next);
            self.turn_ends_next = looked_after;
        } else {
            for answer in looked_after {
                self.to_editor(answer);
            }
        }
        self.turn_ends = std::mem::take(&mut self.turn_ends_next);
        match self.audit_again.take() {
            Some(next) => self.run_audit(&next),
            None => self.release_turn_ends(),
        }
    }

    /// Before the agent is stopped for a re-arm: turns still waiting on
    /// the look off the loop get one now, so their ends do not wait for
    /// the agent's stop (the look after the stop covers what it did since).
    pub(super) fn audit_held_turns_now(&mut self) {
        if self.turn_ends.is_empty() && self.turn_ends_next.is_empty() {
            return;
        }
        let first = self.sessions.live().next().map(|s| s.id.clone());
        match first {
            Some(session) => self.run_audit_now(&session),
            None => self.release_turn_ends(),
        }
    }

    /// Every turn's answer still held goes out.
    pub(super) fn release_turn_ends(&mut self) {
        let held = std::mem::take(&mut self.turn_ends);
        let next = std::mem::take(&mut self.turn_ends_next);
        for answer in held.into_iter().chain(next) {
            self.to_editor(answer);
        }
    }

    fn revert_and_ask(&mut self, session: &str, findings: Vec<Finding>) {
        for finding in findings {
            let Some(revert) = &finding.revert else {
                // Nothing to undo that is the agent's alone: said, loudly.
                warn!(path = %finding.path.display(), "the agent left what would run outside the sandbox, and zcode-acp cannot undo it without touching what is yours: {}", finding.what);
                self.announce_to(
                    session,
                    format!("Sandbox: look at {}", finding.path.display()),
                    format!(
                        "The agent left {} and {}. zcode-acp did not change it, since undoing it would touch what is yours: look at it before you run anything there.",
                        finding.path.display(),
                        finding.what
                    ),
                );
                continue;
            };
            let reverted = revert.apply();
            match &reverted {
                Ok(()) => {
                    warn!(path = %finding.path.display(), what = finding.what, "reverted what the agent left that would run outside the sandbox")
                }
                Err(e) => {
                    warn!(path = %finding.path.display(), "could not revert what the agent left ({e}): {}", finding.what)
                }
            }
            let text = match &reverted {
                Ok(()) => format!(
                    "The agent left {} and {}. It was put back as it was when the agent started; choose Keep to have the agent's version back.",
                    finding.path.display(),
                    finding.what
                ),
                Err(e) => format!(
                    "The agent left {} and {}. zcode-acp could not put it back ({e}): look at it before you run anything there.",
                    finding.path.display(),
                    finding.what
                ),
            };
            self.announce_to(
                session,
                format!("Sandbox: reverted {}", finding.path.display()),
                text,
            );
            if reverted.is_ok() && finding.keep.is_some() {
                self.ask_keep(session, finding);
            }
        }
    }

    fn ask_keep(&mut self, session: &str, finding: Finding) {
        let bid = self.alloc_id();
        self.announcements += 1;
        let params = super::prompts::permission_request(
            session,
            format!("zcode-acp-audit-{}", self.announcements),
            format!("Keep what the agent left in {}?", finding.path.display()),
            &finding.path,
            finding.what.clone(),
            &[super::prompts::KEEP, super::prompts::REVERT],
        );
        self.routes.expect_from_editor(
            bid,
            AtEditor::AuditPrompt {
                finding: Box::new(finding),
            },
        );
        self.to_editor(request(bid, "session/request_permission", &params));
    }

    /// The user answered: keep puts the agent's version back, and it is
    /// the baseline from now on.
    pub(super) fn on_audit_answer(&mut self, finding: Finding, frame: &crate::relay::Frame) {
        let kept = super::prompts::chosen(frame, &[super::prompts::KEEP]).is_some();
        if !kept {
            return info!(path = %finding.path.display(), "the user kept it reverted");
        }
        let Some(keep) = &finding.keep else { return };
        match keep.apply() {
            Ok(()) => {
                info!(path = %finding.path.display(), "the user kept the agent's version");
                if let Some(base) = &mut self.audit {
                    base.accept(&finding);
                    // An audit running on the baseline before this answer
                    // would revert what was just kept: it is dropped, and
                    // run again on this one.
                    self.audit_epoch += 1;
                    if let Some(session) = self.auditing.clone() {
                        self.audit_again.get_or_insert(session);
                    }
                }
            }
            Err(e) => {
                warn!(path = %finding.path.display(), "could not put the agent's version back: {e}")
            }
        }
    }
}
