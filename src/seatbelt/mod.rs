//! Seatbelt (macOS `sandbox-exec`) profiles generated from the policy.
//!
//! Building the text is pure and tested on every platform (golden files,
//! and a property test that interprets the SBPL and compares every decision
//! with [`Policy::evaluate_resolved`]); writing it out and wrapping commands
//! in it is in [`enforce`].

/// The last stage of a command the editor runs in a Seatbelt sandbox:
/// `zcode-acp __exec-env --env=NAME=VALUE... -- COMMAND ARGS` (carried out
/// by `commands::exec_env`), already confined when it applies the agent's
/// environment.
pub fn exec_env_argv(exe: &str, env: &[(String, String)], argv: &[String]) -> Vec<String> {
    let mut out = vec![exe.to_owned(), "__exec-env".to_owned()];
    out.extend(env.iter().map(|(k, v)| format!("--env={k}={v}")));
    out.push("--".to_owned());
    out.extend(argv.iter().cloned());
    out
}

/// What a Seatbelt sandbox is called in the confinement variable
/// (`confine::CONFINED_ENV`) and in labels.
pub const MACOS_SEATBELT: &str = "macos seatbelt";

pub mod enforce;
pub mod quote;
pub mod refusal_log;
pub mod violations;

use std::fmt::Write;
use std::path::Path;

use crate::policy::{Band, Matcher, Ops, Policy, Rule};
use quote::QuoteError;

/// The fixed head of every profile.
pub const BASE_PROFILE: &str = include_str!("../../profiles/base.sb");

/// The regex for `.zcode` entries and `.zcode/acp` paths (see
/// [`crate::policy::is_zcode_config_path`]); it names no path, so it
/// needs no escaping.
const ZCODE_CONFIG_REGEX: &str = r"/\.zcode(/acp(/.*)?)?$";

fn filter(m: &Matcher) -> Result<String, QuoteError> {
    Ok(match m {
        Matcher::Subpath(p) => format!("(subpath {})", quote::string(p)?),
        Matcher::Literal(p) => format!("(literal {})", quote::string(p)?),
        Matcher::NamePrefix { dir, prefix } => {
            let dir = if dir == Path::new("/") {
                String::new()
            } else {
                quote::regex_literal(dir)?
            };
            let prefix = quote::regex_literal(Path::new(prefix))?;
            format!("(regex #\"^{dir}/{prefix}[^/]*(/.*)?$\")")
        }
        Matcher::ZcodeConfig { beneath } => format!(
            "(require-all (subpath {}) (regex #\"{ZCODE_CONFIG_REGEX}\"))",
            quote::string(beneath)?
        ),
    })
}

/// The path a matcher is anchored at, to find which denials can overlap
/// an allow.
fn anchor(m: &Matcher) -> &Path {
    match m {
        Matcher::Subpath(p) | Matcher::Literal(p) => p,
        Matcher::NamePrefix { dir, .. } => dir,
        Matcher::ZcodeConfig { beneath } => beneath,
    }
}

/// Whether two matchers can cover a common path (conservatively: a false
/// "yes" only adds a redundant exclusion).
fn may_overlap(a: &Matcher, b: &Matcher) -> bool {
    match (a, b) {
        (Matcher::NamePrefix { dir, .. }, other) | (other, Matcher::NamePrefix { dir, .. }) => {
            let named = if matches!(a, Matcher::NamePrefix { .. }) {
                a
            } else {
                b
            };
            named.matches(anchor(other)) || dir.starts_with(anchor(other))
        }
        _ => {
            let (a, b) = (anchor(a), anchor(b));
            a.starts_with(b) || b.starts_with(a)
        }
    }
}

fn comment(out: &mut String, why: &str) {
    for line in why.lines() {
        let _ = writeln!(out, ";; {line}");
    }
}

