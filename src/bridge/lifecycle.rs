//! The backend's lifecycle as a state machine of its own: which phase the
//! bridge is in, why the next generation starts, when it may, and when to
//! give up. It decides; the bridge carries its decisions out (stops and
//! starts processes, answers and queues frames). Time is passed in, so
//! tests drive it directly.
//!
//! ```text
//!   Starting{at} --started--> SettingUp --set_up--> Running
//!        ^                                            |
//!        |  crashed (backoff)             restart_asked
//!        +------------------ Draining <---------------+
//!                        (drained: old one stopped)
//!   any --crashed too often / refused--> GaveUp      any --shut_down--> ShuttingDown
//!   GaveUp --an editor request after the cool-down--> Starting
//! ```
//!
//! Crashes are forgiven with time: a restart waits longer after each recent
//! crash (backoff), too many within the window make the bridge give up for
//! a cool-down only, and the editor's next request after it starts the
//! agent again. An agent that has never answered `initialize` is not
//! restarted at all: it is broken, not unlucky, and the editor hears why
//! at once.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Where the bridge is in a backend's life.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Phase {
    /// No generation runs; the next start is due at `at`.
    Starting { at: Instant },
    /// A generation runs and is being set up (the editor's initialize and
    /// login replayed, live sessions restored); editor requests wait.
    SettingUp,
    /// Editor frames go straight to the backend.
    Running,
    /// A restart waits for the editor's requests in flight to finish;
    /// new editor requests wait (cancellations pass).
    Draining,
    /// The bridge gave up on the backend; requests get `message`. From
    /// `retry_after` on (never, when `None`: the sandbox cannot be armed),
    /// the editor's next request starts it again.
    GaveUp {
        message: String,
        retry_after: Option<Instant>,
    },
    /// The bridge is ending: the backend may still answer until `deadline`.
    ShuttingDown { deadline: Instant },
}

/// Why a generation is (re)started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Cause {
    /// The bridge's first generation: nothing to drain, nothing to announce.
    FirstStart,
    /// Asked for (a re-arm, SIGHUP, a grant): the old one was drained.
    Asked(String),
    /// The last generation died (or failed to start).
    Crashed(String),
}

impl Cause {
    /// In words, for the restart's announcement; `None` for the first start.
    pub fn announced(&self) -> Option<&str> {
        match self {
            Cause::FirstStart => None,
            Cause::Asked(why) | Cause::Crashed(why) => Some(why),
        }
    }
}

/// What a crash (or failed start) leads to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum AfterCrash {
    /// Another start, at `at`.
    Retry { at: Instant },
    /// Too many within the window: the bridge gives up, with this message.
    GiveUp(String),
    /// The bridge is shutting down or has given up already: nothing more.
    Ignored,
}

/// What becomes of a message from the editor (a request or a
/// notification; answers are routed in every phase) in the phase the
/// bridge is in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Admission {
    /// It goes through routing to the backend now.
    Dispatch,
    /// It waits for the backend to be back (routing holds it).
    Hold,
    /// No backend will come for it: a request is answered with this, a
    /// notification dropped.
    Refuse(Closed),
}

/// Why no backend will take an editor message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Closed {
    /// The bridge gave up on the agent (the message says why, and when
    /// it starts again).
    GaveUp(String),
    ShuttingDown,
}

#[derive(Debug)]
pub(super) struct Lifecycle {
    phase: Phase,
    /// Why the restart in progress happens.
    cause: Cause,
    /// A restart asked for while one was setting up: it runs next.
    pending: Option<String>,
    crashes: VecDeque<Instant>,
    crash_limit: usize,
    crash_window: Duration,
    /// How long a give-up after crashes lasts.
    cooldown: Duration,
    /// Whether any generation has answered `initialize`.
    initialized: bool,
}

impl Lifecycle {
    /// The first generation starts at once, so the agent warms up while
    /// the editor is still connecting.
    pub fn new(
        now: Instant,
        crash_limit: usize,
        crash_window: Duration,
        cooldown: Duration,
    ) -> Lifecycle {
        Lifecycle {
            phase: Phase::Starting { at: now },
            cause: Cause::FirstStart,
            pending: None,
            crashes: VecDeque::new(),
            crash_limit,
            crash_window,
            cooldown,
            initialized: false,
        }
    }

