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

/// The host of a base URL (`https://llm.example.com:8443/v1` is
/// `llm.example.com`); none for what is not one.
pub fn url_host(url: &str) -> Option<String> {
    let rest = url.trim().split_once("://").map_or(url.trim(), |(_, r)| r);
    let authority = rest.split(['/', '?', '#']).next()?;
    let hostport = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let host = if let Some(v6) = hostport.strip_prefix('[') {
        v6.split_once(']')?.0
    } else {
        hostport.split(':').next()?
    };
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    let plausible = !host.is_empty()
        && host.len() <= crate::config::network::MAX_HOST_LEN
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-.:_".contains(&b));
    plausible.then_some(host)
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
            if let Some(h) = env.var(var).as_deref().and_then(url_host) {
                add(h);
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
    fn a_base_url_gives_its_host() {
        for (url, host) in [
            ("https://llm.example.com:8443/v1", Some("llm.example.com")),
            (
                "http://user:pw@Proxy.Example.com/",
                Some("proxy.example.com"),
            ),
            ("https://[2001:db8::1]:443/x", Some("2001:db8::1")),
            ("llm.example.com", Some("llm.example.com")),
            ("http://127.0.0.1:11434", Some("127.0.0.1")),
            ("https:///nothing", None),
            ("http://bad host/", None),
        ] {
            assert_eq!(url_host(url).as_deref(), host, "{url}");
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
