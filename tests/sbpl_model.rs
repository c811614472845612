//! The Seatbelt profile decides exactly as the policy does.
//!
//! A small SBPL interpreter (allow/deny, subpath/literal/regex,
//! require-all/require-any/require-not, last match wins) runs every
//! generated profile against random policies and paths, island ancestors
//! and not-yet-existing paths included, and must agree with
//! `Policy::evaluate_resolved` on every decision; and every outbound
//! connection (an address, a loopback port, a Unix socket) is decided as
//! the network table and the proxy's port say. This runs on every
//! platform; the macOS tests check that sandbox-exec itself agrees.

#[path = "support/policies.rs"]
mod policies;

use std::path::Path;

use policies::{any_path, input, probes};
use proptest::prelude::*;
use zcode_acp::policy::network::NetworkPolicy;
use zcode_acp::policy::{Op, Policy};
use zcode_acp::seatbelt::{build_profile, build_profile_tagged, build_profile_with};

#[derive(Debug, Clone)]
enum Sexp {
    List(Vec<Sexp>),
    Sym(String),
    Str(String),
    Regex(regex::Regex),
}

fn parse(text: &str) -> Vec<Sexp> {
    let chars: Vec<char> = text.chars().collect();
    let mut i = 0;
    let mut stack: Vec<Vec<Sexp>> = vec![Vec::new()];
    while i < chars.len() {
        let c = chars[i];
        match c {
            ';' => {
                while i < chars.len() && chars[i] != '\n' {
                    i += 1;
                }
            }
            '(' => {
                stack.push(Vec::new());
                i += 1;
            }
            ')' => {
                let list = stack.pop().expect("balanced");
                stack.last_mut().expect("balanced").push(Sexp::List(list));
                i += 1;
            }
            '"' => {
                let mut s = String::new();
                i += 1;
                while chars[i] != '"' {
                    if chars[i] == '\\' {
                        i += 1;
                    }
                    s.push(chars[i]);
                    i += 1;
                }
                i += 1;
                stack.last_mut().unwrap().push(Sexp::Str(s));
            }
            '#' if chars.get(i + 1) == Some(&'"') => {
                let mut s = String::new();
                i += 2;
                while chars[i] != '"' {
                    s.push(chars[i]);
                    i += 1;
                }
                i += 1;
                stack
                    .last_mut()
                    .unwrap()
                    .push(Sexp::Regex(regex::Regex::new(&s).expect("a valid regex")));
            }
            c if c.is_whitespace() => i += 1,
            _ => {
                let mut s = String::new();
                while i < chars.len()
                    && !chars[i].is_whitespace()
                    && chars[i] != '('
                    && chars[i] != ')'
                {
                    s.push(chars[i]);
                    i += 1;
                }
                stack.last_mut().unwrap().push(Sexp::Sym(s));
            }
        }
    }
    assert_eq!(stack.len(), 1, "unbalanced profile");
    stack.pop().unwrap()
}

struct Rule {
    allow: bool,
    ops: Vec<String>,
    filters: Vec<Sexp>,
}

fn rules(profile: &str) -> Vec<Rule> {
    parse(profile)
        .into_iter()
        .filter_map(|form| {
            let Sexp::List(items) = form else { return None };
            let Some(Sexp::Sym(head)) = items.first() else {
                return None;
            };
            let allow = match head.as_str() {
                "allow" => true,
                "deny" => false,
                _ => return None,
            };
            let mut ops = Vec::new();
            let mut filters = Vec::new();
            for item in &items[1..] {
                match item {
                    Sexp::Sym(op) => ops.push(op.clone()),
                    // An action modifier such as `(with message "tag")`:
                    // changes what is logged, never what is decided.
                    Sexp::List(l) if matches!(l.first(), Some(Sexp::Sym(h)) if h == "with") => {}
                    other => filters.push(other.clone()),
                }
            }
            Some(Rule {
                allow,
                ops,
                filters,
            })
        })
        .collect()
}

