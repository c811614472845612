//! The network layer: the proxy that is a sandbox's one way out (its
//! decisions are `policy::network`'s; Linux's namespace setup is
//! `linux::net`).

pub mod asks;
pub mod ledger;
pub mod proxy;
pub mod sni;
mod tunnel;

/// After a failed accept (out of descriptors, mostly): a pause, so a loop
/// of accepts does not spin while the connections holding them are open.
pub(crate) async fn pause_after_failed_accept(what: &str, e: std::io::Error) {
    tracing::debug!("{what}: {e}");
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
}