    /// A generation answered `initialize`: from now on it is restarted
    /// after a crash.
    pub fn initialized(&mut self) {
        self.initialized = true;
    }

    /// A message from the editor (`request`: one awaiting an answer;
    /// `cancellation`: one cancelling a turn or a request) arrives at
    /// `now`. While a restart drains, cancellations still reach the
    /// backend, which is finishing the work they cancel; while the bridge
    /// has given up, a request after the cool-down starts the agent again
    /// and waits for it.
    pub fn admit(&mut self, request: bool, cancellation: bool, now: Instant) -> Admission {
        match &self.phase {
            Phase::Running => Admission::Dispatch,
            Phase::Draining if cancellation => Admission::Dispatch,
            Phase::Draining | Phase::Starting { .. } | Phase::SettingUp => Admission::Hold,
            Phase::ShuttingDown { .. } => Admission::Refuse(Closed::ShuttingDown),
            Phase::GaveUp { message, .. } => {
                let message = message.clone();
                if request && self.request_arrived(now) {
                    tracing::info!(
                        "starting the agent again: the cool-down after its crashes is over"
                    );
                    return Admission::Hold;
                }
                Admission::Refuse(Closed::GaveUp(message))
            }
        }
    }

    /// An editor request arrived while the bridge had given up: after the
    /// cool-down it starts the agent again (true: hold the request for
    /// it), with a clean slate of crashes.
    fn request_arrived(&mut self, now: Instant) -> bool {
        match &self.phase {
            Phase::GaveUp {
                retry_after: Some(at),
                ..
            } if now >= *at => {
                self.crashes.clear();
                self.cause = Cause::Asked("the cool-down after the agent's crashes is over".into());
                self.phase = Phase::Starting { at: now };
                true
            }
            _ => false,
        }
    }

    pub fn phase(&self) -> &Phase {
        &self.phase
    }

    pub fn is_shutting_down(&self) -> bool {
        matches!(self.phase, Phase::ShuttingDown { .. })
    }

    /// When the loop must act without an event.
    pub fn wake_at(&self) -> Option<Instant> {
        match self.phase {
            Phase::Starting { at } => Some(at),
            Phase::ShuttingDown { deadline } => Some(deadline),
            _ => None,
        }
    }

    /// A restart is asked for. Returns false when none will come (the
    /// bridge gave up or is ending). Asked while one is setting up, it
    /// runs once that one is done; asked while one is on its way, it is
    /// part of it.
    pub fn restart_asked(&mut self, why: &str) -> bool {
        match self.phase {
            Phase::GaveUp { .. } | Phase::ShuttingDown { .. } => false,
            Phase::Running => {
                self.phase = Phase::Draining;
                self.cause = Cause::Asked(why.to_owned());
                true
            }
            Phase::SettingUp => {
                self.pending.get_or_insert_with(|| why.to_owned());
                true
            }
            Phase::Draining | Phase::Starting { .. } => true,
        }
    }

    /// The drained generation was stopped: the next one may start (after
    /// the backoff recent crashes call for).
    pub fn drained(&mut self, now: Instant) {
        if self.phase == Phase::Draining {
            self.phase = Phase::Starting {
                at: now + self.backoff(now),
            };
        }
    }

    /// A generation was started; it is being set up.
    pub fn started(&mut self) {
        if matches!(self.phase, Phase::Starting { .. }) {
            self.phase = Phase::SettingUp;
        }
    }

    /// The generation is set up and running. Returns why it was started
    /// (for the announcement) and a restart asked for meanwhile, which the
    /// bridge asks for again once it has released what it queued.
    pub fn set_up(&mut self) -> (Cause, Option<String>) {
        let cause = std::mem::replace(&mut self.cause, Cause::FirstStart);
        if self.phase != Phase::SettingUp {
            return (cause, None);
        }
        self.phase = Phase::Running;
        (cause, self.pending.take())
    }

