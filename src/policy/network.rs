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
//! Defaults: host loopback and LAN denied, and public egress to the
//! running agent's own API and sign-in hosts and the package registries
//! (`egress`) only: any other public host is asked, so nothing the agent
//! read leaves for a host nobody approved. `"egress": "allow"` opens every
//! public host, and the resolvers of `/etc/resolv.conf` on port 53
//! whatever their range (with an egress list they are not reachable: a
//! resolver answers for any name, which would let through what the list
//! keeps out; the proxy resolves the names it lets through itself).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use super::local_names::LocalNames;

// The table as the config files write it is config's (plain values, read
// and written there); what it lets through is decided here.
use crate::config::network::{parse_egress, union_egress, union_loopback, within_limits};
pub use crate::config::network::{
    Egress, HostLoopback, Lan, NetworkTable, MAX_HOSTS, MAX_HOST_LEN, MAX_PORTS, PROXY_PORT,
};

/// What a tunnel must start with before its bytes are passed on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TunnelCheck {
    /// Nothing: an address, another port, or the open internet.
    Open,
    /// A TLS ClientHello for this very name (what the default list opens).
    OwnNameOnly,
    /// No TLS ClientHello for another name (a name someone allowed).
    NoOtherName,
}

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
    /// Public hosts reachable without a question besides the egress list:
    /// the running agent's API and sign-in hosts, its base-URL variables'
    /// hosts, the package registries (`policy::egress::reachable`). Filled
    /// when the policy is gathered, never from a config; empty in a closed
    /// table.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub listed: Vec<String>,
    /// A table that could not be read: nothing public, the list included.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub closed: bool,
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

