//! Connections the network table refuses, put to the user (see
//! `network::asks` for the proxy's side). The generation's proxy asks on
//! a socket the bridge listens on for as long as the generation runs;
//! each question becomes one of the bridge's allow prompts on the session
//! whose turn is running, with the write prompts' four answers:
//!
//! - allow once: this destination, for this bridge's lifetime;
//! - always allow: that, and recorded in the project's sandbox.json
//!   `network` table (approved), where the table can say it this narrowly
//!   (a host loopback port, a public host); a LAN host or another address
//!   of this machine is allowed for this bridge only, and the user is told;
//! - don't allow: not asked again this turn;
//! - never allow: refused for this bridge's lifetime.
//!
//! One prompt per destination is open at a time (later questions wait on
//! it), and at most a few at once, as for refused writes: an agent trying
//! many hosts must not bury the editor in prompts. A question outside any
//! turn is refused without asking. A prompt whose askers all gave up (the
//! proxy waits two minutes at most) is withdrawn from the editor
//! (`$/cancel_request`), so it neither lingers nor counts against the
//! few.

use std::collections::{HashMap, HashSet};

use tokio::sync::{mpsc, oneshot};
use tracing::{debug, info, warn};

use super::{prompts, AtEditor, Bridge};
use crate::network::asks::{Ask, Question, Reply};
use crate::policy::network::{authority, NetworkTable};
use crate::relay::envelope::request;
use crate::relay::Frame;

/// Network prompts open at once, at most: as many as of refused writes.
pub(super) const MAX_OPEN: usize = super::permissions::MAX_OPEN_WRITE_PROMPTS;
/// Network prompts in one turn, at most: an agent trying one port after
/// another must not keep the user answering.
pub(super) const MAX_PER_TURN: usize = 10;
/// Questions waiting on one prompt, at most (each holds a connection).
pub(super) const MAX_WAITING: usize = 16;

/// A destination, as the client named it, with the zone it resolved to
/// and, outside the public zone, the address: a name allowed for one
/// place that leads elsewhere later is asked about again.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct Dest {
    pub host: String,
    pub port: u16,
    pub zone: crate::policy::network::Zone,
    pub addr: Option<std::net::IpAddr>,
}

impl Dest {
    fn of(ask: &Ask) -> Dest {
        Dest {
            host: ask.host.to_ascii_lowercase(),
            port: ask.port,
            zone: ask.zone,
            addr: (ask.zone != crate::policy::network::Zone::Public).then_some(ask.addr),
        }
    }
}

/// An open prompt and the questions waiting on it.
#[derive(Debug)]
pub(super) struct NetPrompt {
    pub ask: Ask,
    pub session: String,
    pub waiting: Vec<oneshot::Sender<Reply>>,
}

/// What an answer means.
#[derive(Debug)]
pub(super) struct NetAnswered {
    pub prompt: NetPrompt,
    pub reply: Reply,
    /// Record it in the project's table ("always allow").
    pub record: bool,
}

/// What the user said about destinations.
#[derive(Debug, Default)]
pub(super) struct NetPermissions {
    open: HashMap<u64, NetPrompt>,
    by_dest: HashMap<Dest, u64>,
    granted: HashSet<Dest>,
    never: HashSet<Dest>,
    dismissed: HashSet<Dest>,
    /// Prompts opened this turn.
    this_turn: usize,
}

