//! The credentials of a proxy whose port any local program can reach
//! (macOS: the host's loopback, see `network::outside`): HTTP's
//! `Proxy-Authorization: Basic` and SOCKS5's user name and password carry
//! the same user and a token drawn for each arming, which only the
//! sandbox's commands are given.

/// The user name in the proxy's credentials (see `proxy::Judge::token`).
pub const CLIENT: &str = "zcode";

/// Whether `given` is `token`, in a time that does not depend on where
/// they differ.
pub fn same_secret(given: &[u8], token: &[u8]) -> bool {
    given.len() == token.len() && given.iter().zip(token).fold(0u8, |d, (a, b)| d | (a ^ b)) == 0
}

/// Whether the request's headers carry `Proxy-Authorization: Basic` for
/// [`CLIENT`] and `token`.
pub fn authorized<'a>(headers: impl Iterator<Item = &'a str>, token: &str) -> bool {
    use base64::Engine;
    let expected = base64::engine::general_purpose::STANDARD.encode(format!("{CLIENT}:{token}"));
    headers
        .filter_map(|l| l.split_once(':'))
        .filter(|(name, _)| name.trim().eq_ignore_ascii_case("proxy-authorization"))
        .any(|(_, value)| {
            let mut parts = value.split_whitespace();
            parts
                .next()
                .is_some_and(|s| s.eq_ignore_ascii_case("basic"))
                && parts
                    .next()
                    .is_some_and(|c| same_secret(c.as_bytes(), expected.as_bytes()))
        })
}
