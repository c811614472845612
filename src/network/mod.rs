//! The network layer: the proxy that is a sandbox's one way out (its
//! decisions are `policy::network`'s; Linux's namespace setup is
//! `linux::net`).

pub mod asks;
pub mod credentials;
pub mod ledger;
pub mod outside;
pub mod proxy;
pub mod sni;
mod tunnel;

/// The variables that point a command at the proxy.
pub const PROXY_VARS: [&str; 8] = [
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "http_proxy",
    "https_proxy",
    "ALL_PROXY",
    "all_proxy",
    "NO_PROXY",
    "no_proxy",
];

/// The environment that points a command at the proxy on `port` of its
/// loopback (with `token`, its credentials: see `proxy::Judge::token`),
/// with the loopback itself left direct.
pub fn proxy_env(port: u16, token: Option<&str>) -> Vec<(String, String)> {
    // ALL_PROXY too names the HTTP proxy, not SOCKS (which the same port
    // also speaks): some clients refuse a scheme they were built without.
    let user = token.map_or(String::new(), |t| format!("{}:{t}@", credentials::CLIENT));
    let http = format!("http://{user}127.0.0.1:{port}");
    let direct = "localhost,127.0.0.1,::1".to_owned();
    let values = [&http, &http, &http, &http, &http, &http, &direct, &direct];
    PROXY_VARS
        .iter()
        .zip(values)
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect()
}

/// After a failed accept (out of descriptors, mostly): a pause, so a loop
/// of accepts does not spin while the connections holding them are open.
pub(crate) async fn pause_after_failed_accept(what: &str, e: std::io::Error) {
    tracing::debug!("{what}: {e}");
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
}
