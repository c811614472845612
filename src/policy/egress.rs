//! The hosts a sandbox reaches without a question while its egress is
//! the default (a list, everything else asked): the running agent's own
//! API and sign-in hosts, the host of any base-URL variable set for it,
//! and a short, named list of the package registries and source hosts
//! developers fetch from. Everything else the agent reads could be sent
//! anywhere else; so anywhere else is the user's call.
//!
//! Pure: the agents come from `agents`, the environment from `env`.

use super::agents::Profile;
use super::env::Env;

/// A host reachable without a question, and why it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Listed {
    /// A host pattern as the egress list writes it (`*.example.com` is
    /// the domain and its subdomains).
    pub host: &'static str,
    pub why: &'static str,
}

const fn listed(host: &'static str, why: &'static str) -> Listed {
    Listed { host, why }
}

/// The registries and source hosts a build or an install fetches from.
/// GitHub's API (`api.github.com`) is not among them: it takes uploads (a
/// gist) with any token the agent holds; it is asked.
pub const REGISTRIES: &[Listed] = &[
    listed(
        "registry.npmjs.org",
        "npm's registry (npm, pnpm, yarn, bun)",
    ),
    listed("registry.yarnpkg.com", "yarn's mirror of npm's registry"),
    listed("pypi.org", "PyPI's index (pip, uv, poetry)"),
    listed("files.pythonhosted.org", "PyPI's file host"),
    listed("crates.io", "crates.io (cargo)"),
    listed("index.crates.io", "crates.io's sparse index"),
    listed("static.crates.io", "crates.io's downloads"),
    listed("proxy.golang.org", "Go's module proxy"),
    listed("sum.golang.org", "Go's checksum database"),
    listed(
        "github.com",
        "GitHub: git clone and fetch, release downloads",
    ),
    listed(
        "codeload.github.com",
        "GitHub's archives (npm's git dependencies)",
    ),
    listed(
        "objects.githubusercontent.com",
        "GitHub's release and LFS downloads",
    ),
    listed(
        "release-assets.githubusercontent.com",
        "GitHub's release downloads",
    ),
    listed("raw.githubusercontent.com", "files of GitHub repositories"),
    listed("gitlab.com", "GitLab: git clone and fetch, releases"),
];

/// The hosts `profile`'s agent needs to work: its model API and sign-in.
pub fn agent_hosts(profile: Profile) -> Vec<&'static str> {
    let agent = profile.agent();
    agent
        .api_hosts
        .iter()
        .chain(agent.sign_in_hosts)
        .copied()
        .collect()
}

/// The host and port of a base URL (`https://llm.example.com:8443/v1` is
/// `llm.example.com` and 8443; without a port, the scheme's: 80 for
/// `http`, else 443); none for what is not one.
pub fn url_host(url: &str) -> Option<(String, u16)> {
    let url = url.trim();
    let (scheme, rest) = url.split_once("://").unwrap_or(("https", url));
    let authority = rest.split(['/', '?', '#']).next()?;
    let hostport = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let (host, port) = if let Some(v6) = hostport.strip_prefix('[') {
        let (host, after) = v6.split_once(']')?;
        (host, after.strip_prefix(':'))
    } else {
        match hostport.split_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (hostport, None),
        }
    };
    let port = match port {
        Some(p) => p.parse().ok()?,
        None if scheme.eq_ignore_ascii_case("http") => 80,
        None => 443,
    };
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    let plausible = !host.is_empty()
        && host.len() <= crate::config::network::MAX_HOST_LEN
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-.:_".contains(&b));
    plausible.then_some((host, port))
}

pub use super::network::{entry, entry_parts};

/// Of a sandbox's `listed` hosts ([`reachable`]), the agent's own: what
/// is not a registry.
pub fn own_hosts(listed: &[String]) -> Vec<String> {
    listed
        .iter()
        .filter(|h| !REGISTRIES.iter().any(|r| r.host == h.as_str()))
        .cloned()
        .collect()
}

/// Everything reachable without a question for a sandbox running the
/// agents of `profiles`: their hosts, the hosts of their base-URL
/// variables in `env`, and the registries. Each once, in that order.
pub fn reachable(profiles: &[Profile], env: &dyn Env) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut add = |h: String| {
        if !out.contains(&h) {
            out.push(h);
        }
    };
    for p in profiles {
        for h in agent_hosts(*p) {
            add(h.to_owned());
        }
        for var in p.agent().base_url_env {
            if let Some((host, port)) = env.var(var).as_deref().and_then(url_host) {
                add(entry(&host, port));
            }
        }
    }
    for r in REGISTRIES {
        add(r.host.to_owned());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn a_base_url_gives_its_host_and_port() {
        for (url, want) in [
            (
                "https://llm.example.com:8443/v1",
                Some(("llm.example.com", 8443)),
            ),
            (
                "http://user:pw@Proxy.Example.com/",
                Some(("proxy.example.com", 80)),
            ),
            ("https://[2001:db8::1]:443/x", Some(("2001:db8::1", 443))),
            ("llm.example.com", Some(("llm.example.com", 443))),
            ("http://127.0.0.1:11434", Some(("127.0.0.1", 11434))),
            ("https:///nothing", None),
            ("http://bad host/", None),
            ("https://a.example:99999/", None),
        ] {
            let got = url_host(url);
            assert_eq!(got.as_ref().map(|(h, p)| (h.as_str(), *p)), want, "{url}");
        }
        for (host, port) in [
            ("a.example", 443),
            ("a.example", 8080),
            ("2001:db8::1", 8443),
            ("2001:db8::1", 443),
        ] {
            assert_eq!(entry_parts(&entry(host, port)), (host, port));
        }
    }

    #[test]
    fn the_agent_its_base_url_and_the_registries_are_reachable() {
        let env: HashMap<String, String> = [(
            "ANTHROPIC_BASE_URL".to_owned(),
            "https://gateway.corp.example/anthropic".to_owned(),
        )]
        .into();
        let hosts = reachable(&[Profile::Claude], &env);
        for h in [
            "api.anthropic.com",
            "gateway.corp.example",
            "pypi.org",
            "github.com",
        ] {
            assert!(hosts.iter().any(|x| x == h), "{h}: {hosts:?}");
        }
        // Another agent's API is not.
        assert!(!hosts.iter().any(|x| x == "api.openai.com"), "{hosts:?}");
        assert!(!hosts.iter().any(|x| x == "api.github.com"), "{hosts:?}");
        // No agent: the registries only.
        assert_eq!(reachable(&[], &env).len(), REGISTRIES.len());
    }
}