impl NetPermissions {
    /// Answers a question from what was said before, or joins the prompt
    /// open for its destination (`None` either way); hands the answer's
    /// way back when a new prompt may be opened.
    pub fn consider(
        &mut self,
        ask: &Ask,
        answer: oneshot::Sender<Reply>,
    ) -> Option<oneshot::Sender<Reply>> {
        let dest = Dest::of(ask);
        let said = if self.granted.contains(&dest) {
            Some(Reply {
                allow: true,
                remember: true,
            })
        } else if self.never.contains(&dest) {
            Some(Reply {
                allow: false,
                remember: true,
            })
        } else if self.dismissed.contains(&dest) {
            Some(Reply::NO)
        } else {
            None
        };
        if let Some(reply) = said {
            let _ = answer.send(reply);
            return None;
        }
        if let Some(p) = self.by_dest.get(&dest).and_then(|b| self.open.get_mut(b)) {
            if p.waiting.len() < MAX_WAITING {
                p.waiting.push(answer);
            } else {
                info!(
                    host = ask.host,
                    port = ask.port,
                    "a connection was refused without asking: {MAX_WAITING} are already waiting on the prompt for it"
                );
                let _ = answer.send(Reply::NO);
            }
            return None;
        }
        let full = if self.open.len() >= MAX_OPEN {
            Some(format!("{MAX_OPEN} network prompts are open"))
        } else if self.this_turn >= MAX_PER_TURN {
            Some(format!(
                "{MAX_PER_TURN} network prompts were asked this turn"
            ))
        } else {
            None
        };
        if let Some(full) = full {
            info!(
                host = ask.host,
                port = ask.port,
                "a connection was refused without asking: {full}"
            );
            let _ = answer.send(Reply::NO);
            return None;
        }
        Some(answer)
    }

    /// Closes the prompts nobody waits on any more (every asker gave up):
    /// their ids, for the bridge to withdraw at the editor. An answer to
    /// one of them later finds nothing and is dropped.
    pub fn prune(&mut self) -> Vec<u64> {
        let mut gone = Vec::new();
        for (bid, prompt) in &mut self.open {
            prompt.waiting.retain(|w| !w.is_closed());
            if prompt.waiting.is_empty() {
                gone.push(*bid);
            }
        }
        for bid in &gone {
            if let Some(prompt) = self.open.remove(bid) {
                self.by_dest.remove(&Dest::of(&prompt.ask));
            }
        }
        gone.sort_unstable();
        gone
    }

    pub fn opened(&mut self, bid: u64, prompt: NetPrompt) {
        self.this_turn += 1;
        self.by_dest.insert(Dest::of(&prompt.ask), bid);
        self.open.insert(bid, prompt);
    }

    /// The user answered prompt `bid` (`None`: dismissed or cancelled).
    pub fn answered(
        &mut self,
        bid: u64,
        choice: Option<prompts::PromptOption>,
    ) -> Option<NetAnswered> {
        let prompt = self.open.remove(&bid)?;
        let dest = Dest::of(&prompt.ask);
        self.by_dest.remove(&dest);
        let (reply, record) = match choice {
            Some(prompts::ALLOW_ONCE) => (
                Reply {
                    allow: true,
                    remember: true,
                },
                false,
            ),
            Some(prompts::ALLOW_ALWAYS) => (
                Reply {
                    allow: true,
                    remember: true,
                },
                true,
            ),
            Some(prompts::REJECT_ALWAYS) => (
                Reply {
                    allow: false,
                    remember: true,
                },
                false,
            ),
            _ => (Reply::NO, false),
        };
        match (reply.allow, reply.remember) {
            (true, _) => {
                self.granted.insert(dest);
            }
            (false, true) => {
                self.never.insert(dest);
            }
            (false, false) => {
                self.dismissed.insert(dest);
            }
        }
        Some(NetAnswered {
            prompt,
            reply,
            record,
        })
    }

    /// A new prompt from the editor: declined destinations may be asked
    /// again.
    pub fn new_turn(&mut self) {
        self.dismissed.clear();
        self.this_turn = 0;
    }
}

/// The socket the running generation's proxy asks on, while it runs.
pub(super) struct NetAsks {
    tx: mpsc::UnboundedSender<Question>,
    rx: mpsc::UnboundedReceiver<Question>,
    serving: Option<tokio::task::JoinHandle<()>>,
}

impl NetAsks {
    pub fn new() -> NetAsks {
        let (tx, rx) = mpsc::unbounded_channel();
        NetAsks {
            tx,
            rx,
            serving: None,
        }
    }