fn matches(filter: &Sexp, path: &str) -> bool {
    let Sexp::List(items) = filter else {
        panic!("bad filter {filter:?}")
    };
    let Some(Sexp::Sym(head)) = items.first() else {
        panic!("bad filter {filter:?}")
    };
    let arg = || match &items[1] {
        Sexp::Str(s) => s.clone(),
        other => panic!("expected a string, got {other:?}"),
    };
    match head.as_str() {
        "subpath" => {
            let p = arg();
            p == "/" || path == p || path.starts_with(&format!("{p}/"))
        }
        "literal" => path == arg(),
        "regex" => match &items[1] {
            Sexp::Regex(r) => r.is_match(path),
            other => panic!("expected a regex, got {other:?}"),
        },
        "require-all" => items[1..].iter().all(|f| matches(f, path)),
        "require-any" => items[1..].iter().any(|f| matches(f, path)),
        "require-not" => !matches(&items[1], path),
        other => panic!("unknown filter {other}"),
    }
}

fn op_matches(rule_op: &str, op: &str) -> bool {
    rule_op == "default"
        || rule_op == op
        || rule_op.strip_suffix('*').is_some_and(|p| op.starts_with(p))
}

/// What the profile decides for one write operation on one path.
fn interpret(rules: &[Rule], op: Op, path: &Path) -> bool {
    let op = match op {
        Op::Write => "file-write-data",
        Op::Remove => "file-write-unlink",
    };
    let path = path.to_str().unwrap();
    rules
        .iter()
        .rev()
        .find(|r| {
            r.ops.iter().any(|o| op_matches(o, op))
                && (r.filters.is_empty() || r.filters.iter().any(|f| matches(f, path)))
        })
        .map(|r| r.allow)
        .unwrap_or(true)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]
    #[test]
    fn the_profile_decides_as_the_policy_does(input in input(true), extra in prop::collection::vec(any_path(), 0..20)) {
        let policy = Policy::build(&input);
        let profile = build_profile_tagged(&policy, Some("zcode-acp-model"))
            .expect("the alphabet is quotable");
        let rules = rules(&profile);
        let mut paths = probes(&policy);
        paths.extend(extra);
        for path in paths {
            for op in [Op::Write, Op::Remove] {
                let expected = policy.evaluate_resolved(&path, op);
                let got = interpret(&rules, op, &path);
                prop_assert_eq!(got, expected.allowed, "{:?} {:?}: policy says {:?}", op, path, expected);
            }
        }
    }
}

#[test]
fn the_interpreter_itself_can_disagree() {
    // Guard against an interpreter that agrees with everything: a profile
    // with its islands removed must disagree with the policy somewhere.
    let input = policies::one_root("/h/w");
    let policy = Policy::build(&input);
    let profile = build_profile(&policy).unwrap();
    let rules_full = rules(&profile);
    let island = Path::new("/h/w/.zcode/acp/sandbox.json");
    assert!(!interpret(&rules_full, Op::Write, island));
    let cut = profile.split(";; ---- islands").next().unwrap();
    let rules_cut = rules(cut);
    let stripped_allow: Vec<Rule> = rules_cut
        .into_iter()
        .map(|mut r| {
            if r.allow {
                r.filters.truncate(1);
                if let Some(Sexp::List(items)) = r.filters.first().cloned() {
                    if matches!(items.first(), Some(Sexp::Sym(s)) if s == "require-all") {
                        r.filters = vec![items[1].clone()];
                    }
                }
            }
            r
        })
        .collect();
    assert!(interpret(&stripped_allow, Op::Write, island));
}

/// Where a connection goes (or, inbound, where it arrives), as Seatbelt's
/// `remote` (`local`) filter sees it.
#[derive(Debug, Clone)]
enum Dest {
    /// An address: the loopback or any other, a port, TCP or UDP.
    Ip {
        loopback: bool,
        port: u16,
        tcp: bool,
    },
    Unix(String),
}

