//! What the user has said about writes, as a state machine of its own:
//! open prompts (one per path; later denials of the path wait on it),
//! grants for this bridge's lifetime, paths never to allow, refusals the
//! user dismissed this turn, and projects whose hand edits were put to the
//! user. It decides; the bridge sends the prompts, records answers in
//! sandbox.json, re-arms and releases the held writes. Tests drive it
//! directly.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use super::prompts::{self, PromptOption};
use crate::config::project::List;
use crate::relay::{Frame, RawId};

/// Write prompts open at once, at most (of every kind: writes through the
/// editor, refused direct writes; connections have their own, see
/// `net_asks`): an agent looping over many paths must not bury the editor
/// in prompts.
pub(super) const MAX_OPEN_WRITE_PROMPTS: usize = 3;
/// Write prompts one turn may open, at most. Past either bound a write is
/// refused without asking (through the editor: answered with `-32096`; a
/// direct one: not offered), and the turn's end sums them up in one notice.
pub(super) const MAX_WRITE_PROMPTS_PER_TURN: usize = 10;

/// Who asked for a write through the editor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Asker {
    /// The agent of this backend generation.
    Agent(u64),
    /// A `run_code` run, through its session's editor socket.
    CodeTool,
}

/// A write held until the user answers.
#[derive(Debug)]
pub(super) struct HeldWrite {
    pub from: Asker,
    /// The asker's id for the request.
    pub backend_id: RawId,
    /// The request, its path already the real one that was judged.
    pub frame: Frame,
}

/// Writes of one path that wait on its open question, at most: each holds
/// its frame, and an "Allow once" makes them all.
pub(super) const MAX_JOINED: usize = 64;

/// What became of a denied write, given the questions open.
#[derive(Debug)]
pub(super) enum Joined {
    /// It waits on the question open for its path.
    Waits,
    /// No question is open for its path: one may be asked.
    New(HeldWrite),
    /// Too many wait on the question already: it is refused.
    Full(HeldWrite),
}

/// An open prompt.
#[derive(Debug)]
pub(super) struct Prompt {
    pub path: PathBuf,
    pub session: String,
    pub held: Vec<HeldWrite>,
    /// For a write the agent made itself: granting it needs a re-arm.
    pub direct: bool,
}

/// Why a refused direct write is not offered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum NotOffered {
    AlreadyGranted,
    AlreadyAsked,
    DismissedThisTurn,
    EnoughOpen,
    EnoughThisTurn,
}

impl std::fmt::Display for NotOffered {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            NotOffered::AlreadyGranted => "already granted",
            NotOffered::AlreadyAsked => "already asked",
            NotOffered::DismissedThisTurn => "you said no this turn",
            NotOffered::EnoughOpen => "enough questions are open",
            NotOffered::EnoughThisTurn => "this turn asked enough questions",
        })
    }
}

/// What an answer means, for the bridge to carry out.
#[derive(Debug)]
pub(super) struct Answered {
    pub prompt: Prompt,
    pub choice: Option<PromptOption>,
    /// The held writes may go ahead.
    pub allowed: bool,
    /// Record the path in the project's sandbox.json.
    pub record: Option<List>,
    /// The agent writes it itself: only a re-armed generation can.
    pub rearm: bool,
}

#[derive(Debug, Default)]
pub(super) struct Permissions {
    open: HashMap<u64, Prompt>,
    by_path: HashMap<PathBuf, u64>,
    grants: Vec<PathBuf>,
    never: Vec<PathBuf>,
    dismissed: HashSet<PathBuf>,
    config_asked: Vec<PathBuf>,
    /// Write prompts opened since the editor's last prompt.
    asked_this_turn: usize,
    /// Writes refused without asking since the last summary, in order
    /// (each path once).
    unasked: Vec<PathBuf>,
    unasked_count: usize,
}

impl Permissions {
    /// Whether a grant made in this bridge covers `path`.
    pub fn granted(&self, path: &Path) -> bool {
        self.grants.iter().any(|g| path.starts_with(g))
    }

    /// Grants `path` for this bridge's lifetime (an agent's state place
    /// the user allowed).
    pub fn grant(&mut self, path: PathBuf) {
        if !self.granted(&path) {
            self.grants.push(path);
        }
    }

    /// The grants made in this bridge, for the next generation's policy.
    pub fn grants(&self) -> &[PathBuf] {
        &self.grants
    }

    /// Whether the user said never for `path`.
    pub fn refused_for_good(&self, path: &Path) -> bool {
        self.never.iter().any(|n| path.starts_with(n))
    }

    /// A denied write of `path`: joins the prompt already open for it, or
    /// is handed back for a new prompt, or (past [`MAX_JOINED`] waiting on
    /// that prompt) handed back to be refused.
    pub fn join(&mut self, path: &Path, held: HeldWrite) -> Joined {
        match self
            .by_path
            .get(path)
            .and_then(|bid| self.open.get_mut(bid))
        {
            Some(p) if p.held.len() >= MAX_JOINED => Joined::Full(held),
            Some(p) => {
                p.held.push(held);
                Joined::Waits
            }
            None => Joined::New(held),
        }
    }