    /// Listens on the abstract socket `name` until [`NetAsks::stop`].
    pub fn listen(&mut self, name: String) {
        self.stop();
        match crate::network::asks::listen(&name) {
            Ok(listener) => {
                let tx = self.tx.clone();
                self.serving = Some(tokio::spawn(crate::network::asks::serve(listener, tx)));
            }
            Err(e) => warn!(
                "cannot listen for the proxy's questions ({e}): refused connections are not put to the user"
            ),
        }
    }

    /// Takes the questions of a proxy running in this process
    /// (`network::outside`) until [`NetAsks::stop`].
    pub fn take(&mut self, mut questions: mpsc::UnboundedReceiver<Question>) {
        self.stop();
        let tx = self.tx.clone();
        self.serving = Some(tokio::spawn(async move {
            while let Some(question) = questions.recv().await {
                if tx.send(question).is_err() {
                    return;
                }
            }
        }));
    }

    pub fn stop(&mut self) {
        if let Some(task) = self.serving.take() {
            task.abort();
        }
    }

    /// The next question (never, while nothing listens).
    pub async fn next(&mut self) -> Question {
        // The bridge holds a sender: the channel never closes.
        self.rx.recv().await.expect("the bridge holds a sender")
    }
}

impl Bridge {
    /// From the running generation's proxy: a connection the table
    /// refused (answered from what the user said, or put to them), or an
    /// asker that gave up.
    pub(super) fn on_network_ask(&mut self, question: Question) {
        // Prompts nobody waits on are withdrawn first: they would count
        // against the few open at once.
        self.withdraw_abandoned_prompts();
        let Question::Asked(ask, answer) = question else {
            return;
        };
        let Some(answer) = self.asks.net.consider(&ask, answer) else {
            return;
        };
        let Some(session) = self.routes.latest_turn().map(str::to_owned) else {
            debug!(
                host = ask.host,
                port = ask.port,
                "a connection refused outside any turn: not offered"
            );
            let _ = answer.send(Reply::NO);
            return;
        };
        let bid = self.alloc_id();
        self.editor.announcements += 1;
        // The address as well as the name: the name is the agent's to choose.
        let dest = authority(&ask.host, ask.port);
        let title = if ask.host == ask.addr.to_string() || ask.addr.is_unspecified() {
            format!("Allow the agent to connect to {dest}?")
        } else {
            format!("Allow the agent to connect to {dest} ({})?", ask.addr)
        };
        let text = format!(
            "The sandbox refused a connection to {}{}: {}. Allow once holds until zcode-acp exits; Always allow records it in the project's sandbox.json.",
            ask.zone.name(),
            if ask.addr.is_unspecified() {
                " (not resolved: the name is outside the egress list)".to_owned()
            } else {
                format!(" ({})", ask.addr)
            },
            ask.why
        );
        let params = prompts::connection_request(
            &session,
            format!("zcode-acp-network-{}", self.editor.announcements),
            title,
            text,
        );
        info!(
            host = ask.host,
            port = ask.port,
            session,
            "asking the user whether the agent may connect"
        );
        self.routes.expect_from_editor(bid, AtEditor::NetPrompt);
        self.asks.net.opened(
            bid,
            NetPrompt {
                ask,
                session,
                waiting: vec![answer],
            },
        );
        self.to_editor(request(bid, "session/request_permission", &params));
    }

    /// Withdraws from the editor the network prompts whose askers all
    /// gave up.
    fn withdraw_abandoned_prompts(&mut self) {
        for bid in self.asks.net.prune() {
            info!(
                request = bid,
                "a network prompt is withdrawn: the connection it asked about is no longer waiting"
            );
            self.to_editor(crate::relay::envelope::notification(
                "$/cancel_request",
                &serde_json::json!({ "requestId": bid }).to_string(),
            ));
        }
    }