/// One allow rule, excluding the denials inside it (only the islands, for
/// a grant that opens a protected path).
fn emit_allow(
    out: &mut String,
    rule: &Rule,
    denials: &[&Rule],
    islands_only: bool,
) -> Result<(), QuoteError> {
    comment(out, &rule.why);
    let own = filter(&rule.matcher)?;
    let excluded: Vec<String> = denials
        .iter()
        .filter(|d| {
            (!islands_only || d.kind == Band::Island) && may_overlap(&d.matcher, &rule.matcher)
        })
        .map(|d| filter(&d.matcher).map(|f| format!("(require-not {f})")))
        .collect::<Result<_, _>>()?;
    if excluded.is_empty() {
        let _ = writeln!(out, "(allow file-write* {own})");
    } else {
        let _ = writeln!(
            out,
            "(allow file-write* (require-all {own}\n    {}))",
            excluded.join("\n    ")
        );
    }
    Ok(())
}

/// Builds the whole profile text.
pub fn build_profile(policy: &Policy) -> Result<String, QuoteError> {
    build_profile_tagged(policy, None)
}

/// The profile with no proxy to go out through: a table that confines
/// the network leaves the agent its listed loopback ports and nothing
/// else ([`build_profile_with`]).
pub fn build_profile_tagged(policy: &Policy, tag: Option<&str>) -> Result<String, QuoteError> {
    build_profile_with(policy, tag, None)
}

/// Builds the profile with every write denial carrying `tag` as its
/// message: Seatbelt logs each refused operation with the message of the
/// rule that refused it, so the bridge can tell its own agent's denials
/// from every other sandboxed process's in the system log. `proxy`: the
/// port of the host's loopback where this arming's proxy listens, the
/// one way out when the network table confines.
pub fn build_profile_with(
    policy: &Policy,
    tag: Option<&str>,
    proxy: Option<u16>,
) -> Result<String, QuoteError> {
    let with = match tag {
        Some(tag) => format!(" (with message {})", quote::string(Path::new(tag))?),
        None => String::new(),
    };
    let mut out = String::from(BASE_PROFILE);
    out.push_str(
        "\n;; ---- base: no file writes anywhere; everything writable is allowed below.\n",
    );
    let _ = writeln!(out, "(deny file-write*{with})");
    let denials: Vec<&Rule> = policy
        .rules
        .iter()
        .filter(|r| !r.allows() && r.ops == Ops::All)
        .collect();

    out.push_str("\n;; ---- allow: the write whitelist.\n");
    out.push_str(";; Each allow also excludes the protected paths and islands inside it, so\n");
    out.push_str(";; the result does not rest on rule order alone.\n");
    for rule in policy.rules.iter().filter(|r| r.allows() && !r.reopens) {
        emit_allow(&mut out, rule, &denials, false)?;
    }
    for (kind, title) in [
        (
            Band::Protected,
            "protected: denied; the user may grant them in the editor",
        ),
        (
            Band::Island,
            "islands: never writable, and no grant opens them",
        ),
    ] {
        if kind == Band::Island {
            // The user's grants for protected paths come after the protected
            // band (they open what they name) and before the islands.
            let reopened: Vec<&Rule> = policy.rules.iter().filter(|r| r.reopens).collect();
            if !reopened.is_empty() {
                out.push_str("\n;; ---- grants the user made for protected paths.\n");
                for rule in reopened {
                    emit_allow(&mut out, rule, &denials, true)?;
                }
            }
        }
        let _ = writeln!(out, "\n;; ---- {title}.");
        for rule in policy.rules.iter().filter(|r| r.kind == kind) {
            comment(&mut out, &rule.why);
            let f = filter(&rule.matcher)?;
            match rule.ops {
                Ops::All => {
                    let _ = writeln!(out, "(deny file-write* {f}{with})");
                }
                // Pinned in place: no rename or removal, contents stay open.
                Ops::RemoveOnly => {
                    let _ = writeln!(out, "(deny file-write-unlink {f}{with})");
                }
            }
        }
    }
    emit_sockets(&mut out, policy)?;
    emit_network(&mut out, &policy.network, proxy);
    Ok(out)
}