    /// Whether a refused direct write of `grant` may be offered now.
    pub fn may_offer_direct(&self, grant: &Path) -> Result<(), NotOffered> {
        if self.granted(grant) {
            return Err(NotOffered::AlreadyGranted);
        }
        if self.by_path.contains_key(grant) {
            return Err(NotOffered::AlreadyAsked);
        }
        if self.dismissed.contains(grant) {
            return Err(NotOffered::DismissedThisTurn);
        }
        self.may_ask()
    }

    /// Whether one more write prompt may be opened now (see
    /// [`MAX_OPEN_WRITE_PROMPTS`], [`MAX_WRITE_PROMPTS_PER_TURN`]).
    pub fn may_ask(&self) -> Result<(), NotOffered> {
        if self.open.len() >= MAX_OPEN_WRITE_PROMPTS {
            return Err(NotOffered::EnoughOpen);
        }
        if self.asked_this_turn >= MAX_WRITE_PROMPTS_PER_TURN {
            return Err(NotOffered::EnoughThisTurn);
        }
        Ok(())
    }

    /// A write refused without asking, for the turn's summary.
    pub fn not_asked(&mut self, path: &Path) {
        self.unasked_count += 1;
        if !self.unasked.iter().any(|p| p == path) && self.unasked.len() < 1000 {
            self.unasked.push(path.to_path_buf());
        }
    }

    /// The writes refused without asking since the last call: (how many,
    /// the distinct paths, in order).
    pub fn take_unasked(&mut self) -> Option<(usize, Vec<PathBuf>)> {
        if self.unasked_count == 0 {
            return None;
        }
        let n = std::mem::take(&mut self.unasked_count);
        Some((n, std::mem::take(&mut self.unasked)))
    }

    /// A prompt was sent as the bridge's request `bid`.
    pub fn opened(&mut self, bid: u64, prompt: Prompt) {
        self.asked_this_turn += 1;
        self.by_path.insert(prompt.path.clone(), bid);
        self.open.insert(bid, prompt);
    }

    /// The user answered prompt `bid` with `choice` (`None`: dismissed,
    /// cancelled or unreadable, which allows nothing). `None` when no such
    /// prompt is open.
    pub fn answered(&mut self, bid: u64, choice: Option<PromptOption>) -> Option<Answered> {
        let prompt = self.open.remove(&bid)?;
        self.by_path.remove(&prompt.path);
        let (allowed, record) = match choice {
            Some(prompts::ALLOW_ONCE) => (true, None),
            Some(prompts::ALLOW_ALWAYS) => (true, Some(List::Allow)),
            Some(prompts::REJECT_ALWAYS) => (false, Some(List::Deny)),
            _ => (false, None),
        };
        if allowed {
            self.grants.push(prompt.path.clone());
        } else if record == Some(List::Deny) {
            self.never.push(prompt.path.clone());
        } else if prompt.direct {
            // Not asked again this turn: the agent may retry many times.
            self.dismissed.insert(prompt.path.clone());
        }
        let rearm = prompt.direct && allowed;
        Some(Answered {
            prompt,
            choice,
            allowed,
            record,
            rearm,
        })
    }

    /// The editor sent a new prompt: refusals the user declined may be
    /// asked again.
    pub fn new_turn(&mut self) {
        self.dismissed.clear();
        self.asked_this_turn = 0;
    }

