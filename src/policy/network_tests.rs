//! Tests of the network table's decisions (`policy::network`).

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
fn the_default_closes_the_host_and_the_lan_and_asks_beyond_its_list() {
    let p = NetworkPolicy::default().listing(vec!["api.anthropic.com".into(), "pypi.org".into()]);
    let resolvers = [ip("10.0.0.53")];
    let d = |host: &str, port, a| p.decide(host, port, ip(a), &[], &resolvers);
    assert_eq!(d("api.anthropic.com", 443, "160.79.104.10"), Verdict::Allow);
    assert_eq!(d("PyPI.org.", 443, "151.101.0.223"), Verdict::Allow);
    // The list is for HTTPS: another port of a listed host is asked.
    assert!(matches!(
        d("pypi.org", 80, "151.101.0.223"),
        Verdict::Deny { .. }
    ));
    assert!(matches!(
        d("pypi.org", 22, "151.101.0.223"),
        Verdict::Deny { .. }
    ));
    // Reached by the list alone: its tunnels must be TLS for that name.
    assert!(p.only_by_default_list("pypi.org", 443));
    assert!(!p.only_by_default_list("pypi.org", 80));
    let mine = NetworkPolicy::parse(&json!({"egress": ["pypi.org"]}))
        .unwrap()
        .listing(vec!["pypi.org".into()]);
    assert!(
        !mine.only_by_default_list("pypi.org", 443),
        "the user listed it"
    );
    assert!(!p.only_by_default_list("151.101.0.223", 443));
    use super::TunnelCheck;
    assert_eq!(p.tunnel_check("pypi.org", 443), TunnelCheck::OwnNameOnly);
    assert_eq!(mine.tunnel_check("pypi.org", 443), TunnelCheck::NoOtherName);
    assert_eq!(
        p.tunnel_check("asked.example", 443),
        TunnelCheck::NoOtherName
    );
    assert_eq!(p.tunnel_check("asked.example", 22), TunnelCheck::Open);
    assert_eq!(p.tunnel_check("151.101.0.223", 443), TunnelCheck::Open);
    match d("example.com", 443, "93.184.216.34") {
        Verdict::Deny {
            zone: Zone::Public,
            why,
        } => {
            assert!(why.contains("egress"), "{why}")
        }
        v => panic!("an unlisted host: {v:?}"),
    }
    // Not even resolved (the name itself could carry what was read).
    assert!(p.asks_before_resolving_here("secret.attacker.example", 443));
    assert!(!p.asks_before_resolving_here("api.anthropic.com", 443));
    // No resolver: it would look up any name.
    assert!(matches!(
        d("10.0.0.53", 53, "10.0.0.53"),
        Verdict::Deny { .. }
    ));
    assert!(
        p.describe().contains("any other public host is asked"),
        "{}",
        p.describe()
    );
    // A closed table (one that cannot be read) takes no list.
    let closed = NetworkPolicy::closed().listing(vec!["pypi.org".into()]);
    assert!(closed.asks_before_resolving_here("pypi.org", 443));
    assert!(closed.describe().contains("no public egress"));
}

