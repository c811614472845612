//! The network table as the user config and a project's sandbox.json
//! write it, `"network": {"hostLoopback": ..., "lan": ..., "egress": ...}`:
//! read, checked, widened and written back here, as plain values. What it
//! lets through is `policy::network`'s to decide.

use std::collections::BTreeSet;
use std::net::Ipv6Addr;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The port of the sandbox's own proxy on its loopback (Linux): fixed, so
/// every process of a generation (the agent, its terminals, `run_code`)
/// is told the same address, and never a host port to open a way to.
pub const PROXY_PORT: u16 = 3128;

/// The most host loopback ports a table may list (each is mirrored by up
/// to two listeners, 127.0.0.1 and ::1, all handed to the proxy in one
/// message, which carries 253 descriptors at most).
pub const MAX_PORTS: usize = 100;
/// The most hosts an egress list may hold, the user's and the projects'
/// together.
pub const MAX_HOSTS: usize = 1000;
/// The longest host name an egress entry may be (a DNS name's limit,
/// without its final dot), not counting a `*.` in front.
pub const MAX_HOST_LEN: usize = 253;

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum HostLoopback {
    #[default]
    Deny,
    /// These ports only (a local model server, an MCP server).
    Ports(BTreeSet<u16>),
    /// Everything on the host's loopback: the sandbox then shares the
    /// host's network, and no other rule of the table can hold.
    Allow,
}