fn tcp(loopback: bool, port: u16) -> Dest {
    Dest::Ip {
        loopback,
        port,
        tcp: true,
    }
}

/// Whether `(remote ...)` (or `(local ...)`, for `side` "local") matches
/// `dest`.
fn side_matches(side: &str, filter: &Sexp, dest: &Dest) -> bool {
    let Sexp::List(items) = filter else {
        panic!("bad filter {filter:?}")
    };
    assert!(
        matches!(items.first(), Some(Sexp::Sym(h)) if h == side),
        "a network rule filters by `{side}`: {filter:?}"
    );
    match (items.get(1), dest) {
        (
            Some(Sexp::Sym(kind)),
            Dest::Ip {
                loopback,
                port,
                tcp,
            },
        ) if kind == "ip" || (kind == "tcp" && *tcp) || (kind == "udp" && !*tcp) => {
            let Some(Sexp::Str(spec)) = items.get(2) else {
                panic!("`remote ip` takes \"host:port\": {filter:?}")
            };
            let (host, p) = spec.rsplit_once(':').expect("host:port");
            let host_ok = match host {
                "*" => true,
                "localhost" => *loopback,
                other => panic!("Seatbelt knows only * and localhost, not {other}"),
            };
            host_ok && (p == "*" || p.parse::<u16>().expect("a port") == *port)
        }
        (Some(Sexp::Sym(kind)), Dest::Unix(path)) if kind == "unix-socket" => match items.get(2) {
            None => true,
            Some(Sexp::List(f)) => match (f.first(), f.get(1)) {
                (Some(Sexp::Sym(h)), Some(Sexp::Str(lit))) if h == "path-literal" => path == lit,
                (Some(Sexp::Sym(h)), Some(Sexp::Regex(re))) if h == "path-regex" => {
                    re.is_match(path)
                }
                _ => panic!("unknown socket filter {f:?}"),
            },
            Some(other) => panic!("unknown socket filter {other:?}"),
        },
        _ => false,
    }
}

/// What the profile decides for one network operation (Seatbelt's
/// default here is to allow: the profile allows by default).
fn decides(rules: &[Rule], op: &str, side: &str, dest: &Dest) -> bool {
    rules
        .iter()
        .rev()
        .find(|r| {
            r.ops.iter().any(|o| op_matches(o, op))
                && (r.filters.is_empty() || r.filters.iter().any(|f| side_matches(side, f, dest)))
        })
        .map(|r| r.allow)
        .unwrap_or(true)
}

/// One outbound connection to `dest`.
fn outbound(rules: &[Rule], dest: &Dest) -> bool {
    decides(rules, "network-outbound", "remote", dest)
}

/// One connection arriving at `local`.
fn inbound(rules: &[Rule], local: &Dest) -> bool {
    decides(rules, "network-inbound", "local", local)
}

/// Whether a `mach-lookup` of the service `name` is allowed.
fn mach_lookup(rules: &[Rule], name: &str) -> bool {
    rules
        .iter()
        .rev()
        .find(|r| {
            r.ops.iter().any(|o| op_matches(o, "mach-lookup"))
                && (r.filters.is_empty()
                    || r.filters.iter().any(|f| match f {
                        Sexp::List(l) => match (l.first(), l.get(1)) {
                            (Some(Sexp::Sym(h)), Some(Sexp::Str(v))) if h == "global-name" => {
                                v == name
                            }
                            (Some(Sexp::Sym(h)), Some(Sexp::Str(v)))
                                if h == "global-name-prefix" =>
                            {
                                name.starts_with(v.as_str())
                            }
                            _ => panic!("unknown mach filter {l:?}"),
                        },
                        other => panic!("unknown mach filter {other:?}"),
                    }))
        })
        .map(|r| r.allow)
        .unwrap_or(true)
}

