//! What left, turn by turn: the generation's proxy counts what each
//! connection carried (`network::ledger`), the bridge reads the counts as
//! they come and, when a turn ends, tells the user in the editor what went
//! anywhere other than the agent's own API.

use tokio::io::unix::AsyncFd;

use super::Bridge;
use crate::network::ledger::{Ledger, Source};

/// The running generation's counts, and the turn's so far.
#[derive(Default)]
pub(super) struct TurnLedger {
    source: Option<AsyncFd<Source>>,
    ledger: Ledger,
}

impl TurnLedger {
    /// Listens where a new generation's proxy counts (what the last one
    /// counted is kept for the turn).
    pub fn listen(&mut self, name: &str) {
        self.count(Source::bind(name));
    }

    /// Reads `source` from now on (what the last one counted is kept for
    /// the turn).
    pub fn count(&mut self, source: std::io::Result<Source>) {
        self.take_in();
        let registered = source.and_then(|source| {
            // SAFETY: the descriptor registered is the socket the Source
            // owns, which the AsyncFd holds for as long as it is
            // registered (its drop deregisters before the Source closes it).
            unsafe { AsyncFd::register_with_interest(source, tokio::io::Interest::READABLE) }
                .map_err(|e| e.into_parts().1)
        });
        self.source = match registered {
            Ok(source) => Some(source),
            Err(e) => {
                tracing::warn!("what the agent sends over the network is not counted this generation: cannot listen for its proxy's counts ({e})");
                None
            }
        };
    }

    /// Waits until counts are queued (never, without a proxy).
    pub async fn ready(&self) {
        match &self.source {
            Some(source) => match source.readable().await {
                // Cleared before the read that follows: what comes after
                // it wakes this again.
                Ok(mut guard) => guard.clear_ready(),
                Err(_) => std::future::pending().await,
            },
            None => std::future::pending().await,
        }
    }

    /// Adds what is queued to the turn's counts.
    pub fn take_in(&mut self) {
        if let Some(source) = &self.source {
            for r in source.get_ref().drain() {
                self.ledger.add(&r);
            }
        }
    }

    /// The turn's counts, read to the last queued; the next turn starts
    /// from nothing.
    fn take_turn(&mut self) -> Ledger {
        self.take_in();
        std::mem::take(&mut self.ledger)
    }
}

impl Bridge {
    /// Counts the proxy queued.
    pub(super) fn on_ledger(&mut self) {
        self.asks.ledger.take_in();
    }

    /// At a turn's end: what it sent anywhere but the agent's own API and
    /// sign-in hosts, in one notice on `session`.
    pub(super) fn say_what_left(&mut self, session: &str) {
        let ledger = self.asks.ledger.take_turn();
        if ledger.is_empty() {
            return;
        }
        let own = match &self.confinement {
            crate::confine::Confinement::Armed(armed) => {
                crate::policy::egress::own_hosts(&armed.policy.network.listed)
            }
            _ => Vec::new(),
        };
        let Some((title, lines)) = ledger.summary(&own, "this turn") else {
            return;
        };
        tracing::info!("{title}");
        let text = format!(
            "What went out through the sandbox's proxy this turn, beyond the agent's own API (counts only; nothing of what was sent is kept):\n- {}",
            lines.join("\n- ")
        );
        self.announce_to(session, format!("Network: {title}"), text);
    }
}
