//! The network table: which destinations a sandboxed process may reach,
//! one decision for both platforms (Linux enforces it in its proxy,
//! Seatbelt the part its profile can express).
//!
//! Three zones, judged on the address a connection would really go to
//! (after name resolution, so a name that resolves to the LAN is LAN):
//! - **host loopback**: 127.0.0.0/8, ::1, the unspecified addresses, and
//!   every address of this machine's own interfaces (a service bound to
//!   0.0.0.0 answers on all of them): the user's Jupyter, code-server,
//!   databases, Docker on TCP;
//! - **LAN**: private, shared, link-local and unique-local ranges, and
//!   the subnets of this machine's own links whatever their range (a
//!   network in public address space; the global IPv6 addresses of the
//!   hosts beside this one, which a LAN host's name resolves to as well);
//! - **public**: everything else.
//!
//! Defaults: host loopback and LAN denied, public egress allowed, and the
//! resolvers of `/etc/resolv.conf` reachable on port 53 whatever their
//! range while egress is allowed (with an egress list they are not: a
//! resolver answers for any name, which would let through what the list
//! keeps out).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use serde::{Deserialize, Serialize};
use serde_json::Value;

// The table as the config files write it is config's (plain values, read
// and written there); what it lets through is decided here.
use crate::config::network::{parse_egress, union_egress, union_loopback, within_limits};
pub use crate::config::network::{
    Egress, HostLoopback, Lan, NetworkTable, MAX_HOSTS, MAX_HOST_LEN, MAX_PORTS, PROXY_PORT,
};

/// The table, as the user config and sandbox.json write it:
/// `"network": {"hostLoopback": "deny" | "allow" | [ports], "lan": "deny"
/// | "allow", "egress": "allow" | [host patterns]}`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct NetworkPolicy {
    pub host_loopback: HostLoopback,
    pub lan: Lan,
    pub egress: Egress,
    /// Unix sockets zcode-acp itself serves to this sandbox (a run's tools
    /// socket; the directory of the bridge's editor sockets, all beneath
    /// it), which judge every request they take: reachable although they
    /// are bound before the sandbox is armed. Never from a config.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub served_sockets: Vec<std::path::PathBuf>,
}

/// Where an address is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Zone {
    HostLoopback,
    Lan,
    Public,
}

impl Zone {
    pub fn name(self) -> &'static str {
        match self {
            Zone::HostLoopback => "the host's loopback or own address",
            Zone::Lan => "the local network",
            Zone::Public => "the internet",
        }
    }
}

/// An address of one of this machine's interfaces, with the length of its
/// subnet's prefix: the hosts on that link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OwnAddress {
    pub addr: IpAddr,
    pub prefix: u8,
}

impl OwnAddress {
    /// Whether `addr` (canonical) is in this address's subnet. A prefix
    /// of 0 (the whole address space) counts as none.
    fn on_link(&self, addr: IpAddr) -> bool {
        match (canonical(self.addr), addr) {
            (IpAddr::V4(own), IpAddr::V4(a)) if (1..=32).contains(&self.prefix) => {
                let mask = u32::MAX << (32 - self.prefix);
                u32::from(own) & mask == u32::from(a) & mask
            }
            (IpAddr::V6(own), IpAddr::V6(a)) if (1..=128).contains(&self.prefix) => {
                let mask = u128::MAX << (128 - self.prefix);
                u128::from(own) & mask == u128::from(a) & mask
            }
            _ => false,
        }
    }
}

/// A destination judged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Allow,
    Deny { zone: Zone, why: String },
}

impl NetworkPolicy {
    /// Reads the user's table (what it names replaces the default);
    /// `Err` says what is wrong in the user's terms.
    pub fn parse(value: &Value) -> Result<NetworkPolicy, String> {
        let table = NetworkTable::parse(value)?;
        let default = NetworkPolicy::default();
        Ok(NetworkPolicy {
            host_loopback: table.host_loopback.unwrap_or(default.host_loopback),
            lan: table.lan.unwrap_or(default.lan),
            egress: table.egress.unwrap_or(default.egress),
            served_sockets: Vec::new(),
        })
    }