const RESOLVER: &str = "/private/var/run/mDNSResponder";

fn loopback_table() -> impl Strategy<Value = serde_json::Value> {
    prop_oneof![
        Just(serde_json::json!("deny")),
        Just(serde_json::json!("allow")),
        // Never the sandbox's own proxy port, which the table refuses.
        prop::collection::vec(
            (1024u16..65535).prop_filter("the proxy's port", |p| {
                *p != zcode_acp::policy::network::PROXY_PORT
            }),
            1..5
        )
        .prop_map(|p| serde_json::json!(p)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]
    #[test]
    fn the_network_goes_out_through_the_proxy_only(
        loopback in loopback_table(),
        proxy in 1024u16..65535,
        probes in prop::collection::vec(1u16..65535, 0..20),
    ) {
        let mut policy = Policy::build(&policies::one_root("/h/w"));
        policy.network = NetworkPolicy::parse(&serde_json::json!({"hostLoopback": loopback})).unwrap();
        let table = &policy.network;
        let profile = build_profile_with(&policy, Some("zcode-acp-model"), Some(proxy)).unwrap();
        let rules = rules(&profile);
        let confines = table.confines();
        let listed = table.mirrored_ports();
        let mut ports = probes;
        ports.extend(&listed);
        ports.extend([proxy, 443, 53]);
        for port in ports {
            // Anywhere but the loopback: only where nothing is confined
            // (the proxy carries the rest), TCP or UDP.
            for tcp in [true, false] {
                let away = outbound(&rules, &Dest::Ip { loopback: false, port, tcp });
                prop_assert_eq!(away, !confines, "an address away, port {} (tcp {})", port, tcp);
            }
            // The loopback: TCP to the proxy and the listed ports.
            let expected = !confines || port == proxy || listed.contains(&port);
            prop_assert_eq!(outbound(&rules, &tcp(true, port)), expected, "the loopback, port {} (proxy {})", port, proxy);
            let udp = Dest::Ip { loopback: true, port, tcp: false };
            prop_assert_eq!(outbound(&rules, &udp), !confines, "UDP on the loopback, port {}", port);
            // Connections arrive from this Mac's loopback only.
            prop_assert!(inbound(&rules, &tcp(true, port)));
            prop_assert_eq!(inbound(&rules, &tcp(false, port)), !confines, "arriving from away, port {}", port);
        }
        // Name lookups are the proxy's to make where it confines, by
        // socket or by service; downloads by the system's service too.
        prop_assert_eq!(outbound(&rules, &Dest::Unix(RESOLVER.into())), !confines);
        for service in ["com.apple.dnssd.service", "com.apple.mDNSResponder", "com.apple.nsurlsessiond.NSURLSessionProxyService"] {
            prop_assert_eq!(mach_lookup(&rules, service), !confines, "{}", service);
        }
        prop_assert!(mach_lookup(&rules, "com.apple.trustd"));
        prop_assert!(outbound(&rules, &Dest::Unix("/private/var/run/syslog".into())));
        prop_assert!(!outbound(&rules, &Dest::Unix("/Users/dev/.gnupg/S.gpg-agent".into())));
    }
}

#[test]
fn the_network_model_itself_can_disagree() {
    // A profile without its network section must let an address away
    // through and the resolver answer: the model sees the difference.
    let policy = Policy::build(&policies::one_root("/h/w"));
    let profile = build_profile_with(&policy, None, Some(40000)).unwrap();
    let away = tcp(false, 443);
    assert!(!outbound(&rules(&profile), &away));
    assert!(!outbound(&rules(&profile), &Dest::Unix(RESOLVER.into())));
    let cut = profile.split(";; ---- the network").next().unwrap();
    assert!(outbound(&rules(cut), &away));
    assert!(outbound(&rules(cut), &Dest::Unix(RESOLVER.into())));
}