    /// The user answered a network prompt.
    pub(super) fn on_net_prompt_answer(&mut self, bid: u64, frame: &Frame) {
        let choice = prompts::chosen(frame, prompts::ALLOW_FLOW);
        let Some(answered) = self.asks.net.answered(bid, choice) else {
            return;
        };
        let NetAnswered {
            prompt,
            reply,
            record,
        } = answered;
        info!(
            host = prompt.ask.host,
            port = prompt.ask.port,
            allowed = reply.allow,
            "the user answered a network prompt"
        );
        for waiting in prompt.waiting {
            let _ = waiting.send(reply);
        }
        if !record {
            return;
        }
        let ask = &prompt.ask;
        let what = authority(&ask.host, ask.port);
        let table = NetworkTable::opening(&ask.host, ask.port, ask.addr, ask.zone);
        let root = self
            .sessions
            .table
            .get(&prompt.session)
            .and_then(|s| crate::policy::resolve_real(&s.cwd).ok());
        match (table, root) {
            (Ok(table), Some(root)) => {
                self.disk
                    .record_network(&self.cfg.managed, root, table, prompt.session, what)
            }
            (Err(why), _) => self.after_network_record(
                &prompt.session,
                &what,
                false,
                Err(super::disk::DiskError::NotATableEntry(why)),
            ),
            (_, None) => self.after_network_record(
                &prompt.session,
                &what,
                false,
                Err(super::disk::DiskError::WorkspaceGone),
            ),
        }
    }