    /// Nothing reachable: what a table that cannot be read stands for.
    pub fn closed() -> NetworkPolicy {
        NetworkPolicy {
            egress: Egress::Hosts(Vec::new()),
            ..NetworkPolicy::default()
        }
    }

    /// Whether the sandbox keeps a network of its own: not when the whole
    /// host loopback is allowed (it is then the host's network).
    pub fn confines(&self) -> bool {
        self.host_loopback != HostLoopback::Allow
    }

    /// The host loopback ports reachable from inside, mirrored onto the
    /// sandbox's own loopback (Linux).
    pub fn mirrored_ports(&self) -> Vec<u16> {
        self.host_loopback.ports()
    }

    /// This table widened by what a project's `table` names (each
    /// root's approved table adds to the user's; what it does not name
    /// changes nothing).
    pub fn widened_by(mut self, table: &NetworkTable) -> NetworkPolicy {
        if let Some(theirs) = &table.host_loopback {
            self.host_loopback = union_loopback(self.host_loopback, theirs);
        }
        if table.lan == Some(Lan::Allow) {
            self.lan = Lan::Allow;
        }
        if let Some(theirs) = &table.egress {
            self.egress = union_egress(self.egress, theirs);
        }
        self
    }

    /// Judges a connection to `addr`, asked for as `host` (a name, or the
    /// address itself), port `port`. `own`: this machine's interface
    /// addresses and their subnets; `resolvers`: the name servers it uses.
    pub fn decide(
        &self,
        host: &str,
        port: u16,
        addr: IpAddr,
        own: &[OwnAddress],
        resolvers: &[IpAddr],
    ) -> Verdict {
        let zone = zone(addr, own);
        // The name servers, on port 53 only, whatever their zone (a stub
        // resolver on 127.0.0.53, one on the LAN), but only while egress
        // is allowed: a resolver looks up any name it is asked (DNS over
        // TCP through the proxy), so with an egress list it would resolve,
        // and carry out, the names the list keeps from being resolved.
        if port == 53 && self.egress == Egress::Allow && resolvers.contains(&canonical(addr)) {
            return Verdict::Allow;
        }
        let allowed = match zone {
            Zone::HostLoopback => match &self.host_loopback {
                HostLoopback::Allow => true,
                HostLoopback::Ports(ports) => is_loopback(addr) && ports.contains(&port),
                HostLoopback::Deny => false,
            },
            Zone::Lan => self.lan == Lan::Allow,
            Zone::Public => match &self.egress {
                Egress::Allow => true,
                Egress::Hosts(patterns) => patterns.iter().any(|p| host_matches(p, host)),
            },
        };
        if allowed {
            return Verdict::Allow;
        }
        let resolver = port == 53 && resolvers.contains(&canonical(addr));
        let dest = authority(host, port);
        let why = match zone {
            _ if resolver => format!(
                "{dest} is a name server of this machine, which is not reachable with an egress list (it would look up any name, those outside the list too); the proxy resolves the listed hosts itself: connect to them by name through it"
            ),
            Zone::HostLoopback if !is_loopback(addr) => format!(
                "{dest} is this machine's own address ({addr}); the sandbox reaches this machine only through its loopback: add \"network\": {{\"hostLoopback\": [{port}]}} to the user config and connect to 127.0.0.1:{port}"
            ),
            Zone::HostLoopback => format!(
                "{dest} is on this machine ({addr}); to let the agent reach it, add \"network\": {{\"hostLoopback\": [{port}]}} to the user config"
            ),
            Zone::Lan => format!(
                "{dest} ({addr}) is on the local network; to let the agent reach it, add \"network\": {{\"lan\": \"allow\"}} to the user config"
            ),
            Zone::Public => format!(
                "{host} is not in the egress list; to let the agent reach it, add \"{host}\" to \"network\": {{\"egress\": [...]}} in the user config"
            ),
        };
        Verdict::Deny { zone, why }
    }