/// The network table, as Seatbelt can say it: its `remote ip` filter
/// knows only `*` and `localhost`, so every address is closed (the LAN,
/// the internet, the Mac's other addresses, its loopback, TCP and UDP)
/// but TCP to the proxy's port and to the loopback ports the table lists.
/// The proxy, outside the sandbox, judges every destination by the whole
/// table and asks about the rest. Name lookups are its to make: the
/// system's resolver (its socket, and the services that reach it) is
/// closed to the sandbox, since a lookup carries the name it asks for out
/// to whoever serves the domain, and so is the system's download service.
/// What arrives from elsewhere than the loopback is refused too: a server
/// the agent starts on all addresses answers this Mac only, as on Linux.
fn emit_network(
    out: &mut String,
    table: &crate::policy::network::NetworkPolicy,
    proxy: Option<u16>,
) {
    if !table.confines() {
        return;
    }
    out.push_str("\n;; ---- the network: out through zcode-acp's proxy only, which judges every\n");
    out.push_str(";; destination by the network table and asks about the rest. The host's own\n");
    out.push_str(";; services (a notebook, a database, an editor server) would act for the\n");
    out.push_str(";; agent, so its loopback is closed too but for the listed ports.\n");
    out.push_str("(deny network-outbound (remote ip \"*:*\"))\n");
    match proxy {
        Some(port) => {
            comment(out, "the sandbox's proxy (outside the sandbox)");
            let _ = writeln!(
                out,
                "(allow network-outbound (remote tcp \"localhost:{port}\"))"
            );
        }
        None => comment(
            out,
            "no proxy runs for this profile: nothing is reached out there",
        ),
    }
    let listed = table.mirrored_ports();
    if !listed.is_empty() {
        comment(out, "the host loopback ports the network table lists");
    }
    for port in listed {
        let _ = writeln!(
            out,
            "(allow network-outbound (remote tcp \"localhost:{port}\"))"
        );
    }
    comment(
        out,
        "connections from elsewhere than this Mac's loopback (the LAN, the internet) are refused",
    );
    out.push_str("(deny network-inbound (local ip \"*:*\"))\n");
    out.push_str("(allow network-inbound (local ip \"localhost:*\"))\n");
    comment(
        out,
        "name lookups are the proxy's: the system's resolver would carry any name out",
    );
    out.push_str(
        "(deny network-outbound (remote unix-socket (path-literal \"/private/var/run/mDNSResponder\")))\n",
    );
    out.push_str("(deny mach-lookup (global-name \"com.apple.dnssd.service\") (global-name \"com.apple.mDNSResponder\") (global-name \"com.apple.mDNSResponderHelper\"))\n");
    comment(
        out,
        "the system's download service fetches what it is asked, outside the sandbox",
    );
    out.push_str("(deny mach-lookup (global-name-prefix \"com.apple.nsurlsessiond\"))\n");
}