    /// The generation died, or could not be started (`how`, in words;
    /// `last_words`: its last lines on stderr, quoted when the bridge
    /// gives up).
    pub fn crashed(&mut self, now: Instant, how: &str, last_words: &[String]) -> AfterCrash {
        if matches!(
            self.phase,
            Phase::GaveUp { .. } | Phase::ShuttingDown { .. }
        ) {
            return AfterCrash::Ignored;
        }
        let again = format!(
            "zcode-acp starts it again at your next request after {} s{}",
            self.cooldown.as_secs_f64(),
            quoted(last_words)
        );
        // `again` ends the message: the agent's own lines come last.
        if !self.initialized {
            let message = format!(
                "the agent stopped before it answered initialize ({how}), so zcode-acp did not restart it; check the agent command and its messages; {again}"
            );
            self.give_up(message.clone(), Some(now + self.cooldown));
            return AfterCrash::GiveUp(message);
        }
        self.crashes.push_back(now);
        while self
            .crashes
            .front()
            .is_some_and(|t| now.duration_since(*t) > self.crash_window)
        {
            self.crashes.pop_front();
        }
        if self.crashes.len() >= self.crash_limit {
            let message = format!(
                "the agent failed {} times within {} s (last: {how}), so zcode-acp stopped restarting it; {again}",
                self.crashes.len(),
                self.crash_window.as_secs(),
            );
            self.give_up(message.clone(), Some(now + self.cooldown));
            return AfterCrash::GiveUp(message);
        }
        // A restart asked for meanwhile is part of this one, which starts
        // from the state at that time. A restart under way keeps its
        // cause; a crash of a running backend is the cause of its own.
        self.pending = None;
        if self.phase == Phase::Running {
            self.cause = Cause::Crashed(format!("the backend crashed ({how})"));
        }
        let at = now + self.backoff(now);
        self.phase = Phase::Starting { at };
        AfterCrash::Retry { at }
    }

    /// Gives up for good (retrying cannot help), with `message` for
    /// every later request.
    pub fn fail(&mut self, message: String) {
        self.give_up(message, None);
    }

    fn give_up(&mut self, message: String, retry_after: Option<Instant>) {
        if !self.is_shutting_down() {
            self.pending = None;
            self.phase = Phase::GaveUp {
                message,
                retry_after,
            };
        }
    }

    /// The bridge is ending; the backend may answer until `deadline`. Asked
    /// again while ending, only an earlier deadline counts (the editor left
    /// during the grace period: nothing can reach it any more).
    pub fn shut_down(&mut self, deadline: Instant) {
        match &mut self.phase {
            Phase::ShuttingDown { deadline: d } => *d = (*d).min(deadline),
            _ => {
                self.pending = None;
                self.phase = Phase::ShuttingDown { deadline };
            }
        }
    }

    /// How long to wait before the next start, given recent crashes.
    fn backoff(&self, now: Instant) -> Duration {
        let recent = self
            .crashes
            .iter()
            .filter(|t| now.duration_since(**t) <= self.crash_window)
            .count();
        match recent {
            0 => Duration::ZERO,
            n => Duration::from_millis(200u64 << (n - 1).min(5)),
        }
    }
}