    /// Whether a connection to `host` (a name) is refused whatever it
    /// resolves to: a name outside an egress list, where neither the LAN
    /// nor this machine's port is open. Such a name is not resolved.
    pub fn refuses_unresolved(&self, host: &str, port: u16) -> bool {
        let Egress::Hosts(patterns) = &self.egress else {
            return false;
        };
        let loopback_open = match &self.host_loopback {
            HostLoopback::Allow => true,
            HostLoopback::Ports(p) => p.contains(&port),
            HostLoopback::Deny => false,
        };
        host.parse::<IpAddr>().is_err()
            && self.lan == Lan::Deny
            && !loopback_open
            && !patterns.iter().any(|p| host_matches(p, host))
    }

    /// Whether the table stays within what a sandbox's proxy is handed
    /// (a union of tables may pass what each one alone keeps to): `Err`
    /// says which limit it passes.
    pub fn within_limits(&self) -> Result<(), String> {
        let hosts = match &self.egress {
            Egress::Hosts(h) => h.len(),
            Egress::Allow => 0,
        };
        within_limits(self.mirrored_ports().len(), hosts)
    }

    /// One line for `doctor` and the editor's notice.
    pub fn describe(&self) -> String {
        if !self.confines() {
            return "not confined (hostLoopback: allow shares the host's network)".into();
        }
        let loopback = match &self.host_loopback {
            HostLoopback::Deny => "host loopback denied".to_owned(),
            HostLoopback::Ports(p) => format!(
                "host loopback denied but port{} {}",
                if p.len() == 1 { "" } else { "s" },
                p.iter().map(u16::to_string).collect::<Vec<_>>().join(", ")
            ),
            HostLoopback::Allow => unreachable!("confines() said no"),
        };
        let lan = match self.lan {
            Lan::Deny => "LAN denied",
            Lan::Allow => "LAN allowed",
        };
        let egress = match &self.egress {
            Egress::Allow => "public egress allowed".to_owned(),
            Egress::Hosts(h) if h.is_empty() => "no public egress".to_owned(),
            Egress::Hosts(h) => format!("public egress to {} only", h.join(", ")),
        };
        format!("{loopback}, {lan}, {egress}")
    }
}

impl NetworkTable {
    /// The narrowest entry that lets a connection through (what "always
    /// allow" records); `Err` says, in the user's terms, why a table has
    /// none that narrow.
    pub fn opening(
        host: &str,
        port: u16,
        addr: IpAddr,
        zone: Zone,
    ) -> Result<NetworkTable, String> {
        let mut table = NetworkTable::default();
        match zone {
            Zone::HostLoopback if is_loopback(addr) && port == PROXY_PORT => {
                return Err(format!(
                    "port {PROXY_PORT} is the sandbox's own proxy inside the sandbox, and a hostLoopback port cannot be it; run the host's service on another port"
                ))
            }
            Zone::HostLoopback if is_loopback(addr) => {
                table.host_loopback = Some(HostLoopback::Ports([port].into()));
            }
            Zone::HostLoopback => {
                return Err(format!(
                    "{addr} is an address of this machine other than its loopback, which the table has no entry for; the sandbox reaches this machine through its loopback only: add a hostLoopback port to the config and connect to 127.0.0.1 instead"
                ))
            }
            Zone::Lan => {
                return Err(
                    "the table has no entry for one host of the local network; add \"lan\": \"allow\" to the config to allow the whole LAN for good".into(),
                )
            }
            Zone::Public => {
                let host = host.trim_end_matches('.');
                table.egress = Some(parse_egress(&Value::from(vec![host]))?);
            }
        }
        Ok(table)
    }
}