/// Unix sockets, default-deny (see `policy::sockets`): a server outside runs
/// what it is sent with its own rights. The sandbox reaches the few allowed
/// services and sockets beneath the workspace roots (its own servers), and
/// never the servers named last, even beneath a root.
fn emit_sockets(out: &mut String, policy: &Policy) -> Result<(), QuoteError> {
    use crate::policy::sockets::{allowed_on, macos_denied, Os};
    out.push_str("\n;; ---- unix sockets: a server outside runs what it is sent, so none is\n");
    out.push_str(";; reached but services that only answer questions or take logs, and the\n");
    out.push_str(";; agent's own beneath the workspace roots.\n");
    out.push_str("(deny network-outbound (remote unix-socket))\n");
    let mut allowed = Vec::new();
    for a in allowed_on(Os::MacOs) {
        let path = quote::string(Path::new(a.path))?;
        allowed.push((
            a.why.to_owned(),
            if a.dir {
                format!(
                    "(remote unix-socket (path-regex #\"^{}/\"))",
                    quote::regex_literal(Path::new(a.path))?
                )
            } else {
                format!("(remote unix-socket (path-literal {path}))")
            },
        ));
    }
    // A root that opens `/` or the whole home directory would allow every
    // server's socket there (gpg-agent in ~/.gnupg): its sockets stay
    // refused like everyone else's.
    for rule in policy.rules.iter().filter(|r| r.root && !r.dangerous) {
        if let Matcher::Subpath(p) = &rule.matcher {
            let re = if p == Path::new("/") {
                Ok(String::new())
            } else {
                quote::regex_literal(p)
            };
            match re {
                Ok(re) => allowed.push((
                    format!("the agent's own servers in {}", p.display()),
                    format!("(remote unix-socket (path-regex #\"^{re}/\"))"),
                )),
                // The rest of the profile can name such a root; a regex
                // cannot, so its sockets stay refused (and the comment says so).
                Err(_) => comment(
                    out,
                    &format!(
                        "no socket is reachable beneath {}: its path cannot be written in a regex",
                        p.display()
                    ),
                ),
            }
        }
    }
    for path in &policy.network.served_sockets {
        allowed.push((
            "sockets zcode-acp serves this sandbox (it judges every request)".to_owned(),
            format!(
                "(remote unix-socket (path-regex #\"^{}(/|$)\"))",
                quote::regex_literal(path)?
            ),
        ));
    }
    for (why, f) in allowed {
        comment(out, &why);
        let _ = writeln!(out, "(allow network-outbound {f})");
    }
    for (re, why) in macos_denied() {
        comment(out, why);
        let _ = writeln!(
            out,
            "(deny network-outbound (remote unix-socket (path-regex #\"{re}\")))"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::build::{Platform, PolicyInput, ProjectRules, Repo, RootInput, Writable};

    /// Representative inputs whose profiles are pinned in tests/golden.
    fn golden_inputs() -> Vec<(&'static str, PolicyInput)> {
        let base = PolicyInput {
            links: Vec::new(),
            platform: Platform::Macos,
            home: "/Users/dev".into(),
            roots: vec![RootInput {
                path: "/Users/dev/src/app".into(),
                project: ProjectRules::default(),
                repos: vec![Repo {
                    work_tree: "/Users/dev/src/app".into(),
                    git_dir: "/Users/dev/src/app/.git".into(),
                    common_dir: "/Users/dev/src/app/.git".into(),
                    hooks_path: None,
                    gitfile: false,
                }],
            }],
            backend_state: vec![Writable {
                matcher: Matcher::Subpath("/Users/dev/.codex".into()),
                why: "codex's own state".into(),
                layered: false,
            }],
            temp_and_caches: vec![
                Writable {
                    matcher: Matcher::Subpath("/private/var/folders/xy/abc/T".into()),
                    why: "$TMPDIR".into(),
                    layered: false,
                },
                Writable {
                    matcher: Matcher::Subpath("/private/tmp".into()),
                    why: "system temp".into(),
                    layered: false,
                },
            ],
            once_allows: vec![],
            profile_dir: Some("/Users/dev/.zcode-acp/sandbox/0123abcd".into()),
            managed_root: "/Users/dev/.zcode-acp".into(),
            network: Default::default(),
        };
        let mut rich = base.clone();
        rich.roots[0].project = ProjectRules {
            allow: vec!["/Volumes/data/shared".into()],
            deny: vec!["/Users/dev/src/app/secrets".into()],
            strict_git: true,
        };
        rich.roots.push(RootInput {
            path: "/Users/dev/src/wt \"quoted\"".into(),
            project: ProjectRules::default(),
            repos: vec![Repo {
                work_tree: "/Users/dev/src/wt \"quoted\"".into(),
                git_dir: "/Users/dev/src/app/.git/worktrees/wt".into(),
                common_dir: "/Users/dev/src/app/.git".into(),
                hooks_path: None,
                gitfile: false,
            }],
        });
        rich.backend_state = vec![Writable {
            matcher: Matcher::NamePrefix {
                dir: "/Users/dev".into(),
                prefix: ".zcode".into(),
            },
            why: "the zcode backend's own state (~/.zcode*)".into(),
            layered: false,
        }];
        rich.once_allows = vec!["/Users/dev/Downloads/report.pdf".into()];
        rich.network = crate::policy::network::NetworkPolicy::parse(
            &serde_json::json!({"hostLoopback": [5432, 11434]}),
        )
        .unwrap();
        vec![("minimal", base), ("rich", rich)]
    }

    #[test]
    fn golden_profiles() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden");
        let bless = std::env::var_os("ZCODE_ACP_BLESS").is_some();
        for (name, input) in golden_inputs() {
            // As armed: with the proxy's port.
            let text = build_profile_with(&Policy::build(&input), None, Some(49152)).unwrap();
            let file = dir.join(format!("{name}.sb"));
            if bless {
                std::fs::create_dir_all(&dir).unwrap();
                std::fs::write(&file, &text).unwrap();
            }
            let expected = std::fs::read_to_string(&file).unwrap_or_else(|_| {
                panic!(
                    "missing {}; run with ZCODE_ACP_BLESS=1 to create it",
                    file.display()
                )
            });
            assert_eq!(
                text, expected,
                "{name}: the profile changed; review and re-bless with ZCODE_ACP_BLESS=1"
            );
        }
    }

    #[test]
    fn every_address_is_closed_but_the_proxy_and_the_listed_ports() {
        let (_, input) = golden_inputs().remove(0);
        let mut policy = Policy::build(&input);
        let deny = "(deny network-outbound (remote ip \"*:*\"))";
        let proxy = "(allow network-outbound (remote tcp \"localhost:49152\"))";
        let resolver = "(deny network-outbound (remote unix-socket (path-literal \"/private/var/run/mDNSResponder\")))";
        let text = build_profile_with(&policy, None, Some(49152)).unwrap();
        // Seatbelt's last matching rule decides: each allow after the deny,
        // the resolver closed after the sockets' allows.
        assert!(text.find(proxy).unwrap() > text.find(deny).unwrap());
        assert!(
            text.rfind(resolver).unwrap()
                > text
                    .rfind("(allow network-outbound (remote unix-socket")
                    .unwrap()
        );
        // Without a proxy, nothing goes out but the listed ports.
        let text = build_profile(&policy).unwrap();
        assert!(text.contains(deny) && !text.contains(proxy));
        policy.network = crate::policy::network::NetworkPolicy::parse(
            &serde_json::json!({"hostLoopback": [11434]}),
        )
        .unwrap();
        let text = build_profile_with(&policy, None, Some(49152)).unwrap();
        let allow = "(allow network-outbound (remote tcp \"localhost:11434\"))";
        assert!(text.find(allow).unwrap() > text.find(deny).unwrap());
        policy.network = crate::policy::network::NetworkPolicy::parse(
            &serde_json::json!({"hostLoopback": "allow"}),
        )
        .unwrap();
        let text = build_profile_with(&policy, None, Some(49152)).unwrap();
        assert!(!text.contains("remote ip") && !text.contains(resolver));
        assert!(!text.contains("dnssd") && !text.contains("network-inbound"));
    }

    #[test]
    fn paths_that_cannot_be_quoted_fail_the_build() {
        let mut input = golden_inputs().remove(0).1;
        input.roots[0].path = "/Users/dev/a\nb".into();
        assert!(build_profile(&Policy::build(&input)).is_err());
    }
}