    /// Whether the hand edits of `root`'s sandbox.json should be put to
    /// the user now (once per bridge and project).
    pub fn ask_config_once(&mut self, root: &Path) -> bool {
        if self.config_asked.iter().any(|r| r == root) {
            return false;
        }
        self.config_asked.push(root.to_path_buf());
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(n: u64) -> HeldWrite {
        HeldWrite {
            from: Asker::Agent(1),
            backend_id: RawId(n.to_string()),
            frame: Frame::parse(
                format!(
                    r#"{{"jsonrpc":"2.0","id":{n},"method":"fs/write_text_file","params":{{}}}}"#
                )
                .into_bytes(),
            )
            .unwrap(),
        }
    }

    fn prompt(path: &str, direct: bool, held: Vec<HeldWrite>) -> Prompt {
        Prompt {
            path: path.into(),
            session: "s".into(),
            held,
            direct,
        }
    }

    #[test]
    fn one_prompt_per_path_and_its_writes_go_together() {
        let mut p = Permissions::default();
        let Joined::New(first) = p.join(Path::new("/srv/x"), held(1)) else {
            panic!("no question is open yet")
        };
        p.opened(10, prompt("/srv/x", false, vec![first]));
        for i in 2..=MAX_JOINED as u64 {
            assert!(matches!(
                p.join(Path::new("/srv/x"), held(i)),
                Joined::Waits
            ));
        }
        // One more than a question holds is refused, not kept.
        assert!(matches!(
            p.join(Path::new("/srv/x"), held(99)),
            Joined::Full(_)
        ));
        assert!(matches!(
            p.join(Path::new("/srv/y"), held(3)),
            Joined::New(_)
        ));
        let a = p.answered(10, Some(prompts::ALLOW_ONCE)).unwrap();
        assert!(a.allowed && a.record.is_none() && !a.rearm);
        assert_eq!(a.prompt.held.len(), MAX_JOINED);
        assert!(p.granted(Path::new("/srv/x")));
        assert!(p.granted(Path::new("/srv/x/deeper")));
        assert!(!p.granted(Path::new("/srv/xy")));
        // Answered once: a late second answer finds nothing.
        assert!(p.answered(10, Some(prompts::ALLOW_ONCE)).is_none());
    }

    #[test]
    fn each_answer_does_what_it_says() {
        let mut p = Permissions::default();
        p.opened(1, prompt("/a", false, vec![]));
        let a = p.answered(1, Some(prompts::ALLOW_ALWAYS)).unwrap();
        assert_eq!((a.allowed, a.record), (true, Some(List::Allow)));
        p.opened(2, prompt("/b", false, vec![]));
        let a = p.answered(2, Some(prompts::REJECT_ALWAYS)).unwrap();
        assert_eq!((a.allowed, a.record), (false, Some(List::Deny)));
        assert!(p.refused_for_good(Path::new("/b/c")));
        p.opened(3, prompt("/c", false, vec![]));
        let a = p.answered(3, Some(prompts::REJECT_ONCE)).unwrap();
        assert_eq!((a.allowed, a.record), (false, None));
        assert!(!p.refused_for_good(Path::new("/c")) && !p.granted(Path::new("/c")));
        // A cancelled prompt allows nothing.
        p.opened(4, prompt("/d", false, vec![]));
        let a = p.answered(4, None).unwrap();
        assert!(!a.allowed);
        assert_eq!(p.grants(), [PathBuf::from("/a")]);
    }

    #[test]
    fn refused_direct_writes_are_offered_a_few_at_a_time_and_once_a_turn() {
        let mut p = Permissions::default();
        for (bid, path) in [(1, "/p1"), (2, "/p2"), (3, "/p3")] {
            assert_eq!(p.may_offer_direct(Path::new(path)), Ok(()));
            p.opened(bid, prompt(path, true, vec![]));
        }
        assert_eq!(
            p.may_offer_direct(Path::new("/p4")),
            Err(NotOffered::EnoughOpen)
        );
        assert_eq!(p.may_ask(), Err(NotOffered::EnoughOpen));
        assert_eq!(
            p.may_offer_direct(Path::new("/p1")),
            Err(NotOffered::AlreadyAsked)
        );
        // Declined: not asked again this turn; allowed: re-arm.
        assert!(!p.answered(1, Some(prompts::REJECT_ONCE)).unwrap().rearm);
        assert_eq!(
            p.may_offer_direct(Path::new("/p1")),
            Err(NotOffered::DismissedThisTurn)
        );
        assert!(p.answered(2, Some(prompts::ALLOW_ONCE)).unwrap().rearm);
        assert_eq!(
            p.may_offer_direct(Path::new("/p2/f")),
            Err(NotOffered::AlreadyGranted)
        );
        assert_eq!(p.may_offer_direct(Path::new("/p4")), Ok(()));
        p.new_turn();
        assert_eq!(p.may_offer_direct(Path::new("/p1")), Ok(()));
    }

    /// However many distinct paths an agent writes, a few prompts are open
    /// at once and a few more per turn; the rest are counted for one
    /// summary, and the next turn may ask again.
    #[test]
    fn write_prompts_are_bounded_at_once_and_per_turn() {
        let mut p = Permissions::default();
        let mut bid = 0;
        let mut opened = 0;
        for i in 0..3494 {
            let path = PathBuf::from(format!("/outside/f{i}"));
            match p.may_ask() {
                Ok(()) => {
                    bid += 1;
                    p.opened(bid, prompt(path.to_str().unwrap(), false, vec![]));
                    opened += 1;
                    // The user answers each at once.
                    p.answered(bid, Some(prompts::REJECT_ONCE)).unwrap();
                }
                Err(_) => p.not_asked(&path),
            }
        }
        assert_eq!(opened, MAX_WRITE_PROMPTS_PER_TURN);
        let (n, paths) = p.take_unasked().unwrap();
        assert_eq!(n, 3494 - MAX_WRITE_PROMPTS_PER_TURN);
        assert_eq!(paths.len(), 1000);
        assert!(p.take_unasked().is_none());
        assert_eq!(p.may_ask(), Err(NotOffered::EnoughThisTurn));
        p.new_turn();
        assert_eq!(p.may_ask(), Ok(()));
    }

    #[test]
    fn hand_edits_are_put_to_the_user_once_per_project() {
        let mut p = Permissions::default();
        assert!(p.ask_config_once(Path::new("/w")));
        assert!(!p.ask_config_once(Path::new("/w")));
        assert!(p.ask_config_once(Path::new("/v")));
    }
}