/// The agent's last lines on stderr, for a message.
fn quoted(lines: &[String]) -> String {
    if lines.is_empty() {
        return String::new();
    }
    let mut out = String::from(". The agent's last lines on stderr:");
    for line in lines {
        out.push_str("\n  ");
        out.push_str(line);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const COOLDOWN: Duration = Duration::from_secs(60);

    /// A lifecycle whose agent has answered initialize once.
    fn life(now: Instant) -> Lifecycle {
        let mut l = Lifecycle::new(now, 3, Duration::from_secs(30), COOLDOWN);
        l.initialized();
        l
    }

    #[test]
    fn the_first_start_is_immediate_and_not_announced() {
        let now = Instant::now();
        let mut l = life(now);
        assert_eq!(l.phase(), &Phase::Starting { at: now });
        assert_eq!(l.wake_at(), Some(now));
        l.started();
        assert_eq!(l.phase(), &Phase::SettingUp);
        let (cause, pending) = l.set_up();
        assert_eq!((cause.announced(), pending), (None, None));
        assert_eq!(l.phase(), &Phase::Running);
    }

    #[test]
    fn an_asked_restart_drains_then_starts_at_once() {
        let now = Instant::now();
        let mut l = life(now);
        l.started();
        l.set_up();
        assert!(l.restart_asked("re-arm for /p"));
        assert_eq!(l.phase(), &Phase::Draining);
        // Asked again while draining: the same restart.
        assert!(l.restart_asked("SIGHUP"));
        l.drained(now);
        assert_eq!(l.phase(), &Phase::Starting { at: now });
        l.started();
        assert_eq!(l.set_up(), (Cause::Asked("re-arm for /p".into()), None));
        assert_eq!(l.phase(), &Phase::Running);
    }

    #[test]
    fn a_restart_asked_during_setup_runs_after_it() {
        let now = Instant::now();
        let mut l = life(now);
        l.started();
        assert!(l.restart_asked("you allowed writes to /x"));
        assert_eq!(l.phase(), &Phase::SettingUp);
        let (cause, pending) = l.set_up();
        assert_eq!(cause, Cause::FirstStart);
        assert_eq!(l.phase(), &Phase::Running);
        // The bridge releases its queue, then asks again.
        let why = pending.unwrap();
        assert_eq!(why, "you allowed writes to /x");
        assert!(l.restart_asked(&why));
        assert_eq!(l.phase(), &Phase::Draining);
        l.drained(now);
        l.started();
        assert_eq!(
            l.set_up().0,
            Cause::Asked("you allowed writes to /x".into())
        );
    }

    #[test]
    fn crashes_back_off_then_give_up() {
        let t0 = Instant::now();
        let mut l = life(t0);
        l.started();
        l.set_up();
        let at = match l.crashed(t0, "exit status: 1", &[]) {
            AfterCrash::Retry { at } => at,
            other => panic!("{other:?}"),
        };
        assert_eq!(at, t0 + Duration::from_millis(200));
        assert_eq!(l.wake_at(), Some(at));
        l.started();
        assert_eq!(
            l.crashed(t0 + Duration::from_secs(1), "exit status: 1", &[]),
            AfterCrash::Retry {
                at: t0 + Duration::from_secs(1) + Duration::from_millis(400)
            }
        );
        l.started();
        l.set_up();
        match l.crashed(t0 + Duration::from_secs(2), "signal: 9", &[]) {
            AfterCrash::GiveUp(m) => {
                assert!(m.contains("3 times within 30 s (last: signal: 9)"), "{m}")
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            l.phase(),
            Phase::GaveUp { retry_after: Some(at), .. } if *at == t0 + Duration::from_secs(2) + COOLDOWN
        ));
        // Given up: no restart comes, and later crashes change nothing.
        assert!(!l.restart_asked("SIGHUP"));
        assert_eq!(
            l.crashed(t0 + Duration::from_secs(3), "x", &[]),
            AfterCrash::Ignored
        );
        // Until the cool-down is over: the next request starts it again,
        // with the crashes forgotten.
        assert!(!l.request_arrived(t0 + Duration::from_secs(30)));
        let later = t0 + Duration::from_secs(2) + COOLDOWN;
        assert!(l.request_arrived(later));
        assert_eq!(l.phase(), &Phase::Starting { at: later });
        l.started();
        assert_eq!(
            l.set_up().0.announced(),
            Some("the cool-down after the agent's crashes is over")
        );
        assert!(matches!(
            l.crashed(later, "exit status: 1", &[]),
            AfterCrash::Retry { .. }
        ));
    }

    #[test]
    fn an_agent_that_never_answered_initialize_is_not_restarted() {
        let t0 = Instant::now();
        let mut l = Lifecycle::new(t0, 3, Duration::from_secs(30), COOLDOWN);
        l.started();
        let words = ["Error: cannot find module 'x'".to_owned()];
        match l.crashed(t0, "exit status: 3", &words) {
            AfterCrash::GiveUp(m) => {
                assert!(
                    m.contains("before it answered initialize (exit status: 3)"),
                    "{m}"
                );
                assert!(
                    m.contains("after 60 s") && m.ends_with("\n  Error: cannot find module 'x'"),
                    "{m}"
                );
            }
            other => panic!("{other:?}"),
        }
        // Refused for good (the sandbox cannot be armed): never retried.
        let mut refused = life(t0);
        refused.fail("the sandbox cannot be armed".into());
        assert!(!refused.request_arrived(t0 + COOLDOWN * 10));
    }

    #[test]
    fn crashes_outside_the_window_are_forgotten() {
        let t0 = Instant::now();
        let mut l = life(t0);
        for i in 0..6u64 {
            l.started();
            l.set_up();
            let at = t0 + Duration::from_secs(31 * i);
            assert_eq!(
                l.crashed(at, "exit status: 1", &[]),
                AfterCrash::Retry {
                    at: at + Duration::from_millis(200)
                }
            );
        }
    }

    #[test]
    fn a_crash_says_why_unless_a_restart_was_under_way() {
        let now = Instant::now();
        let mut l = life(now);
        l.started();
        l.set_up();
        l.crashed(now, "exit status: 2", &[]);
        l.started();
        assert_eq!(
            l.set_up().0,
            Cause::Crashed("the backend crashed (exit status: 2)".into())
        );
        // Dying while being set up for a re-arm: still that re-arm, and a
        // restart asked for meanwhile is part of the retry.
        l.restart_asked("re-arm");
        l.drained(now);
        l.started();
        l.restart_asked("SIGHUP");
        l.crashed(now + Duration::from_secs(60), "exit status: 3", &[]);
        l.started();
        assert_eq!(l.set_up(), (Cause::Asked("re-arm".into()), None));
        assert_eq!(l.phase(), &Phase::Running);
    }

    #[test]
    fn each_phase_admits_the_editors_messages_its_own_way() {
        let t0 = Instant::now();
        let mut l = life(t0);
        // Starting, then setting up: everything waits.
        assert_eq!(l.admit(true, false, t0), Admission::Hold);
        assert_eq!(l.admit(false, true, t0), Admission::Hold);
        l.started();
        assert_eq!(l.admit(true, false, t0), Admission::Hold);
        l.set_up();
        assert_eq!(l.admit(true, false, t0), Admission::Dispatch);
        assert_eq!(l.admit(false, false, t0), Admission::Dispatch);
        // Draining: only cancellations pass, to the backend finishing the
        // work they cancel.
        l.restart_asked("re-arm");
        assert_eq!(l.admit(false, true, t0), Admission::Dispatch);
        assert_eq!(l.admit(true, true, t0), Admission::Dispatch);
        assert_eq!(l.admit(true, false, t0), Admission::Hold);
        assert_eq!(l.admit(false, false, t0), Admission::Hold);
        l.drained(t0);
        assert_eq!(l.admit(false, true, t0), Admission::Hold);
        // Ending: refused, whatever the message.
        let mut ending = life(t0);
        ending.started();
        ending.set_up();
        ending.shut_down(t0 + Duration::from_secs(2));
        for (request, cancellation) in [(true, false), (false, true), (false, false)] {
            assert_eq!(
                ending.admit(request, cancellation, t0),
                Admission::Refuse(Closed::ShuttingDown)
            );
        }
    }

    #[test]
    fn a_request_after_the_cool_down_starts_the_agent_again_a_notification_does_not() {
        let t0 = Instant::now();
        let mut l = Lifecycle::new(t0, 3, Duration::from_secs(30), COOLDOWN);
        l.started();
        let AfterCrash::GiveUp(message) = l.crashed(t0, "exit status: 1", &[]) else {
            panic!("an agent that never answered initialize is given up on");
        };
        let refused = Admission::Refuse(Closed::GaveUp(message.clone()));
        // Within the cool-down: refused with the give-up's message.
        assert_eq!(l.admit(true, false, t0 + Duration::from_secs(1)), refused);
        let later = t0 + COOLDOWN;
        // A notification never starts it.
        assert_eq!(l.admit(false, false, later), refused);
        assert!(matches!(l.phase(), Phase::GaveUp { .. }));
        // A request does, and waits for it.
        assert_eq!(l.admit(true, false, later), Admission::Hold);
        assert_eq!(l.phase(), &Phase::Starting { at: later });
        // Refused for good: never.
        let mut failed = life(t0);
        failed.fail("the sandbox cannot be armed".into());
        assert_eq!(
            failed.admit(true, false, t0 + COOLDOWN * 10),
            Admission::Refuse(Closed::GaveUp("the sandbox cannot be armed".into()))
        );
    }

    #[test]
    fn shutting_down_ends_everything_else() {
        let now = Instant::now();
        let mut l = life(now);
        l.started();
        l.set_up();
        l.shut_down(now + Duration::from_secs(2));
        assert!(l.is_shutting_down());
        assert_eq!(l.wake_at(), Some(now + Duration::from_secs(2)));
        assert!(!l.restart_asked("SIGHUP"));
        assert_eq!(l.crashed(now, "exit status: 0", &[]), AfterCrash::Ignored);
        l.fail("x".into());
        assert!(l.is_shutting_down());
    }
}