/// Whether `host` is an address (IPv6 in brackets or not), not a name.
fn is_address(host: &str) -> bool {
    host.trim_start_matches('[')
        .trim_end_matches(']')
        .parse::<IpAddr>()
        .is_ok()
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
            ..default
        })
    }

    /// Nothing reachable: what a table that cannot be read stands for.
    pub fn closed() -> NetworkPolicy {
        NetworkPolicy {
            egress: Egress::Hosts(Vec::new()),
            closed: true,
            ..NetworkPolicy::default()
        }
    }

    /// This table with `hosts` reachable without a question (see
    /// [`NetworkPolicy::listed`]); a closed table stays closed.
    pub fn listing(mut self, hosts: Vec<String>) -> NetworkPolicy {
        if !self.closed {
            self.listed = hosts;
        }
        self
    }

    /// Whether `host` is in the egress list (any port) or the policy's
    /// own list (HTTPS only, but for a base URL's own port: the registries
    /// and the agent's API serve nothing else the list is for).
    fn listed_host(&self, patterns: &[String], host: &str, port: u16) -> bool {
        patterns.iter().any(|p| host_matches(p, host)) || self.by_default_list(host, port)
    }

    /// Whether `host:port` is reachable by the policy's own list alone (not
    /// by an egress entry of the user's or a project's): a tunnel there
    /// must be TLS for that very name (see `network::sni`).
    pub fn by_default_list(&self, host: &str, port: u16) -> bool {
        self.listed.iter().any(|e| {
            let (pattern, listed_port) = entry_parts(e);
            listed_port == port && host_matches(pattern, host)
        })
    }

    /// What a tunnel (CONNECT or SOCKS) to `host:port` must start with
    /// (see `network::sni`).
    pub fn tunnel_check(&self, host: &str, port: u16) -> TunnelCheck {
        if self.only_by_default_list(host, port) {
            return TunnelCheck::OwnNameOnly;
        }
        let named = !is_address(host);
        // A name someone allowed (listed, or answered "yes") on the TLS
        // port: behind a shared front, a ClientHello for another name
        // would reach another site, one nobody allowed.
        if named && port == 443 && matches!(self.egress, Egress::Hosts(_)) {
            return TunnelCheck::NoOtherName;
        }
        TunnelCheck::Open
    }

    /// Whether a connection to `host:port` is allowed only because the
    /// policy's own list has it.
    pub fn only_by_default_list(&self, host: &str, port: u16) -> bool {
        if is_address(host) {
            // An address (a base-URL variable's): TLS names no server for
            // it, and it is the one place the connection goes.
            return false;
        }
        match &self.egress {
            Egress::Hosts(patterns) => {
                !patterns.iter().any(|p| host_matches(p, host)) && self.by_default_list(host, port)
            }
            Egress::Allow => false,
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
        let resolver = port == 53 && resolvers.contains(&canonical(addr));
        // The name servers, on port 53, whatever their zone (a stub
        // resolver on 127.0.0.53, one on the LAN), while egress is allowed.
        // With an egress list only when named themselves (in the list, or
        // port 53 of the loopback): a resolver looks up any name it is
        // asked (DNS over TCP through the proxy), so it would resolve, and
        // carry out, the names the list keeps from being resolved; an open
        // LAN does not open that.
        if resolver {
            let named = match &self.egress {
                Egress::Allow => true,
                Egress::Hosts(patterns) => {
                    patterns.iter().any(|p| host_matches(p, host))
                        || matches!(&self.host_loopback, HostLoopback::Ports(p) if p.contains(&53) && is_loopback(addr))
                }
            };
            if named {
                return Verdict::Allow;
            }
        }
        let allowed = !resolver
            && match zone {
                Zone::HostLoopback => match &self.host_loopback {
                    HostLoopback::Allow => true,
                    HostLoopback::Ports(ports) => is_loopback(addr) && ports.contains(&port),
                    HostLoopback::Deny => false,
                },
                Zone::Lan => self.lan == Lan::Allow,
                Zone::Public => match &self.egress {
                    Egress::Allow => true,
                    Egress::Hosts(patterns) => self.listed_host(patterns, host, port),
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

    /// Whether `host` (a name) is put to the user before it is resolved:
    /// a name outside the egress list, unless it is a local name (see
    /// `local_names`) and the LAN or this machine's port is open, where
    /// only its address says whether it may be reached. Resolving a name
    /// carries it to whoever serves its domain, and the name itself can
    /// carry what the agent read.
    pub fn asks_before_resolving(&self, host: &str, port: u16, local: &LocalNames) -> bool {
        let Egress::Hosts(patterns) = &self.egress else {
            return false;
        };
        if is_address(host) || self.listed_host(patterns, host, port) {
            return false;
        }
        let loopback_open = match &self.host_loopback {
            HostLoopback::Allow => true,
            HostLoopback::Ports(p) => p.contains(&port),
            HostLoopback::Deny => false,
        };
        let local_could_open = self.lan == Lan::Allow || loopback_open;
        !(local_could_open && local.is_local(host))
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
            Egress::Allow => "public egress allowed (\"egress\": \"allow\")".to_owned(),
            Egress::Hosts(h) if h.is_empty() && self.listed.is_empty() => {
                "no public egress".to_owned()
            }
            Egress::Hosts(h) => {
                let mut reachable = Vec::new();
                if !self.listed.is_empty() {
                    reachable.push(format!(
                        "the agent's API and the package registries ({} hosts)",
                        self.listed.len()
                    ));
                }
                if !h.is_empty() {
                    reachable.push(h.join(", "));
                }
                format!(
                    "public egress to {} without a question; any other public host is asked (\"egress\": \"allow\" opens them all)",
                    reachable.join(" and ")
                )
            }
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

/// An entry of the policy's own list (`policy::egress`): `host` (HTTPS), or `host:port` / `[v6]:port`
/// for a base URL on another port.
pub fn entry(host: &str, port: u16) -> String {
    match (port, host.contains(':')) {
        (443, _) => host.to_owned(),
        (_, true) => format!("[{host}]:{port}"),
        (_, false) => format!("{host}:{port}"),
    }
}

/// An entry's host pattern and port (see [`entry`]).
pub fn entry_parts(entry: &str) -> (&str, u16) {
    if let Some(v6) = entry.strip_prefix('[') {
        if let Some((host, port)) = v6.split_once("]:") {
            if let Ok(port) = port.parse() {
                return (host, port);
            }
        }
        return (v6.trim_end_matches(']'), 443);
    }
    match entry.rsplit_once(':') {
        Some((host, port)) if !host.contains(':') => match port.parse() {
            Ok(port) => (host, port),
            Err(_) => (entry, 443),
        },
        _ => (entry, 443),
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
#[path = "network_tests.rs"]
mod tests;
