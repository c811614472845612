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

/// Builds the profile with every write denial carrying `tag` as its
/// message: Seatbelt logs each refused operation with the message of the
/// rule that refused it, so the bridge can tell its own agent's denials
/// from every other sandboxed process's in the system log.
pub fn build_profile_tagged(policy: &Policy, tag: Option<&str>) -> Result<String, QuoteError> {
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
    emit_network(&mut out, &policy.network);
    Ok(out)
}

/// The network table, as far as Seatbelt can say it: its `remote ip`
/// filter knows only `*` and `localhost`, so the host's loopback is
/// closed (but the ports the table lists), while the LAN and host
/// patterns need a proxy this profile does not have.
fn emit_network(out: &mut String, table: &crate::policy::network::NetworkPolicy) {
    if !table.confines() {
        return;
    }
    out.push_str("\n;; ---- the network: the host's own services (a notebook, a database, an\n");
    out.push_str(";; editor server) would act for the agent, so its loopback is closed. The\n");
    out.push_str(";; agent's own servers listen there too: reachable on the listed ports only.\n");
    out.push_str("(deny network-outbound (remote ip \"localhost:*\"))\n");
    for port in table.mirrored_ports() {
        let _ = writeln!(
            out,
            "(allow network-outbound (remote ip \"localhost:{port}\"))"
        );
    }
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
        vec![("minimal", base), ("rich", rich)]
    }

    #[test]
    fn golden_profiles() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden");
        let bless = std::env::var_os("ZCODE_ACP_BLESS").is_some();
        for (name, input) in golden_inputs() {
            let text = build_profile(&Policy::build(&input)).unwrap();
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
    fn the_hosts_loopback_is_closed_but_the_listed_ports() {
        let (_, input) = golden_inputs().remove(0);
        let mut policy = Policy::build(&input);
        let text = build_profile(&policy).unwrap();
        let deny = "(deny network-outbound (remote ip \"localhost:*\"))";
        assert!(text.contains(deny));
        policy.network = crate::policy::network::NetworkPolicy::parse(
            &serde_json::json!({"hostLoopback": [11434]}),
        )
        .unwrap();
        let text = build_profile(&policy).unwrap();
        let allow = "(allow network-outbound (remote ip \"localhost:11434\"))";
        // Seatbelt's last matching rule decides: the port after the deny.
        assert!(text.find(allow).unwrap() > text.find(deny).unwrap());
        policy.network = crate::policy::network::NetworkPolicy::parse(
            &serde_json::json!({"hostLoopback": "allow"}),
        )
        .unwrap();
        assert!(!build_profile(&policy).unwrap().contains("remote ip"));
    }

    #[test]
    fn paths_that_cannot_be_quoted_fail_the_build() {
        let mut input = golden_inputs().remove(0).1;
        input.roots[0].path = "/Users/dev/a\nb".into();
        assert!(build_profile(&Policy::build(&input)).is_err());
    }
}