/// `host:port` as a user writes it (`[2001:db8::1]:443` for IPv6).
pub fn authority(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// `example.com` matches itself; `*.example.com` matches its subdomains
/// and itself. Names compare without case and a trailing dot; an IPv6
/// address by its canonical spelling (`2001:db8::1`, however written).
pub fn host_matches(pattern: &str, host: &str) -> bool {
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    let host = match host.parse::<Ipv6Addr>() {
        Ok(v6) => v6.to_string(),
        Err(_) => host,
    };
    match pattern.strip_prefix("*.") {
        Some(domain) => host == domain || host.ends_with(&format!(".{domain}")),
        None => host == pattern,
    }
}

/// IPv6 addresses that carry an IPv4 address are judged as that address:
/// mapped (`::ffff:a.b.c.d`), compatible (`::a.b.c.d`), NAT64
/// (`64:ff9b::/96`, `64:ff9b:1::/48`) and 6to4 (`2002::/16`), where a
/// translator may carry the connection to the LAN.
fn canonical(addr: IpAddr) -> IpAddr {
    let IpAddr::V6(v6) = addr else {
        return addr;
    };
    if let Some(v4) = v6.to_ipv4_mapped() {
        return IpAddr::V4(v4);
    }
    let s = v6.segments();
    let v4 = |hi: u16, lo: u16| Ipv4Addr::new((hi >> 8) as u8, hi as u8, (lo >> 8) as u8, lo as u8);
    let compatible = s[..6] == [0; 6] && !v6.is_loopback() && !v6.is_unspecified();
    let nat64 = s[0] == 0x64 && s[1] == 0xff9b && (s[2..6] == [0; 4] || s[2] == 1);
    if compatible || nat64 {
        return IpAddr::V4(v4(s[6], s[7]));
    }
    if s[0] == 0x2002 {
        return IpAddr::V4(v4(s[1], s[2]));
    }
    addr
}

fn is_loopback(addr: IpAddr) -> bool {
    canonical(addr).is_loopback()
}

/// The zone of `addr`, given this machine's own addresses and subnets.
pub fn zone(addr: IpAddr, own: &[OwnAddress]) -> Zone {
    let addr = canonical(addr);
    if addr.is_loopback() || addr.is_unspecified() || own.iter().any(|o| canonical(o.addr) == addr)
    {
        return Zone::HostLoopback;
    }
    let lan = match addr {
        IpAddr::V4(v4) => lan_v4(v4),
        IpAddr::V6(v6) => lan_v6(v6),
    } || own.iter().any(|o| o.on_link(addr));
    if lan {
        Zone::Lan
    } else {
        Zone::Public
    }
}

fn lan_v4(a: Ipv4Addr) -> bool {
    let [b0, b1, ..] = a.octets();
    a.is_private()
        || a.is_link_local()
        || a.is_broadcast()
        || a.is_multicast()
        // 0.0.0.0/8 is "this network" (only 0.0.0.0 itself reaches this
        // host on Linux, and is judged as the host's above); 100.64.0.0/10
        // is shared (carrier-grade NAT, and tailnets).
        || b0 == 0
        || (b0 == 100 && (64..128).contains(&b1))
}

fn lan_v6(a: Ipv6Addr) -> bool {
    let s0 = a.segments()[0];
    (s0 & 0xfe00) == 0xfc00 // unique local
        || (s0 & 0xffc0) == 0xfe80 // link-local
        || a.is_multicast()
}

/// The name servers of `/etc/resolv.conf`.
pub fn resolvers_of(text: &str) -> Vec<IpAddr> {
    text.lines()
        .filter_map(|l| l.trim().strip_prefix("nameserver"))
        .filter_map(|rest| rest.split_whitespace().next())
        .filter_map(|a| a.split('%').next()?.parse().ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    /// An interface address written `address/prefix`.
    fn own(s: &str) -> OwnAddress {
        let (addr, prefix) = s.split_once('/').unwrap();
        OwnAddress {
            addr: ip(addr),
            prefix: prefix.parse().unwrap(),
        }
    }

    #[test]
    fn zones_follow_the_address() {
        let own = [own("192.0.2.2/32"), own("2001:db8::2/128")];
        for a in [
            "127.0.0.1",
            "127.8.9.1",
            "::1",
            "0.0.0.0",
            "::",
            "192.0.2.2",
            "::ffff:127.0.0.1",
            "2001:db8::2",
            "::127.0.0.1",
            "64:ff9b::7f00:1",
            "2002:7f00:1::",
        ] {
            assert_eq!(zone(ip(a), &own), Zone::HostLoopback, "{a}");
        }
        for a in [
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "100.100.1.1",
            "fd00::1",
            "fe80::1",
            "::ffff:10.0.0.1",
            "0.1.2.3",
            "224.0.0.1",
            "::10.0.0.1",
            "64:ff9b::10.0.0.1",
            "64:ff9b:1::a00:1",
            "2002:a00:1::",
        ] {
            assert_eq!(zone(ip(a), &own), Zone::Lan, "{a}");
        }
        for a in [
            "1.1.1.1",
            "198.51.100.2",
            "172.32.0.1",
            "100.128.0.1",
            "2606:4700::1111",
            "192.0.2.9",
        ] {
            assert_eq!(zone(ip(a), &own), Zone::Public, "{a}");
        }
    }

    #[test]
    fn the_subnets_of_this_machines_links_are_the_lan_whatever_their_range() {
        let own = [
            own("127.0.0.1/8"),
            own("192.0.2.2/24"),
            own("2001:db8:1::2/64"),
            own("203.0.113.7/32"),
            own("198.18.0.1/0"),
        ];
        for a in [
            "192.0.2.1",
            "192.0.2.254",
            "2001:db8:1::99",
            "2001:db8:1:0:aaaa::1",
            "::ffff:192.0.2.9",
        ] {
            assert_eq!(zone(ip(a), &own), Zone::Lan, "{a}");
        }
        for a in ["192.0.3.1", "2001:db8:2::1", "203.0.113.8", "1.1.1.1"] {
            assert_eq!(zone(ip(a), &own), Zone::Public, "{a}");
        }
        assert_eq!(zone(ip("192.0.2.2"), &own), Zone::HostLoopback);
        // A LAN host's global IPv6 address is refused with the LAN.
        let p = NetworkPolicy::default();
        assert!(matches!(
            p.decide("nas.lan", 445, ip("2001:db8:1::5"), &own, &[]),
            Verdict::Deny {
                zone: Zone::Lan,
                ..
            }
        ));
    }

    #[test]
    fn the_default_closes_the_host_and_the_lan_and_keeps_the_internet() {
        let p = NetworkPolicy::default();
        let resolvers = [ip("10.0.0.53")];
        let d = |host: &str, port, a| p.decide(host, port, ip(a), &[], &resolvers);
        assert!(matches!(
            d("localhost", 8888, "127.0.0.1"),
            Verdict::Deny {
                zone: Zone::HostLoopback,
                ..
            }
        ));
        assert!(matches!(
            d("nas", 445, "192.168.1.5"),
            Verdict::Deny {
                zone: Zone::Lan,
                ..
            }
        ));
        assert_eq!(d("example.com", 443, "93.184.216.34"), Verdict::Allow);
        // The resolver, on port 53 only.
        assert_eq!(d("10.0.0.53", 53, "10.0.0.53"), Verdict::Allow);
        assert!(matches!(
            d("10.0.0.53", 80, "10.0.0.53"),
            Verdict::Deny { .. }
        ));
        assert!(p.confines());
    }

    #[test]
    fn the_table_is_read_as_written_and_wrong_values_say_what_is_expected() {
        let p = NetworkPolicy::parse(&json!({"hostLoopback": [11434, 8080], "lan": "allow", "egress": ["*.GitHub.com", "api.anthropic.com"]})).unwrap();
        assert_eq!(p.mirrored_ports(), vec![8080, 11434]);
        assert_eq!(
            p.decide("localhost", 11434, ip("127.0.0.1"), &[], &[]),
            Verdict::Allow
        );
        // A listed port on the host's other addresses stays closed: only
        // loopback is mirrored.
        assert!(matches!(
            p.decide("h", 11434, ip("192.0.2.2"), &[own("192.0.2.2/32")], &[]),
            Verdict::Deny { .. }
        ));
        assert!(matches!(
            p.decide("localhost", 8888, ip("127.0.0.1"), &[], &[]),
            Verdict::Deny { .. }
        ));
        assert_eq!(
            p.decide("nas", 445, ip("192.168.1.5"), &[], &[]),
            Verdict::Allow
        );
        assert_eq!(
            p.decide("api.github.com", 443, ip("140.82.1.1"), &[], &[]),
            Verdict::Allow
        );
        assert_eq!(
            p.decide("github.com.", 443, ip("140.82.1.1"), &[], &[]),
            Verdict::Allow
        );
        assert!(matches!(
            p.decide("evil.com", 443, ip("6.6.6.6"), &[], &[]),
            Verdict::Deny {
                zone: Zone::Public,
                ..
            }
        ));
        for (bad, says) in [
            (json!([]), "must be an object"),
            (json!({"hostLoopback": "yes"}), "list of ports"),
            (json!({"hostLoopback": [0]}), "list of ports"),
            (json!({"hostLoopback": [PROXY_PORT]}), "own proxy"),
            (json!({"lan": true}), "\"deny\" or \"allow\""),
            (json!({"egress": ["a b"]}), "not a host name"),
            (json!({"egres": "allow"}), "known: hostLoopback"),
        ] {
            let e = NetworkPolicy::parse(&bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
        assert!(!NetworkPolicy::parse(&json!({"hostLoopback": "allow"}))
            .unwrap()
            .confines());
    }

    #[test]
    fn a_project_widens_only_what_it_names() {
        let user =
            NetworkPolicy::parse(&json!({"hostLoopback": [1], "egress": ["a.com"]})).unwrap();
        let project = NetworkTable::parse(&json!({"hostLoopback": [2]})).unwrap();
        let both = user.clone().widened_by(&project);
        assert_eq!(both.mirrored_ports(), vec![1, 2]);
        // What the project does not name stays the user's.
        assert_eq!(both.egress, Egress::Hosts(vec!["a.com".into()]));
        let hosts = NetworkTable::parse(&json!({"egress": ["b.com"]})).unwrap();
        assert_eq!(
            user.widened_by(&hosts).egress,
            Egress::Hosts(vec!["a.com".into(), "b.com".into()])
        );
        // Every entry that may add a way out is to be approved.
        assert!(project.opens_anything() && hosts.opens_anything());
        assert!(NetworkTable::parse(&json!({"lan": "allow"}))
            .unwrap()
            .opens_anything());
        assert!(
            !NetworkTable::parse(&json!({"lan": "deny", "hostLoopback": "deny"}))
                .unwrap()
                .opens_anything()
        );
        let wide =
            NetworkTable::parse(&json!({"hostLoopback": [1, 2], "egress": ["a.com", "b.com"]}))
                .unwrap();
        assert!(project.within(&wide) && hosts.within(&wide));
        assert!(!wide.within(&project));
        assert!(!NetworkTable::parse(&json!({"egress": "allow"}))
            .unwrap()
            .within(&wide));
        let t = project.clone().widened(&hosts);
        assert_eq!(
            (t.ports(), t.egress.clone()),
            (vec![2], Some(Egress::Hosts(vec!["b.com".into()])))
        );
        assert_eq!(t.lan, None);
    }

    #[test]
    fn the_table_is_written_as_it_is_read_and_openings_are_narrow() {
        for v in [
            json!({"hostLoopback": [1, 2], "lan": "allow", "egress": ["a.com"]}),
            json!({"hostLoopback": "allow", "lan": "deny", "egress": "allow"}),
            json!({"egress": ["a.com"]}),
        ] {
            let t = NetworkTable::parse(&v).unwrap();
            assert_eq!(t.to_json(), v);
        }
        let port =
            NetworkTable::opening("localhost", 8888, ip("127.0.0.1"), Zone::HostLoopback).unwrap();
        assert_eq!(port.to_json(), json!({"hostLoopback": [8888]}));
        let host =
            NetworkTable::opening("API.Example.com.", 443, ip("1.2.3.4"), Zone::Public).unwrap();
        assert_eq!(host.to_json(), json!({"egress": ["api.example.com"]}));
        // A public IPv6 address is recorded in its canonical spelling, and
        // matches however a client writes it.
        let v6 = NetworkTable::opening(
            "2606:4700:0:0:0:0:0:1111",
            443,
            ip("2606:4700::1111"),
            Zone::Public,
        )
        .unwrap();
        assert_eq!(v6.to_json(), json!({"egress": ["2606:4700::1111"]}));
        let p = NetworkPolicy::parse(&json!({"egress": []}))
            .unwrap()
            .widened_by(&v6);
        for spelling in [
            "2606:4700:0:0:0:0:0:1111",
            "2606:4700:0::1111",
            "2606:4700::1111",
        ] {
            assert_eq!(
                p.decide(spelling, 443, ip(spelling), &[], &[]),
                Verdict::Allow,
                "{spelling}"
            );
        }
        assert!(matches!(
            p.decide("2606:4700::1112", 443, ip("2606:4700::1112"), &[], &[]),
            Verdict::Deny { .. }
        ));
        assert_eq!(
            NetworkTable::parse(&json!({"egress": ["[2606:4700:0::1111]"]}))
                .unwrap()
                .to_json(),
            json!({"egress": ["2606:4700::1111"]})
        );
        assert!(NetworkTable::parse(&json!({"egress": ["*.2606:4700::1111"]})).is_err());
        // What has no entry that narrow says why, and what to do instead.
        for (host, port, addr, zone, says) in [
            ("nas", 445, "10.0.0.2", Zone::Lan, "\"lan\": \"allow\""),
            (
                "h",
                80,
                "192.0.2.2",
                Zone::HostLoopback,
                "other than its loopback",
            ),
            (
                "localhost",
                PROXY_PORT,
                "127.0.0.1",
                Zone::HostLoopback,
                "own proxy",
            ),
            ("a b", 80, "1.2.3.4", Zone::Public, "not a host name"),
        ] {
            let why = NetworkTable::opening(host, port, ip(addr), zone).unwrap_err();
            assert!(why.contains(says), "{host}: {why}");
        }
    }

    #[test]
    fn a_table_and_a_union_of_tables_keep_to_the_limits() {
        let long = "a".repeat(MAX_HOST_LEN);
        for ok in [long.clone(), format!("*.{long}")] {
            assert!(NetworkTable::parse(&json!({"egress": [ok]})).is_ok());
        }
        let e = NetworkTable::parse(&json!({"egress": [format!("{long}a")]})).unwrap_err();
        assert!(
            e.contains("254 characters long") && e.contains("at most 253"),
            "{e}"
        );
        let hosts = |from: usize, n: usize| {
            NetworkTable::parse(&json!({
                "egress": (from..from + n).map(|i| format!("h{i}.example")).collect::<Vec<_>>()
            }))
            .unwrap()
        };
        let e =
            NetworkTable::parse(&json!({"egress": vec!["a.example"; MAX_HOSTS + 1]})).unwrap_err();
        assert!(e.contains("at most 1000"), "{e}");
        // Each table within the limit, their union past it.
        let user = NetworkPolicy::parse(&json!({"egress": []}))
            .unwrap()
            .widened_by(&hosts(0, 600));
        assert_eq!(user.within_limits(), Ok(()));
        let both = user.widened_by(&hosts(600, 600));
        let e = both.within_limits().unwrap_err();
        assert!(e.contains("1200 hosts; at most 1000"), "{e}");
        let e = hosts(0, 600)
            .widened(&hosts(600, 600))
            .within_limits()
            .unwrap_err();
        assert!(e.contains("1200 hosts"), "{e}");
        let ports = |from: u16| {
            NetworkTable::parse(&json!({"hostLoopback": (from..from + 60).collect::<Vec<_>>()}))
                .unwrap()
        };
        let e = ports(1).widened(&ports(100)).within_limits().unwrap_err();
        assert!(e.contains("120 ports; at most 100"), "{e}");
    }

    #[test]
    fn the_resolver_is_reachable_on_53_only_while_egress_is_allowed() {
        let resolvers = [ip("10.0.0.53"), ip("127.0.0.53"), ip("9.9.9.9")];
        let listed = NetworkPolicy::parse(&json!({"egress": ["example.com"]})).unwrap();
        for a in ["10.0.0.53", "127.0.0.53", "9.9.9.9", "::ffff:10.0.0.53"] {
            assert_eq!(
                NetworkPolicy::default().decide(a, 53, ip(a), &[], &resolvers),
                Verdict::Allow,
                "{a}"
            );
            // With a list, a resolver would look up (and carry out) any
            // name: it is judged as any other destination.
            match listed.decide(a, 53, ip(a), &[], &resolvers) {
                Verdict::Deny { why, .. } => assert!(why.contains("name server"), "{a}: {why}"),
                Verdict::Allow => panic!("{a}:53 is reachable with an egress list"),
            }
        }
        // Unless the table opens its zone or lists it.
        let lan = NetworkPolicy::parse(&json!({"egress": [], "lan": "allow"})).unwrap();
        assert_eq!(
            lan.decide("10.0.0.53", 53, ip("10.0.0.53"), &[], &resolvers),
            Verdict::Allow
        );
        let public = NetworkPolicy::parse(&json!({"egress": ["9.9.9.9"]})).unwrap();
        assert_eq!(
            public.decide("9.9.9.9", 53, ip("9.9.9.9"), &[], &resolvers),
            Verdict::Allow
        );
        // A name outside the list is not resolved on port 53 either.
        assert!(listed.refuses_unresolved("secret.attacker.example", 53));
    }

    #[test]
    fn a_name_outside_the_egress_list_is_refused_unresolved() {
        let p = NetworkPolicy::parse(&json!({"egress": ["*.github.com"]})).unwrap();
        assert!(p.refuses_unresolved("secret.attacker.example", 443));
        assert!(!p.refuses_unresolved("api.github.com", 443));
        assert!(
            !p.refuses_unresolved("1.2.3.4", 443),
            "an address is judged as such"
        );
        assert!(!NetworkPolicy::default().refuses_unresolved("x.example", 443));
        // Where the name might lead to an open LAN or port, it is resolved.
        let lan = NetworkPolicy::parse(&json!({"egress": [], "lan": "allow"})).unwrap();
        assert!(!lan.refuses_unresolved("nas.local", 445));
        let port = NetworkPolicy::parse(&json!({"egress": [], "hostLoopback": [8080]})).unwrap();
        assert!(!port.refuses_unresolved("localhost", 8080));
        assert!(port.refuses_unresolved("localhost", 8081));
    }

    #[test]
    fn resolvers_are_read_from_resolv_conf() {
        let text = "# comment\nnameserver 10.0.0.53\nnameserver fe80::1%eth0\nsearch lan\n";
        assert_eq!(resolvers_of(text), vec![ip("10.0.0.53"), ip("fe80::1")]);
    }
}
