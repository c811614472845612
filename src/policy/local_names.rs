//! Names only this machine or its own network answer for, which the
//! sandbox's proxy may resolve before it knows whether they may be
//! reached.
//!
//! Resolving a name carries it to whoever serves its domain, and a name
//! can carry what the agent read (`SECRET.attacker.example`). Where the
//! LAN or a port of this machine is open, only a name's address says
//! whether it may be reached, so it must be resolved first; that is safe
//! only for a name no server on the internet can be made to answer for: a
//! single label, a name under a top-level domain nobody can register,
//! a name in `/etc/hosts`, or one under a search domain of
//! `/etc/resolv.conf` (its own network's). Every other name outside the
//! egress list is put to the user before it is resolved.
//!
//! What this does not know: a search domain that is a public suffix
//! (`co.uk`, set by a DHCP server or a VPN) makes every name under it
//! local; and a single label or a `.local` name is asked of the whole LAN
//! (LLMNR, mDNS), where a host of the attacker's could hear it.

use std::collections::HashSet;

/// Top-level domains nobody can register in the public DNS: reserved
/// (RFC 2606, 6761, 6762), set aside for private use (`internal`,
/// `home.arpa`), or long used privately and never delegated.
const PRIVATE_TOP_LEVEL: &[&str] = &[
    "corp",
    "home",
    "intranet",
    "internal",
    "invalid",
    "lan",
    "local",
    "localdomain",
    "localhost",
    "private",
    "test",
];

/// The local names of this machine, read from its resolver's files.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LocalNames {
    /// `/etc/resolv.conf`'s `search` and `domain` entries of two labels
    /// or more (one label, `com`, would make every name local).
    search: Vec<String>,
    /// The names `/etc/hosts` gives an address.
    hosts: HashSet<String>,
}

impl LocalNames {
    /// Read from `/etc/resolv.conf` and `/etc/hosts`; a file that cannot
    /// be read adds nothing (fewer names are local: more are asked).
    pub fn read() -> LocalNames {
        let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
        LocalNames::parse(&read("/etc/resolv.conf"), &read("/etc/hosts"))
    }

    pub fn parse(resolv_conf: &str, hosts: &str) -> LocalNames {
        let search = resolv_conf
            .lines()
            .filter_map(|l| {
                let mut words = l.split_whitespace();
                match words.next()? {
                    "search" | "domain" => Some(words.map(normal).collect::<Vec<_>>()),
                    _ => None,
                }
            })
            .flatten()
            .filter(|d| d.contains('.'))
            .collect();
        let hosts = hosts
            .lines()
            .map(|l| l.split('#').next().unwrap_or(""))
            .flat_map(|l| l.split_whitespace().skip(1))
            .map(normal)
            .collect();
        LocalNames { search, hosts }
    }

    /// Whether `name` is answered only by this machine or its network.
    /// Only a name of plain letters, digits, `-`, `_` and dots can be: a
    /// resolver may map other characters to dots (`。`, U+3002, is one
    /// under IDNA), turning what looks like a single label into
    /// `secret.attacker.example`.
    pub fn is_local(&self, name: &str) -> bool {
        let name = normal(name);
        if name.is_empty()
            || !name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        {
            return false;
        }
        let under = |domain: &str| {
            name == domain
                || name
                    .strip_suffix(domain)
                    .is_some_and(|rest| rest.ends_with('.'))
        };
        !name.contains('.')
            || PRIVATE_TOP_LEVEL.iter().any(|tld| under(tld))
            || under("home.arpa")
            || self.hosts.contains(&name)
            || self.search.iter().any(|d| under(d))
    }
}

/// A name as the resolver compares it: lower case, without the root's dot.
fn normal(name: &str) -> String {
    name.trim_end_matches('.').to_ascii_lowercase()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_names_no_internet_server_answers_for_are_local() {
        let local = LocalNames::parse(
            "nameserver 10.0.0.53\nsearch corp.example.com com\ndomain Lab.Example.org.\n",
            "127.0.0.1 localhost\n10.0.0.9 nas nas.home.example # the NAS\n# 1.2.3.4 commented.example\n",
        );
        for name in [
            "printer",
            "nas.local",
            "NAS.LOCAL.",
            "router.lan",
            "db.internal",
            "box.home.arpa",
            "localhost",
            "nas.home.example",
            "build.corp.example.com",
            "ci.lab.example.org",
        ] {
            assert!(local.is_local(name), "{name}");
        }
        for name in [
            "secret.attacker.example",
            "attacker.com",
            // A one-label search entry makes no name local.
            "secret.com",
            "commented.example",
            "evil-corp.example.com",
            "local.attacker.example",
            "lan.evil.example",
            "",
            ".",
            // Dots a resolver's IDNA maps to `.`.
            "secret\u{3002}attacker\u{3002}example",
            "secret\u{ff0e}attacker\u{ff0e}example",
            "secret\u{ff61}attacker",
            "printer%2eattacker",
        ] {
            assert!(!local.is_local(name), "{name}");
        }
    }
}