impl HostLoopback {
    /// The ports it lists, if it lists any.
    pub fn ports(&self) -> Vec<u16> {
        match self {
            HostLoopback::Ports(p) => p.iter().copied().collect(),
            _ => Vec::new(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum Lan {
    #[default]
    Deny,
    Allow,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Egress {
    /// Every public host (`"egress": "allow"`).
    Allow,
    /// Hosts matching one of these (`example.com`, `*.example.com`), with
    /// those the policy lists for the running agent (its API, the package
    /// registries: `policy::egress`); any other is asked, or refused where
    /// nobody can be asked.
    Hosts(Vec<String>),
}

/// The default: the policy's list alone; everything else asked.
impl Default for Egress {
    fn default() -> Self {
        Egress::Hosts(Vec::new())
    }
}

pub(crate) fn within_limits(ports: usize, hosts: usize) -> Result<(), String> {
    if ports > MAX_PORTS {
        return Err(format!(
            "`network.hostLoopback` would list {ports} ports; at most {MAX_PORTS} can be mirrored"
        ));
    }
    if hosts > MAX_HOSTS {
        return Err(format!(
            "`network.egress` would list {hosts} hosts; at most {MAX_HOSTS}"
        ));
    }
    Ok(())
}

pub(crate) fn union_loopback(mine: HostLoopback, theirs: &HostLoopback) -> HostLoopback {
    match (mine, theirs) {
        (HostLoopback::Allow, _) | (_, HostLoopback::Allow) => HostLoopback::Allow,
        (HostLoopback::Ports(mut a), HostLoopback::Ports(b)) => {
            a.extend(b);
            HostLoopback::Ports(a)
        }
        (HostLoopback::Deny, o) => o.clone(),
        (mine, HostLoopback::Deny) => mine,
    }
}

pub(crate) fn union_egress(mine: Egress, theirs: &Egress) -> Egress {
    match (mine, theirs) {
        (Egress::Allow, _) | (_, Egress::Allow) => Egress::Allow,
        (Egress::Hosts(mut a), Egress::Hosts(b)) => {
            for h in b {
                if !a.contains(h) {
                    a.push(h.clone());
                }
            }
            Egress::Hosts(a)
        }
    }
}

/// A table as a file writes it: only what it names (a project's, which
/// widens the user's, and the approval ledger's copy of it).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct NetworkTable {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_loopback: Option<HostLoopback>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lan: Option<Lan>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<Egress>,
}

impl NetworkTable {
    /// Reads `"network": {...}`; `Err` says what is wrong.
    pub fn parse(value: &Value) -> Result<NetworkTable, String> {
        let obj = value.as_object().ok_or(
            "`network` must be an object: {\"hostLoopback\": ..., \"lan\": ..., \"egress\": ...}",
        )?;
        let mut table = NetworkTable::default();
        for (key, v) in obj {
            match key.as_str() {
                "hostLoopback" => table.host_loopback = Some(parse_loopback(v)?),
                "lan" => {
                    table.lan = Some(match v.as_str() {
                        Some("deny") => Lan::Deny,
                        Some("allow") => Lan::Allow,
                        _ => return Err("`network.lan` must be \"deny\" or \"allow\"".into()),
                    })
                }
                "egress" => table.egress = Some(parse_egress(v)?),
                other => {
                    return Err(format!(
                        "`network.{other}` is not a setting (known: hostLoopback, lan, egress)"
                    ))
                }
            }
        }
        Ok(table)
    }

    /// The table as the config files write it.
    pub fn to_json(&self) -> Value {
        let mut obj = serde_json::Map::new();
        if let Some(l) = &self.host_loopback {
            let v = match l {
                HostLoopback::Deny => Value::from("deny"),
                HostLoopback::Allow => Value::from("allow"),
                HostLoopback::Ports(p) => Value::from(p.iter().copied().collect::<Vec<u16>>()),
            };
            obj.insert("hostLoopback".into(), v);
        }
        if let Some(l) = self.lan {
            let v = match l {
                Lan::Deny => "deny",
                Lan::Allow => "allow",
            };
            obj.insert("lan".into(), Value::from(v));
        }
        if let Some(e) = &self.egress {
            let v = match e {
                Egress::Allow => Value::from("allow"),
                Egress::Hosts(h) => Value::from(h.clone()),
            };
            obj.insert("egress".into(), v);
        }
        Value::Object(obj)
    }

    /// This table with `other`'s entries added.
    pub fn widened(self, other: &NetworkTable) -> NetworkTable {
        let add = |mine: Option<HostLoopback>, theirs: &Option<HostLoopback>| match (mine, theirs) {
            (Some(m), Some(t)) => Some(union_loopback(m, t)),
            (m, t) => m.or_else(|| t.clone()),
        };
        NetworkTable {
            host_loopback: add(self.host_loopback, &other.host_loopback),
            lan: match (self.lan, other.lan) {
                (Some(Lan::Allow), _) | (_, Some(Lan::Allow)) => Some(Lan::Allow),
                (m, t) => m.or(t),
            },
            egress: match (self.egress, &other.egress) {
                (Some(m), Some(t)) => Some(union_egress(m, t)),
                (m, t) => m.or_else(|| t.clone()),
            },
        }
    }

    /// Whether it names anything that may open a way out (and so needs
    /// the user's approval in a project's file): a host loopback port, the
    /// LAN, or any egress entry, which adds to a user's egress list. Only
    /// a table of `deny`s opens nothing.
    pub fn opens_anything(&self) -> bool {
        matches!(
            self.host_loopback,
            Some(HostLoopback::Ports(_) | HostLoopback::Allow)
        ) || self.lan == Some(Lan::Allow)
            || self.egress.is_some()
    }

    /// Whether it allows nothing `other` does not (a narrowing of an
    /// approved table needs no new approval).
    pub fn within(&self, other: &NetworkTable) -> bool {
        let loopback = match (&self.host_loopback, &other.host_loopback) {
            (None | Some(HostLoopback::Deny), _) => true,
            (_, Some(HostLoopback::Allow)) => true,
            (Some(HostLoopback::Ports(mine)), Some(HostLoopback::Ports(theirs))) => {
                mine.is_subset(theirs)
            }
            _ => false,
        };
        let lan = self.lan != Some(Lan::Allow) || other.lan == Some(Lan::Allow);
        let egress = match (&self.egress, &other.egress) {
            (None, _) => true,
            // An empty list adds nothing to any table.
            (Some(Egress::Hosts(mine)), _) if mine.is_empty() => true,
            (_, Some(Egress::Allow)) => true,
            (Some(Egress::Hosts(mine)), Some(Egress::Hosts(theirs))) => {
                mine.iter().all(|h| theirs.contains(h))
            }
            _ => false,
        };
        loopback && lan && egress
    }

    /// As `NetworkPolicy::within_limits`, for a table (one widened by a
    /// recorded entry).
    pub fn within_limits(&self) -> Result<(), String> {
        let hosts = match &self.egress {
            Some(Egress::Hosts(h)) => h.len(),
            _ => 0,
        };
        within_limits(self.ports().len(), hosts)
    }

    /// The host loopback ports it names.
    pub fn ports(&self) -> Vec<u16> {
        self.host_loopback
            .as_ref()
            .map_or_else(Vec::new, HostLoopback::ports)
    }

    pub fn describe(&self) -> String {
        self.to_json().to_string()
    }
}

fn parse_loopback(v: &Value) -> Result<HostLoopback, String> {
    const EXPECTED: &str =
        "`network.hostLoopback` must be \"deny\", \"allow\" or a list of ports ([11434])";
    match v {
        Value::String(s) if s == "deny" => Ok(HostLoopback::Deny),
        Value::String(s) if s == "allow" => Ok(HostLoopback::Allow),
        Value::Array(items) => {
            let mut ports = BTreeSet::new();
            for item in items {
                let port = item
                    .as_u64()
                    .filter(|p| (1..=65535).contains(p))
                    .ok_or(EXPECTED)? as u16;
                if port == PROXY_PORT {
                    return Err(format!(
                        "`network.hostLoopback`: port {PROXY_PORT} is the sandbox's own proxy inside the sandbox and cannot be mirrored; run the host's service on another port"
                    ));
                }
                ports.insert(port);
            }
            if ports.len() > MAX_PORTS {
                return Err(format!(
                    "`network.hostLoopback` lists {} ports; at most {MAX_PORTS} can be mirrored",
                    ports.len()
                ));
            }
            Ok(if ports.is_empty() {
                HostLoopback::Deny
            } else {
                HostLoopback::Ports(ports)
            })
        }
        _ => Err(EXPECTED.into()),
    }
}

pub(crate) fn parse_egress(v: &Value) -> Result<Egress, String> {
    const EXPECTED: &str =
        "`network.egress` must be \"allow\" or a list of host names ([\"api.anthropic.com\", \"*.github.com\"])";
    match v {
        Value::String(s) if s == "allow" => Ok(Egress::Allow),
        Value::Array(items) => items
            .iter()
            .map(|i| {
                let h = i.as_str().ok_or(EXPECTED)?.trim().to_ascii_lowercase();
                // An IPv6 address, bare or in brackets, in its one
                // canonical spelling (as connections are matched).
                let unbracketed = h.strip_prefix('[').and_then(|r| r.strip_suffix(']'));
                if let Ok(v6) = unbracketed.unwrap_or(&h).parse::<Ipv6Addr>() {
                    return Ok(v6.to_string());
                }
                let bare = h.strip_prefix("*.").unwrap_or(&h);
                if bare.len() > MAX_HOST_LEN {
                    let start: String = bare.chars().take(40).collect();
                    return Err(format!(
                        "`network.egress`: `{start}...` is {} characters long; a host name has at most {MAX_HOST_LEN}",
                        bare.len()
                    ));
                }
                if bare.is_empty() || bare.contains(['*', '/', ':', ' ']) {
                    return Err(format!(
                        "`network.egress`: `{h}` is not a host name or `*.domain` pattern"
                    ));
                }
                Ok(h)
            })
            .collect::<Result<Vec<_>, _>>()
            .and_then(|h| {
                if h.len() > MAX_HOSTS {
                    Err(format!(
                        "`network.egress` lists {} hosts; at most {MAX_HOSTS}",
                        h.len()
                    ))
                } else {
                    Ok(Egress::Hosts(h))
                }
            }),
        _ => Err(EXPECTED.into()),
    }
}