#[test]
fn egress_allow_closes_the_host_and_the_lan_and_keeps_the_internet() {
    let p = NetworkPolicy::parse(&json!({"egress": "allow"})).unwrap();
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
    let user = NetworkPolicy::parse(&json!({"hostLoopback": [1], "egress": ["a.com"]})).unwrap();
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
    let wide = NetworkTable::parse(&json!({"hostLoopback": [1, 2], "egress": ["a.com", "b.com"]}))
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
    let host = NetworkTable::opening("API.Example.com.", 443, ip("1.2.3.4"), Zone::Public).unwrap();
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
    let e = NetworkTable::parse(&json!({"egress": vec!["a.example"; MAX_HOSTS + 1]})).unwrap_err();
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
    let open = NetworkPolicy::parse(&json!({"egress": "allow"})).unwrap();
    for a in ["10.0.0.53", "127.0.0.53", "9.9.9.9", "::ffff:10.0.0.53"] {
        assert_eq!(
            open.decide(a, 53, ip(a), &[], &resolvers),
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
    // An open LAN does not open its name server (it would resolve any name
    // for the agent, DNS over TCP through the proxy).
    let lan = NetworkPolicy::parse(&json!({"egress": [], "lan": "allow"})).unwrap();
    assert!(matches!(
        lan.decide("10.0.0.53", 53, ip("10.0.0.53"), &[], &resolvers),
        Verdict::Deny { .. }
    ));
    assert_eq!(
        lan.decide("10.0.0.54", 53, ip("10.0.0.54"), &[], &resolvers),
        Verdict::Allow,
        "another LAN host's port 53 is the LAN's"
    );
    // Named itself, it is reachable: in the list, or loopback port 53.
    let port = NetworkPolicy::parse(&json!({"egress": [], "hostLoopback": [53]})).unwrap();
    assert_eq!(
        port.decide("127.0.0.53", 53, ip("127.0.0.53"), &[], &resolvers),
        Verdict::Allow
    );
    let public = NetworkPolicy::parse(&json!({"egress": ["9.9.9.9"]})).unwrap();
    assert_eq!(
        public.decide("9.9.9.9", 53, ip("9.9.9.9"), &[], &resolvers),
        Verdict::Allow
    );
    // A name outside the list is not resolved on port 53 either.
    assert!(listed.asks_before_resolving_here("secret.attacker.example", 53));
}

#[test]
fn a_name_outside_the_egress_list_is_asked_before_it_is_resolved() {
    let p = NetworkPolicy::parse(&json!({"egress": ["*.github.com"]})).unwrap();
    assert!(p.asks_before_resolving_here("secret.attacker.example", 443));
    assert!(!p.asks_before_resolving_here("api.github.com", 443));
    assert!(
        !p.asks_before_resolving_here("1.2.3.4", 443),
        "an address is judged as such"
    );
    assert!(NetworkPolicy::default().asks_before_resolving_here("x.example", 443));
    assert!(!NetworkPolicy::parse(&json!({"egress": "allow"}))
        .unwrap()
        .asks_before_resolving_here("x.example", 443));
    // Where a local name might lead to an open LAN or port, it is
    // resolved; any other name is still asked first (the DNS query would
    // carry it out, wherever it leads).
    let lan = NetworkPolicy::parse(&json!({"egress": [], "lan": "allow"})).unwrap();
    assert!(!lan.asks_before_resolving_here("nas.local", 445));
    assert!(!lan.asks_before_resolving_here("printer", 631));
    assert!(lan.asks_before_resolving_here("secret.attacker.example", 445));
    let port = NetworkPolicy::parse(&json!({"egress": [], "hostLoopback": [8080]})).unwrap();
    assert!(!port.asks_before_resolving_here("localhost", 8080));
    assert!(port.asks_before_resolving_here("localhost", 8081));
    assert!(port.asks_before_resolving_here("secret.attacker.example", 8080));
    // Closed LAN and ports: even a local name is asked.
    assert!(NetworkPolicy::default().asks_before_resolving_here("nas.local", 445));
}

#[test]
fn resolvers_are_read_from_resolv_conf() {
    let text = "# comment\nnameserver 10.0.0.53\nnameserver fe80::1%eth0\nsearch lan\n";
    assert_eq!(resolvers_of(text), vec![ip("10.0.0.53"), ip("fe80::1")]);
}

impl NetworkPolicy {
    /// [`NetworkPolicy::asks_before_resolving`] with no hosts file and no
    /// search domain.
    fn asks_before_resolving_here(&self, host: &str, port: u16) -> bool {
        self.asks_before_resolving(host, port, &LocalNames::default())
    }
}