    /// An "always allow" is on disk, or could not be recorded: the grant
    /// then holds for this bridge only, and the user is told.
    pub(super) fn after_network_record(
        &mut self,
        session: &str,
        what: &str,
        mirrored: bool,
        result: Result<(), super::disk::DiskError>,
    ) {
        if result.is_ok() && mirrored {
            // A host port is reached directly (not only through the proxy)
            // once the sandbox is re-armed with it mirrored, which reads
            // the table just recorded.
            let text = format!("The agent may connect to {what} through the sandbox's proxy now, and directly from its next prompt: the sandbox is re-armed when the current turn ends.");
            self.announce_to(session, "Sandbox: connection allowed".into(), text);
            self.request_restart(&format!("you allowed connections to {what}"));
        }
        if let Err(why) = result {
            let text = format!(
                "zcode-acp could not record the connection to {what} in the project's sandbox.json ({why}), so it is allowed only until zcode-acp exits."
            );
            self.announce_to(
                session,
                "Sandbox: connection allowed for this session only".into(),
                text,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::network::Zone;

    fn ask(host: &str, port: u16) -> Ask {
        Ask {
            host: host.into(),
            port,
            addr: "127.0.0.1".parse().unwrap(),
            zone: Zone::HostLoopback,
            why: "refused".into(),
        }
    }

    fn prompt(a: Ask, waiting: Vec<oneshot::Sender<Reply>>) -> NetPrompt {
        NetPrompt {
            ask: a,
            session: "s".into(),
            waiting,
        }
    }

    #[test]
    fn one_prompt_per_destination_and_its_questions_get_one_answer() {
        let mut p = NetPermissions::default();
        let (tx1, mut rx1) = oneshot::channel();
        let first = p.consider(&ask("localhost", 8888), tx1).unwrap();
        p.opened(1, prompt(ask("localhost", 8888), vec![first]));
        let (tx2, mut rx2) = oneshot::channel();
        // Same destination, whatever the case: joins the open prompt.
        assert!(p.consider(&ask("LOCALHOST", 8888), tx2).is_none());
        let a = p.answered(1, Some(prompts::ALLOW_ONCE)).unwrap();
        assert!(a.reply.allow && !a.record);
        for w in a.prompt.waiting {
            w.send(a.reply).unwrap();
        }
        assert!(rx1.try_recv().unwrap().allow && rx2.try_recv().unwrap().allow);
        // Granted: answered at once, and the proxy may remember it.
        let (tx3, mut rx3) = oneshot::channel();
        assert!(p.consider(&ask("localhost", 8888), tx3).is_none());
        assert_eq!(
            rx3.try_recv().unwrap(),
            Reply {
                allow: true,
                remember: true
            }
        );
        assert!(
            p.answered(1, Some(prompts::ALLOW_ONCE)).is_none(),
            "answered once"
        );
    }

    #[test]
    fn each_answer_does_what_it_says_and_prompts_are_few() {
        let mut p = NetPermissions::default();
        for (bid, port) in [(1, 1), (2, 2), (3, 3)] {
            let (tx, _rx) = oneshot::channel();
            let t = p.consider(&ask("h", port), tx).unwrap();
            p.opened(bid, prompt(ask("h", port), vec![t]));
        }
        // A fourth destination while three are open: refused unasked.
        let (tx, mut rx) = oneshot::channel();
        assert!(p.consider(&ask("h", 4), tx).is_none());
        assert_eq!(rx.try_recv().unwrap(), Reply::NO);
        assert!(p.answered(1, Some(prompts::ALLOW_ALWAYS)).unwrap().record);
        let never = p.answered(2, Some(prompts::REJECT_ALWAYS)).unwrap();
        assert_eq!(
            never.reply,
            Reply {
                allow: false,
                remember: true
            }
        );
        let once = p.answered(3, Some(prompts::REJECT_ONCE)).unwrap();
        assert_eq!(once.reply, Reply::NO);
        // Declined this turn: not asked again until the next one.
        let (tx, mut rx) = oneshot::channel();
        assert!(p.consider(&ask("h", 3), tx).is_none());
        assert_eq!(rx.try_recv().unwrap(), Reply::NO);
        p.new_turn();
        let (tx, _rx) = oneshot::channel();
        assert!(p.consider(&ask("h", 3), tx).is_some());
        let (tx, mut rx) = oneshot::channel();
        assert!(p.consider(&ask("h", 2), tx).is_none());
        assert_eq!(
            rx.try_recv().unwrap(),
            Reply {
                allow: false,
                remember: true
            }
        );
        // A cancelled prompt allows nothing.
        let (tx, _rx) = oneshot::channel();
        let t = p.consider(&ask("h", 9), tx).unwrap();
        p.opened(9, prompt(ask("h", 9), vec![t]));
        assert!(!p.answered(9, None).unwrap().reply.allow);
    }

    #[test]
    fn prompts_nobody_waits_on_are_closed_and_make_room() {
        let mut p = NetPermissions::default();
        let mut askers = Vec::new();
        for (bid, port) in [(1, 1), (2, 2), (3, 3)] {
            let (tx, rx) = oneshot::channel();
            let t = p.consider(&ask("h", port), tx).unwrap();
            p.opened(bid, prompt(ask("h", port), vec![t]));
            askers.push(rx);
        }
        // A second question on prompt 2, which stays while it waits.
        let (tx, second) = oneshot::channel();
        assert!(p.consider(&ask("h", 2), tx).is_none());
        assert_eq!(p.prune(), Vec::<u64>::new(), "everyone still waits");
        // Every asker gives up (the proxy stopped waiting).
        drop(askers);
        assert_eq!(p.prune(), vec![1, 3]);
        // Three were open: a new destination is asked about again.
        let (tx, _rx) = oneshot::channel();
        let t = p.consider(&ask("h", 4), tx).expect("room for a prompt");
        p.opened(4, prompt(ask("h", 4), vec![t]));
        // A withdrawn prompt's late answer does nothing; a question for
        // its destination opens a prompt of its own.
        assert!(p.answered(1, Some(prompts::ALLOW_ONCE)).is_none());
        let (tx, _rx) = oneshot::channel();
        assert!(p.consider(&ask("h", 1), tx).is_some());
        // Prompt 2 stayed while its second asker waited; it goes with it.
        drop(second);
        assert_eq!(p.prune(), vec![2]);
        assert!(p.answered(2, Some(prompts::ALLOW_ONCE)).is_none());
    }
}
